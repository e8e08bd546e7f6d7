"""A skip returns what the run that made it skip returned (`report.output`, as
Powertools returns the cached response), and the ledger reads from Python
(`store.runs(job=…, scope=…)`)."""

import pyidem


def test_a_time_window_skip_returns_the_earlier_output(store, name):
    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(records=2, output={"file": f"orders-{run.date}.csv"})

    first = body.run(date="2025-11-18")
    again = body.run(date="2025-11-18")
    assert again.status == "skipped" and again.skip_reason == "time_window"
    assert again.output == {"file": "orders-2025-11-18.csv"} == first.output
    assert again.previous_run["run_id"] == first.run_id
    # Skips pointing at different earlier runs, in turn: each returns its own run's output.
    body.run(date="2025-11-19")
    for day in ("2025-11-18", "2025-11-19", "2025-11-18", "2025-11-19"):
        assert body.run(date=day).output == {"file": f"orders-{day}.csv"}


def test_a_content_skip_returns_the_output_of_the_run_with_that_content(store, name):
    content = {"rows": 3}

    @pyidem.processor(name, store=store, content_hash="24h")
    def body(run):
        return pyidem.Outcome(output={"rows": content["rows"]})

    @body.describe
    def describe(run):
        return pyidem.Content(checksum=str(content["rows"]))

    body.run(date="2025-11-18")
    content["rows"] = 4
    body.run(date="2025-11-18")
    content["rows"] = 3
    skipped = body.run(date="2025-11-18")
    assert skipped.skip_reason == "duplicate_content_hash"
    assert skipped.output == {"rows": 3}


def test_store_runs_reads_the_ledger(store, name):
    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(records=1, output={"day": str(run.date)})

    a = body.run(date="2025-11-18")
    b = body.run(date="2025-11-18")
    c = body.run(date="2025-11-19")
    rows = store.runs(job=name)
    assert [r.run_id for r in rows] == [c.run_id, b.run_id, a.run_id]  # newest first
    day = store.runs(name, scope="2025-11-18")
    assert [(r.status, r.output) for r in day] == [("skipped", None), ("completed", {"day": "2025-11-18"})]
    assert day[0].previous_run_id == a.run_id and day[0].job == name
    assert [r.run_id for r in store.runs(name, status="completed", limit=1)] == [c.run_id]
    assert store.runs(name, run_id=b.run_id)[0].skip_reason == "time_window"
    assert store.runs("no_such_job") == []
