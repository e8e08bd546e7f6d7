"""The body's exception reaches the caller, as in Powertools and Prefect: the run is
recorded failed and its lease released first, then the same exception object is raised,
with its traceback. `BaseException`s always go on; `raise_on_failure=False` and
`report.raise_for_status()` are the report-returning form."""

import traceback

import pytest

import pyidem


def test_the_body_exception_propagates_after_the_run_is_recorded(store, name):
    attempts = []

    class WarehouseTimeout(ValueError):
        pass

    @pyidem.processor(name, store=store, time_window="1h", lease="10m")
    def body(run):
        attempts.append(run.run_id)
        if len(attempts) == 1:
            raise WarehouseTimeout("warehouse timed out")
        return pyidem.Outcome(records=1)

    with pytest.raises(ValueError) as caught:
        body.run(date="2025-11-18")
    assert type(caught.value) is WarehouseTimeout
    # Its traceback goes through the body.
    frames = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
    assert "body" in frames, frames
    # Recorded failed, with the traceback's last lines, before it was raised.
    (row,) = store.runs(name)
    assert row.status == "failed" and row.run_id == attempts[0]
    assert "WarehouseTimeout: warehouse timed out" in row.error
    # The lease was released (a held 10-minute lease would skip with in_progress), no key
    # was written (the retry runs).
    retry = body.run(date="2025-11-18", trigger="retry")
    assert retry.status == "completed", retry
    assert len(attempts) == 2


def test_system_exit_in_the_body_propagates_even_without_raise_on_failure(store, name):
    @pyidem.processor(name, store=store, lease="10m")
    def body(run):
        raise SystemExit(3)

    with pytest.raises(SystemExit) as caught:
        body.run(date="2025-11-18", raise_on_failure=False)
    assert caught.value.code == 3
    (row,) = store.runs(name)
    assert row.status == "failed" and "SystemExit: 3" in row.error

    @pyidem.processor(name, store=store, lease="10m")
    def again(run):
        raise GeneratorExit

    with pytest.raises(GeneratorExit):
        again.run(date="2025-11-18", raise_on_failure=False)
    # The lease of the first was released: the second ran (and failed) at once.
    assert [r.status for r in store.runs(name)] == ["failed", "failed"]


def test_raise_on_failure_false_returns_the_failed_report(store, name):
    @pyidem.processor(name, store=store)
    def body(run):
        raise KeyError("player_id")

    report = body.run(date="2025-11-18", raise_on_failure=False)
    assert report.status == "failed"
    assert "KeyError: 'player_id'" in report.error
    with pytest.raises(pyidem.RunFailed) as failed:
        report.raise_for_status()
    assert failed.value.report is report
    ok = pyidem.processor(name + "_ok", store=store)(lambda run: 1).run(date="2025-11-18")
    assert ok.raise_for_status() is None


def test_describe_and_return_errors_propagate(store, name):
    @pyidem.processor(name, store=store, content_hash="24h")
    def body(run):
        raise AssertionError("not reached")

    @body.describe
    def content(run):
        raise LookupError("no source table")

    with pytest.raises(LookupError, match="no source table"):
        body.run(date="2025-11-18")

    @pyidem.processor(name + "_bad", store=store)
    def bad(run):
        return "done"

    with pytest.raises(TypeError, match="must return pyidem.Outcome"):
        bad.run(date="2025-11-18")
    assert store.runs(name + "_bad")[0].status == "failed"
