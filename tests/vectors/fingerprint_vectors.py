#!/usr/bin/env python3
"""Reference event fingerprint (seed 000) and the test vectors idem's Rust code must match.

Regenerate (from the repository root; needs only python3 >= 3.11, no packages):

    python3 tests/vectors/fingerprint_vectors.py > tests/vectors/fingerprint.json

The output is deterministic (fixed random seed), so regenerating without changing this
script leaves the file byte-for-byte unchanged. `cargo test --test it events::vectors`
recomputes every vector with idem's implementation.

The algorithm, as the Python service of seed 000 computes it:

    signatures = sorted(
        (e.timestamp.isoformat(), e.account_id, e.product_id, e.side,
         str(e.price), e.quantity, e.event_type)
        for e in events
    )
    hashlib.sha256(json.dumps(signatures).encode()).hexdigest()

where each event arrives as one JSON object (one NDJSON line):

* timestamp: an ISO 8601 text with a UTC offset or `Z`; it becomes an aware datetime
  converted to UTC, so `isoformat()` renders `2025-11-18T09:00:00+00:00`, with
  `.ffffff` only when the microseconds are not zero (digits past the sixth are dropped,
  as `datetime.fromisoformat` does);
* price: the decimal text as given: a JSON string as is, a JSON number as written in the
  line (`100.50` stays `100.50`), never through a float;
* quantity: a JSON integer;
* account_id, product_id, side, event_type: JSON strings.

`json.dumps` with its defaults uses the `", "` / `": "` separators and `ensure_ascii=True`
(non-ASCII as lower-case `\\uXXXX`, surrogate pairs beyond the BMP). Tuples sort element
by element: strings by code point, integers numerically.
"""

import hashlib
import json
import random
import sys
from datetime import datetime, timedelta, timezone

FIELDS = ("timestamp", "account_id", "product_id", "side", "price", "quantity", "event_type")


class RawInt(str):
    """The text of a JSON integer, as written."""


class RawFloat(str):
    """The text of a JSON number with a fraction or exponent, as written."""


def parse_event(line):
    """One NDJSON line -> its signature tuple."""
    obj = json.loads(line, parse_int=RawInt, parse_float=RawFloat)
    ts = datetime.fromisoformat(obj["timestamp"])
    if ts.tzinfo is None:
        raise ValueError("timestamp without a UTC offset")
    price = obj["price"]
    price_text = str(price)  # a str subclass keeps the text as written
    quantity = obj["quantity"]
    if not isinstance(quantity, RawInt):
        raise ValueError("quantity is not an integer")
    return (
        ts.astimezone(timezone.utc).isoformat(),
        str(obj["account_id"]),
        str(obj["product_id"]),
        str(obj["side"]),
        price_text,
        int(quantity),
        str(obj["event_type"]),
    )


def signature_json(lines):
    return json.dumps(sorted(parse_event(line) for line in lines))


def fingerprint(lines):
    return hashlib.sha256(signature_json(lines).encode()).hexdigest()


def line(ts, account, product, side, price, quantity, event_type, price_raw=False):
    """An NDJSON line; price_raw puts the price in as a JSON number, as written."""
    price_json = price if price_raw else json.dumps(price, ensure_ascii=False)
    return (
        '{"timestamp": %s, "account_id": %s, "product_id": %s, "side": %s, '
        '"price": %s, "quantity": %d, "event_type": %s}'
        % (
            json.dumps(ts),
            json.dumps(account, ensure_ascii=False),
            json.dumps(product, ensure_ascii=False),
            json.dumps(side),
            price_json,
            quantity,
            json.dumps(event_type, ensure_ascii=False),
        )
    )


