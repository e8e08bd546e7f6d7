"""idem's log events go to `logging.getLogger("pyidem")`, each with the run's fields
(`job`, `scope`, `run_id`, `trigger`) as record attributes (`extra`), at the level the
library gives them, filtered by the logger's level."""

import logging

import pytest

import pyidem


@pytest.fixture
def records():
    """The `pyidem` logger's records, whatever the root logger's configuration."""
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logger = logging.getLogger("pyidem")
    handler = Keep(level=logging.DEBUG)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield seen
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_run_events_carry_the_runs_fields(store, name, records):
    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(records=4)

    first = body.run(date="2025-11-18", trigger="scheduler")
    body.run(date="2025-11-18")
    mine = [r for r in records if getattr(r, "job", None) == name]
    messages = [r.getMessage() for r in mine]
    assert "run requested" in messages and "processed" in messages, messages
    requested = next(r for r in mine if r.getMessage() == "run requested")
    assert requested.name == "pyidem" and requested.levelno == logging.INFO
    assert (requested.scope, requested.run_id, requested.trigger) == ("2025-11-18", first.run_id, "scheduler")
    processed = next(r for r in mine if r.getMessage() == "processed")
    assert processed.records == 4 and processed.run_id == first.run_id
    skip = next(r for r in mine if r.getMessage().startswith("skip:"))
    assert skip.reason == "time_window" and skip.run_id != first.run_id


def test_a_failure_is_a_warning_and_the_level_filters(store, name, records):
    @pyidem.processor(name, store=store)
    def body(run):
        raise RuntimeError("no rows")

    logging.getLogger("pyidem").setLevel(logging.WARNING)
    report = body.run(date="2025-11-18", raise_on_failure=False)
    mine = [r for r in records if getattr(r, "job", None) == name]
    assert [r.levelname for r in mine] == ["WARNING"], [r.getMessage() for r in mine]
    assert "RuntimeError: no rows" in mine[0].getMessage()
    assert mine[0].run_id == report.run_id and mine[0].scope == "2025-11-18"
