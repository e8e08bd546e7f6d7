"""Output is JSON or a warning you can see. The rule: a body whose output JSON cannot
hold (an object, NaN, a set, a non-str key) has still done its work, so the run completes
and is recorded (the next run skips, nothing is redone) with no output, and an
`OutputWarning` names the value. Nothing is stored as its `str()`. Dates and times are
kept as ISO 8601 text, an aware datetime with its offset."""

import datetime
import math
import warnings

import pytest

import pyidem


class Thing:
    pass


@pytest.mark.parametrize(
    "output,where",
    [
        ({"players": 3, "thing": Thing()}, 'output["thing"]'),
        ({"ratio": math.nan}, 'output["ratio"]: nan'),
        ({"stats": [1.0, math.inf]}, 'output["stats"][1]: inf'),
        ({"ids": {1, 2}}, 'output["ids"]: a set'),
        ({1: "one"}, "output: key 1 (int)"),
        ({"big": 2**70}, 'output["big"]: 1180591620717411303424 does not fit'),
    ],
)
def test_bad_output_completes_the_run_without_it_and_warns(store, name, output, where):
    calls = []

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        calls.append(1)
        return pyidem.Outcome(records=5, output=output)

    with pytest.warns(pyidem.OutputWarning, match=r"^" + __import__("re").escape(f"{name}: {where}")):
        report = body.run(date="2025-11-18")
    assert report.status == "completed" and report.records_processed == 5
    assert report.output is None
    assert where.split(":")[0] in report.output_warning
    (row,) = store.runs(name)
    assert row.status == "completed" and row.output is None
    # Done work is not redone: the next run skips.
    assert body.run(date="2025-11-18").status == "skipped"
    assert calls == [1]


def test_dates_and_times_are_iso_text_and_keep_their_zone(store, name):
    tokyo = datetime.timezone(datetime.timedelta(hours=9))
    at = datetime.datetime(2025, 11, 18, 23, 30, tzinfo=tokyo)

    @pyidem.processor(name, store=store)
    def body(run):
        return pyidem.Outcome(output={"at": at, "day": run.date, "span": (1, 2)})

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = body.run(date="2025-11-18")
    assert report.output == {"at": "2025-11-18T23:30:00+09:00", "day": "2025-11-18", "span": [1, 2]}
    assert datetime.datetime.fromisoformat(report.output["at"]) == at
    assert store.runs(name)[0].output == report.output


def test_a_warning_turned_error_comes_after_the_run_is_recorded(store, name):
    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(output=Thing())

    with warnings.catch_warnings():
        warnings.simplefilter("error", pyidem.OutputWarning)
        with pytest.raises(pyidem.OutputWarning):
            body.run(date="2025-11-18")
    assert store.runs(name)[0].status == "completed"


def test_params_that_are_not_json_are_refused_before_the_run(store, name):
    calls = []
    body = pyidem.processor(name, store=store)(lambda run: calls.append(1))
    with pytest.raises(TypeError, match=r'params\["conn"\]: a Thing is not JSON'):
        body.run(date="2025-11-18", params={"conn": Thing()})
    with pytest.raises(ValueError, match=r'params\["x"\]: nan'):
        body.run(date="2025-11-18", params={"x": math.nan})
    assert calls == [] and store.runs(name) == []
