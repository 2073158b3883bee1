"""The command gateway: validate, load, handle, append, dispatch, wait.

::

    from wow_django.application import WaitStage, send

    result = send(PlaceOrder(customer_id="c-1", amount=10),
                                request_id="client-req-1", wait=WaitStage.PROJECTED)
    result.aggregate_id, result.aggregate_version

``send`` raises a :class:`~wow_django.exceptions.CommandError` subclass (or
``EventVersionConflict`` once retries are exhausted) when the command is
refused; nothing is appended then. A repeated request id returns the first
result with ``duplicate=True`` and appends nothing. ``expected_version=N``
(Wow's ``Command-Aggregate-Version``) refuses the command with
``CommandExpectVersionConflict`` unless the aggregate is at version N (0: it
does not exist yet).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import logging
import random
import re
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from wow_django.application.command_status import STATUS_STORE_NAME, CommandStatusBook
from wow_django.application.followers import STAGE_KINDS, Progress, ProjectionWaiter, stage_followers
from wow_django.application.ports import TaskQueue
from wow_django.application.projections import BY_FOLLOWER, COMPLETED, Dispatcher, Job, Tracker
from wow_django.application.repository import (
    OPERATOR_HEADER,
    AggregateRepository,
    apply_stream,
    encode_events,
    snapshot_of,
)
from wow_django.application.snapshotting import SNAPSHOT_FOLLOWER, should_snapshot
from wow_django.domain.aggregate import Aggregate, CommandContext, aggregate_for_command, aggregate_type
from wow_django.domain.ids import generate_id
from wow_django.domain.messages import (
    AggregateDeleted,
    AggregateRecovered,
    Command,
    DeleteAggregate,
    Event,
    RecoverAggregate,
    command_type,
)
from wow_django.domain.values import NUL_RULE, nul_path
from wow_django.exceptions import (
    AggregateIsDeleted,
    AggregateNotFound,
    CommandError,
    CommandExpectVersionConflict,
    CommandValidationError,
    DomainError,
    DuplicateAggregateId,
    DuplicateRequestId,
    EventStoreError,
    EventVersionConflict,
    NotAggregateOwner,
    RecoverableStoreError,
    RequestIdReused,
    StoreUnreachable,
    UnknownAggregate,
    UnknownCommand,
)
from wow_django.persistence.contracts import EventStore, PrepareKey, SnapshotStore
from wow_django.persistence.records import DEFAULT_TENANT_ID, MAX_VERSION, AggregateId, EventStream, now_ms

logger = logging.getLogger("wow_django.application.gateway")

MAX_ID_LENGTH = 128


@functools.cache
def printable_characters() -> str:
    """A regular-expression character class body (no brackets) of the printable characters: those of the Basic
    Multilingual Plane that ``str.isprintable`` accepts (no control, format, separator, surrogate, private-use or
    unassigned character; the ASCII space is printable). Written with ``\\u`` escapes of four hex digits only, so Python,
    ECMAScript (OpenAPI's pattern dialect) and Rust read it alike."""
    parts, start = [], None
    for code in range(0x10001):
        printable = code < 0x10000 and chr(code).isprintable()
        if printable and start is None:
            start = code
        elif not printable and start is not None:
            end = code - 1
            parts.append(f"\\u{start:04x}" if start == end else f"\\u{start:04x}-\\u{end:04x}")
            start = None
    return "".join(parts)


@functools.cache
def id_pattern() -> str:
    """The pattern of every id a client gives (aggregate, request, tenant): :data:`ID_RULE`."""
    return f"^[{printable_characters()}]{{1,{MAX_ID_LENGTH}}}$"


@functools.cache
def _id_re() -> re.Pattern:
    return re.compile(f"[{printable_characters()}]{{1,{MAX_ID_LENGTH}}}")


ID_RULE = (f"a printable string of 1 to {MAX_ID_LENGTH} characters of the Basic Multilingual Plane (no control, "
           "format, separator or private-use character)")


class WaitStage(enum.StrEnum):
    """How far the gateway goes before it returns."""

    SENT = "SENT"  # handed to the task queue (a Celery task by default)
    PROCESSED = "PROCESSED"  # events appended
    SNAPSHOT = "SNAPSHOT"  # snapshot step done (saved, queued or not due)
    PROJECTED = "PROJECTED"  # the aggregate's projection followers passed the stream (not event processors)
    EVENT_HANDLED = "EVENT_HANDLED"  # the aggregate's event processors passed the stream
    SAGA_HANDLED = "SAGA_HANDLED"  # the @follower followers (process managers) taking the stream passed it

    @classmethod
    def parse(cls, value: str | WaitStage | None, name: str = "wait") -> WaitStage:
        """The stage ``value`` names (any case); None or "" is PROCESSED. ``name`` is what a refusal names."""
        if value is None or value == "":
            return cls.PROCESSED
        if isinstance(value, WaitStage):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            shown = repr(value) if len(str(value)) <= 40 else f"{str(value)[:40]!r}…"
            raise CommandValidationError(
                f"wait stage {shown} is not one of {allowed}",
                [{"name": name, "msg": f"must be one of {allowed}"}],
            ) from None


#: The stages a wait function (``Command-Wait-Processor``/``-Function``) narrows: each waits for followers.
HANDLER_STAGES = (WaitStage.PROJECTED, WaitStage.EVENT_HANDLED, WaitStage.SAGA_HANDLED)


def stage_path(stage: WaitStage) -> list[WaitStage]:
    """The stages a command reaches on its way to ``stage`` (what a server-sent stream shows, one event each):
    SNAPSHOT comes before PROJECTED; EVENT_HANDLED and SAGA_HANDLED come right after PROCESSED."""
    if stage is WaitStage.SENT:
        return [WaitStage.SENT]
    if stage is WaitStage.PROJECTED:
        return [WaitStage.PROCESSED, WaitStage.SNAPSHOT, WaitStage.PROJECTED]
    if stage is WaitStage.PROCESSED:
        return [WaitStage.PROCESSED]
    return [WaitStage.PROCESSED, stage]


@dataclass(frozen=True)
class WaitFunction:
    """Which followers a handler stage waits for (Wow's ``Command-Wait-Context``, ``-Processor`` and
    ``-Function``): the follower named ``processor``, those whose function is named ``function``; ``""`` for
    any. ``context`` must be this service's context (or be empty): a service waits for its own followers."""

    context: str = ""
    processor: str = ""
    function: str = ""

    def __bool__(self) -> bool:
        return bool(self.processor or self.function)


#: The argument names :func:`check_wait_function` names in its refusals (the HTTP API names its headers).
WAIT_FUNCTION_FIELDS = {"context": "wait_for.context", "processor": "wait_for.processor",
                        "function": "wait_for.function"}


def check_wait_function(aggregate_name: str, stage: WaitStage, only: WaitFunction, context_name: str, *,
                        fields: dict[str, str] | None = None, aliases: tuple[str, ...] = ()) -> WaitFunction:
    """``only`` if it can narrow ``stage`` of a command of ``aggregate_name`` in context ``context_name``
    (or one of its ``aliases``); else ``CommandValidationError`` naming the field (``fields`` maps
    context/processor/function to the names shown)."""
    names = {**WAIT_FUNCTION_FIELDS, **(fields or {})}
    for part in ("context", "processor", "function"):
        value = getattr(only, part)
        if not isinstance(value, str) or (value and not _id_re().fullmatch(value)):
            rule = f"must be {ID_RULE}"
            raise CommandValidationError(f"{names[part]} {rule}", [{"name": names[part], "msg": rule}])
    if only.context and only.context != context_name and only.context not in aliases:
        rule = (f"must be this service's context {context_name!r} (or be left out): a command waits for the "
                "followers of its own service")
        raise CommandValidationError(f"{names['context']} {only.context!r} {rule}",
                                     [{"name": names["context"], "msg": rule}])
    if not only:
        return only
    part = "processor" if only.processor else "function"
    if stage not in HANDLER_STAGES:
        rule = "narrows the stages " + ", ".join(s.value for s in HANDLER_STAGES) + f" only, not {stage.value}"
        raise CommandValidationError(f"{names[part]} {rule}", [{"name": names[part], "msg": rule}])
    if not stage_followers(stage.value, aggregate_name, processor=only.processor, function=only.function):
        known = stage_followers(stage.value, aggregate_name)
        kind = {"projection": "projection", "processor": "event processor",
                "follower": "follower declared with @follower"}[STAGE_KINDS[stage.value]]
        rule = (f"must name {'an' if kind[0] in 'aeiou' else 'a'} {kind} taking {aggregate_name!r}" + (
            f" ({', '.join(known[:10])}{', …' if len(known) > 10 else ''})" if known else "; it has none")
            + (" whose function is " + repr(only.function) if only.function else ""))
        raise CommandValidationError(f"{names[part]} {getattr(only, part)!r} {rule}",
                                     [{"name": names[part], "msg": rule}])
    return only


@dataclass(frozen=True)
class CommandResult:
    command_id: str
    request_id: str
    aggregate_name: str
    aggregate_id: str
    tenant_id: str
    aggregate_version: int | None
    stage: WaitStage
    events: tuple[str, ...] = ()
    duplicate: bool = False
    error_code: str = "Ok"
    error_msg: str = ""
    binding_errors: tuple[dict, ...] = ()
    #: Wow's fields: the bounded context, the command (its handler is the ``function``), when the result was
    #: signalled (epoch ms) and the signal's own id.
    context_name: str = ""
    command_name: str = ""
    signal_time: int = 0
    signal_id: str = ""

    @property
    def succeeded(self) -> bool:
        return self.error_code == "Ok"

    @property
    def function(self) -> dict:
        """Wow's ``FunctionInfo`` of what produced this result: the aggregate's handler of the command."""
        return {"functionKind": "COMMAND", "contextName": self.context_name, "processorName": self.aggregate_name,
                "name": self.command_name}

    @classmethod
    def from_json(cls, data: dict) -> CommandResult:
        """The result :meth:`to_json` gave."""
        return cls(
            command_id=data["commandId"], request_id=data["requestId"], aggregate_name=data["aggregateName"],
            aggregate_id=data["aggregateId"], tenant_id=data["tenantId"], aggregate_version=data["aggregateVersion"],
            stage=WaitStage(data["stage"]), events=tuple(data.get("events") or ()),
            duplicate=bool(data.get("duplicate")), error_code=data.get("errorCode", "Ok"),
            error_msg=data.get("errorMsg", ""), binding_errors=tuple(data.get("bindingErrors") or ()),
            context_name=data.get("contextName", ""), command_name=(data.get("function") or {}).get("name", ""),
            # to_json shows the command id where a result has no signal id of its own: read back as none.
            signal_time=data.get("signalTime", 0),
            signal_id="" if data.get("id") == data["commandId"] else data.get("id", ""),
        )

    def to_json(self) -> dict:
        """As Wow's ``CommandResult`` (``id``, ``waitCommandId``, ``contextName``, ``function``, ``result``,
        ``signalTime``, ``succeeded`` too) with wow_django's ``events`` and ``duplicate``."""
        return {
            "id": self.signal_id or self.command_id,
            "waitCommandId": self.command_id,
            "contextName": self.context_name,
            "function": self.function,
            "result": {},
            "signalTime": self.signal_time,
            "succeeded": self.succeeded,
            "commandId": self.command_id,
            "requestId": self.request_id,
            "aggregateName": self.aggregate_name,
            "aggregateId": self.aggregate_id,
            "tenantId": self.tenant_id,
            "aggregateVersion": self.aggregate_version,
            "stage": self.stage.value,
            "events": list(self.events),
            "duplicate": self.duplicate,
            "errorCode": self.error_code,
            "errorMsg": self.error_msg,
            "bindingErrors": list(self.binding_errors),
        }


@dataclass(frozen=True)
class CommandMessage:
    """A command with its routing and identity: what the task queue carries."""

    aggregate_name: str
    command_name: str
    body: dict
    aggregate_id: str
    request_id: str
    command_id: str
    request_id_given: bool
    tenant_id: str = DEFAULT_TENANT_ID
    owner_id: str = ""
    operator: str = ""
    header: dict = field(default_factory=dict)
    #: The version the aggregate must be at (0: not created yet), or None for any.
    expected_version: int | None = None
    #: Refuse the command (NotAggregateOwner) when the aggregate has an owner other than ``owner_id``.
    owner_only: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CommandMessage:
        return cls(**data)


def is_valid_id(value: Any) -> bool:
    """Whether ``value`` can be an id (aggregate, request, tenant): :data:`ID_RULE`, the pattern
    :func:`id_pattern` the OpenAPI schema gives."""
    return isinstance(value, str) and _id_re().fullmatch(value) is not None


def _check_id(value: Any, name: str) -> str:
    if not is_valid_id(value):
        shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else \
            f"{value[:40]!r}… ({len(value)} characters)"
        raise CommandValidationError(f"{name} must be {ID_RULE}, got {shown}", [{"name": name, "msg": f"must be {ID_RULE}"}])
    return value


def _command_type(name: str) -> type[Command]:
    """The command class declared under ``name``; ``UnknownCommand`` when there is none."""
    command_cls = command_type(name)
    if command_cls is None:
        raise UnknownCommand(f"There is no command named {name!r}.")
    return command_cls


def check_expected_version(value: Any, name: str = "expected_version") -> int | None:
    """``value`` if it can be an expected aggregate version (a whole number from 0 to MAX_VERSION), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_VERSION:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}…"
        rule = f"must be a whole number from 0 (not created yet) to {MAX_VERSION}"
        raise CommandValidationError(f"{name} {rule}, got {shown}", [{"name": name, "msg": rule}])
    return value


#: The stream header key of :func:`command_digest`: what a repeated request id is compared with.
COMMAND_DIGEST = "commandDigest"
#: Marks a recorded status as a business rule's refusal (replayed to the same request, see ``_recorded_refusal``).
REFUSAL = "refusal"


def command_digest(message: CommandMessage) -> str:
    """A fingerprint of what a request asked: its command and validated body (canonical JSON, SHA-256)."""
    canonical = json.dumps({"command": message.command_name, "body": message.body}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def derived_aggregate_id(aggregate_name: str, tenant_id: str, request_id: str) -> str:
    """The id a create command gets from its tenant and request id, so a retried create is recognised.

    The tenant is part of it: two tenants using one request id create two aggregates.
    """
    return hashlib.sha256(f"{aggregate_name}\0{tenant_id}\0{request_id}".encode()).hexdigest()[:32]


class CommandGateway:
    def __init__(
        self,
        event_store: EventStore,
        snapshot_store: SnapshotStore | None,
        *,
        context_name: str,
        prepare_keys: Callable[[str], PrepareKey] | None = None,
        tasks: Callable[[], TaskQueue] | None = None,
        dispatcher: Dispatcher | None = None,
        projections: ProjectionWaiter | None = None,
        before_send: Callable[[], None] | None = None,
        after_append: Callable[[], None] | None = None,
        retry_limit: int = 8,
        retry_backoff_ms: float = 5.0,
        wait_timeout_s: float = 30.0,
        storage_timeout_s: float | None = 10.0,
        snapshot_strategy: str = "all",
        snapshot_version_offset: int = 5,
        snapshot_time_offset_s: float = 60.0,
        snapshot_mode: str = "inline",
        status_ttl_s: float = 7 * 24 * 3600,
        hurry: Callable[[str], None] | None = None,
    ):
        self.event_store = event_store
        self.snapshot_store = snapshot_store
        self.context_name = context_name
        self.repository = AggregateRepository(event_store, snapshot_store, context_name)
        self.prepare_keys = prepare_keys
        self.status_ttl_s = status_ttl_s
        self._tasks = tasks
        if dispatcher is None:
            dispatcher = Dispatcher(
                save_snapshot=snapshot_store.save if snapshot_store is not None else None,
                queue_snapshot=self._queue_snapshot,
            )
        self.dispatcher = dispatcher
        #: PROJECTED waits with it for the projection followers (None: this gateway runs no projections).
        self.projections = projections
        #: Called before each command is processed (the runtime starts this process's follower threads).
        self.before_send = before_send
        #: Called in the sending thread after each append, before waiting (the runtime's inline mode runs
        #: this process's followers there); its failure is logged, never the command's.
        self.after_append = after_append
        self.retry_limit = retry_limit
        self.retry_backoff_ms = retry_backoff_ms
        self.wait_timeout_s = wait_timeout_s
        #: One attempt's storage work ends within this (EventStore.deadline), and no retry starts past it.
        self.storage_timeout_s = storage_timeout_s
        self.snapshot_strategy = snapshot_strategy if snapshot_store is not None else "none"
        self.snapshot_version_offset = snapshot_version_offset
        self.snapshot_time_offset_s = snapshot_time_offset_s
        self.snapshot_mode = snapshot_mode
        if snapshot_mode == "follower" and projections is None and self.snapshot_strategy != "none":
            raise ValueError("snapshot_mode='follower' needs a waiter (projections=) for the SNAPSHOT stage: without "
                             "one a SNAPSHOT answer would not mean that the snapshot is stored")
        #: Hurries this process's runner of a follower a SNAPSHOT wait waits for (the runtime's threads).
        self.hurry = hurry
        self._locks: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()
        #: The dispatch tracker of each command of this process whose snapshot step is still pending
        #: (SNAPSHOT_MODE "inline" or "celery"), by command id: a repeat of the request (the server-sent
        #: stream's next stage) waits for that step as the first request would have. A tracker leaves when
        #: its job is done and dropped.
        self._trackers: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    # --- entry points ------------------------------------------------------------

    def send(
        self,
        command: Command,
        *,
        aggregate: str | type[Aggregate] | None = None,
        aggregate_id: str | None = None,
        request_id: str | None = None,
        tenant_id: str | None = None,
        owner_id: str = "",
        operator: str = "",
        header: dict | None = None,
        wait: WaitStage | str = WaitStage.PROCESSED,
        timeout: float | None = None,
        expected_version: int | None = None,
        owner_only: bool = False,
        wait_for: WaitFunction | None = None,
    ) -> CommandResult:
        """Send ``command``; ``wait_for`` narrows a handler stage (PROJECTED, EVENT_HANDLED, SAGA_HANDLED) to
        some of its followers (:class:`WaitFunction`); ``expected_version=N`` refuses it (``CommandExpectVersionConflict``, nothing
        appended) unless the aggregate is at version N, 0 meaning not created yet; ``owner_only`` refuses it
        (``NotAggregateOwner``, nothing appended) when the aggregate has an owner other than ``owner_id``,
        checked under the aggregate's lock when the command runs (queued ones too)."""
        if not isinstance(command, Command):
            raise TypeError(f"send() takes a Command instance, got {type(command).__name__}")
        cls = self._aggregate_for(command.command_name, aggregate)
        message = self._message(cls, command.command_name, command.model_dump(mode="json"), aggregate_id,
                                request_id, tenant_id, owner_id, operator, header, expected_version, owner_only)
        stage = WaitStage.parse(wait)
        return self._send(cls, command, message, stage, timeout, self._wait_for(cls, stage, wait_for))

    def send_json(
        self,
        aggregate_name: str,
        command_name: str,
        body: Any,
        *,
        aggregate_id: str | None = None,
        request_id: str | None = None,
        tenant_id: str | None = None,
        owner_id: str = "",
        operator: str = "",
        header: dict | None = None,
        wait: WaitStage | str = WaitStage.PROCESSED,
        timeout: float | None = None,
        expected_version: int | None = None,
        owner_only: bool = False,
        wait_for: WaitFunction | None = None,
    ) -> CommandResult:
        """Like :meth:`send` for a command given by name with a JSON body (validated here)."""
        cls = self._aggregate_for(command_name, aggregate_name)
        command = _command_type(command_name).from_json(body if body is not None else {})
        message = self._message(cls, command_name, command.model_dump(mode="json"), aggregate_id, request_id,
                                tenant_id, owner_id, operator, header, expected_version, owner_only)
        stage = WaitStage.parse(wait)
        return self._send(cls, command, message, stage, timeout, self._wait_for(cls, stage, wait_for))

    def _wait_for(self, cls: type[Aggregate], stage: WaitStage, wait_for: WaitFunction | None) -> WaitFunction:
        if wait_for is None:
            return WaitFunction()
        if not isinstance(wait_for, WaitFunction):
            raise TypeError(f"wait_for takes a WaitFunction, got {type(wait_for).__name__}")
        return check_wait_function(cls.aggregate_name, stage, wait_for, self.context_name)

    def process_message(self, message: CommandMessage, wait: WaitStage = WaitStage.PROJECTED,
                        timeout: float | None = None) -> CommandResult:
        """Process a message queued with stage SENT (the queued task's entry point).

        Its outcome, refusals included, is recorded for :meth:`status` before it is returned (or raised).
        """
        try:
            cls = self._aggregate_for(message.command_name, message.aggregate_name)
            _refuse_nul(message.body, message.operator, message.owner_id, message.header)
            command = _command_type(message.command_name).from_json(message.body)
            result = self._process(cls, command, message, wait, timeout)
        except RequestIdReused:
            raise  # about another request than the one recorded under this id: its record stands
        except (CommandError, EventVersionConflict) as exc:
            if getattr(exc, "refusal_kept", False):
                raise  # _process kept it as a refusal the same request gets again
            self._record_status(self._result(
                message, None, WaitStage.PROCESSED, error_code=exc.error_code, error_msg=str(exc),
                binding_errors=tuple(getattr(exc, "binding_errors", ()) or ())))
            raise
        self._record_status(result)
        return result

    def status(self, aggregate: str | type[Aggregate], request_id: str, *, tenant_id: str = DEFAULT_TENANT_ID,
               aggregate_id: str | None = None) -> CommandResult | None:
        """What became of the command sent with ``request_id``: the stage it reached and its error, if any.

        Found for every command sent with wait stage SENT (its outcome is recorded, refusals included,
        for ``COMMAND_STATUS_TTL_S``) and for every command that stored events: a create command by its
        request id, a command on an existing aggregate given ``aggregate_id`` too. ``None`` otherwise,
        and for another tenant's request. A stored command whose snapshot has caught up is at SNAPSHOT.
        ``tenant_id`` defaults to the default tenant, as in :meth:`send`.
        """
        name = aggregate if isinstance(aggregate, str) else aggregate.aggregate_name
        cls = aggregate_type(name)
        if cls is None:
            raise UnknownAggregate(f"There is no aggregate named {name!r}.")
        _check_id(request_id, "request_id")
        _check_id(tenant_id, "tenant_id")
        if aggregate_id is not None:
            _check_id(aggregate_id, "aggregate_id")
        book = self._status_book()
        recorded = book.get(cls.aggregate_name, tenant_id, request_id) if book is not None else None
        if recorded is not None and recorded.get(REFUSAL):
            # A kept refusal, unless a copy of the request stored its events after all (they raced).
            result: CommandResult | None = (self._stored_status(cls, request_id, tenant_id, aggregate_id)
                                            or CommandResult.from_json(recorded))
        elif recorded is not None:
            result = CommandResult.from_json(recorded)
        else:
            result = self._stored_status(cls, request_id, tenant_id, aggregate_id)
        if result is None or not result.succeeded or result.aggregate_version is None:
            return result
        if result.stage is WaitStage.PROCESSED and self.snapshot_store is not None:
            snapshot = self.snapshot_store.load(AggregateId(cls.aggregate_name, result.aggregate_id,
                                                            self.context_name, tenant_id))
            if snapshot is not None and snapshot.version >= result.aggregate_version:
                result = dataclasses.replace(result, stage=WaitStage.SNAPSHOT)
        return result

    def _stored_status(self, cls: type[Aggregate], request_id: str, tenant_id: str,
                       aggregate_id: str | None) -> CommandResult | None:
        ids = [aggregate_id] if aggregate_id is not None else []
        ids.append(derived_aggregate_id(cls.aggregate_name, tenant_id, request_id))
        for candidate in dict.fromkeys(ids):
            stream = self.event_store.get_by_request_id(
                AggregateId(cls.aggregate_name, candidate, self.context_name, tenant_id), request_id)
            if stream is not None:
                return CommandResult(
                    command_id=stream.command_id, request_id=request_id, aggregate_name=cls.aggregate_name,
                    aggregate_id=candidate, tenant_id=tenant_id, aggregate_version=stream.version,
                    stage=WaitStage.PROCESSED, events=tuple(event.name for event in stream.body),
                    context_name=self.context_name, command_name=str(stream.header.get("command", "")),
                    signal_time=stream.create_time, signal_id=stream.id)
        return None

    def _status_book(self) -> CommandStatusBook | None:
        if self.prepare_keys is None:
            return None
        return CommandStatusBook(self.prepare_keys(STATUS_STORE_NAME), timedelta(seconds=self.status_ttl_s))

    def _record_status(self, result: CommandResult) -> None:
        book = self._status_book()
        if book is not None:
            book.record(result.to_json())

    def _record_refusal(self, message: CommandMessage, exc: DomainError) -> None:
        """Keep a business rule's refusal of a request under its request id for ``status_ttl_s``: the same
        request again gets the same refusal (:meth:`_recorded_refusal`), not a second run that may pass."""
        result = getattr(exc, "command_result", None)
        if getattr(exc, "refusal_kept", False):
            return  # a replay of a kept refusal: its record stands (and its time to live is not extended)
        try:
            book = self._status_book()
            if book is None:
                return
            result = result or self._result(message, None, WaitStage.PROCESSED, error_code=exc.error_code,
                                            error_msg=str(exc))
            book.record({**result.to_json(), REFUSAL: True, COMMAND_DIGEST: command_digest(message)})
            exc.refusal_kept = True
        except Exception:  # noqa: BLE001 - the refusal is the answer; keeping it is best effort
            logger.exception("could not keep the refusal of request %s", message.request_id)

    def _recorded_refusal(self, message: CommandMessage) -> CommandError | None:
        """The refusal to answer this request with when a business rule refused it before (within
        ``status_ttl_s``): the same ``DomainError``, its result the first one's marked as a repeat; or
        ``RequestIdReused`` when that request had another command or body. None otherwise."""
        try:
            book = self._status_book()
            if book is None:
                return None
            recorded = book.get(message.aggregate_name, message.tenant_id, message.request_id)
        except Exception:  # noqa: BLE001 - unreadable: the request runs, as it would without the record
            logger.warning("could not read the refusals recorded under request %s; sending it",
                           message.request_id, exc_info=True)
            return None
        if recorded is None or not recorded.get(REFUSAL):
            return None
        if recorded.get(COMMAND_DIGEST) != command_digest(message) or (
                message.aggregate_id is not None and recorded.get("aggregateId") != message.aggregate_id):
            return RequestIdReused(
                f"request id {message.request_id!r} was already used for a {recorded.get('function', {}).get('name')!r} "
                f"command that was refused ({recorded.get('errorCode')}): a request id repeats one request, it does "
                "not name a new one. Send this command with a new request id.")
        refusal = DomainError(recorded.get("errorCode", "DomainError"), recorded.get("errorMsg", ""))
        refusal.command_result = dataclasses.replace(CommandResult.from_json(recorded), duplicate=True,
                                                     signal_time=now_ms(), signal_id=generate_id())
        refusal.refusal_kept = True  # its record stands: nothing to record again (nor its time to live to extend)
        return refusal

    # --- helpers --------------------------------------------------------------

    def _aggregate_for(self, command_name: str, aggregate: str | type[Aggregate] | None) -> type[Aggregate]:
        name = aggregate if isinstance(aggregate, str) or aggregate is None else aggregate.aggregate_name
        named = aggregate_type(name) if name is not None else None
        if name is not None and named is None:
            raise UnknownAggregate(f"There is no aggregate named {name!r}.")
        command_cls = _command_type(command_name)
        if command_cls in (DeleteAggregate, RecoverAggregate):
            if name is None or named is None:
                raise UnknownCommand(f"{command_name!r} needs the aggregate it applies to (aggregate=...).")
            if not named.allow_delete:
                raise UnknownCommand(f"Aggregate {name!r} does not allow {command_name!r}.")
            return named
        cls = aggregate_for_command(command_name)
        if cls is None or (name is not None and cls.aggregate_name != name):
            where = f"aggregate {name!r}" if name else "any aggregate"
            raise UnknownCommand(f"{command_name!r} is not a command of {where}.")
        return cls

    def _message(self, cls, command_name, body, aggregate_id, request_id, tenant_id, owner_id, operator,
                 header, expected_version=None, owner_only=False) -> CommandMessage:
        expected_version = check_expected_version(expected_version)
        _refuse_nul(body, operator, owner_id, header)
        command_id = generate_id()
        request_id_given = request_id is not None and request_id != ""
        request_id = _check_id(request_id, "request_id") if request_id_given else command_id
        tenant_id = _check_id(tenant_id, "tenant_id") if tenant_id else DEFAULT_TENANT_ID
        handler = cls.handlers.get(command_name)
        if aggregate_id is not None and aggregate_id != "":
            aggregate_id = _check_id(aggregate_id, "aggregate_id")
        elif handler is not None and handler.create:
            aggregate_id = (derived_aggregate_id(cls.aggregate_name, tenant_id, request_id) if request_id_given
                            else generate_id())
        else:
            raise CommandValidationError(
                f"{command_name!r} acts on an existing {cls.aggregate_name}: its aggregate id is required.",
                [{"name": "aggregate_id", "msg": "required for this command"}],
            )
        return CommandMessage(
            aggregate_name=cls.aggregate_name, command_name=command_name, body=body, aggregate_id=aggregate_id,
            request_id=request_id, command_id=command_id, request_id_given=request_id_given,
            tenant_id=tenant_id, owner_id=owner_id or "", operator=operator or "", header=dict(header or {}),
            expected_version=expected_version, owner_only=bool(owner_only),
        )

    def _send(self, cls, command, message: CommandMessage, wait: WaitStage, timeout,
              only: WaitFunction = WaitFunction()) -> CommandResult:
        try:
            return self._send_or_process(cls, command, message, wait, timeout, only)
        except (CommandError, EventStoreError) as exc:
            # The command's result comes with its refusal (its ids, as Wow's failed CommandResult has them).
            if getattr(exc, "command_result", None) is None:
                exc.command_result = self._result(
                    message, None, WaitStage.SENT if wait is WaitStage.SENT else WaitStage.PROCESSED,
                    error_code=exc.error_code, error_msg=str(exc),
                    binding_errors=tuple(getattr(exc, "binding_errors", ())))
            raise

    def _send_or_process(self, cls, command, message: CommandMessage, wait: WaitStage, timeout,
                         only: WaitFunction) -> CommandResult:
        if wait is WaitStage.SENT:
            self.tasks.process_command(message.to_dict())
            sent = self._result(message, None, WaitStage.SENT)
            # After queueing (a refused queueing is the caller's error, not a status); never over an outcome
            # a fast worker recorded first.
            self._record_status(sent)
            return sent
        return self._process(cls, command, message, wait, timeout, only)

    def _started(self) -> None:
        if self.before_send is not None:
            try:
                self.before_send()
            except Exception:  # the followers are not the command's business: answer it anyway
                logger.exception("starting this process's followers failed")

    @property
    def tasks(self) -> TaskQueue:
        """The task queue that takes SENT commands and snapshots in ``SNAPSHOT_MODE="celery"``."""
        if self._tasks is None:
            raise RuntimeError("this gateway has no task queue (pass tasks=...): it cannot queue work")
        return self._tasks()

    def _queue_snapshot(self, stream: EventStream) -> None:
        self.tasks.request_snapshot(stream.aggregate_name, stream.aggregate_id.id)

    def _result(self, message: CommandMessage, version, stage, events=(), duplicate=False, **error) -> CommandResult:
        return CommandResult(
            command_id=message.command_id, request_id=message.request_id, aggregate_name=message.aggregate_name,
            aggregate_id=message.aggregate_id, tenant_id=message.tenant_id, aggregate_version=version,
            stage=stage, events=tuple(events), duplicate=duplicate, context_name=self.context_name,
            command_name=message.command_name, signal_time=now_ms(), signal_id=generate_id(), **error,
        )

    def _lock(self, key: tuple[str, str]) -> threading.RLock:
        with self._locks_guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = threading.RLock()
                self._locks[key] = lock
            return lock

    def _backoff(self, attempt: int) -> None:
        delay_ms = self.retry_backoff_ms * (2 ** min(attempt, 10)) * random.uniform(0.5, 1.5)
        if delay_ms > 0:
            time.sleep(min(delay_ms, 2_000) / 1000.0)

    def _stored(self, message: CommandMessage, wait: WaitStage, timeout: float | None = None,
                only: WaitFunction = WaitFunction()) -> CommandResult | None:
        """The result of this request if its events are already stored (by an earlier request or attempt)."""
        found = self._find_stored(message)
        return None if found is None else self._answer_stored(found, wait, timeout, only)

    def _find_stored(self, message: CommandMessage) -> tuple[CommandMessage, EventStream, bool] | None:
        """This request's stored events, if any: (the message with the first request's command id, the stream,
        whether it is a repeat); ``RequestIdReused`` when the request id names another command or body."""
        key = AggregateId(message.aggregate_name, message.aggregate_id, self.context_name, message.tenant_id)
        original = self.event_store.get_by_request_id(key, message.request_id)
        if original is None or original.aggregate_id.tenant_id != message.tenant_id:
            return None  # another tenant's command is never answered with, nor revealed
        stored_command, stored_digest = original.header.get("command"), original.header.get(COMMAND_DIGEST)
        if (stored_command is not None and stored_command != message.command_name) or (
                stored_digest is not None and stored_digest != command_digest(message)):
            what = (f"command {stored_command!r}" if stored_command != message.command_name
                    else f"a different {message.command_name!r} body")
            raise RequestIdReused(
                f"request id {message.request_id!r} was already used for {what} on {message.aggregate_name} "
                f"{message.aggregate_id!r}: a request id repeats one request, it does not name a new one. "
                "Send this command with a new request id.")
        # Our own earlier attempt (same command id) is this command's first result, not a repeat.
        duplicate = original.command_id != message.command_id
        # The first request's result, its command id included: a repeat is the same command, answered again.
        return dataclasses.replace(message, command_id=original.command_id), original, duplicate

    def _answer_stored(self, found: tuple[CommandMessage, EventStream, bool], wait: WaitStage,
                       timeout: float | None, only: WaitFunction = WaitFunction()) -> CommandResult:
        """The stored request's result; for a handler stage after waiting for its followers (never under the
        aggregate's lock: another command of the aggregate is not held behind this wait)."""
        message, original, duplicate = found
        names = [e.name for e in original.body]
        limit = self.wait_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        reached = WaitStage.PROCESSED
        errors: list[str] = []
        if wait in (WaitStage.SNAPSHOT, WaitStage.PROJECTED):
            if self.snapshot_mode == "follower" and self.projections is not None \
                    and self.snapshot_strategy != "none":
                # The first request's snapshot is the snapshot follower's to write, as for a new command.
                progress = self._snapshot_follower_passed(self.projections, original, limit)
                if not progress.done:
                    return self._result(message, original.version, WaitStage.PROCESSED, names,
                                        duplicate=duplicate, **_timeout_error(progress, limit, "SNAPSHOT"))
                errors.extend(progress.errors)
            else:
                # The first request's snapshot step, when this process still runs it (inline or queued).
                tracker = self._trackers.get(message.command_id)
                if tracker is not None:
                    if not tracker.snapshot_done.wait(limit):
                        return self._result(message, original.version, WaitStage.PROCESSED, names,
                                            duplicate=duplicate, error_code="RequestTimeout",
                                            error_msg=f"appended, but SNAPSHOT did not finish within {limit}s")
                    errors.extend(tracker.errors)
            reached = WaitStage.SNAPSHOT
        if wait in HANDLER_STAGES and self.projections is not None:
            # The first request's followers may not have run yet (its process died after the append).
            progress = self._handlers_passed(self.projections, original, wait, only,
                                             max(0.0, deadline - time.monotonic()))
            if not progress.done:
                return self._result(message, original.version, reached, names, duplicate=duplicate,
                                    **_timeout_error(progress, limit, wait.value))
            errors.extend(progress.errors)
        if errors:  # as a first answer would say it (the stage reached, and what failed on the way)
            return self._result(message, original.version, wait, names, duplicate=duplicate,
                                error_code="DispatchFailed", error_msg="appended, but: " + "; ".join(errors))
        return self._result(message, original.version, wait, names, duplicate=duplicate)

    def _handlers_passed(self, projections: ProjectionWaiter, stream: EventStream, stage: WaitStage,
                         only: WaitFunction, limit: float) -> Progress:
        """Wait (at most ``limit`` s) for the followers of handler stage ``stage`` (narrowed by ``only``) to pass
        ``stream``; PROJECTED with no narrowing waits for every projection taking it."""
        if stage is WaitStage.PROJECTED and not only:
            return projections.wait(stream, limit)
        names = stage_followers(stage.value, stream.aggregate_name, [event.name for event in stream.body],
                                processor=only.processor, function=only.function)
        return projections.wait(stream, limit, names=names)

    # --- the command's life -------------------------------------------------------

    def _process(self, cls: type[Aggregate], command: Command, message: CommandMessage, wait: WaitStage,
                 timeout: float | None, only: WaitFunction = WaitFunction()) -> CommandResult:
        if message.request_id_given:
            refused = self._recorded_refusal(message)
            if refused is not None:
                # A copy of this request that ran on a changed state and stored its events wins over the
                # refusal kept for it (they raced): its result is the request's answer.
                found = self._find_stored(message)
                if found is not None:
                    return self._answer_stored(found, wait, timeout, only)
                raise refused
        self._started()
        lock = self._lock((cls.aggregate_name, message.aggregate_id))
        attempt = 0
        limit = self.storage_timeout_s
        deadline = time.monotonic() + limit if limit is not None else None
        # Compensations of attempts whose outcome is unknown (a transient error
        # after the write may have landed): run only once we know it did not.
        carried: list = []

        def give_up(ctx: CommandContext) -> None:
            ctx.compensate()
            while carried:
                carried.pop()()

        while True:
            ctx = CommandContext(
                command_id=message.command_id, request_id=message.request_id, aggregate_id=message.aggregate_id,
                tenant_id=message.tenant_id, owner_id=message.owner_id, operator=message.operator,
                header=dict(message.header), prepare_keys=self.prepare_keys,
            )
            try:
                # One command per aggregate at a time in this process: load to
                # dispatch-submit; other processes are kept apart by the
                # version index and retried below.
                with lock:
                    found = self._find_stored(message) if message.request_id_given or carried else None
                    if found is None:
                        # What is left of the command's storage time (never 0: to pymongo, that is no limit).
                        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                        with self.event_store.deadline(left):
                            stream, tracker = self._attempt(cls, command, message, ctx)
                if found is not None:
                    return self._answer_stored(found, wait, timeout, only)
                break
            except (DuplicateRequestId, DuplicateAggregateId):
                stored = self._stored(message, wait, timeout, only)
                if stored is not None:
                    return stored  # its reservations belong to the stored events: keep them
                give_up(ctx)
                raise
            except StoreUnreachable:
                # Nothing was sent (no server could be selected): this attempt's reservations go; those of an
                # earlier attempt whose outcome is unknown stay. Retrying now would stack server-selection timeouts.
                ctx.compensate()
                raise
            except RecoverableStoreError as exc:
                try:
                    stored = self._stored(message, wait, timeout, only)
                except RecoverableStoreError:
                    carried.extend(ctx.take_compensations())  # outcome unknown: keep what was reserved
                else:
                    if stored is not None:
                        return stored  # the write had landed before the error
                    ctx.compensate()
                if attempt >= self.retry_limit or (deadline is not None and time.monotonic() >= deadline):
                    logger.warning("%s on %s %r: giving up after %d retries (%.1f s storage timeout)",
                                   type(exc).__name__, cls.aggregate_name, message.aggregate_id, attempt, limit or 0)
                    raise  # carried reservations stay: the write may have landed
                self._backoff(attempt)
                attempt += 1
            except CommandError as exc:
                # Refused in the state loaded (a business rule, CommandExpectVersionConflict): a copy of this
                # request (another process, another thread of a client retrying) may have been appended
                # between the request-id lookup and the load, and it is what put the aggregate in that state.
                # Its result is this request's answer, as on the duplicate path (its reservations are the
                # stored events': kept). Only then is the refusal this request's own.
                outcome_known = True
                if message.request_id_given:
                    try:
                        stored = self._stored(message, wait, timeout, only)
                    except RecoverableStoreError:
                        stored, outcome_known = None, False  # a copy may have landed: the refusal is not kept
                    if stored is not None:
                        return stored
                give_up(ctx)
                if isinstance(exc, DomainError) and message.request_id_given and outcome_known:
                    self._record_refusal(message, exc)
                raise
            except EventVersionConflict as exc:
                ctx.compensate()
                if attempt >= self.retry_limit:
                    logger.warning("%s on %s %r: giving up after %d retries", type(exc).__name__,
                                   cls.aggregate_name, message.aggregate_id, attempt)
                    give_up(ctx)
                    raise
                self._backoff(attempt)
                attempt += 1
            except BaseException:
                give_up(ctx)
                raise
        if self.after_append is not None:
            try:
                self.after_append()
            except Exception:  # the followers are not the command's business: answer it anyway
                logger.exception("running the followers after %s %r failed", cls.aggregate_name,
                                 message.aggregate_id)
        return self._wait(message, stream, tracker, wait, timeout, only)

    def _attempt(self, cls, command, message: CommandMessage, ctx: CommandContext):
        name = command.command_name
        aggregate = self.repository.load(cls, message.aggregate_id, tenant_id=message.tenant_id)
        if message.expected_version is not None:
            # Checked first, as Wow does: the client's precondition, whatever else the command meets. Another
            # tenant's aggregate is one this tenant does not see: version 0.
            seen = aggregate if aggregate is not None and aggregate.tenant_id == message.tenant_id else None
            actual = seen.version if seen is not None else 0
            if actual != message.expected_version:
                raise CommandExpectVersionConflict(cls.aggregate_name, message.aggregate_id,
                                                   message.expected_version, actual)
        handler = cls.handlers.get(name)
        if handler is not None and handler.create:
            if aggregate is not None:
                raise DuplicateAggregateId(cls.aggregate_name, message.aggregate_id)
            aggregate = cls(message.aggregate_id, message.tenant_id, message.owner_id)
        elif aggregate is None or aggregate.tenant_id != message.tenant_id:
            raise AggregateNotFound(f"{cls.aggregate_name} {message.aggregate_id!r} does not exist.")
        elif message.owner_only and aggregate.owner_id and aggregate.owner_id != message.owner_id:
            raise NotAggregateOwner(f"{cls.aggregate_name} {message.aggregate_id!r} belongs to another user: "
                                    "only its owner sends it commands.")
        if isinstance(command, DeleteAggregate):
            if aggregate.deleted:
                raise AggregateIsDeleted(f"{cls.aggregate_name} {message.aggregate_id!r} is already deleted.")
            events: list[Event] = [AggregateDeleted()]
        elif isinstance(command, RecoverAggregate):
            if not aggregate.deleted:
                raise DomainError("AggregateNotDeleted",
                                  f"{cls.aggregate_name} {message.aggregate_id!r} is not deleted; nothing to recover.")
            events = [AggregateRecovered()]
        else:
            if aggregate.deleted:
                raise AggregateIsDeleted(
                    f"{cls.aggregate_name} {message.aggregate_id!r} is deleted; recover it before sending {name!r}."
                )
            method = getattr(aggregate, handler.method)
            produced = method(command, ctx) if handler.takes_context else method(command)
            events = self._events(cls, handler.method, produced)
        stream = EventStream(
            id=generate_id(),
            aggregate_id=AggregateId(cls.aggregate_name, message.aggregate_id, self.context_name, aggregate.tenant_id),
            version=aggregate.version + 1,
            body=encode_events(events),
            request_id=message.request_id,
            command_id=message.command_id,
            owner_id=aggregate.owner_id,
            header={**message.header, OPERATOR_HEADER: message.operator, "command": name,
                    COMMAND_DIGEST: command_digest(message)},
            create_time=now_ms(),
        )
        self.event_store.append(stream)
        apply_stream(aggregate, stream, events)
        job = self._job(aggregate, stream)
        if job.snapshot is None and not job.queue_snapshot:
            return stream, job.tracker  # nothing to dispatch: no thread hand-off
        self._trackers[message.command_id] = job.tracker
        self.dispatcher.submit(job)
        return stream, job.tracker

    @staticmethod
    def _events(cls, method: str, produced) -> list[Event]:
        events = [produced] if isinstance(produced, Event) else list(produced or ())
        if not events or not all(isinstance(e, Event) for e in events):
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__}.{method} must return an Event or a non-empty list of "
                f"Events, got {produced!r}"
            )
        return events

    def _job(self, aggregate: Aggregate, stream: EventStream) -> Job:
        due = should_snapshot(self.snapshot_strategy, aggregate, version_offset=self.snapshot_version_offset,
                              time_offset_s=self.snapshot_time_offset_s)
        if due and self.snapshot_mode == "follower":  # the snapshot follower writes it: SNAPSHOT waits for it
            return Job(stream=stream, snapshot=None, queue_snapshot=False, tracker=BY_FOLLOWER)
        inline = due and self.snapshot_mode == "inline"
        return Job(
            stream=stream,
            snapshot=snapshot_of(aggregate, self.context_name) if inline else None,
            queue_snapshot=due and not inline,
            tracker=Tracker() if due else COMPLETED,
        )

    def _wait(self, message, stream: EventStream, tracker: Tracker, wait: WaitStage, timeout,
              only: WaitFunction = WaitFunction()) -> CommandResult:
        names = [e.name for e in stream.body]
        limit = self.wait_timeout_s if timeout is None else timeout
        if wait in (WaitStage.SENT, WaitStage.PROCESSED):
            return self._result(message, stream.version, WaitStage.PROCESSED, names)
        deadline = time.monotonic() + limit
        errors: list[str] = []
        stage = WaitStage.PROCESSED
        if wait in (WaitStage.SNAPSHOT, WaitStage.PROJECTED):  # EVENT_HANDLED and SAGA_HANDLED come after PROCESSED
            if tracker is BY_FOLLOWER and self.projections is not None:
                progress = self._snapshot_follower_passed(self.projections, stream, limit)
                if not progress.done:
                    return self._result(message, stream.version, WaitStage.PROCESSED, names,
                                        **_timeout_error(progress, limit, "SNAPSHOT"))
                errors.extend(progress.errors)
            elif not tracker.snapshot_done.wait(limit):
                return self._result(message, stream.version, WaitStage.PROCESSED, names,
                                    error_code="RequestTimeout",
                                    error_msg=f"appended, but SNAPSHOT did not finish within {limit}s")
            stage = WaitStage.SNAPSHOT
            errors.extend(tracker.errors)
        if wait in HANDLER_STAGES:
            if self.projections is not None:
                progress = self._handlers_passed(self.projections, stream, wait, only,
                                                 max(0.0, deadline - time.monotonic()))
                if not progress.done:
                    return self._result(message, stream.version, stage, names,
                                        **_timeout_error(progress, limit, wait.value))
                errors.extend(progress.errors)
            stage = wait
        if errors:
            return self._result(message, stream.version, stage, names, error_code="DispatchFailed",
                                error_msg="appended, but: " + "; ".join(errors))
        return self._result(message, stream.version, stage, names)

    def _snapshot_follower_passed(self, projections: ProjectionWaiter, stream: EventStream, limit: float) -> Progress:
        """Wait (at most ``limit`` s) for the snapshot follower to pass ``stream``, hurrying this process's
        runner of it out of its linger."""
        if self.hurry is not None:
            self.hurry(SNAPSHOT_FOLLOWER)
        return projections.wait(stream, limit, names=[SNAPSHOT_FOLLOWER])

    def close(self) -> None:
        self.dispatcher.close()


def _refuse_nul(body, operator, owner_id, header) -> None:
    """``CommandValidationError`` naming the field that holds a NUL character (no SQL database stores one)."""
    for name, value in (("body", body), ("operator", operator), ("owner_id", owner_id), ("header", header)):
        where = nul_path(value, "" if name == "body" else name)
        if where is not None:
            raise CommandValidationError(f"{where}: {NUL_RULE}", [{"name": where, "msg": NUL_RULE}])


def _timeout_error(progress: Progress, limit: float, stage: str = "PROJECTED") -> dict:
    pending = ", ".join(progress.pending)
    unread = f"; their checkpoints could not be read: {progress.unread}" if progress.unread else ""
    what = {"PROJECTED": "projection follower(s)", "EVENT_HANDLED": "event processor follower(s)",
            "SAGA_HANDLED": "follower(s)"}.get(stage, "follower")
    return {"error_code": "RequestTimeout",
            "error_msg": f"appended, but {stage} did not finish within {limit}s (waiting for the "
                         f"{what} {pending}{unread}; is a follower running? see manage.py "
                         "wow_followers)"}

