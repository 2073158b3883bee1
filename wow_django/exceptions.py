"""Errors raised by wow_django. No Django or pymongo imports here.

Every error carries an ``error_code`` (stable, used in HTTP bodies) and a
message that says what happened and what to do. The codes are Wow's
(``ErrorCodes`` in the Kotlin framework) wherever Wow has one, and names in
the same PascalCase style where it has none: :class:`ErrorCodes` lists both.
"""

from __future__ import annotations

from typing import Any


class ErrorCodes:
    """Every ``errorCode`` wow_django answers with (a ``DomainError`` carries its handler's own)."""

    # Wow's own codes, spelled as Wow spells them.
    SUCCEEDED = "Ok"
    NOT_FOUND = "NotFound"
    BAD_REQUEST = "BadRequest"
    ILLEGAL_ARGUMENT = "IllegalArgument"
    REQUEST_TIMEOUT = "RequestTimeout"
    TOO_MANY_REQUESTS = "TooManyRequests"
    DUPLICATE_REQUEST_ID = "DuplicateRequestId"
    COMMAND_VALIDATION = "CommandValidation"
    EVENT_VERSION_CONFLICT = "EventVersionConflict"
    DUPLICATE_AGGREGATE_ID = "DuplicateAggregateId"
    COMMAND_EXPECT_VERSION_CONFLICT = "CommandExpectVersionConflict"
    ILLEGAL_ACCESS_DELETED_AGGREGATE = "IllegalAccessDeletedAggregate"
    ILLEGAL_ACCESS_OWNER_AGGREGATE = "IllegalAccessOwnerAggregate"
    # Wow answers these for the HTTP statuses they name.
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    NOT_ACCEPTABLE = "NotAcceptable"
    PAYLOAD_TOO_LARGE = "PayloadTooLarge"
    UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"
    # wow_django's own, for what Wow has no code for.
    QUERY_TOO_EXPENSIVE = "QueryTooExpensive"
    AGGREGATE_NOT_DELETED = "AggregateNotDeleted"
    DISPATCH_FAILED = "DispatchFailed"
    KEY_ALREADY_PREPARED = "KeyAlreadyPrepared"
    KEY_NOT_HELD = "KeyNotHeld"
    NOT_AUTHENTICATED = "NotAuthenticated"
    AUTHENTICATION_FAILED = "AuthenticationFailed"
    PERMISSION_DENIED = "PermissionDenied"
    STORE_UNAVAILABLE = "StoreUnavailable"
    BROKER_UNAVAILABLE = "BrokerUnavailable"
    BUS_TRANSPORT_UNAVAILABLE = "BusTransportUnavailable"
    BUS_VALIDATION = "BusValidation"
    CONSUMER_NOT_EXPECTED = "ConsumerNotExpected"
    REPUSH_NOT_ALLOWED = "RepushNotAllowed"
    REPUSH_TOO_EARLY = "RepushTooEarly"
    REPUSH_LIMIT_REACHED = "RepushLimitReached"
    REPUSH_CONFLICT = "RepushConflict"
    ALREADY_CONSUMED = "AlreadyConsumed"
    EVENT_EXPIRED = "EventExpired"
    BUS_ERROR = "BusError"
    DUPLICATE_EVENT_STREAM_ID = "DuplicateEventStreamId"


class WowError(Exception):
    """Base class of every wow_django error."""

    error_code = "WowError"
    # Set by the command gateway on a refused command (annotations only: an error without them has neither):
    # the command's result (a ``wow_django.application.gateway.CommandResult``) and whether its refusal is kept
    # under its request id.
    command_result: Any
    refusal_kept: bool


# A client can make thousands of errors (one per unknown key) or send a megabyte name: what is
# reported back is capped, and says how much was left out.
MAX_BINDING_ERRORS = 20
MAX_ECHO_LENGTH = 200


