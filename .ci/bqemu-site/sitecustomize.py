"""Loaded by the BigQuery emulator's Python at start (.ci/bqemulator.sh puts this folder on
PYTHONPATH): a parse cache for sqlglot, the emulator's SQL parser.

The emulator (bqemulator 1.4.0) parses each statement it is sent several times (to classify
it, detect DDL, rewrite table names, translate it), and idem sends the same statement texts
again and again with other parameters: parsing was half of the emulator's CPU time in the
BigQuery tests (py-spy, issue 36), and the emulator is one CPU-bound process. This keeps the
trees of texts parsed more than once and hands out copies, so a caller that rewrites its
tree in place never changes the kept one (a copy costs about a fifth of a parse). A text met
for the first time is parsed and its tree handed out as it is, with no copy made, nor kept.
What a statement does is unchanged: the same text parsed with the same dialect and options
gives the same tree, and a text that fails to parse is never kept (it fails again, with the
same error, every time).
"""

import importlib.abc
import importlib.util
import json
import sys
import threading
from collections import OrderedDict

_LIMIT = 4096


def _keep(table, key, value):
    """Keeps `value` under `key` in an LRU `table` of at most `_LIMIT` entries."""
    table[key] = value
    if len(table) > _LIMIT:
        table.popitem(last=False)


def _install():
    try:
        from sqlglot.dialects.dialect import Dialect
    except ImportError:  # not the emulator's environment: nothing to patch
        return
    parse = Dialect.parse
    trees = OrderedDict()  # key -> the trees of a text met at least twice
    met = OrderedDict()  # key -> None: texts met once
    lock = threading.Lock()

    def cached_parse(self, sql, **opts):
        try:
            key = (
                type(self),
                tuple(sorted(self.settings.items())),
                sql,
                tuple(sorted(opts.items())),
            )
            hash(key)
        except TypeError:  # an option or setting that cannot be a key: parsed as before
            return parse(self, sql, **opts)
        with lock:
            parsed = trees.get(key)
            if parsed is not None:
                trees.move_to_end(key)
            again = parsed is None and met.pop(key, False) is None
        if parsed is None:
            parsed = parse(self, sql, **opts)
            with lock:
                if not again:
                    _keep(met, key, None)
                    return parsed
                _keep(trees, key, parsed)
        return [None if tree is None else tree.copy() for tree in parsed]

    Dialect.parse = cached_parse


def _memo_translate(module):
    """Keep the DuckDB text that `SQLTranslator.translate` made of a statement.

    A translation was a quarter of the emulator's CPU time with the parse cache (py-spy of
    tests/bigquery.rs, issue 36): idem sends the same statement texts with new parameters,
    and parameters are bound after the translation. `translate` is a function of the text,
    the schema snapshot it is given, the caller and the translator's rules (the same global
    registry in every translator; the scripting interpreter makes a translator per script),
    so those are the key. Only successes are kept: a failure is translated again, and fails
    the same way."""
    translator = module.SQLTranslator
    translate = translator.translate
    ok = module.Ok
    kept = OrderedDict()
    lock = threading.Lock()

    def memo(self, bq_sql, *, schema=None, caller=None, **kwargs):
        try:
            if kwargs:
                raise TypeError("an argument the key does not cover")
            key = (
                tuple(type(rule) for rule in self._rules),
                bq_sql,
                None if schema is None else json.dumps(schema, sort_keys=True),
                caller,
            )
            hash(key)
        except (TypeError, ValueError, AttributeError):
            return translate(self, bq_sql, schema=schema, caller=caller, **kwargs)
        with lock:
            text = kept.get(key)
            if text is not None:
                kept.move_to_end(key)
                return ok(text)
        result = translate(self, bq_sql, schema=schema, caller=caller)
        if isinstance(result, ok) and isinstance(result.value, str):
            with lock:
                _keep(kept, key, result.value)
        return result

    translator.translate = memo


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the emulator's translator module once it is imported (importing it here,
    at the interpreter's start, would run the emulator's imports in another order)."""

    name = "bqemulator.sql.translator"

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _memo_translate(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_install()
sys.meta_path.insert(0, _PatchOnImport())
