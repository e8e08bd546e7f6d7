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
same error, every time). Passes that only read their tree get the kept one itself
(`_read_only`), and the translator's answers are kept (`_memo_translate`).
"""

import contextvars
import importlib.abc
import importlib.util
import json
import sys
import threading
from collections import OrderedDict

_LIMIT = 4096

# Set while a pass that only reads its statement's tree runs (`_read_only`): the parse
# cache then hands it the kept trees themselves, not copies. A context variable, so each
# request (each asyncio task, each thread) has its own.
_READING = contextvars.ContextVar("idem_bqemu_reading", default=False)


def _keep(table, key, value):
    """Keeps `value` under `key` in an LRU `table` of at most `_LIMIT` entries."""
    table[key] = value
    if len(table) > _LIMIT:
        table.popitem(last=False)


class _Kept:
    """Answers kept by key, at most `_LIMIT` of them (the least recently used go), for
    the memos below; shared by the emulator's threads."""

    def __init__(self):
        self._table = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            value = self._table.get(key)
            if value is not None:
                self._table.move_to_end(key)
            return value

    def put(self, key, value):
        with self._lock:
            _keep(self._table, key, value)


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
        if _READING.get():
            return list(parsed)
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
    kept = _Kept()

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
        text = kept.get(key)
        if text is not None:
            return ok(text)
        result = translate(self, bq_sql, schema=schema, caller=caller)
        if isinstance(result, ok) and isinstance(result.value, str):
            kept.put(key, result.value)
        return result

    translator.translate = memo


def _holds_a_tree(value):
    """Whether `value` is or holds (in a tuple or list) an sqlglot tree."""
    from sqlglot.expressions import Expression

    if isinstance(value, Expression):
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds_a_tree(v) for v in value)
    return False


def _read_only(fn):
    """`fn` (a synchronous pass that parses its statement to look at it) run on the kept
    trees, without copies. After the translation memo, copies of kept trees were the
    largest part of the emulator's CPU time (18%, py-spy of tests/bigquery.rs, issue 36),
    and most were made for passes like these, which read a statement's kind and names and
    answer None, a string or strings. Each pass wrapped here was read to check that it
    never changes its tree (isinstance checks, `args.get`, names). One that answers with
    a part of its tree (a DDL statement's target, say), which its caller may change, is
    run again the usual way, on copies, and that answer is returned."""

    def wrapper(*args, **kwargs):
        token = _READING.set(True)
        try:
            answer = fn(*args, **kwargs)
        finally:
            _READING.reset(token)
        if _holds_a_tree(answer):
            return fn(*args, **kwargs)
        return answer

    wrapper.__wrapped__ = fn
    return wrapper


def _memo_table_refs(module):
    """Keep what `rewrite_table_refs` made of a DuckDB text for a project: a function of
    those two strings alone (it reads no catalog; it parses the text, qualifies its table
    names in place and prints it again), 6% of the emulator's CPU time with the parse
    cache. Only answers are kept: an error (an invalid dataset name) is raised again."""
    rewrite = module.rewrite_table_refs
    kept = _Kept()

    def memo(duckdb_sql, project_id):
        key = (duckdb_sql, project_id)
        text = kept.get(key)
        if text is None:
            text = rewrite(duckdb_sql, project_id)
            if isinstance(text, str):
                kept.put(key, text)
        return text

    module.rewrite_table_refs = memo


def _read_only_passes(*names):
    """A patch that wraps the module functions `names` with `_read_only`."""

    def patch(module):
        for name in names:
            setattr(module, name, _read_only(getattr(module, name)))

    return patch


# What to patch in which of the emulator's modules, once it is imported (importing them
# here, at the interpreter's start, would run the emulator's imports in another order).
# The passes are patched in the module that calls them by name: the executor imported
# `detect_drop_routine` into its own namespace, and the routes import the executor's
# `classify_statement_type`, which is patched before they do.
_PATCHES = {
    "bqemulator.sql.translator": _memo_translate,
    "bqemulator.sql.table_rewriter": _memo_table_refs,
    "bqemulator.jobs.executor": _read_only_passes(
        "classify_statement_type", "detect_drop_routine", "_reject_dml_on_immutable"
    ),
    "bqemulator.catalog.ddl_sync": _read_only_passes(
        "_detect_catalog_drop",
        "_detect_plain_create_table",
        "_detect_create_schema",
        "_detect_plain_create_view",
    ),
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches each module of `_PATCHES` once it is imported."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.pop(name, None)
        if patch is None:
            return None
        if not _PATCHES:
            sys.meta_path.remove(self)
        # Found the usual way (this finder answers nothing for a module it has patched).
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_install()
sys.meta_path.insert(0, _PatchOnImport())
