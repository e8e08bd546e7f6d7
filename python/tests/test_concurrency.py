"""8 Python processes on one scope: the body runs exactly once (the lease, then the
time window), on SQLite and on Postgres."""

import multiprocessing
import pathlib

import pytest

import _workers

PROCESSES = 8


def _race(url, name, tmp_path: pathlib.Path):
    ctx = multiprocessing.get_context("spawn")
    marker = tmp_path / "ran"
    marker.touch()
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_workers.run_once, args=(url, name, str(marker), barrier, results))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ran = marker.read_text().split()
    assert len(ran) == 1, f"the body ran {len(ran)} times: {outcomes}"
    statuses = sorted(o[0] for o in outcomes)
    assert statuses == ["completed"] + ["skipped"] * (PROCESSES - 1), outcomes
    assert {o[1] for o in outcomes if o[0] == "skipped"} <= {"in_progress", "time_window"}


def test_eight_processes_on_sqlite_run_the_body_once(tmp_path, name):
    _race(f"sqlite://{tmp_path}/idem.db", name, tmp_path)


def test_eight_processes_on_postgres_run_the_body_once(tmp_path, name, postgres_url):
    _race(postgres_url, name, tmp_path)
