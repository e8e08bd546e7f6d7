"""SIGTERM (and Ctrl-C) during the body: the run is recorded as interrupted and its
lease released, so the next run goes ahead at once instead of waiting for the lease."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import pyidem

SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, time
    import pyidem
    url, name, started = sys.argv[1:4]
    store = pyidem.open_store(url)

    @pyidem.processor(name, store=store, time_window="1h", lease="10m")
    def body(run):
        pathlib.Path(started).write_text(run.run_id)
        time.sleep(60)

    body.run(date="2025-11-18")
    print("not interrupted")
    """
)


def _interrupt(tmp_path, url, name, sig):
    started = tmp_path / "started"
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), url, name, str(started)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not started.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the body never started"
        time.sleep(0.05)
    run_id = started.read_text()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err, run_id


def _ledger_row(idem_bin, url, name, run_id):
    out = subprocess.run(
        [idem_bin, "--store", url, "--format", "json", "runs", "--job", name, "--limit", "0"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = json.loads(out)
    rows = rows.get("runs", rows) if isinstance(rows, dict) else rows
    return next(r for r in rows if r["run_id"] == run_id)


@pytest.mark.parametrize("sig,expected", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_signal_during_the_body_records_interrupted_and_releases_the_lease(
    tmp_path, name, sqlite_url, idem_bin, sig, expected
):
    code, out, err, run_id = _interrupt(tmp_path, sqlite_url, name, sig)
    assert "not interrupted" not in out
    if sig == signal.SIGTERM:
        assert code == 143, err
    else:
        assert code != 0, err
    row = _ledger_row(idem_bin, sqlite_url, name, run_id)
    assert row["status"] == "failed", row
    assert f"interrupted by {expected}" in row["error"], row
    # The lease was released: the next run goes ahead now (a held 10-minute lease would
    # make it skip with in_progress), and the failed run left no key behind.
    store = pyidem.open_store(sqlite_url)

    @pyidem.processor(name, store=store, time_window="1h", lease="10m")
    def body(run):
        return 1

    assert body.run(date="2025-11-18").status == "completed"


def test_sigterm_on_postgres(tmp_path, name, postgres_url, idem_bin):
    code, _, err, run_id = _interrupt(tmp_path, postgres_url, name, signal.SIGTERM)
    assert code == 143, err
    row = _ledger_row(idem_bin, postgres_url, name, run_id)
    assert "interrupted by SIGTERM" in row["error"]
    store = pyidem.open_store(postgres_url)

    @pyidem.processor(name, store=store, lease="10m")
    def body(run):
        return 1

    assert body.run(date="2025-11-18").status == "completed"
