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

import threading
from collections import OrderedDict

_LIMIT = 4096


def _install():
    try:
        from sqlglot.dialects.dialect import Dialect
    except ImportError:  # not the emulator's environment: nothing to patch
        return
    parse = Dialect.parse
    trees = OrderedDict()  # key -> the trees of a text met at least twice
    met = OrderedDict()  # key -> None: texts met once
    lock = threading.Lock()

    def keep(table, key, value):
        table[key] = value
        if len(table) > _LIMIT:
            table.popitem(last=False)

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
                    keep(met, key, None)
                    return parsed
                keep(trees, key, parsed)
        return [None if tree is None else tree.copy() for tree in parsed]

    Dialect.parse = cached_parse


_install()
