"""The type stubs name everything the package exports (editors complete from them)."""

import ast
import pathlib

import idem

STUB = pathlib.Path(idem.__file__).with_name("__init__.pyi")


def test_stubs_cover_the_public_names():
    tree = ast.parse(STUB.read_text())
    declared = {
        node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))
    }
    assert set(idem.__all__) <= declared, set(idem.__all__) - declared
    assert STUB.with_name("py.typed").exists()
