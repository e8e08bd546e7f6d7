"""pyidem: idem for Python, on the idem Rust core.

Processors: a function run per scope (usually a partition date) behind guards: a lease
(never twice at once), a time window (the same scope completed recently => skip) and a
content hash (the same content processed recently => skip). Every run is recorded in the
store's run ledger, the ledger ``idem run``, ``idem runs`` and ``idem report`` use, and
the keys are written only on success, byte-identical to the Rust library's.

    import pyidem
    store = pyidem.open_store("sqlite:///var/lib/idem/idem.db")

    @pyidem.processor("player_game_summary", store=store, time_window="1h", content_hash="24h")
    def summarize(run):
        rows = load(run.date)
        return pyidem.Outcome(records=len(rows), output={"players": len(rows)})

    report = summarize.run(date="2025-11-18", trigger="scheduler")

Events: ``pyidem.Gate`` (``idem gate``'s deduplication, batch by batch) and
``pyidem.idempotent`` (a function called once per key, its result returned again to
later calls with the same key).
"""

from __future__ import annotations

import datetime as _dt
import functools as _functools
import inspect as _inspect
import json as _json
import logging as _logging
import signal as _signal
import threading as _threading
import time as _time
import warnings as _warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, TypedDict, Union

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
    "OutputWarning",
    "PayloadConflict",
    "Processor",
    "Report",
    "Run",
    "RunFailed",
    "RunRecord",
    "Store",
    "StoreError",
    "Terminated",
    "TradeEvent",
    "Verdict",
    "explain",
    "fingerprint",
    "idempotent",
    "open_store",
    "processor",
    "scope_key",
]

# A library's logger stays quiet until the application configures logging.
_logging.getLogger("pyidem").addHandler(_logging.NullHandler())

Duration = Union[str, int, float, _dt.timedelta, bool, None]


class TradeEvent(TypedDict):
    """A trade event as :func:`fingerprint` reads it (seed 000's fields, all required)."""

    timestamp: str
    account_id: str
    product_id: str
    side: str
    price: Union[str, int, float]
    quantity: int
    event_type: str


class RunFailed(IdemError):
    """A run that failed without a Python exception to raise (``report.raise_for_status()``,
    or a failure of the run itself, such as a lost lease). ``.report`` is the run's report."""

    def __init__(self, report: "Report"):
        self.report = report
        super().__init__(f"{report.job} for {report.scope} failed: {report.error}")

    def __reduce__(self) -> Any:
        return (type(self), (self.report,))


class PayloadConflict(IdemError):
    """``pyidem.idempotent``: a call with a key seen before but other arguments."""


class OutputWarning(UserWarning):
    """A body's output (or an idempotent function's result) that JSON cannot hold: the
    run completes and is recorded without it, and this warning names the value."""


