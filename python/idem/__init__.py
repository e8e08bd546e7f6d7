"""idem for Python: idempotent scheduled batch jobs on the idem Rust core.

A processor runs per scope (usually a partition date) behind guards: a lease (never twice
at once), a time window (the same scope completed recently => skip) and a content hash
(the same content processed recently => skip). Every run is recorded in the store's run
ledger, the same ledger ``idem run``, ``idem runs`` and ``idem report`` use, and the keys
are written only on success, byte-identical to the Rust library's.

    import idem
    store = idem.open_store("sqlite:///var/lib/idem/idem.db")

    @idem.processor("player_game_summary", store=store, time_window="1h", content_hash="24h")
    def summarize(run):
        rows = load(run.date)
        return idem.Outcome(records=len(rows), output={"players": len(rows)})

    report = summarize.run(date="2025-11-18", trigger="scheduler")
"""

from __future__ import annotations

import datetime as _dt
import inspect as _inspect
import signal as _signal
import threading as _threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from . import _idem
from ._idem import (  # noqa: F401  (re-exported)
    Content,
    Gate,
    IdemError,
    Outcome,
    Run,
    Store,
    StoreError,
    Terminated,
    Verdict,
    fingerprint,
    open_store,
    scope_key,
)

__version__ = _idem.__version__

__all__ = [
    "Content",
    "Explanation",
    "Gate",
    "IdemError",
    "Outcome",
    "Processor",
    "Report",
    "Run",
    "Store",
    "StoreError",
    "Terminated",
    "Verdict",
    "explain",
    "fingerprint",
    "open_store",
    "processor",
    "scope_key",
]

Duration = Union[str, int, float, _dt.timedelta, bool, None]


def _duration(value: Duration, what: str) -> Optional[str]:
    """A duration as the job files spell it: ``"1h"``, ``"90s"``, ``"off"``."""
    if value is None:
        return None
    if value is False:
        return "off"
    if value is True:
        raise TypeError(f"{what}: give a duration (\"1h\", seconds or a timedelta), not True")
    if isinstance(value, _dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)):
        if value <= 0:
            return "off"
        millis = round(value * 1000)
        return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"
    if isinstance(value, str):
        return value
    raise TypeError(f"{what}: expected a duration string, seconds or a timedelta, not {type(value).__name__}")


def _date(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        return value.date().isoformat()
    if isinstance(value, _dt.date):
        return value.isoformat()
    return str(value)


class _Result:
    """A dict from the core, read as attributes."""

    _fields: tuple = ()

    def __init__(self, data: Dict[str, Any]):
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self) -> Dict[str, Any]:
        """Everything, as ``idem run --json`` prints it."""
        return dict(self._data)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self._data.get(k)!r}" for k in self._fields if self._data.get(k) is not None)
        return f"idem.{type(self).__name__}({shown})"


class Report(_Result):
    """The result of one run: ``status`` (completed, skipped, failed), ``skip_reason``
    (time_window, content_hash, in_progress), ``why`` (the sentence saying which guard,
    which earlier run and when), ``run_id``, ``error``, ``processing_key``..."""

    _fields = ("job", "scope", "status", "skip_reason", "would_skip_reason", "why", "run_id", "error")

    @property
    def why(self) -> Optional[str]:
        return self._data.get("detail")

    def __getattr__(self, name: str) -> Any:
        if name == "why":
            return self._data.get("detail")
        return super().__getattr__(name)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={(self.why if k == 'why' else self._data.get(k))!r}"
            for k in self._fields
            if (self.why if k == "why" else self._data.get(k)) is not None
        )
        return f"idem.Report({shown})"


class Explanation(_Result):
    """What a run would do now: ``decision`` (run or skip), ``skip_reason``, ``why``,
    ``guards`` (every guard's verdict), ``processing_key``."""

    _fields = ("job", "scope", "decision", "skip_reason", "why")

    @property
    def why(self) -> Optional[str]:
        return self._data.get("detail")


def _main_thread() -> bool:
    return _threading.current_thread() is _threading.main_thread()


