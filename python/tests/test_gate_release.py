"""A batch whose handler failed loses no event: `Gate.release` takes its marks back, and
`with gate.batch(events)` confirms on success and releases on an exception, on SQLite,
Postgres and Redis, with and without pending marks."""

import uuid

import pytest

import pyidem


def _gates(url, **options):
    """Two gates on one namespace: this process's, and another's (a second consumer)."""
    ns = f"release-{uuid.uuid4().hex}"
    store = pyidem.open_store(url)
    return pyidem.Gate(store, ns, "id", **options), pyidem.Gate(pyidem.open_store(url), ns, "id", **options)


@pytest.mark.parametrize("options", [{}, {"pending_timeout": "5m"}], ids=["plain", "pending"])
def test_a_released_batch_is_new_again_at_once(event_store_url, options):
    gate, other = _gates(event_store_url, **options)
    handled = gate.check_and_mark([{"id": "h"}])
    gate.confirm(handled)
    batch = [{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "h"}]
    verdicts = gate.check_and_mark(batch)
    assert [v.verdict for v in verdicts] == ["new", "new", "replay"]
    # The handler failed. Without a release the redelivery is a replay and does not pass,
    # on this gate at once (a consumer acking non-passing messages would ack it).
    assert [v.passes for v in gate.check_and_mark(batch[:2])] == [False, False]
    assert gate.release(verdicts) == 2
    redelivered = gate.check_and_mark(batch)
    assert [v.verdict for v in redelivered] == ["new", "new", "replay"]
    assert [v.passes for v in redelivered] == [True, True, False]
    assert gate.release(redelivered) == 2
    # Another gate (another consumer) gets them new at once, not after a pending timeout.
    assert [v.verdict for v in other.check_and_mark(batch)] == ["new", "new", "replay"]


def test_batch_confirms_on_success_and_releases_on_an_exception(event_store_url):
    gate, other = _gates(event_store_url, pending_timeout="5m")
    events = [{"id": "1", "amount": "10.00"}, {"id": "2", "amount": "5.00"}]
    with pytest.raises(ValueError, match="warehouse"):
        with gate.batch(events) as verdicts:
            assert [v.verdict for v in verdicts] == ["new", "new"]
            raise ValueError("warehouse timed out")
    handled = []
    with gate.batch(events) as verdicts:
        assert [v.verdict for v in verdicts] == ["new", "new"]
        handled += [e for e, v in zip(events, verdicts) if v.passes]
    assert handled == events
    # Confirmed: another consumer finds them handled without waiting out the 5 minutes.
    assert [v.verdict for v in other.check_and_mark(events)] == ["replay", "replay"]


def test_an_interrupt_in_the_batch_releases_it_too(store):
    gate = pyidem.Gate(store, "interrupt", "id")
    with pytest.raises(KeyboardInterrupt):
        with gate.batch([{"id": 1}]):
            raise KeyboardInterrupt
    assert [v.verdict for v in gate.check_and_mark([{"id": 1}])] == ["new"]


def test_release_takes_only_this_gates_verdicts(store):
    gate = pyidem.Gate(store, "mine", "id")
    other = pyidem.Gate(store, "mine", "id")
    verdicts = gate.check_and_mark([{"id": 1}])
    with pytest.raises(ValueError, match="another gate"):
        other.release(verdicts)
    with pytest.raises(TypeError):
        gate.release(["new"])
    assert gate.release([]) == 0
    # Invalid events and replays have no mark of this batch to take back.
    assert gate.release(gate.check_and_mark([{"id": 1}, {"no": "id"}])) == 0
