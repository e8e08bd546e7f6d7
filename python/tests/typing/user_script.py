"""A user's script using the package's API as a data engineer would, checked with
`mypy --strict` (test_typing.py): every call below must type-check as written."""

from __future__ import annotations

import datetime
import os
from typing import Any, Dict, List

import pyidem


def load(day: datetime.date) -> List[Dict[str, Any]]:
    return [{"player": "p1", "day": day.isoformat()}]


def main() -> int:
    with pyidem.open_store(
        os.environ.get("IDEM_STORE", "memory://"),
        breaker_failures=3,
        breaker_reset=datetime.timedelta(seconds=10),
    ) as store:

        @pyidem.processor("player_game_summary", store=store, time_window="1h", content_hash=datetime.timedelta(days=1))
        def summarize(run: pyidem.Run) -> pyidem.Outcome:
            rows = load(run.date)
            return pyidem.Outcome(records=len(rows), output={"players": len(rows)})

        @summarize.describe
        def content(run: pyidem.Run) -> pyidem.Content:
            return pyidem.Content(entities=[r["player"] for r in load(run.date)])

        try:
            report: pyidem.Report = summarize.run(date=datetime.date(2025, 11, 18), trigger="scheduler")
        except pyidem.RunFailed as failed:
            print(failed.report.error)
            return 1
        again = summarize.run(date="2025-11-18", raise_on_failure=False)
        again.raise_for_status()
        if again.status == "skipped":
            print(again.why, again.output, report.run_id)
        for row in store.runs("player_game_summary", scope="2025-11-18", limit=10):
            print(row.run_id, row.status, row.output)

        gate = pyidem.Gate(store, "fund_loads", "id", ttl=datetime.timedelta(days=7), pending_timeout=30)
        events: List[Dict[str, Any]] = [{"id": "1", "amount": "10.00"}]
        with gate.batch(events) as verdicts:
            handled = [e for e, v in zip(events, verdicts) if v.passes]
        failed_batch = gate.check_and_mark(events)
        released: int = gate.release(failed_batch)
        print(len(handled), released, gate.stats())

        @pyidem.idempotent(store, key="order_id", expires="1h", validate=["amount"])
        def charge(order_id: str, amount: int) -> Dict[str, int]:
            return {"charged": amount}

        receipt: Dict[str, int] = charge("o-1", 100)
        print(receipt["charged"])

        trade: pyidem.TradeEvent = {
            "timestamp": "2025-11-18T10:00:00Z",
            "account_id": "A1",
            "product_id": "BTC-USD",
            "side": "buy",
            "price": "101.50",
            "quantity": 3,
            "event_type": "trade",
        }
        print(pyidem.fingerprint([trade]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
