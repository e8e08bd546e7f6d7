"""One ledger for Python and the CLI: a Python run is skipped by `idem run` of the same
job and scope, a CLI run skips the Python one, and `idem runs`, `idem explain` and
`idem report` show Python runs.

The CLI cannot call a Python body, so the job file the CLI runs is a command job of the
same name and guards: the job name is the ledger's identity (processor_name, keys)."""

import json
import sqlite3
import subprocess

import pyidem

JOB = """
name = "{name}"
processor = "command"
[guards]
time_window = "1h"
[command]
run = ["sh", "-c", "echo {{date}} >> {marker}"]
"""


def _cli(idem_bin, url, jobs, *args):
    return subprocess.run(
        [idem_bin, "--store", url, "--jobs-dir", str(jobs), "--format", "json", *args],
        capture_output=True,
        text=True,
    )


def _one_ledger(tmp_path, url, name, idem_bin):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    marker = tmp_path / "cli-ran"
    (jobs / f"{name}.toml").write_text(JOB.format(name=name, marker=marker))
    store = pyidem.open_store(url)
    python_ran = []

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        python_ran.append(run.scope)
        return pyidem.Outcome(records=7)

    # Python first: the CLI skips.
    first = body.run(date="2025-11-18", trigger="scheduler")
    assert first.status == "completed"
    cli = _cli(idem_bin, url, jobs, "run", name, "--date", "2025-11-18")
    assert cli.returncode == 0, cli.stderr
    report = json.loads(cli.stdout)
    assert report["status"] == "skipped" and report["skip_reason"] == "time_window", report
    assert report["previous_run"]["run_id"] == first.run_id
    assert not marker.exists()

    # The CLI first: Python skips.
    cli = _cli(idem_bin, url, jobs, "run", name, "--date", "2025-11-19")
    assert cli.returncode == 0, cli.stderr
    cli_report = json.loads(cli.stdout)
    assert cli_report["status"] == "completed"
    assert marker.read_text().split() == ["2025-11-19"]
    second = body.run(date="2025-11-19")
    assert second.status == "skipped" and second.skip_reason == "time_window"
    assert second.previous_run["run_id"] == cli_report["run_id"]
    assert python_ran == ["2025-11-18"]

    # `idem runs` and `idem explain` see the Python runs.
    runs = _cli(idem_bin, url, jobs, "runs", "--job", name, "--limit", "0")
    assert runs.returncode == 0, runs.stderr
    rows = json.loads(runs.stdout)
    rows = rows.get("runs", rows) if isinstance(rows, dict) else rows
    ids = {r["run_id"] for r in rows}
    assert {first.run_id, second.run_id, cli_report["run_id"]} <= ids
    explain = _cli(idem_bin, url, jobs, "explain", name, "--date", "2025-11-18")
    assert explain.returncode == 0, explain.stderr
    assert first.run_id in explain.stdout

    # `idem report` counts them with the CLI's: 2 completed (one each), 2 skipped.
    rep = _cli(idem_bin, url, jobs, "report", "--job", name)
    assert rep.returncode == 0, rep.stderr
    (proc,) = json.loads(rep.stdout)["processors"]
    assert proc["job"] == name
    assert proc["runs"]["total_invocations"] == 4, proc
    assert proc["runs"]["completed_runs"] == 2, proc
    assert proc["runs"]["skipped_runs"] == 2, proc


def test_one_ledger_with_the_cli_on_sqlite(tmp_path, name, sqlite_url, idem_bin):
    _one_ledger(tmp_path, sqlite_url, name, idem_bin)


def test_one_ledger_with_the_cli_on_postgres(tmp_path, name, postgres_url, idem_bin):
    _one_ledger(tmp_path, postgres_url, name, idem_bin)


OUTPUT_JOB = """
name = "NAME"
processor = "command"
[guards]
time_window = "1h"
[command]
run = ["sh", "-c", \'\'\'printf '{"records": 2, "output": {"file": "p.csv"}}' > "$IDEM_RESULT"\'\'\']
"""


def test_scope_keys_and_outputs_are_the_clis(tmp_path, name, sqlite_url, idem_bin):
    """The scope key Python computes is the one `idem run` wrote; a Python run skipped by
    the CLI's run returns the output the CLI's run recorded."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / f"{name}.toml").write_text(OUTPUT_JOB.replace("NAME", name))
    cli = _cli(idem_bin, sqlite_url, jobs, "run", name, "--date", "2025-11-18")
    assert cli.returncode == 0, cli.stderr
    report = json.loads(cli.stdout)
    assert report["status"] == "completed" and report["output"] == {"file": "p.csv"}, report
    # The scope key the CLI wrote, read from the ledger's own table.
    with sqlite3.connect(sqlite_url[len("sqlite://"):]) as db:
        (written,) = db.execute(
            "SELECT processing_key FROM processing_keys WHERE kind = 'scope' AND processor_name = ?",
            (name,),
        ).fetchone()
    assert pyidem.scope_key(name, "2025-11-18") == written
    assert pyidem.scope_key(name, "2025-11-19") != written
    store = pyidem.open_store(sqlite_url)

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        raise AssertionError("skipped by the CLI's run")

    skipped = body.run(date="2025-11-18")
    assert skipped.skip_reason == "time_window", skipped
    assert skipped.previous_run["run_id"] == report["run_id"]
    assert skipped.output == {"file": "p.csv"}