def vectors():
    v = []

    def add(name, lines):
        v.append(
            {
                "name": name,
                "events": lines,
                "signature_json": signature_json(lines),
                "fingerprint": fingerprint(lines),
            }
        )

    add("empty", [])
    add("one ascii event", [line("2025-11-18T09:00:00Z", "acc-1", "BTC-USD", "buy", "100.50", 5, "trade")])
    add(
        "two events given out of order",
        [
            line("2025-11-18T10:00:00+00:00", "acc-2", "ETH-USD", "sell", "2500.00", 2, "trade"),
            line("2025-11-18T09:00:00+00:00", "acc-1", "BTC-USD", "buy", "100.50", 5, "trade"),
        ],
    )
    add(
        "price as a json number keeps its text",
        [
            line("2025-11-18T09:00:00Z", "acc-1", "BTC-USD", "buy", "100.50", 5, "trade", price_raw=True),
            line("2025-11-18T09:00:01Z", "acc-1", "BTC-USD", "buy", "7", 1, "trade", price_raw=True),
            line("2025-11-18T09:00:02Z", "acc-1", "BTC-USD", "buy", "-0.000100", 1, "trade", price_raw=True),
            line("2025-11-18T09:00:03Z", "acc-1", "BTC-USD", "buy", "1.5e3", 1, "trade", price_raw=True),
            line("2025-11-18T09:00:04Z", "acc-1", "BTC-USD", "buy", "12345678901234567890.123456789", 1, "trade", price_raw=True),
        ],
    )
    add(
        "price as string and as number give the same signature",
        [line("2025-11-18T09:00:00Z", "acc-1", "BTC-USD", "buy", "100.50", 5, "trade", price_raw=True)],
    )
    add(
        "fractional seconds",
        [
            line("2025-11-18T09:00:00.000000Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00.5Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00.123Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00.000001+00:00", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00.999999Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:01.1234567Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:02.123456789Z", "a", "p", "buy", "1", 1, "trade"),
        ],
    )
    add(
        "offsets converted to utc",
        [
            line("2025-11-18T14:30:00+05:30", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T01:00:00-08:00", "a", "p", "sell", "1", 1, "trade"),
            line("2025-11-19T00:30:00.250000+01:00", "a", "p", "buy", "1", 1, "trade"),
            line("2025-12-31T23:59:59-00:00", "a", "p", "buy", "1", 1, "trade"),
            line("2025-12-31T23:59:59.5-01:00", "a", "p", "buy", "1", 1, "trade"),
            line("2025-01-01T00:00:00+14:00", "a", "p", "buy", "1", 1, "trade"),
        ],
    )
    add(
        "non-ascii text escaped as python does",
        [
            line("2025-11-18T09:00:00Z", "compte-é", "café", "buy", "1.00", 1, "trade"),
            line("2025-11-18T09:00:00Z", "口座-東京", "商品", "sell", "2.00", 1, "取引"),
            line("2025-11-18T09:00:00Z", "emoji-😀", "𝄞-clef", "buy", "3.00", 1, "trade"),
            line("2025-11-18T09:00:00Z", 'quote " backslash \\ slash /', "tab\there\nnewline", "buy", "4.00", 1, "trade"),
            line("2025-11-18T09:00:00Z", "ctl \x01\x1f del \x7f bell \x07 ff \x0c bs \x08 cr \r", "nbsp\xa0", "buy", "5.00", 1, "trade"),
            line("2025-11-18T09:00:00Z", "\u2028\u2029\ufeff\uffff", "\U0010ffff", "buy", "6.00", 1, "trade"),
        ],
    )
    add(
        "sorting by code point, not by utf-16 unit",
        [
            line("2025-11-18T09:00:00Z", "\uff61", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "\U0001f600", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "\ue000", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "Z", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "", "p", "buy", "1", 1, "trade"),
        ],
    )
    add(
        "quantity sorts numerically",
        [
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1", q, "trade")
            for q in (10, 9, -1, 100, 0, -20, 2**63 - 1, -(2**63), 2**70)
        ],
    )
    add(
        "ties broken by later elements",
        [
            line("2025-11-18T09:00:00Z", "a", "p", "sell", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1.0", 1, "trade"),
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1", 1, "cancel"),
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1", 2, "trade"),
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1", 1, "trade"),
        ],
    )
    add(
        "fraction sorts after the whole second",
        [
            line("2025-11-18T09:00:00.000001Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T09:00:00Z", "a", "p", "buy", "1", 1, "trade"),
            line("2025-11-18T08:59:59.999999Z", "a", "p", "buy", "1", 1, "trade"),
        ],
    )
    add(
        "extra fields ignored, key order free",
        [
            '{"event_type": "trade", "id": "x-1", "quantity": 5, "price": "100.50", '
            '"side": "buy", "product_id": "BTC-USD", "account_id": "acc-1", '
            '"timestamp": "2025-11-18T09:00:00Z", "meta": {"source": "feed"}}',
        ],
    )
    add(
        "early and late years",
        [
            line("0001-01-01T00:00:00Z", "a", "p", "buy", "1", 1, "trade"),
            line("9999-12-31T23:59:59.999999Z", "a", "p", "buy", "1", 1, "trade"),
            line("1970-01-01T00:00:00Z", "a", "p", "buy", "1", 1, "trade"),
            line("1969-12-31T23:59:59.5Z", "a", "p", "buy", "1", 1, "trade"),
        ],
    )

    rng = random.Random(11)
    accounts = ["acc-%d" % i for i in range(20)] + ["compte-é", "口座-7", "user-😀"]
    products = ["BTC-USD", "ETH-USD", "SOL-USD", "café-crème", "商品-1"]
    sides = ["buy", "sell"]
    types = ["trade", "cancel", "amend", "取引"]
    base = datetime(2025, 11, 18, 9, 0, 0, tzinfo=timezone.utc)
    offsets = [timedelta(0), timedelta(hours=5, minutes=30), timedelta(hours=-8), timedelta(hours=1)]
    many = []
    for _ in range(500):
        at = base + timedelta(seconds=rng.randrange(0, 3 * 86400), microseconds=rng.choice([0, 0, rng.randrange(1, 10**6)]))
        tz = timezone(rng.choice(offsets))
        ts = at.astimezone(tz).isoformat()
        if tz.utcoffset(None) == timedelta(0) and rng.random() < 0.5:
            ts = ts.replace("+00:00", "Z")
        price = "%d.%02d" % (rng.randrange(0, 100000), rng.randrange(0, 100))
        many.append(
            line(ts, rng.choice(accounts), rng.choice(products), rng.choice(sides), price,
                 rng.randrange(-5, 1000), rng.choice(types), price_raw=rng.random() < 0.3)
        )
    # Exact duplicates stay in the signature list.
    many.extend(rng.sample(many, 20))
    add("many events with duplicates", many)
    shuffled = list(many)
    rng.shuffle(shuffled)
    add("many events shuffled give the same fingerprint", shuffled)
    return v


def main():
    doc = {
        "generator": "tests/vectors/fingerprint_vectors.py",
        "algorithm": "sha256(json.dumps(sorted(signatures))), signature = "
        "[timestamp.isoformat() in utc, account_id, product_id, side, str(price), quantity, event_type]",
        "vectors": vectors(),
    }
    json.dump(doc, sys.stdout, indent=1, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
