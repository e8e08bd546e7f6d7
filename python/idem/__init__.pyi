"""Type stubs for idem (the package idem/ around the native module idem._idem)."""

import datetime
from typing import Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, TypeVar, Union

__version__: str

Duration = Union[str, int, float, datetime.timedelta, bool, None]
DateLike = Union[str, datetime.date, None]
Trigger = Literal["scheduler", "manual", "pubsub", "retry", "backfill"]
Event = Union[str, bytes, Mapping[str, Any]]

class IdemError(Exception): ...
class StoreError(IdemError): ...
class Terminated(BaseException): ...

class Store:
    @property
    def url(self) -> str: ...

def open_store(url: str, store_failure: Literal["strict", "best_effort"] = "strict") -> Store: ...
def scope_key(processor: str, scope: str) -> str: ...
def fingerprint(events: Iterable[Event]) -> str: ...

class Run:
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
    records: int
    output: Any
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
    @property
    def why(self) -> Optional[str]: ...
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
    @property
    def why(self) -> Optional[str]: ...
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

class Gate:
    def __init__(
        self,
        store: Store,
        namespace: str,
        key: Union[str, List[str]],
        *,
        fingerprint_fields: Optional[List[str]] = None,
        exclude_fields: Optional[List[str]] = None,
        normalize_amounts: Optional[List[str]] = None,
        ttl: str = "never",
        ttl_by_type: Optional[Dict[str, str]] = None,
        type_field: str = "event_type",
        strategy: Literal["strict", "best_effort", "log_only"] = "strict",
        pending_timeout: Optional[str] = None,
    ) -> None: ...
    @property
    def namespace(self) -> str: ...
    def check_and_mark(self, events: Iterable[Event]) -> List[Verdict]: ...
    def confirm(self, verdicts: Iterable[Verdict]) -> int:
        """With `pending_timeout`: confirms the pending marks of the new keys among
        `verdicts` (from this gate's `check_and_mark` calls), once their events are
        handled; how many keys were confirmed. 0 on a gate without pending marks."""
        ...
    def filter(self, events: Iterable[Event]) -> List[Event]:
        """The events that pass. Confirms nothing: with `pending_timeout`, use
        `check_and_mark` and `confirm`."""
        ...
    def stats(self) -> Dict[str, Any]: ...
