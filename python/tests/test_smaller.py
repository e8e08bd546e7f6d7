"""The smaller things: dates from aware datetimes, `timedelta` durations everywhere, a
store's `close()` and `with`, the breaker's thresholds, errors in Python's words, help
without `Ellipsis`, record counts checked, the lease default as documented."""

import datetime
import pathlib
import re

import pytest

import pyidem

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
UNREACHABLE = "postgres://postgres@127.0.0.1:9/idem_nowhere?connect_timeout=1"


def test_an_aware_datetime_keeps_its_zone(store, name):
    @pyidem.processor(name, store=store)
    def body(run):
        return pyidem.Outcome(output={"at": run.params["at"]})

    la = datetime.timezone(datetime.timedelta(hours=-8))
    late = datetime.datetime(2025, 11, 18, 23, 30, tzinfo=la)  # 2025-11-19 07:30 UTC
    report = body.run(date=late, params={"at": late})
    assert report.scope == "2025-11-18"  # the date where it happened, not UTC's
    assert datetime.datetime.fromisoformat(report.output["at"]) == late
    assert report.output["at"].endswith("-08:00")


def test_durations_are_strings_seconds_or_timedeltas(store, name):
    gate = pyidem.Gate(store, "d", "id", ttl=datetime.timedelta(days=7), pending_timeout=30)
    assert [v.verdict for v in gate.check_and_mark([{"id": 1}])] == ["new"]
    pyidem.Gate(store, "d", "id", ttl=3600.5, ttl_by_type={"refund": datetime.timedelta(hours=1), "load": "never"})
    with pytest.raises(ValueError, match="ttl=-5"):
        pyidem.Gate(store, "d", "id", ttl=-5)
    with pytest.raises(ValueError, match=r'pending_timeout="soon"'):
        pyidem.Gate(store, "d", "id", pending_timeout="soon")
    with pytest.raises(TypeError, match="ttl: give a duration"):
        pyidem.Gate(store, "d", "id", ttl=[1])

    @pyidem.processor(name, store=store, time_window=datetime.timedelta(hours=2), lease=600, wait=datetime.timedelta(seconds=5))
    def body(run):
        return 0

    body.run(date="2025-11-18")
    assert "2h time window" in body.run(date="2025-11-18").why


def test_a_store_closes_and_is_a_context_manager(sqlite_url, name):
    with pyidem.open_store(sqlite_url) as store:
        body = pyidem.processor(name, store=store)(lambda run: 1)
        assert body.run(date="2025-11-18").status == "completed"
        gate = pyidem.Gate(store, "c", "id")
        assert not store.closed
    assert store.closed and "closed" in repr(store)
    with pytest.raises(pyidem.IdemError, match="is closed"):
        body.run(date="2025-11-19")
    with pytest.raises(pyidem.IdemError, match="is closed"):
        gate.check_and_mark([{"id": 1}])
    with pytest.raises(pyidem.IdemError, match="is closed"):
        store.runs(name)
    store.close()  # twice is fine
    # The file is whole: another store reads the run.
    assert [r.status for r in pyidem.open_store(sqlite_url).runs(name)] == ["completed"]


def test_the_breakers_thresholds_are_configurable(name):
    def second_run_errors(**breaker):
        store = pyidem.open_store(UNREACHABLE, store_failure="best_effort", **breaker)
        body = pyidem.processor(name, store=store, store_failure="best_effort")(lambda run: 1)
        body.run(date="2025-11-18")
        return body.run(date="2025-11-18").store_errors[0]

    # Two failures in the first run: the default breaker (2 failures) is open for the
    # second, for 30 s; one of 5 failures is not, and tries the store again.
    assert re.search(r"circuit breaker open .*retry after 2\d{4} ms", second_run_errors())
    assert re.search(r"retry after 35\d{5} ms", second_run_errors(breaker_reset=datetime.timedelta(hours=1)))
    assert "circuit breaker" not in second_run_errors(breaker_failures=5)
    with pytest.raises(ValueError, match="breaker_failures=0"):
        pyidem.open_store(UNREACHABLE, store_failure="best_effort", breaker_failures=0)


def test_errors_are_worded_for_python(store, name):
    body = pyidem.processor(name, store=store)(lambda run: 1)
    with pytest.raises(ValueError) as e:
        body.run(date="2025-13-45")
    assert str(e.value).startswith('date="2025-13-45": not a calendar date'), e.value
    assert "--date" not in str(e.value) and "datetime.date" in str(e.value)
    with pytest.raises(ValueError) as e:
        pyidem.processor(name, store=store, time_window="soon")(lambda run: 1)
    assert str(e.value).startswith(f'pyidem.processor("{name}"): time_window: bad duration "soon"'), e.value
    assert "job file" not in str(e.value) and "guards." not in str(e.value)
    with pytest.raises(ValueError, match=r'trigger="cron": expected "scheduler"'):
        body.run(date="2025-11-18", trigger="cron")
    with pytest.raises(ValueError, match=r'strategy="sometimes"'):
        pyidem.Gate(store, "e", "id", strategy="sometimes")
    with pytest.raises(ValueError, match=r'store_failure="sometimes"'):
        pyidem.open_store("memory://", store_failure="sometimes")


def test_run_is_made_by_pyidem_only():
    with pytest.raises(TypeError):
        pyidem.Run()


def test_record_counts_are_checked(store, name):
    with pytest.raises(ValueError, match=r"records=1180591620717411303424: a count of records is from 0 to 2\*\*63-1"):
        pyidem.Outcome(records=2**70)
    with pytest.raises(ValueError, match="records=-1"):
        pyidem.Outcome(records=-1)
    with pytest.raises(TypeError, match="not bool"):
        pyidem.Outcome(records=True)
    assert pyidem.Outcome(records=2**63 - 1).records == 2**63 - 1

    @pyidem.processor(name, store=store)
    def body(run):
        return -3

    with pytest.raises(ValueError, match="return value=-3"):
        body.run(date="2025-11-18")


def test_the_lease_default_is_the_documented_one(store, name):
    report = pyidem.processor(name, store=store)(lambda run: 1).run(date="2025-11-18")
    lease = next(g for g in report.guards if g["guard"] == "lease")
    until = re.search(r"until (\S+ \S+) UTC", lease["detail"]).group(1)
    held = datetime.datetime.fromisoformat(until) - datetime.datetime.fromisoformat(report.started_at[:19])
    assert datetime.timedelta(minutes=59) < held <= datetime.timedelta(hours=1, seconds=1), held
    assert "a 1-hour lease" in DOCS.read_text()
    assert "1-hour lease" in pyidem.processor.__doc__