def shorten(text: str, limit: int = MAX_ECHO_LENGTH) -> str:
    """``text`` cut to ``limit`` characters, ending in "..." when it was longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def left_out(count: int) -> str:
    """The note that says ``count`` binding errors are not reported."""
    return f"({count} more binding errors left out)"


def reported_binding_errors(errors) -> tuple[list[dict], int]:
    """The first MAX_BINDING_ERRORS of ``errors`` with names and messages shortened, and how many were left out."""
    errors = list(errors)
    shown = [{"name": shorten(str(e.get("name", ""))), "msg": shorten(str(e.get("msg", "")))}
             for e in errors[:MAX_BINDING_ERRORS]]
    return shown, len(errors) - len(shown)


def binding_summary(errors) -> str:
    """``name: msg; ...`` for the reported errors, with the note of those left out."""
    shown, omitted = reported_binding_errors(errors)
    summary = "; ".join(f"{e['name']}: {e['msg']}" if e["name"] else e["msg"] for e in shown)
    return f"{summary} {left_out(omitted)}" if omitted else summary


# --- configuration and schema -------------------------------------------


class DeclarationError(WowError, ValueError):
    """A command, event, aggregate or handler is declared wrongly (names the declaration and the rule)."""

    error_code = "DeclarationError"


class SchemaConflictError(WowError):
    """An existing index collides with one wow_django needs."""

    error_code = "SchemaConflict"


class DatabaseOwnershipError(WowError):
    """The database is claimed by another bounded context."""

    error_code = "DatabaseOwnedByOtherContext"


# --- event store ---------------------------------------------------------


class EventStoreError(WowError):
    error_code = "EventStoreError"


class EventVersionConflict(EventStoreError):
    """Another event stream already holds this aggregate version."""

    error_code = "EventVersionConflict"

    def __init__(self, aggregate_name: str, aggregate_id: str, version: int, message: str | None = None):
        self.aggregate_name = aggregate_name
        self.aggregate_id = aggregate_id
        self.version = version
        super().__init__(
            message
            or f"Version {version} of {aggregate_name} {aggregate_id!r} was written concurrently; "
            "reload the aggregate and retry the command."
        )


class DuplicateAggregateId(EventVersionConflict):
    """An aggregate with this id already exists (conflict at version 1)."""

    error_code = "DuplicateAggregateId"

    def __init__(self, aggregate_name: str, aggregate_id: str, version: int = 1):
        super().__init__(
            aggregate_name,
            aggregate_id,
            version,
            f"{aggregate_name} {aggregate_id!r} already exists; use a new aggregate id to create one.",
        )


class DuplicateRequestId(EventStoreError):
    """This request id was already appended: the command has been processed."""

    error_code = "DuplicateRequestId"

    def __init__(self, aggregate_name: str, aggregate_id: str, request_id: str):
        self.aggregate_name = aggregate_name
        self.aggregate_id = aggregate_id
        self.request_id = request_id
        super().__init__(
            f"Request {request_id!r} was already processed for {aggregate_name} {aggregate_id!r}; "
            "treat it as done (idempotent retry) or send a new request id."
        )


class DuplicateEventStreamId(EventStoreError):
    """An event stream with this id was already appended."""

    error_code = "DuplicateEventStreamId"


class RecoverableStoreError(WowError):
    """A transient failure (network, timeout, primary step-down). Retrying may succeed.

    A write that fails this way may or may not have been applied; retry with
    the same request id so a repeat is recognised as a duplicate.
    """

    error_code = "StoreUnavailable"


class StoreUnreachable(RecoverableStoreError):
    """No server could be selected within the server-selection timeout: nothing was sent, so nothing was
    written. Retrying inside the request would only stack more timeouts: the gateway answers at once
    (503 with Retry-After over HTTP) and the client retries later."""


class UnacknowledgedWriteError(WowError):
    """The server did not acknowledge a write (write concern w=0)."""

    error_code = "UnacknowledgedWrite"


# --- prepare keys --------------------------------------------------------


class KeyAlreadyPrepared(WowError):
    error_code = "KeyAlreadyPrepared"

    def __init__(self, name: str, key: str):
        self.name = name
        self.key = key
        super().__init__(f"{key!r} is already taken in prepare key {name!r}.")


class KeyNotHeld(WowError):
    """A reservation was to be moved from ``key`` but ``key`` is not held with the expected value (missing,
    expired or another's); the move changed nothing and ``new_key`` was released again."""

    error_code = ErrorCodes.KEY_NOT_HELD

    def __init__(self, name: str, key: str, new_key: str):
        self.name = name
        self.key = key
        self.new_key = new_key
        super().__init__(f"{key!r} is not held with the expected value in prepare key {name!r}: the move to "
                         f"{new_key!r} was undone. Read the key's current value and retry.")


# --- commands --------------------------------------------------------------------


class CommandError(WowError):
    """A command was refused; nothing was appended."""

    error_code = "CommandError"


class CommandValidationError(CommandError):
    """The command's fields are invalid. ``binding_errors`` names each field and rule."""

    error_code = "CommandValidation"

    def __init__(self, message: str, binding_errors: list[dict] | None = None):
        self.binding_errors = list(binding_errors or [])
        super().__init__(message)

    @classmethod
    def from_pydantic(cls, command_name: str, exc) -> CommandValidationError:
        errors = []
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            name = ".".join(str(part) for part in error.get("loc", ())) or "(body)"
            message = error.get("msg", "invalid")
            if error.get("type") == "extra_forbidden":
                message = "unknown field: not part of this command"
            errors.append({"name": name, "msg": message})
        return cls(f"Invalid {command_name!r} command: {binding_summary(errors)}", errors)


class UnknownAggregate(CommandError):
    error_code = "NotFound"


class UnknownCommand(CommandError):
    error_code = "NotFound"


class AggregateNotFound(CommandError):
    error_code = "NotFound"


class AggregateIsDeleted(CommandError):
    error_code = "IllegalAccessDeletedAggregate"


class CommandExpectVersionConflict(CommandError):
    """The command expected another aggregate version than the current one (``expected_version``, the
    ``Command-Aggregate-Version`` header): someone changed the aggregate since the client read it. Refused,
    nothing appended; reload and decide again."""

    error_code = ErrorCodes.COMMAND_EXPECT_VERSION_CONFLICT

    def __init__(self, aggregate_name: str, aggregate_id: str, expected_version: int, actual_version: int):
        self.aggregate_name = aggregate_name
        self.aggregate_id = aggregate_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        super().__init__(
            f"{aggregate_name} {aggregate_id!r} is at version {actual_version}, not the expected version "
            f"{expected_version}: it changed since it was read. Reload it and send the command again if it "
            "still applies."
        )


class NotAggregateOwner(CommandError):
    """A command sent under the owner policy (``owner_only``) reached an aggregate that another user owns:
    refused, nothing appended (Wow's ``IllegalAccessOwnerAggregate``, HTTP 403)."""

    error_code = ErrorCodes.ILLEGAL_ACCESS_OWNER_AGGREGATE


class RequestIdReused(CommandError):
    """A request id (idempotency key) already answered another command or another body: refused, nothing
    appended. The same key with the same command and body gets the first command's result instead.
    Wow's ``DuplicateRequestId`` (HTTP 400)."""

    error_code = ErrorCodes.DUPLICATE_REQUEST_ID


class DomainError(CommandError):
    """Raised by a command handler when a business rule forbids the command.

    ``code`` is a stable machine-readable name (``ORDER_CANCELLED``).
    """

    error_code = "DomainError"

    def __init__(self, code: str, message: str):
        self.error_code = code
        super().__init__(message)


# --- integration-event bus -----------------------------------------------


class BusError(WowError):
    """Base class of bus errors."""

    error_code = "BusError"

    def __init__(self, message: str, binding_errors: list[dict] | None = None):
        self.binding_errors = list(binding_errors or [])
        super().__init__(message)


class EnvelopeValidationError(BusError):
    """An envelope (or a feedback) is invalid; ``binding_errors`` names each field and rule."""

    error_code = "BusValidation"

    @classmethod
    def from_errors(cls, what: str, errors: list[dict]) -> EnvelopeValidationError:
        return cls(f"Invalid {what}: {binding_summary(errors)}", errors)


class EventNotFound(BusError):
    error_code = "NotFound"

    def __init__(self, event_id: str):
        self.event_id = event_id
        super().__init__(f"There is no bus event with eventId {event_id!r}.")


class TraceNotFound(BusError):
    error_code = "NotFound"

    def __init__(self, trace_id: str):
        self.trace_id = trace_id
        super().__init__(f"There is no bus event with traceId {trace_id!r}.")


class ConsumerNotExpected(BusError):
    """The consumer is not one of the event's expected consumers (topic_consumers when it was sent)."""

    error_code = "ConsumerNotExpected"

    def __init__(self, event_id: str, consumer_id: str):
        self.event_id = event_id
        self.consumer_id = consumer_id
        super().__init__(
            f"{consumer_id!r} is not an expected consumer of event {event_id!r}: it was not an enabled "
            "topic consumer of the event's topic when the event was sent."
        )


class RepushRefused(BusError):
    """A re-push is not allowed now (status, expiry, count, or the consumer already consumed)."""


    def __init__(self, code: str, message: str):
        self.error_code = code
        super().__init__(message)


class TransportUnavailable(BusError):
    """The message broker could not be reached or did not confirm a publish."""

    error_code = "BusTransportUnavailable"


# --- followers -----------------------------------------------------------------------


class LeaseLost(WowError):
    """The caller no longer holds the follower's lease (it expired and another instance took it)."""

    def __init__(self, name: str, owner: str, holder: str | None):
        self.name, self.owner, self.holder = name, owner, holder
        super().__init__(f"follower {name!r}: {owner!r} no longer holds the lease (held by {holder!r})")


class ContextLockTimeout(RecoverableStoreError):
    """An append waited ``WOW['APPEND_LOCK_TIMEOUT_S']`` for its context's lock, held by another writer's open
    transaction (a hung process, a long ``ATOMIC_REQUESTS`` request): nothing stored; retry with the same
    request id (HTTP 503 ``StoreUnavailable``)."""


class CheckpointFenced(WowError):
    """A checkpoint write of a batch read before an operator's rewind, pause or skip: refused, nothing changed."""

    def __init__(self, name: str, generation: int, stored: int | None):
        self.name, self.generation, self.stored = name, generation, stored
        super().__init__(f"follower {name!r} was rewound, paused or skipped while a batch was in flight "
                         f"(generation {generation} → {stored}): its checkpoint is not written, the next "
                         "batch reads from the stored position")


class UnknownFollower(WowError, LookupError):
    """No state is stored for a follower of that name."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"no follower named {name!r} has run yet")
