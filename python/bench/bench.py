"""Benchmarks of the Python package (figures in docs/python.md), all in one run:

1. a skipped ``summarize.run()`` from Python (it returns the earlier run's output, read
   from the ledger) against the same skip through the Rust library (a no-op Rust
   processor, same job, guards and store, n runs in one call), without and with that read;
2. a replay through ``@pyidem.idempotent`` (one call, its key already done) against a bare
   one-key ``Gate.check_and_mark`` replay on the same store;
3. with ``--gate``: ``Gate.check_and_mark`` of 100 k events (batches of 1000) against
   ``idem gate`` on the same store.

Rounds alternate the two sides of each pair; times are medians over the rounds, ratios
the median of the rounds' ratios.

    python python/bench/bench.py [--store URL] [--runs N] [--rounds R] [--gate --idem target/release/idem]
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid

import pyidem


def _per_call(fn, n):
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n


def skip_ratio(url: str, runs: int, rounds: int) -> dict:
    store = pyidem.open_store(url)
    name = f"bench_{uuid.uuid4().hex[:8]}"

    @pyidem.processor(name, store=store, time_window="1h", lease="10m")
    def summarize(run):
        return pyidem.Outcome(records=1, output={"players": 412, "file": "summary.csv"})

    assert summarize.run(date="2025-11-18").status == "completed"
    skipped = summarize.run(date="2025-11-18")
    assert skipped.status == "skipped" and skipped.output["players"] == 412
    summarize._job._bench_rust(20, "2025-11-18")  # warm up both paths

    def python_skip():
        for _ in range(runs):
            summarize.run(date="2025-11-18")

    def rust(remember):
        secs, counts = summarize._job._bench_rust(runs, "2025-11-18", remember)
        assert counts == {"skipped": runs}, counts
        return secs / runs

    py, bare, read = [], [], []
    for _ in range(rounds):
        py.append(_per_call(python_skip, 1) / runs)
        bare.append(rust(False))
        read.append(rust(True))
    p, b, r = (statistics.median(x) for x in (py, bare, read))
    return {
        "runs": runs,
        "rounds": rounds,
        "python_us_per_skip": round(p * 1e6, 1),
        "rust_us_per_skip": round(b * 1e6, 1),
        "rust_with_output_read_us_per_skip": round(r * 1e6, 1),
        # Each round's ratio (its two sides measured back to back), their median.
        "ratio": round(statistics.median(x / y for x, y in zip(py, bare)), 2),
        "ratio_to_rust_with_output_read": round(statistics.median(x / y for x, y in zip(py, read)), 2),
        "python_ratio_per_round": [round(x / y, 2) for x, y in zip(py, bare)],
    }


def decorator_ratio(url: str, calls: int, rounds: int) -> dict:
    store = pyidem.open_store(url)

    @pyidem.idempotent(store, key="order_id", namespace=f"bench-{uuid.uuid4().hex}")
    def charge(order_id: str, amount: int) -> dict:
        return {"charged": amount, "receipt": "r-1"}

    gate = pyidem.Gate(store, f"bench-bare-{uuid.uuid4().hex}", "k")
    event = {"k": "o-1", "p": {"order_id": "o-1", "amount": 100}}
    assert gate.check_and_mark([event])[0].verdict == "new"
    first = charge("o-1", 100)
    for _ in range(20):  # warm up
        assert charge("o-1", 100) == first
        assert gate.check_and_mark([event])[0].verdict == "replay"
    deco, bare = [], []
    for _ in range(rounds):
        deco.append(_per_call(lambda: charge("o-1", 100), calls))
        bare.append(_per_call(lambda: gate.check_and_mark([event]), calls))
    d, b = statistics.median(deco), statistics.median(bare)
    return {
        "calls": calls,
        "rounds": rounds,
        "decorator_replay_us": round(d * 1e6, 1),
        "check_and_mark_replay_us": round(b * 1e6, 1),
        "ratio": round(statistics.median(x / y for x, y in zip(deco, bare)), 2),
        "ratio_per_round": [round(x / y, 2) for x, y in zip(deco, bare)],
    }


def gate_100k(url: str, idem_bin: str, n: int = 100_000) -> dict:
    lines = [
        json.dumps({"id": str(i % (n * 9 // 10)), "amount": f"{i % 997}.00", "kind": "load"})
        for i in range(n)
    ]
    store = pyidem.open_store(url)
    gate = pyidem.Gate(store, f"py-{uuid.uuid4().hex}", "id")
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
    ap.add_argument("--runs", type=int, default=2000, help="skips (and replays) per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gate", action="store_true", help="also the 100 k event gate against idem gate")
    ap.add_argument("--idem", default="target/release/idem")
    args = ap.parse_args()
    fresh = lambda: args.store or f"sqlite://{tempfile.mkdtemp()}/bench.db"  # noqa: E731
    print(json.dumps({"store": fresh().split("://")[0], "skip": skip_ratio(fresh(), args.runs, args.rounds)}))
    print(json.dumps({"store": fresh().split("://")[0], "idempotent": decorator_ratio(fresh(), args.runs, args.rounds)}))
    if args.gate:
        print(json.dumps({"store": fresh().split("://")[0], "gate": gate_100k(fresh(), args.idem)}))


if __name__ == "__main__":
    main()
