"""Code the tests run in other processes (multiprocessing's spawn imports it by name)."""

import os
import time

import idem


def run_once(url, name, marker, barrier, results):
    """One of N processes running the same processor on the same scope at once."""
    store = idem.open_store(url)

    @idem.processor(name, store=store, time_window="1h", lease="10m")
    def body(run):
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return idem.Outcome(records=1)

    barrier.wait()
    report = body.run(date="2025-11-18", trigger="scheduler")
    results.put((report.status, report.skip_reason))
