"""Reports are plain values: picklable, copyable, comparable, read-only; a spawn
`Pool.map` whose workers return reports ends."""

import copy
import multiprocessing
import pickle

import pytest

import _workers
import pyidem


def test_reports_pickle_copy_and_compare(store, name):
    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(records=2, output={"rows": [1, 2]})

    report = body.run(date="2025-11-18")
    skipped = body.run(date="2025-11-18")
    for value in (report, skipped, body.explain("2025-11-18"), store.runs(name)[0]):
        again = pickle.loads(pickle.dumps(value))
        assert again == value and type(again) is type(value)
        assert copy.copy(value) == value
        assert copy.deepcopy(value) == value
        assert repr(again) == repr(value)
    assert skipped != report
    assert pickle.loads(pickle.dumps(skipped)).why == skipped.why
    with pytest.raises(AttributeError, match="read-only"):
        report.status = "failed"


def test_a_spawn_pool_returns_reports(tmp_path, name):
    url = f"sqlite://{tmp_path}/idem.db"
    first = _workers.run_day(url, name, "2025-11-18")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        args = [(url, name, d) for d in ("2025-11-18", "2025-11-19")]
        # Bounded: on the package before reports were values, this never returned.
        reports = pool.starmap_async(_workers.run_day, args).get(timeout=120)
    assert [type(r) for r in reports] == [pyidem.Report] * 2
    assert [r.status for r in reports] == ["skipped", "completed"]
    assert reports[0].previous_run["run_id"] == first.run_id
    assert [r.output["day"] for r in reports] == ["2025-11-18", "2025-11-19"]


def test_a_failed_report_and_its_error_pickle(store, name):
    @pyidem.processor(name, store=store)
    def body(run):
        raise RuntimeError("disk full")

    report = body.run(date="2025-11-18", raise_on_failure=False)
    with pytest.raises(pyidem.RunFailed) as failed:
        report.raise_for_status()
    again = pickle.loads(pickle.dumps(failed.value))
    assert again.report == report and "disk full" in str(again)
