"""A store opened before `os.fork()` (a module-level store under gunicorn or Celery
prefork) works in the child: it opens itself again there, for processors and gates, on
SQLite and Postgres; the parent's store goes on working. Children that hang fail the test
(each is waited for with a deadline, then killed)."""

import json
import multiprocessing
import os
import pathlib
import shutil
import signal
import subprocess
import threading
import time
import uuid
import warnings

import pytest

import pyidem

# Python 3.12+ warns about fork() in a process with threads (the package's runtime has
# some): that is the situation under test.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _stacks(pid):
    """Where each thread of a hung child waits: every thread's backtrace when gdb is
    installed, else each thread's name and kernel wait channel (so a hang in CI says
    which lock it is, not only that there was one)."""
    if shutil.which("gdb"):
        try:
            out = subprocess.run(
                ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 40"],
                capture_output=True, text=True, timeout=120,
            ).stdout
            return "\n".join(l for l in out.splitlines() if l.startswith(("Thread ", "#")))
        except (OSError, subprocess.SubprocessError) as e:
            return f"gdb failed: {e}"
    lines = []
    for task in sorted(pathlib.Path(f"/proc/{pid}/task").glob("*")):
        try:
            lines.append(f"{task.name} {(task / 'comm').read_text().strip()} {(task / 'wchan').read_text()}")
        except OSError:
            pass
    return "\n".join(lines)


def _wait(pid, seconds=60):
    """The child's exit status; kills it and fails if it has not ended in time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    stacks = _stacks(pid)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung; its threads:\n{stacks}")


def _fork(child):
    """Runs `child()` in a forked child; its return value (JSON) comes back."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = json.dumps({"ok": child()})
        except BaseException as e:  # reported to the parent, whatever it is
            out = json.dumps({"error": f"{type(e).__name__}: {e}"})
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    code = _wait(pid)
    with os.fdopen(read) as f:
        result = json.loads(f.read() or "{}")
    assert code == 0 and "ok" in result, result
    return result["ok"]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, sqlite_url):
    return sqlite_url if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def test_a_store_opened_before_fork_runs_processors_in_the_child(url, name):
    store = pyidem.open_store(url)

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(records=1, output={"pid": os.getpid()})

    # The parent used the store (its connections are open) before forking.
    assert body.run(date="2025-11-18").status == "completed"

    def child():
        skipped = body.run(date="2025-11-18")
        done = body.run(date="2025-11-19")
        return [skipped.status, done.status, done.output["pid"] == os.getpid()]

    assert _fork(child) == ["skipped", "completed", True]
    # The parent's store still works, and sees the child's run.
    assert body.run(date="2025-11-19").status == "skipped"
    assert [r.status for r in store.runs(name, scope="2025-11-19")] == ["skipped", "completed"]


def test_a_gate_made_before_fork_works_in_the_child(url):
    store = pyidem.open_store(url)
    gate = pyidem.Gate(store, f"fork-{uuid.uuid4().hex}", "id", pending_timeout="5m")
    before = gate.check_and_mark([{"id": "parent"}])
    gate.confirm(before)

    def child():
        verdicts = gate.check_and_mark([{"id": "parent"}, {"id": "child"}])
        # The parent's verdicts belong to the parent's gate.
        try:
            gate.confirm(before)
            refused = False
        except ValueError:
            refused = True
        return [[v.verdict for v in verdicts], gate.confirm(verdicts), refused]

    assert _fork(child) == [["replay", "new"], 1, True]
    assert [v.verdict for v in gate.check_and_mark([{"id": "child"}])] == ["replay"]


def test_a_fork_pool_with_a_module_level_store(tmp_path, name):
    url = f"sqlite://{tmp_path}/idem.db"
    store = pyidem.open_store(url)

    @pyidem.processor(name, store=store, time_window="1h")
    def body(run):
        return pyidem.Outcome(records=1)

    body.run(date="2025-11-01")
    global _POOL_BODY
    _POOL_BODY = body
    ctx = multiprocessing.get_context("fork")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with ctx.Pool(2) as pool:
            statuses = pool.map_async(_run_in_pool, ["2025-11-01", "2025-11-02", "2025-11-03"]).get(timeout=120)
    assert statuses == ["skipped", "completed", "completed"]


_POOL_BODY = None


def _run_in_pool(date):
    return _POOL_BODY.run(date=date).status


def test_a_closed_store_says_so_in_the_child_too(sqlite_url):
    store = pyidem.open_store(sqlite_url)
    store.close()

    def child():
        try:
            pyidem.Gate(store, "ns", "id")
        except pyidem.IdemError as e:
            return str(e)
        return "opened"

    assert "is closed" in _fork(child)


def test_forking_while_another_thread_uses_sqlite(tmp_path):
    """Threads busy with SQLite while the main thread forks, again and again: each child
    opens its store and answers. A lock held by a busy thread at the instant of a fork
    would be held forever in that child: SQLite's own (taken around the fork), and the
    library's process-wide ones (none is a plain static: `idem::per_process`). A child
    hung so on the library's SQLite statement texts, a `static Mutex` then (2026-11-28,
    once in 431 forks with the CPU busy)."""
    store = pyidem.open_store(f"sqlite://{tmp_path}/busy.db")
    busy = pyidem.Gate(store, "busy", "id")
    stop = threading.Event()

    def churn():
        n = 0
        while not stop.is_set():
            # Each call a store of its own too: opening and closing files, as the
            # garbage collector's closing of dropped stores does.
            busy.check_and_mark([{"id": f"{threading.get_ident()}-{n}"}])
            pyidem.Gate(pyidem.open_store(f"sqlite://{tmp_path}/t{threading.get_ident()}-{n % 4}.db"), "b", "id")
            n += 1

    workers = [threading.Thread(target=churn) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        for i in range(150):
            url = f"sqlite://{tmp_path}/child-{i}.db"
            verdicts = _fork(lambda: [v.verdict for v in pyidem.Gate(pyidem.open_store(url), "c", "id").check_and_mark([{"id": 1}])])
            assert verdicts == ["new"]
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)


def test_forking_while_other_threads_call_into_the_runtime():
    """Threads calling into the package as fast as they can, the GIL released, while the
    main thread forks again and again: each child opens a store and answers. A lock these
    calls take on their way in (the runtime's, once a `std::sync::Mutex`) held by one of
    them at the instant of a fork would be held forever in the child, whose first call
    would then wait for good (CI, 2026-11-27: a child of
    `test_forking_while_another_thread_uses_sqlite` hung so under load)."""
    gate = pyidem.Gate(pyidem.open_store("memory://"), "busy", "id")
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            gate.check_and_mark([])

    workers = [threading.Thread(target=churn) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        for _ in range(100):
            verdicts = _fork(lambda: [v.verdict for v in pyidem.Gate(pyidem.open_store("memory://"), "c", "id").check_and_mark([{"id": 1}])])
            assert verdicts == ["new"]
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
