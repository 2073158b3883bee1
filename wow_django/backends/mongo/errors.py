"""Mapping pymongo errors to wow_django errors.

Duplicate-key errors are told apart by the index they hit: the ``keyPattern``
MongoDB reports, else the index name in the message. The embedded engine
reports neither; the caller then confirms with a read of the conflicting key
(see ``MongoEventStore``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from pymongo import errors as pymongo_errors

from wow_django.exceptions import RecoverableStoreError, StoreUnreachable

DUPLICATE_KEY_CODES = {11000, 11001, 12582}

# Server codes after which a retry may succeed: shutdown, step-down,
# not-primary, network and time-limit conditions.
RECOVERABLE_CODES = {
    6,  # HostUnreachable
    7,  # HostNotFound
    64,  # WriteConcernFailed (wtimeout): the write may still apply
    89,  # NetworkTimeout
    91,  # ShutdownInProgress
    133,  # FailedToSatisfyReadPreference (no primary yet); recoverable in Wow too
    189,  # PrimarySteppedDown
    262,  # ExceededTimeLimit
    264,  # StaleEpoch: a sharded collection changed under the write; recoverable in Wow too
    9001,  # SocketException
    10107,  # NotWritablePrimary
    11600,  # InterruptedAtShutdown
    11602,  # InterruptedDueToReplStateChange
    13435,  # NotPrimaryNoSecondaryOk
    13436,  # NotPrimaryOrSecondary
    134,  # ReadConcernMajorityNotAvailableYet
    175,  # QueryPlanKilled
    237,  # CursorKilled
    11601,  # Interrupted
}

VERSION_INDEXES = ("aggregateId_1_version_1",)
REQUEST_ID_INDEXES = ("aggregateId_1_requestId_1", "requestId_1")


def is_duplicate_key(error: dict) -> bool:
    return error.get("code") in DUPLICATE_KEY_CODES


def duplicate_key_kind(error: Mapping[str, Any] | None) -> str | None:
    """``"version"``, ``"request"``, ``"id"`` or ``None`` (engine did not say)."""
    if not error:
        return None
    pattern = error.get("keyPattern")
    if isinstance(pattern, dict) and pattern:
        fields = set(pattern)
        if "version" in fields:
            return "version"
        if "requestId" in fields:
            return "request"
        if fields == {"_id"}:
            return "id"
    message = str(error.get("errmsg", ""))
    for name in VERSION_INDEXES:
        if f"index: {name} " in message:
            return "version"
    for name in REQUEST_ID_INDEXES:
        if f"index: {name} " in message:
            return "request"
    if "index: _id_ " in message:
        return "id"
    return None


def is_recoverable(exc: BaseException) -> bool:
    """Whether a retry may succeed. A write concern error of any code counts: the write may have landed
    (the gateway reads back before it compensates), so it is never a plain failure."""
    if isinstance(exc, (pymongo_errors.AutoReconnect, pymongo_errors.ConnectionFailure,
                        pymongo_errors.ExecutionTimeout, pymongo_errors.WTimeoutError,
                        pymongo_errors.WriteConcernError)):
        return True
    if isinstance(exc, pymongo_errors.BulkWriteError):
        details = exc.details or {}
        return bool(details.get("writeConcernErrors")) and not details.get("writeErrors")
    if isinstance(exc, pymongo_errors.PyMongoError):
        if exc.has_error_label("RetryableWriteError") or exc.has_error_label("TransientTransactionError"):
            return True
        code = getattr(exc, "code", None)
        if code in RECOVERABLE_CODES:
            return True
        details = getattr(exc, "details", None) or {}
        if isinstance(details, dict) and details.get("writeConcernError", {}).get("code") in RECOVERABLE_CODES:
            return True
    return False


@contextlib.contextmanager
def recoverable_errors(action: str) -> Iterator[None]:
    """Re-raise transient pymongo failures as ``RecoverableStoreError``."""
    try:
        yield
    except pymongo_errors.ServerSelectionTimeoutError as exc:
        raise StoreUnreachable(f"{action} failed: no MongoDB server could be selected ({type(exc).__name__}); "
                               "nothing was sent, retry later") from exc
    except pymongo_errors.PyMongoError as exc:
        if is_recoverable(exc):
            raise RecoverableStoreError(f"{action} failed transiently ({type(exc).__name__}: {exc}); retry") from exc
        raise
