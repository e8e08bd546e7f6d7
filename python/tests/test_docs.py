"""docs/python.md's comparison table: every cell of this package's column names the tests
that back it, and each of those tests exists."""

import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
DOCS = TESTS.parents[1] / "docs" / "python.md"


def _table():
    text = DOCS.read_text()
    section = text.split("## Compared with Powertools and Prefect", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    header, *body = rows
    assert header.split("|")[4].strip() == "pyidem", header
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in body]


def _tests_in(path):
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_cell_of_this_packages_column_names_existing_tests():
    rows = _table()
    assert len(rows) >= 15
    for feature, _powertools, _prefect, ours in rows:
        named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", ours)
        assert named, f"{feature}: no test named in {ours!r}"
        for file, test in named:
            assert test in _tests_in(TESTS / file), f"{feature}: {file}::{test} does not exist"
