"""The event API: fingerprint as `idem fingerprint`, the gate's verdicts as `idem gate`'s
on the peer data, on SQLite, Postgres and Redis, and on the same keys."""

import json
import subprocess
import time
import uuid

import pytest

import pyidem


def test_fingerprint_matches_the_cli(idem_bin, tmp_path):
    events = [
        {"timestamp": "2025-11-18T10:00:00Z", "account_id": "A1", "product_id": "BTC-USD",
         "side": "buy", "price": "101.50", "quantity": 3, "event_type": "trade"},
        {"timestamp": "2025-11-18T10:00:01Z", "account_id": "A2", "product_id": "ETH-USD",
         "side": "sell", "price": "20.1", "quantity": 1, "event_type": "trade"},
    ]
    lines = "\n".join(json.dumps(e) for e in events) + "\n"
    cli = subprocess.run([idem_bin, "fingerprint"], input=lines, capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    expected = cli.stdout.strip().split()[-1]
    assert pyidem.fingerprint(events) == expected
    assert pyidem.fingerprint([json.dumps(e) for e in reversed(events)]) == expected
    with pytest.raises(ValueError):
        pyidem.fingerprint([{"not": "a trade"}])


def _cli_verdicts(idem_bin, url, peer_data, key, namespace):
    out = subprocess.run(
        [idem_bin, "--store", url, "gate", "--key", key, "--namespace", namespace,
         "--input", str(peer_data)],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(l)["verdict"] for l in out.stdout.splitlines()]


def _gate_parity(idem_bin, url, peer_data):
    lines = peer_data.read_text().splitlines()
    store = pyidem.open_store(url)
    for key in ("id", "id,customer_id"):
        cli_ns, py_ns = f"cli-{uuid.uuid4().hex}", f"py-{uuid.uuid4().hex}"
        expected = _cli_verdicts(idem_bin, url, peer_data, key, cli_ns)
        assert len(expected) == 1000
        gate = pyidem.Gate(store, py_ns, key)
        got = []
        for i in range(0, len(lines), 300):  # batches of another size than the CLI's
            got += [str(v) for v in gate.check_and_mark(lines[i:i + 300])]
        assert got == expected
        assert {"new", "conflict"} <= set(got)  # the peer data has both
        stats = gate.stats()
        assert stats["checked"] == 1000
        # Dicts give the same verdicts as lines; the Python gate on the CLI's namespace
        # finds the CLI's keys (the same keys): nothing is new.
        again = pyidem.Gate(store, cli_ns, key.split(","))
        verdicts = again.check_and_mark([json.loads(l) for l in lines])
        assert "new" not in {v.verdict for v in verdicts}
        assert verdicts[0].key == (json.loads(lines[0])["id"] if key == "id"
                                   else "{id}:{customer_id}".format(**json.loads(lines[0])))


def test_gate_verdicts_equal_idem_gate_on_sqlite(idem_bin, sqlite_url, peer_data):
    _gate_parity(idem_bin, sqlite_url, peer_data)


def test_gate_verdicts_equal_idem_gate_on_postgres(idem_bin, postgres_url, peer_data):
    _gate_parity(idem_bin, postgres_url, peer_data)


def test_gate_verdicts_equal_idem_gate_on_redis(idem_bin, redis_prefix_url, peer_data):
    _gate_parity(idem_bin, redis_prefix_url, peer_data)


def test_gate_ttl_strategy_invalid_and_filter(store):
    gate = pyidem.Gate(store, "t", "id", ttl="1h", strategy="log_only")
    verdicts = gate.check_and_mark(['{"id": "1", "a": 1}', '{"id": "1", "a": 2}', "not json", {"b": 1}])
    assert [str(v) for v in verdicts] == ["new", "conflict", "invalid", "invalid"]
    assert verdicts[1].passes  # log_only never filters a valid event
    assert verdicts[2].error
    strict = pyidem.Gate(store, "f", "id")
    assert strict.filter([{"id": 1}, {"id": 1}, {"id": 2}]) == [{"id": 1}, {"id": 2}]
    with pytest.raises(ValueError):
        pyidem.Gate(store, "t", "id", strategy="sometimes")
    with pytest.raises(ValueError):
        pyidem.Gate(store, "t", "")


def test_redis_is_for_event_keys_only(redis_url, name):
    store = pyidem.open_store(redis_url)
    with pytest.raises(pyidem.IdemError, match="event keys only"):
        pyidem.processor(name, store=store)(lambda run: None)


def test_pending_marks_expire_unless_confirmed(sqlite_url, postgres_url, redis_prefix_url):
    """With pending_timeout, a new key stays pending until confirm: unconfirmed, its
    event is new again after the timeout (a restarted gate handles it again); confirmed,
    it is a replay. One sleep for the three stores."""
    stores = {
        "sqlite": sqlite_url,
        "postgres": postgres_url,
        "redis": redis_prefix_url,
    }
    dropped = [{"id": f"d{i}", "a": i} for i in range(3)]
    handled = [{"id": f"h{i}", "a": i} for i in range(3)]
    namespaces = {}
    for label, url in stores.items():
        namespaces[label] = ns = f"pending-{uuid.uuid4().hex}"
        gate = pyidem.Gate(pyidem.open_store(url), ns, "id", pending_timeout="1s")
        # Never confirmed: the process "died" before handling these.
        assert [str(v) for v in gate.check_and_mark(dropped)] == ["new"] * 3, label
        first = gate.check_and_mark(handled[:2])
        second = gate.check_and_mark(handled[2:] + [handled[0], "not json"])
        assert [str(v) for v in second] == ["new", "replay", "invalid"], label
        # Verdicts of several calls together; new keys only, each once.
        assert gate.confirm(first + second + first) == 3, label
        with pytest.raises(ValueError):
            pyidem.Gate(pyidem.open_store(url), ns, "id", pending_timeout="1s").confirm(first)
        with pytest.raises(TypeError):
            gate.confirm(["new"])
    time.sleep(1.5)
    for label, url in stores.items():
        # A gate started again after the timeout.
        gate = pyidem.Gate(pyidem.open_store(url), namespaces[label], "id", pending_timeout="1s")
        assert [str(v) for v in gate.check_and_mark(dropped)] == ["new"] * 3, label
        assert [str(v) for v in gate.check_and_mark(handled)] == ["replay"] * 3, label


def test_confirm_without_pending_marks_is_a_no_op(store):
    gate = pyidem.Gate(store, "no-pending", "id")
    verdicts = gate.check_and_mark([{"id": 1}, {"id": 2}])
    assert [str(v) for v in verdicts] == ["new", "new"]
    assert gate.confirm(verdicts) == 0
    assert gate.confirm([]) == 0
    assert [str(v) for v in gate.check_and_mark([{"id": 1}])] == ["replay"]
