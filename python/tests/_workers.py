"""Code the tests run in other processes (multiprocessing's spawn imports it by name)."""

import os
import time

import pyidem


def run_once(url, name, marker, barrier, results):
    """One of N processes running the same processor on the same scope at once."""
    store = pyidem.open_store(url)

    @pyidem.processor(name, store=store, time_window="1h", lease="10m")
    def body(run):
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return pyidem.Outcome(records=1)

    barrier.wait()
    report = body.run(date="2025-11-18", trigger="scheduler")
    results.put((report.status, report.skip_reason))


def run_day(url, name, date):
    """A pool worker: runs the day, returns the report (a picklable value)."""
    store = pyidem.open_store(url)

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(records=1, output={"day": str(run.date)})

    return body.run(date=date)


def idempotent_once(url, namespace, marker, barrier, results):
    """One of N processes calling the same idempotent function with the same key at once."""
    store = pyidem.open_store(url)

    @pyidem.idempotent(store, key="order_id", namespace=namespace)
    def charge(order_id):
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return f"result of {os.getpid()}"

    barrier.wait()
    results.put(charge("o-1"))
