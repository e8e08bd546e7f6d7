"""What `mypy --strict` must refuse (test_typing.py names the lines it expects)."""

import pyidem

store = pyidem.open_store("memory://")
run = pyidem.Run()  # error: Run is made by pyidem only
pyidem.fingerprint([{"timestamp": "2025-11-18T10:00:00Z", "account_id": "A1"}])  # error: missing fields


@pyidem.idempotent(store, key="order_id")
def charge(order_id: str, amount: int) -> int:
    return amount


charge("o-1", "100")  # error: amount is an int
pyidem.Gate(store, "ns", "id", strategy="sometimes")  # error: not a strategy