def _duration(value: Duration, what: str) -> Optional[str]:
    """A duration as the job files spell it: ``"1h"``, ``"90s"``, ``"off"``."""
    if value is None:
        return None
    if value is False:
        return "off"
    if value is True:
        raise TypeError(f"{what}: give a duration (\"1h\", seconds or a datetime.timedelta), not True")
    if isinstance(value, _dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{what}={value!r}: give a finite number of seconds")
        if value <= 0:
            return "off"
        millis = round(value * 1000)
        return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"
    if isinstance(value, str):
        return value
    raise TypeError(
        f"{what}: give a duration (\"1h\", seconds or a datetime.timedelta), not {type(value).__name__}"
    )


def _date(value: Any) -> Optional[str]:
    """The run's date: a ``datetime`` gives its date in its own zone (an aware one keeps
    its zone: 23:30 at UTC-8 is that day, not the next day's UTC date)."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        return value.date().isoformat()
    if isinstance(value, _dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return value
    raise TypeError(f"date: give \"YYYY-MM-DD\", a datetime.date or an expression such as \"yesterday\", not {type(value).__name__}")


class _Result:
    """A plain value from the core's dict, read as attributes: immutable, comparable,
    picklable and copyable (a worker process may return one)."""

    __slots__ = ("_data",)
    _fields: tuple = ()

    def __init__(self, data: Dict[str, Any]):
        object.__setattr__(self, "_data", dict(data))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __reduce__(self) -> Any:
        return (type(self), (self._data,))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._data == other._data  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self._data))

    def as_dict(self) -> Dict[str, Any]:
        """Everything, as ``idem run --json`` prints it."""
        return dict(self._data)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={getattr(self, k)!r}" for k in self._fields if getattr(self, k, None) is not None
        )
        return f"pyidem.{type(self).__name__}({shown})"


class Report(_Result):
    """The result of one run: ``status`` (completed, skipped, failed), ``skip_reason``
    (time_window, duplicate_content_hash, in_progress), ``why`` (the sentence saying which
    guard, which earlier run and when), ``output`` (on a skip: the output of the run that
    made it skip), ``run_id``, ``error``, ``processing_key``..."""

    __slots__ = ()
    _fields = ("job", "scope", "status", "skip_reason", "would_skip_reason", "why", "run_id", "error")

    @property
    def why(self) -> Optional[str]:
        return self._data.get("detail")

    @property
    def output_warning(self) -> Optional[str]:
        """Why the body's output was not kept (not JSON), or ``None``."""
        return self._data.get("output_warning")

    def raise_for_status(self) -> None:
        """Raises :class:`RunFailed` when the run failed."""
        if self._data.get("status") == "failed":
            raise RunFailed(self)


class Explanation(_Result):
    """What a run would do now: ``decision`` (run or skip), ``skip_reason``, ``why``,
    ``guards`` (every guard's verdict), ``processing_key``."""

    __slots__ = ()
    _fields = ("job", "scope", "decision", "skip_reason", "why")

    @property
    def why(self) -> Optional[str]:
        return self._data.get("detail")


class RunRecord(_Result):
    """A row of the run ledger (``Store.runs``): ``run_id``, ``job``, ``scope``,
    ``status``, ``output``, ``error``, ``started_at``, ``finished_at``..."""

    __slots__ = ()
    _fields = ("job", "scope", "status", "run_id", "started_at")


def _main_thread() -> bool:
    return _threading.current_thread() is _threading.main_thread()


class _SigtermAsException:
    """For the run's duration, SIGTERM raises ``pyidem.Terminated`` in the main thread
    (when nothing else handles SIGTERM), so the run is recorded as interrupted and its
    lease released, as ``idem run`` does."""

    def __enter__(self) -> "_SigtermAsException":
        self.previous: Any = None
        if _main_thread() and _signal.getsignal(_signal.SIGTERM) in (_signal.SIG_DFL, None):

            def handler(signum: int, frame: Any) -> None:
                raise Terminated("SIGTERM")

            self.previous = _signal.signal(_signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.previous is not None:
            _signal.signal(_signal.SIGTERM, self.previous)
        return False


class Processor:
    """A Python function run per scope behind idem's guards (made by :func:`processor`)."""

    def __init__(self, fn: Callable[[Run], Any], name: str, store: Store, **config: Any):
        if _inspect.iscoroutinefunction(fn) or _inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"pyidem.processor({name!r}): async def bodies are not supported; "
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
            raise TypeError(f"pyidem.processor: unknown option(s) {', '.join(sorted(config))}")
        self._job = _idem.NativeJob(name, store, guards, settings, version)
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__

    def describe(self, fn: Callable[[Run], Optional[Content]]) -> Callable[[Run], Optional[Content]]:
        """Decorator: the content the content hash guard compares (``pyidem.Content``)."""
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
        raise_on_failure: bool = True,
    ) -> Report:
        """Runs the body for ``date`` behind the guards and records the run.

        An exception in the body fails the run: it is recorded (the traceback's last lines
        are the ledger's error, no key is written, so a retry runs) and its lease released,
        then the exception itself is raised again, with its traceback. With
        ``raise_on_failure=False`` the report says ``failed`` instead (a ``BaseException``
        such as ``SystemExit`` is raised all the same). A run that fails without an
        exception of the body's (a lost lease) raises :class:`RunFailed`.

        ``KeyboardInterrupt`` or SIGTERM during the run records it as interrupted,
        releases the lease and is raised again (SIGTERM as ``SystemExit(143)``).

        On a skip by the time window or the content hash, ``report.output`` is the output
        of the run that made it skip.
        """
        with _SigtermAsException():
            try:
                data = self._job.run(
                    self.fn, self._describe, _date(date), scope, trigger, params, run_id, raise_on_failure
                )
            except Terminated:
                raise SystemExit(128 + _signal.SIGTERM) from None
        report = Report(data)
        if report.output_warning:
            _warnings.warn(f"{self.name}: {report.output_warning}", OutputWarning, stacklevel=2)
        if raise_on_failure:
            report.raise_for_status()
        return report

    def explain(self, date: Any = None, *, scope: Optional[str] = None, params: Optional[Dict[str, Any]] = None) -> Explanation:
        """What a run would do now; nothing runs, nothing is claimed or recorded."""
        return Explanation(self._job.explain(self._describe, _date(date), scope, params))

    def __call__(self, run: Run) -> Any:
        return self.fn(run)

    def __repr__(self) -> str:
        return f"pyidem.Processor({self.name!r}, store={self.store!r})"


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
    """Decorator making a function a processor named ``name`` on ``store``.

    The options are a job file's, with the same defaults: no time window, no content
    hash, a 1-hour lease (renewed by the heartbeat while the body runs),
    ``on_in_progress="skip"``, ``mode="enforce"``, ``store_failure="strict"``,
    ``hash="sha256"``.
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


# --- idempotent functions ---------------------------------------------------------------

_RESULT = "idem_result"
_UNKEPT = "idem_unkept"
_NO_PAYLOAD = object()


def _lookup(bound: Dict[str, Any], path: str) -> Any:
    """``order.id``: the argument ``order``, then its item or attribute ``id``."""
    head, *rest = path.split(".")
    if head not in bound:
        raise TypeError(f"no argument named {head!r} (the arguments: {', '.join(bound)})")
    value = bound[head]
    for part in rest:
        if isinstance(value, dict):
            if part not in value:
                raise KeyError(f"{path}: {part!r} is not in the argument")
            value = value[part]
        else:
            value = getattr(value, part)
    return value


def _key_text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        raise ValueError(f"key {what}: {value!r} cannot name a call (give a str or an int)")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, _dt.date):
        return value.isoformat()
    return _json.dumps(value, sort_keys=True, separators=(",", ":"))


class _Idempotent:
    """A function called at most once per key (see :func:`idempotent`)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        store: Store,
        key: Union[str, Sequence[str], Callable[..., Any]],
        namespace: Optional[str],
        expires: Duration,
        validate: Union[bool, str, Sequence[str], Callable[..., Any]],
        timeout: Duration,
    ):
        if _inspect.iscoroutinefunction(fn):
            raise TypeError("pyidem.idempotent: async def functions are not supported")
        self.fn = fn
        self._signature = _inspect.signature(fn)
        self._key = key
        self._fields = [key] if isinstance(key, str) else (None if callable(key) else list(key))
        if self._fields is not None and (not self._fields or not all(isinstance(f, str) and f for f in self._fields)):
            raise ValueError("pyidem.idempotent: key= is an argument name, a list of them, or a callable")
        self._validate = validate
        if timeout is None or isinstance(timeout, bool):
            raise TypeError("timeout: give a duration (\"5m\", seconds or a datetime.timedelta)")
        self.namespace = namespace or f"{fn.__module__}.{fn.__qualname__}"
        self.gate = Gate(store, self.namespace, "k", ttl=expires, pending_timeout=timeout)
        _functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        # As a method: bound to the instance, like the function it wraps.
        return self if obj is None else _functools.partial(self, obj)

    def _arguments(self, args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def key_of(self, *args: Any, **kwargs: Any) -> str:
        """The key a call with these arguments has."""
        return self._key_and_payload(args, kwargs, with_payload=False)[0]

    def _key_and_payload(self, args: tuple, kwargs: Dict[str, Any], with_payload: bool = True) -> "tuple[str, Any]":
        """The call's key and the payload a later call with the key must repeat (the
        arguments bound once for both)."""
        v = self._validate if with_payload else False
        bound: Optional[Dict[str, Any]] = None
        if self._fields is not None or v is True or not (v is False or callable(v)):
            bound = self._arguments(args, kwargs)
        if self._fields is None:
            key = _key_text(self._key(*args, **kwargs), "(from the key function)")  # type: ignore[operator]
        else:
            key = ":".join(_key_text(_lookup(bound, f), f) for f in self._fields)  # type: ignore[arg-type]
        if v is False:
            return key, _NO_PAYLOAD
        if v is True:
            return key, {k: a for k, a in bound.items() if k not in ("self", "cls")}  # type: ignore[union-attr]
        if callable(v):
            return key, v(*args, **kwargs)
        fields = [v] if isinstance(v, str) else list(v)
        return key, {f: _lookup(bound, f) for f in fields}  # type: ignore[arg-type]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, payload = self._key_and_payload(args, kwargs)
        event: Dict[str, Any] = {"k": key}
        if payload is not _NO_PAYLOAD:
            event["p"] = payload
        try:
            _json.dumps(event, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"{self.namespace}: the arguments compared between calls with one key are not JSON ({e}); "
                "name the ones to compare with validate=[...], or validate=False"
            ) from None
        pause = 0.01
        while True:
            (verdict,) = self.gate.check_and_mark([event])
            if verdict.verdict == "new":
                return self._first(verdict, args, kwargs)
            if verdict.verdict == "conflict":
                raise PayloadConflict(
                    f"{self.namespace}: key {key!r} was called before with other arguments"
                )
            if verdict.verdict != "replay":
                raise IdemError(f"{self.namespace}: {verdict.error or verdict.verdict}")
            decision = verdict.decision
            if isinstance(decision, dict) and _RESULT in decision:
                if decision.get(_UNKEPT):
                    _warnings.warn(
                        f"{self.namespace}: key {key!r}: the first call's result was not kept "
                        f"({decision[_UNKEPT]}); returning None",
                        OutputWarning,
                        stacklevel=2,
                    )
                return decision[_RESULT]
            # Marked, its result not recorded yet: the first call is still running (in this
            # process; another process's call is waited for inside check_and_mark), or
            # between its confirmation and its record. Asked again until it is recorded,
            # or released (then this call runs), or its mark expires (`timeout`).
            _time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _first(self, verdict: Verdict, args: tuple, kwargs: Dict[str, Any]) -> Any:
        try:
            result = self.fn(*args, **kwargs)
        except BaseException:
            # Not done: the next call with this key runs it.
            self.gate.release([verdict])
            raise
        self.gate.confirm([verdict])
        try:
            self.gate.record(verdict, {_RESULT: result})
        except (TypeError, ValueError) as e:
            self.gate.record(verdict, {_RESULT: None, _UNKEPT: str(e)})
            _warnings.warn(
                f"{self.namespace}: {e}; later calls with key {verdict.key!r} return None",
                OutputWarning,
                stacklevel=3,
            )
        return result

    def __repr__(self) -> str:
        return f"pyidem.idempotent({self.fn.__qualname__}, namespace={self.namespace!r})"


def idempotent(
    store: Store,
    *,
    key: Union[str, Sequence[str], Callable[..., Any]],
    expires: Duration = "1h",
    validate: Union[bool, str, Sequence[str], Callable[..., Any]] = True,
    namespace: Optional[str] = None,
    timeout: Duration = "5m",
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: the function runs once per key; a later call with the same key returns
    the first call's result (as JSON gives it back) without running it.

    ``key``: the argument whose value names the call (``"order_id"``, a dotted path
    ``"order.id"`` into a dict or an object), several (joined with ``:``), or a callable
    taking the call's arguments. ``expires``: how long a key is remembered (``None``:
    always). ``validate``: which arguments must be the same in a later call with the key
    (all, by default; names, a callable, or ``False``): other ones raise
    :class:`PayloadConflict`. An exception in the function releases the key (the next
    call runs it). A call made while another with the same key runs waits for its result;
    ``timeout`` is how long a call may hold its key unfinished (its process may have died)
    before another runs it. The store: SQLite, Postgres, Redis or memory.
    """

    def wrap(fn: Callable[..., Any]) -> Any:
        return _Idempotent(fn, store, key, namespace, expires, validate, timeout)

    return wrap
