"""Processors and guards from Python: the Rust runner's skips, failures, shadow mode."""

import datetime
import hashlib
import json

import pytest

import pyidem


def test_completes_then_skips_within_the_time_window(store, name):
    calls = []

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        calls.append((run.scope, run.date, run.trigger, run.params))
        return pyidem.Outcome(records=3, output={"players": 3})

    first = body.run(date="2025-11-18", trigger="scheduler", params={"team": "LAL"})
    assert first.status == "completed", first
    assert first.records_processed == 3
    assert first.output == {"players": 3}
    assert calls == [("2025-11-18", datetime.date(2025, 11, 18), "scheduler", {"team": "LAL"})]

    again = body.run(date=datetime.date(2025, 11, 18))
    assert again.status == "skipped"
    assert again.skip_reason == "time_window"
    assert first.run_id in json.dumps(again.previous_run)
    assert "within the 1h time window" in again.why
    assert len(calls) == 1

    other_day = body.run(date="2025-11-19")
    assert other_day.status == "completed"
    assert len(calls) == 2


def test_content_change_runs_and_same_content_skips(store, name):
    entities = ["p1", "p2"]
    calls = []

    @pyidem.processor(name, store=store, content_hash="24h")
    def body(run):
        calls.append(list(entities))
        return len(entities)

    @body.describe
    def content(run):
        return pyidem.Content(entities=list(entities), source="boxscores")

    assert body.run(date="2025-11-18").status == "completed"
    same = body.run(date="2025-11-18")
    assert same.status == "skipped" and same.skip_reason == "duplicate_content_hash", same
    entities.append("p3")
    changed = body.run(date="2025-11-18")
    assert changed.status == "completed", changed
    assert calls == [["p1", "p2"], ["p1", "p2", "p3"]]
    # The key is the Rust library's: the SHA-256 of the canonical JSON (keys sorted, no
    # spaces, entities sorted) of content, processor and scope, computed here
    # independently; src/key.rs's key_is_digest_of_canonical_json pins the same bytes.
    canonical = json.dumps(
        {"content": {"entities": ["p1", "p2", "p3"], "source": "boxscores"}, "processor": name, "scope": "2025-11-18"},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert changed.processing_key == hashlib.sha256(canonical.encode()).hexdigest()
    assert pyidem.Content(entities=["p3", "p1", "p2"], source="boxscores").key(name, "2025-11-18") == changed.processing_key
    assert same.processing_key != changed.processing_key


def test_shadow_mode_runs_and_says_what_would_have_skipped(store, name):
    calls = []

    @pyidem.processor(name, store=store, time_window="1h", mode="shadow")
    def body(run):
        calls.append(1)

    assert body.run(date="2025-11-18").status == "completed"
    second = body.run(date="2025-11-18")
    assert second.status == "completed"
    assert second.would_skip_reason == "time_window"
    assert len(calls) == 2


def test_explain_changes_nothing(store, name):
    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return 1

    before = pyidem.explain(body, "2025-11-18")
    assert before.decision == "run"
    assert body.run(date="2025-11-18").status == "completed"
    after = body.explain("2025-11-18")
    assert after.decision == "skip" and after.skip_reason == "time_window"
    assert "time window" in after.why
    assert [g["guard"] for g in after.guards][:1] == ["time_window"]


def test_lease_held_skips_in_progress(store, name):
    inner = []

    @pyidem.processor(name, store=store, lease="10m")
    def body(run):
        inner.append(body2.run(date="2025-11-18"))

    @pyidem.processor(name, store=store, lease="10m")
    def body2(run):
        raise AssertionError("never runs while the lease is held")

    assert body.run(date="2025-11-18").status == "completed"
    assert inner[0].status == "skipped" and inner[0].skip_reason == "in_progress"


UNREACHABLE = "postgres://postgres@127.0.0.1:9/idem_nowhere?connect_timeout=1"


def test_strict_store_failure_raises(name):
    with pytest.raises(pyidem.StoreError):
        pyidem.open_store(UNREACHABLE)


def test_best_effort_store_failure_runs_unguarded_and_says_so(name):
    store = pyidem.open_store(UNREACHABLE, store_failure="best_effort")
    calls = []

    @pyidem.processor(name, store=store, time_window="1h", store_failure="best_effort")
    def body(run):
        calls.append(1)

    report = body.run(date="2025-11-18")
    assert report.status == "completed"
    assert report.store_errors and not report.recorded
    assert body.run(date="2025-11-18").status == "completed"
    assert len(calls) == 2


def test_strict_processor_on_an_unreachable_store_raises(name):
    store = pyidem.open_store(UNREACHABLE, store_failure="best_effort")

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        raise AssertionError("strict: never runs unguarded")

    with pytest.raises(pyidem.StoreError):
        body.run(date="2025-11-18")


def test_bad_options_are_refused(store, name):
    with pytest.raises(ValueError, match="store_failure|strict"):
        pyidem.processor(name, store=store, store_failure="sometimes")(lambda run: None)
    with pytest.raises(ValueError):
        pyidem.processor(name, store=store, time_window="soon")(lambda run: None)
    with pytest.raises(TypeError, match="async def"):

        @pyidem.processor(name, store=store)
        async def body(run):
            pass


def test_durations_as_seconds_and_timedelta(store, name):
    @pyidem.processor(name, store=store, time_window=datetime.timedelta(hours=2), lease=600)
    def body(run):
        return 0

    body.run(date="2025-11-18")
    assert "2h time window" in body.run(date="2025-11-18").why


def test_memory_store_and_scope(name):
    store = pyidem.open_store("memory://")

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        assert run.date == datetime.date(2025, 11, 18)

    assert body.run(date="2025-11-18", scope="2025-11-18/team=LAL").status == "completed"
    assert body.run(date="2025-11-18", scope="2025-11-18/team=LAL").status == "skipped"
    assert body.run(date="2025-11-18").status == "completed"
