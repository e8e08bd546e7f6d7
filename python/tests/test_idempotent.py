"""`pyidem.idempotent`: a function run once per key taken from its arguments, the first
result returned to later calls, other arguments under a seen key a conflict, an exception
releasing the key, an expiry; on the event-key stores (SQLite, Postgres, Redis), with
threads and separate processes at once."""

import multiprocessing
import threading
import time
import uuid

import pytest

import _workers
import pyidem


def test_a_replay_returns_the_first_result_without_running(event_store_url):
    url = event_store_url
    store = pyidem.open_store(url)
    calls = []

    @pyidem.idempotent(store, key="order_id", namespace=f"charge-{uuid.uuid4().hex}")
    def charge(order_id: str, amount: int, note: str = "") -> dict:
        calls.append(order_id)
        return {"charged": amount, "receipt": f"r-{len(calls)}"}

    first = charge("o-1", 100)
    assert first == {"charged": 100, "receipt": "r-1"}
    assert charge("o-1", 100) == first
    assert charge(order_id="o-1", amount=100, note="") == first
    assert charge("o-2", 100) == {"charged": 100, "receipt": "r-2"}
    assert calls == ["o-1", "o-2"]
    # The same key with other arguments: a conflict, as the gate says.
    with pytest.raises(pyidem.PayloadConflict, match="o-1"):
        charge("o-1", 999)
    assert calls == ["o-1", "o-2"]


def test_keys_from_paths_callables_and_validated_fields(store):
    calls = []

    @pyidem.idempotent(store, key=["order.id", "order.customer"], validate="order.amount")
    def ship(order: dict, attempt: int) -> int:
        calls.append(order["id"])
        return len(calls)

    assert ship({"id": 7, "customer": "c", "amount": 5}, attempt=1) == 1
    # `attempt` is not compared: same key, same amount, a replay.
    assert ship({"id": 7, "customer": "c", "amount": 5}, attempt=2) == 1
    with pytest.raises(pyidem.PayloadConflict):
        ship({"id": 7, "customer": "c", "amount": 6}, attempt=3)
    assert ship.key_of({"id": 7, "customer": "c"}, 1) == "7:c"

    @pyidem.idempotent(store, key=lambda event: event["headers"]["message_id"], validate=False)
    def handle(event: dict) -> str:
        calls.append(event["body"])
        return event["body"].upper()

    assert handle({"headers": {"message_id": "m1"}, "body": "hi"}) == "HI"
    assert handle({"headers": {"message_id": "m1"}, "body": "other"}) == "HI"
    assert calls == [7, "hi"]


def test_an_exception_releases_the_key(store):
    attempts = []

    @pyidem.idempotent(store, key="job_id")
    def flaky(job_id: str) -> str:
        attempts.append(job_id)
        if len(attempts) == 1:
            raise ConnectionError("upstream down")
        return "done"

    with pytest.raises(ConnectionError):
        flaky("j1")
    assert flaky("j1") == "done"
    assert flaky("j1") == "done"
    assert attempts == ["j1", "j1"]


def test_the_key_expires(store):
    calls = []

    @pyidem.idempotent(store, key="x", expires="1s")
    def f(x: int) -> int:
        calls.append(x)
        return len(calls)

    assert f(1) == 1
    assert f(1) == 1
    # Past the expiry the call runs again: asked until it does (the state, not a sleep).
    deadline = time.monotonic() + 30
    while f(1) == 1:
        assert time.monotonic() < deadline, "the key never expired"
        time.sleep(0.1)
    assert calls == [1, 1]


def test_a_result_json_cannot_hold_is_returned_once_and_warned(store):
    @pyidem.idempotent(store, key="x")
    def f(x: int) -> object:
        return {1, 2}

    with pytest.warns(pyidem.OutputWarning, match="a set is not JSON"):
        assert f(1) == {1, 2}
    with pytest.warns(pyidem.OutputWarning, match="not kept"):
        assert f(1) is None


def test_threads_at_once_run_it_once(event_store_url):
    url = event_store_url
    store = pyidem.open_store(url)
    calls = []
    started = threading.Event()

    @pyidem.idempotent(store, key="x", namespace=f"threads-{uuid.uuid4().hex}")
    def slow(x: int) -> str:
        calls.append(threading.get_ident())
        started.set()
        time.sleep(0.5)
        return "result"

    results = []
    threads = [threading.Thread(target=lambda: results.append(slow(1))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == ["result"] * 6
    assert len(calls) == 1


def test_processes_at_once_run_it_once(event_store_url, tmp_path):
    url = event_store_url
    ctx = multiprocessing.get_context("spawn")
    marker = tmp_path / "ran"
    marker.touch()
    namespace = f"procs-{uuid.uuid4().hex}"
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_workers.idempotent_once, args=(url, namespace, str(marker), barrier, results))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ran = marker.read_text().split()
    assert len(ran) == 1, f"ran in {len(ran)} processes"
    assert got == [f"result of {ran[0]}"] * 4
