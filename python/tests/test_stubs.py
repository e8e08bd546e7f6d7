"""The type stubs name everything the package exports (editors complete from them)."""

import ast
import json
import pathlib
import pydoc
import subprocess

import pytest

import pyidem

STUB = pathlib.Path(pyidem.__file__).with_name("__init__.pyi")


def test_stubs_cover_the_public_names():
    tree = ast.parse(STUB.read_text())
    declared = {
        node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))
    }
    assert set(pyidem.__all__) <= declared, set(pyidem.__all__) - declared
    assert STUB.with_name("py.typed").exists()


def test_the_trade_event_type_names_every_field_fingerprint_requires(idem_bin):
    stub = ast.parse(STUB.read_text())
    (declared,) = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "TradeEvent"]
    fields = [n.target.id for n in declared.body if isinstance(n, ast.AnnAssign)]
    assert fields == list(pyidem.TradeEvent.__annotations__)
    assert pyidem.TradeEvent.__required_keys__ == set(fields)
    event = {
        "timestamp": "2025-11-18T10:00:00Z", "account_id": "A1", "product_id": "BTC-USD",
        "side": "buy", "price": "101.50", "quantity": 3, "event_type": "trade",
    }
    assert set(event) == set(fields)
    # The event with exactly these fields is fingerprinted as `idem fingerprint` does it.
    cli = subprocess.run(
        [idem_bin, "fingerprint"], input=json.dumps(event) + "\n", capture_output=True, text=True
    )
    assert cli.returncode == 0, cli.stderr
    assert pyidem.fingerprint([event]) == cli.stdout.strip().split()[-1]
    for field in fields:
        partial = {k: v for k, v in event.items() if k != field}
        with pytest.raises(ValueError, match=field):
            pyidem.fingerprint([partial])


def test_help_shows_real_defaults():
    for thing in (pyidem.Gate, pyidem.Outcome, pyidem.Content, pyidem.open_store, pyidem.Store):
        assert "Ellipsis" not in pydoc.render_doc(thing), thing
    text = pydoc.render_doc(pyidem.Gate)
    assert "ttl='never'" in text and "strategy='strict'" in text
