"""Type stubs for pyidem (the package pyidem/ around the native module pyidem._idem)."""

import datetime
from types import TracebackType
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterable,
    List,
    Literal,
    Mapping,
    NoReturn,
    Optional,
    Sequence,
    Type,
    TypedDict,
    TypeVar,
    Union,
)

from typing_extensions import ParamSpec, Self

__version__: str

Duration = Union[str, int, float, datetime.timedelta, bool, None]
DateLike = Union[str, datetime.date, None]
Trigger = Literal["scheduler", "manual", "pubsub", "retry", "backfill"]
Event = Union[str, bytes, Mapping[str, Any]]

class IdemError(Exception): ...
class StoreError(IdemError): ...
class Terminated(BaseException): ...

class RunFailed(IdemError):
    report: Report
    def __init__(self, report: Report) -> None: ...

class PayloadConflict(IdemError): ...
class OutputWarning(UserWarning): ...

class Store:
    @property
    def url(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    def runs(
        self,
        job: Optional[str] = None,
        *,
        scope: Optional[str] = None,
        status: Optional[Literal["completed", "skipped", "failed"]] = None,
        run_id: Optional[str] = None,
        limit: int = 100,
    ) -> List[RunRecord]: ...

def open_store(
    url: str,
    *,
    store_failure: Literal["strict", "best_effort"] = "strict",
    breaker_failures: int = 2,
    breaker_reset: Union[str, int, float, datetime.timedelta, None] = None,
) -> Store: ...
def scope_key(processor: str, scope: str) -> str: ...

class TradeEvent(TypedDict):
    """A trade event as `fingerprint` reads it (seed 000's fields, all required)."""

    timestamp: str
    account_id: str
    product_id: str
    side: str
    price: Union[str, int, float]
    quantity: int
    event_type: str

def fingerprint(events: Iterable[Union[str, bytes, TradeEvent]]) -> str:
    """The fingerprint of a set of trade events (JSON text or dicts with every
    `TradeEvent` field), as `idem fingerprint` computes it, whatever their order."""
    ...

class Run:
    # Made by pyidem for each run; not constructible.
    def __init__(self, _made_by_pyidem_only: NoReturn) -> None: ...
    @property
    def processor(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def date(self) -> datetime.date: ...
    @property
    def params(self) -> Dict[str, Any]: ...
    @property
    def run_id(self) -> str: ...
    @property
    def trigger(self) -> str: ...

class Outcome:
    @property
    def records(self) -> int: ...
    @property
    def output(self) -> Any: ...
    def __init__(self, records: int = 0, output: Any = None) -> None: ...

class Content:
    def __init__(
        self,
        entities: Optional[Iterable[Any]] = None,
        rows: Optional[Iterable[Mapping[str, Any]]] = None,
        checksum: Optional[str] = None,
        **fields: Any,
    ) -> None: ...
    def key(self, processor: str, scope: str, hash: Literal["sha256", "md5"] = "sha256", version: str = "") -> str: ...

class Report:
    run_id: str
    job: str
    scope: str
    trigger: str
    mode: str
    status: Literal["completed", "skipped", "failed"]
    skip_reason: Optional[str]
    would_skip_reason: Optional[str]
    previous_run: Optional[Dict[str, Any]]
    detail: Optional[str]
    records_processed: Optional[int]
    processing_key: Optional[str]
    output: Any
    error: Optional[str]
    guards: List[Dict[str, Any]]
    recorded: bool
    lease_lost: bool
    store_errors: List[str]
    recording_failed: bool
    spooled: bool
    started_at: str
    finished_at: str
    duration_ms: int
    def __init__(self, data: Mapping[str, Any]) -> None: ...
    @property
    def why(self) -> Optional[str]: ...
    @property
    def output_warning(self) -> Optional[str]: ...
    def raise_for_status(self) -> None: ...
    def as_dict(self) -> Dict[str, Any]: ...

class Explanation:
    job: str
    scope: str
    mode: str
    decision: Literal["run", "skip"]
    skip_reason: Optional[str]
    detail: Optional[str]
    previous_run: Optional[Dict[str, Any]]
    processing_key: Optional[str]
    guards: List[Dict[str, Any]]
    def __init__(self, data: Mapping[str, Any]) -> None: ...
    @property
    def why(self) -> Optional[str]: ...
    def as_dict(self) -> Dict[str, Any]: ...

class RunRecord:
    run_id: str
    job: str
    processor: str
    scope: str
    scope_date: str
    trigger: str
    mode: str
    status: Literal["completed", "skipped", "failed"]
    skip_reason: Optional[str]
    would_skip_reason: Optional[str]
    previous_run_id: Optional[str]
    records_processed: Optional[int]
    processing_key: Optional[str]
    output: Any
    error: Optional[str]
    started_at: str
    finished_at: str
    duration_ms: int
    def __init__(self, data: Mapping[str, Any]) -> None: ...
    def as_dict(self) -> Dict[str, Any]: ...

_D = TypeVar("_D", bound=Callable[[Run], Optional[Content]])

class Processor:
    name: str
    store: Store
    def describe(self, fn: _D) -> _D: ...
    def run(
        self,
        date: DateLike = None,
        *,
        scope: Optional[str] = None,
        trigger: Trigger = "manual",
        params: Optional[Mapping[str, Any]] = None,
        run_id: Optional[str] = None,
        raise_on_failure: bool = True,
    ) -> Report: ...
    def explain(self, date: DateLike = None, *, scope: Optional[str] = None, params: Optional[Mapping[str, Any]] = None) -> Explanation: ...
    def __call__(self, run: Run) -> Any: ...

def processor(
    name: str,
    store: Store,
    *,
    time_window: Duration = None,
    content_hash: Duration = None,
    lease: Duration = None,
    on_in_progress: Optional[Literal["skip", "wait"]] = None,
    wait: Duration = None,
    heartbeat: Optional[bool] = None,
    hash: Optional[Literal["sha256", "md5"]] = None,
    order: Optional[List[str]] = None,
    mode: Optional[Literal["enforce", "shadow", "off"]] = None,
    store_failure: Optional[Literal["strict", "best_effort"]] = None,
    strict_recording: Optional[bool] = None,
    version: str = "",
    date: Optional[str] = None,
    timezone: Optional[str] = None,
) -> Callable[[Callable[[Run], Union[Outcome, int, None]]], Processor]: ...

def explain(proc: Processor, date: DateLike = None, *, scope: Optional[str] = None, params: Optional[Mapping[str, Any]] = None) -> Explanation: ...

class Verdict:
    @property
    def verdict(self) -> Literal["new", "replay", "conflict", "invalid"]: ...
    @property
    def key(self) -> Optional[str]: ...
    @property
    def passes(self) -> bool: ...
    @property
    def verified(self) -> bool: ...
    @property
    def error(self) -> Optional[str]: ...
    @property
    def decision(self) -> Any:
        """For a replay: what `Gate.record` stored with the key, or None."""
        ...

class Gate:
    """An idempotency gate over one namespace of an event-key store (SQLite, Postgres,
    Redis, memory): what `idem gate` does, one batch per call."""

    def __init__(
        self,
        store: Store,
        namespace: str,
        key: Union[str, List[str]],
        *,
        fingerprint_fields: Optional[List[str]] = None,
        exclude_fields: Optional[List[str]] = None,
        normalize_amounts: Optional[List[str]] = None,
        ttl: Duration = "never",
        ttl_by_type: Optional[Mapping[str, Duration]] = None,
        type_field: str = "event_type",
        strategy: Literal["strict", "best_effort", "log_only"] = "strict",
        pending_timeout: Duration = None,
    ) -> None: ...
    @property
    def namespace(self) -> str: ...
    def check_and_mark(self, events: Iterable[Event]) -> List[Verdict]: ...
    def confirm(self, verdicts: Iterable[Verdict]) -> int:
        """With `pending_timeout`: confirms the pending marks of the new keys among
        `verdicts` (from this gate's `check_and_mark` calls), once their events are
        handled; how many keys were confirmed. 0 on a gate without pending marks."""
        ...
    def release(self, verdicts: Iterable[Verdict]) -> int:
        """Takes back the marks of the new keys among `verdicts`, when handling their
        events failed: their next delivery is `new` again. How many were taken back."""
        ...
    def batch(self, events: Iterable[Event]) -> ContextManager[List[Verdict]]:
        """`with gate.batch(events) as verdicts:` confirms on success, releases on an
        exception."""
        ...
    def record(self, verdict: Verdict, decision: Any) -> bool:
        """Stores a JSON `decision` with a new verdict's key: what its replays carry."""
        ...
    def filter(self, events: Iterable[Event]) -> List[Event]:
        """The events that pass. Confirms nothing: with `pending_timeout`, use
        `check_and_mark` and `confirm`."""
        ...
    def stats(self) -> Dict[str, Any]: ...

_P = ParamSpec("_P")
_R = TypeVar("_R")

def idempotent(
    store: Store,
    *,
    key: Union[str, Sequence[str], Callable[..., Any]],
    expires: Duration = "1h",
    validate: Union[bool, str, Sequence[str], Callable[..., Any]] = True,
    namespace: Optional[str] = None,
    timeout: Duration = "5m",
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """The function runs once per key; a later call with the key returns the first
    call's result (as JSON gives it back) without running it."""
    ...