class _SigtermAsException:
    """For the run's duration, SIGTERM raises ``idem.Terminated`` in the main thread (when
    nothing else handles SIGTERM), so the run is recorded as interrupted and its lease
    released, as ``idem run`` does."""

    def __enter__(self):
        self.previous = None
        if _main_thread() and _signal.getsignal(_signal.SIGTERM) in (_signal.SIG_DFL, None):

            def handler(signum, frame):
                raise Terminated("SIGTERM")

            self.previous = _signal.signal(_signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            _signal.signal(_signal.SIGTERM, self.previous)
        return False


class Processor:
    """A Python function run per scope behind idem's guards (made by :func:`processor`)."""

    def __init__(self, fn: Callable[[Run], Any], name: str, store: Store, **config: Any):
        if _inspect.iscoroutinefunction(fn) or _inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"idem.processor({name!r}): async def bodies are not supported; "
                "use a def that calls asyncio.run(...) (the run holds a lease and a ledger row "
                "around one synchronous call)"
            )
        self.fn = fn
        self.name = name
        self.store = store
        self._describe: Optional[Callable[[Run], Optional[Content]]] = None
        guards = {
            "time_window": _duration(config.pop("time_window", None), "time_window"),
            "content_hash": _duration(config.pop("content_hash", None), "content_hash"),
            "lease": _duration(config.pop("lease", None), "lease"),
            "on_in_progress": config.pop("on_in_progress", None),
            "wait": _duration(config.pop("wait", None), "wait"),
            "heartbeat": config.pop("heartbeat", None),
            "hash": config.pop("hash", None),
            "order": config.pop("order", None),
        }
        settings = {
            "mode": config.pop("mode", None),
            "store_failure": config.pop("store_failure", None),
            "strict_recording": config.pop("strict_recording", None),
            "date": config.pop("date", None),
            "timezone": config.pop("timezone", None),
        }
        version = config.pop("version", "") or ""
        if config:
            raise TypeError(f"idem.processor: unknown option(s) {', '.join(sorted(config))}")
        self._job = _idem.NativeJob(name, store, guards, settings, version)
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__

    def describe(self, fn: Callable[[Run], Optional[Content]]) -> Callable[[Run], Optional[Content]]:
        """Decorator: the content the content hash guard compares (``idem.Content``)."""
        if _inspect.iscoroutinefunction(fn):
            raise TypeError("a describe function must be a plain def, not async def")
        self._describe = fn
        return fn

    def run(
        self,
        date: Any = None,
        *,
        scope: Optional[str] = None,
        trigger: str = "manual",
        params: Optional[Dict[str, Any]] = None,
        run_id: Optional[str] = None,
    ) -> Report:
        """Runs the body for ``date`` behind the guards and records the run.

        An exception in the body fails the run (no key is written, so a retry runs; the
        traceback's last lines are the ledger's error) and the report says ``failed``.
        ``KeyboardInterrupt`` or SIGTERM during the run records it as interrupted,
        releases the lease and is raised again (SIGTERM as ``SystemExit(143)``).
        """
        with _SigtermAsException():
            try:
                data = self._job.run(self.fn, self._describe, _date(date), scope, trigger, params, run_id)
            except Terminated:
                raise SystemExit(128 + _signal.SIGTERM) from None
        return Report(data)

    def explain(self, date: Any = None, *, scope: Optional[str] = None, params: Optional[Dict[str, Any]] = None) -> Explanation:
        """What a run would do now; nothing runs, nothing is claimed or recorded."""
        return Explanation(self._job.explain(self._describe, _date(date), scope, params))

    def __call__(self, run: Run) -> Any:
        return self.fn(run)

    def __repr__(self) -> str:
        return f"idem.Processor({self.name!r}, store={self.store!r})"


def processor(
    name: str,
    store: Store,
    *,
    time_window: Duration = None,
    content_hash: Duration = None,
    lease: Duration = None,
    on_in_progress: Optional[str] = None,
    wait: Duration = None,
    heartbeat: Optional[bool] = None,
    hash: Optional[str] = None,
    order: Optional[List[str]] = None,
    mode: Optional[str] = None,
    store_failure: Optional[str] = None,
    strict_recording: Optional[bool] = None,
    version: str = "",
    date: Optional[str] = None,
    timezone: Optional[str] = None,
) -> Callable[[Callable[[Run], Any]], Processor]:
    """Decorator making a function an idem processor named ``name`` on ``store``.

    The options are a job file's, with the same defaults: no time window, no content
    hash, a 10-minute lease, ``on_in_progress="skip"``, ``mode="enforce"``,
    ``store_failure="strict"``, ``hash="sha256"``.
    """

    def wrap(fn: Callable[[Run], Any]) -> Processor:
        return Processor(
            fn,
            name,
            store,
            time_window=time_window,
            content_hash=content_hash,
            lease=lease,
            on_in_progress=on_in_progress,
            wait=wait,
            heartbeat=heartbeat,
            hash=hash,
            order=order,
            mode=mode,
            store_failure=store_failure,
            strict_recording=strict_recording,
            version=version,
            date=date,
            timezone=timezone,
        )

    return wrap


def explain(proc: Processor, date: Any = None, *, scope: Optional[str] = None, params: Optional[Dict[str, Any]] = None) -> Explanation:
    """What ``proc.run(date)`` would do now (see :meth:`Processor.explain`)."""
    return proc.explain(date, scope=scope, params=params)
