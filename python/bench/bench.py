"""Benchmarks of the Python package (figures in docs/python.md):

1. a skipped ``summarize.run()`` from Python against the same skip through the Rust
   library (a no-op Rust processor, same job, guards and store, n runs in one call);
2. ``Gate.check_and_mark`` of 100 k events from Python (batches of 1000) against
   ``idem gate`` on the same store.

    python python/bench/bench.py [--store URL] [--idem target/release/idem] [--runs N]
"""

import argparse
import json
import os
import subprocess
import tempfile
import time
import uuid

import idem


def skip_ratio(url: str, runs: int) -> dict:
    store = idem.open_store(url)
    name = f"bench_{uuid.uuid4().hex[:8]}"

    @idem.processor(name, store=store, time_window="1h", lease="10m")
    def summarize(run):
        return idem.Outcome(records=1)

    assert summarize.run(date="2025-11-18").status == "completed"
    for _ in range(20):  # warm up both paths
        summarize.run(date="2025-11-18")
    summarize._job._bench_rust(20, "2025-11-18")
    started = time.perf_counter()
    for _ in range(runs):
        assert summarize.run(date="2025-11-18").status == "skipped"
    python_s = time.perf_counter() - started
    rust_s, counts = summarize._job._bench_rust(runs, "2025-11-18")
    assert counts == {"skipped": runs}, counts
    return {
        "runs": runs,
        "python_us_per_skip": round(python_s / runs * 1e6, 1),
        "rust_us_per_skip": round(rust_s / runs * 1e6, 1),
        "ratio": round(python_s / rust_s, 2),
    }


def gate_100k(url: str, idem_bin: str, n: int = 100_000) -> dict:
    lines = [
        json.dumps({"id": str(i % (n * 9 // 10)), "amount": f"{i % 997}.00", "kind": "load"})
        for i in range(n)
    ]
    store = idem.open_store(url)
    gate = idem.Gate(store, f"py-{uuid.uuid4().hex}", "id")
    started = time.perf_counter()
    verdicts = []
    for i in range(0, n, 1000):
        verdicts += gate.check_and_mark(lines[i : i + 1000])
    python_s = time.perf_counter() - started
    with tempfile.NamedTemporaryFile("w", suffix=".ndjson", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        started = time.perf_counter()
        subprocess.run(
            [idem_bin, "--store", url, "gate", "--key", "id", "--namespace",
             f"cli-{uuid.uuid4().hex}", "--input", f.name, "--output", os.devnull],
            check=True, capture_output=True,
        )
        cli_s = time.perf_counter() - started
    finally:
        os.unlink(f.name)
    return {
        "events": n,
        "python_s": round(python_s, 2),
        "python_events_per_s": round(n / python_s),
        "idem_gate_s": round(cli_s, 2),
        "idem_gate_events_per_s": round(n / cli_s),
        "new": sum(1 for v in verdicts if v.verdict == "new"),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default=None, help="default: a fresh SQLite file")
    ap.add_argument("--idem", default="target/debug/idem")
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    url = args.store or f"sqlite://{tempfile.mkdtemp()}/bench.db"
    print(json.dumps({"store": url.split("://")[0], "skip": skip_ratio(url, args.runs)}))
    url = args.store or f"sqlite://{tempfile.mkdtemp()}/bench.db"
    print(json.dumps({"store": url.split("://")[0], "gate": gate_100k(url, args.idem)}))


if __name__ == "__main__":
    main()
