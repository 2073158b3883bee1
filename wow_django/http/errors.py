"""Errors as JSON ``{errorCode, errorMsg, bindingErrors}`` with the status a client can act on.

The codes are the Wow framework's (``ErrorCodes``) wherever Wow has one, and
PascalCase names of wow_django's own otherwise (all in
:class:`wow_django.exceptions.ErrorCodes`):

======  ==================================================  =========================================
status  when                                                errorCode
======  ==================================================  =========================================
400     condition, projection, sort, limit, pagination;     IllegalArgument
        path id, head/tail, tenant header; malformed
        JSON, not UTF-8, lone surrogates, non-finite or
        over-64-bit numbers, deep nesting
400     a query the database stopped at its time limit      QueryTooExpensive
        (not retried, no Retry-After)
400     command body, Command-Request-Id,                   CommandValidation
        Command-Wait-Stage, Command-Wait-Timeout,
        Command-Aggregate-Version
400     a request Django refused before any view            BadRequest
        (``handlers.bad_request``)
400     an invalid bus envelope, feedback or event query    BusValidation
400     DomainError (as Wow's server: its codes default     the handler's code (ORDER_CANCELLED...)
        to 400), DuplicateAggregateId, DuplicateRequestId   DuplicateAggregateId, DuplicateRequestId,
        (a request id reused with another command or        KeyAlreadyPrepared, KeyNotHeld,
        body), KeyAlreadyPrepared, KeyNotHeld,              AggregateNotDeleted
        recover_aggregate on a live aggregate
401     no or bad credentials (403 when the first           NotAuthenticated, AuthenticationFailed
        authentication class has no challenge)
403     a permission class or the tenant resolver refuses   PermissionDenied
403     the owner policy: another user's aggregate          IllegalAccessOwnerAggregate
403     a consumer reports on an event it was not sent      ConsumerNotExpected
404     unknown aggregate, command or route; nothing        NotFound
        stored under the id for this tenant; no bus
        event or trace with the id
405     wrong method                                        MethodNotAllowed
406     Accept excludes application/json                    NotAcceptable
409     the aggregate is not at Command-Aggregate-Version   CommandExpectVersionConflict
409     EventVersionConflict (retries exhausted)            EventVersionConflict
409     a refused re-push                                   RepushNotAllowed, RepushTooEarly,
                                                            RepushLimitReached, RepushConflict,
                                                            AlreadyConsumed, EventExpired,
                                                            ConsumerNotExpected
410     a deleted aggregate: its state, or a command        IllegalAccessDeletedAggregate
        other than recover_aggregate
413     body over DATA_UPLOAD_MAX_MEMORY_SIZE               PayloadTooLarge
415     an unsafe request without Content-Type:            UnsupportedMediaType
        application/json, whatever the body
429     throttled (Retry-After)                             TooManyRequests
503     RecoverableStoreError, broker unreachable,          StoreUnavailable, BrokerUnavailable,
        bus transport down, a rollup that did not settle    BusTransportUnavailable, BusError
        (Retry-After: 1)
======  ==================================================  =========================================

A command result (200/202) carries ``errorCode`` too: ``Ok``, or
``RequestTimeout`` / ``DispatchFailed`` when the events were stored but the
asked stage was not confirmed. A command refused once its request was read
answers its result with the error (``command_result`` on the exception), as
Wow's server does; every error answer repeats its code in ``Wow-Error-Code``.

Anything else is a bug and is left to Django (a 500 with the traceback logged).

This is the one place where an error gets an HTTP status: every view of
wow_django (aggregates and bus) answers through :func:`exception_handler`, and
a project may name it in ``REST_FRAMEWORK["EXCEPTION_HANDLER"]`` for its own
views too.
"""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DataError
from django.http import Http404
from kombu.exceptions import OperationalError as BrokerError
from rest_framework import exceptions as drf
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from wow_django.exceptions import (
    AggregateIsDeleted,
    AggregateNotFound,
    BusError,
    CommandError,
    CommandExpectVersionConflict,
    CommandValidationError,
    ConsumerNotExpected,
    DuplicateAggregateId,
    DuplicateRequestId,
    EnvelopeValidationError,
    ErrorCodes,
    EventNotFound,
    EventStoreError,
    KeyAlreadyPrepared,
    KeyNotHeld,
    NotAggregateOwner,
    RecoverableStoreError,
    RepushRefused,
    RequestIdReused,
    TraceNotFound,
    TransportUnavailable,
    UnknownAggregate,
    UnknownCommand,
    WowError,
    left_out,
    reported_binding_errors,
    shorten,
)
from wow_django.query.errors import QueryValidationError

RETRY_AFTER_S = "1"
#: The response header that repeats an error's code, as Wow's server sets it.
WOW_ERROR_CODE_HEADER = "Wow-Error-Code"

logger = logging.getLogger("wow_django.http")

# A 503's cause names internal hosts (pymongo's topology description, a broker URL with its
# password): it is logged, and the client gets only what to do.
UNAVAILABLE_MESSAGES = {
    ErrorCodes.STORE_UNAVAILABLE: "The store is unavailable for a moment; retry later.",
    ErrorCodes.BUS_TRANSPORT_UNAVAILABLE: "The bus transport is unavailable for a moment; retry later.",
    ErrorCodes.BROKER_UNAVAILABLE: "The task broker is unreachable; retry later.",
}


class InvalidRequest(WowError):
    """A path parameter or header breaks a rule; ``binding_errors`` names it."""

    error_code = ErrorCodes.ILLEGAL_ARGUMENT

    def __init__(self, name: str, rule: str):
        self.binding_errors = [{"name": name, "msg": rule}]
        super().__init__(f"{name}: {rule}")


class ResourceNotFound(WowError):
    """Nothing is stored under this id for this tenant, or no route has this path."""

    error_code = ErrorCodes.NOT_FOUND


MAX_MESSAGE_LENGTH = 4000


def error_body(code: str, message: str, binding_errors=()) -> dict:
    """The error JSON; at most MAX_BINDING_ERRORS binding errors, names and texts shortened, the rest counted."""
    shown, omitted = reported_binding_errors(binding_errors)
    note = left_out(omitted)
    if omitted and note not in message:
        message = f"{message} {note}"
    if len(message) > MAX_MESSAGE_LENGTH:
        message = shorten(message, MAX_MESSAGE_LENGTH - len(note) - 1) + (f" {note}" if omitted else "")
    return {"errorCode": code, "errorMsg": message, "bindingErrors": shown}


# Checked in order: subclasses before their bases.
_WOW_STATUS: tuple[tuple[type[WowError], int], ...] = (
    (QueryValidationError, status.HTTP_400_BAD_REQUEST),
    (CommandValidationError, status.HTTP_400_BAD_REQUEST),
    (InvalidRequest, status.HTTP_400_BAD_REQUEST),
    (UnknownAggregate, status.HTTP_404_NOT_FOUND),
    (UnknownCommand, status.HTTP_404_NOT_FOUND),
    (AggregateNotFound, status.HTTP_404_NOT_FOUND),
    (ResourceNotFound, status.HTTP_404_NOT_FOUND),
    (AggregateIsDeleted, status.HTTP_410_GONE),
    (NotAggregateOwner, status.HTTP_403_FORBIDDEN),
    # As Wow's server answers them (ErrorHttpStatusMapping): a request id reused with another body, an id
    # already taken, a key already prepared, a business rule: 400; version conflicts: 409.
    (RequestIdReused, status.HTTP_400_BAD_REQUEST),
    (CommandExpectVersionConflict, status.HTTP_409_CONFLICT),
    (RecoverableStoreError, status.HTTP_503_SERVICE_UNAVAILABLE),
    (KeyAlreadyPrepared, status.HTTP_400_BAD_REQUEST),
    # The reservation to move is missing, expired or another's: refused as a taken key is.
    (KeyNotHeld, status.HTTP_400_BAD_REQUEST),
    (EnvelopeValidationError, status.HTTP_400_BAD_REQUEST),
    (EventNotFound, status.HTTP_404_NOT_FOUND),
    (TraceNotFound, status.HTTP_404_NOT_FOUND),
    (ConsumerNotExpected, status.HTTP_403_FORBIDDEN),
    (RepushRefused, status.HTTP_409_CONFLICT),
    (TransportUnavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
    # A rollup that did not settle under concurrent changes: retrying helps.
    (BusError, status.HTTP_503_SERVICE_UNAVAILABLE),
    # DomainError (a business rule, with its handler's code) and the rest: Wow's default, 400.
    (CommandError, status.HTTP_400_BAD_REQUEST),
    (DuplicateAggregateId, status.HTTP_400_BAD_REQUEST),
    (DuplicateRequestId, status.HTTP_400_BAD_REQUEST),
    # EventVersionConflict (retries exhausted), DuplicateEventStreamId, a stream the store refused.
    (EventStoreError, status.HTTP_409_CONFLICT),
)


def _drf_binding_errors(detail, prefix: str = "") -> list[dict]:
    if isinstance(detail, dict):
        found = []
        for key, value in detail.items():
            found.extend(_drf_binding_errors(value, f"{prefix}.{key}" if prefix else str(key)))
        return found
    if isinstance(detail, list):
        found = []
        for item in detail:
            found.extend(_drf_binding_errors(item, prefix))
        return found
    return [{"name": prefix, "msg": str(detail)}]


def _drf_message(detail) -> str:
    if isinstance(detail, dict | list):
        parts = _drf_binding_errors(detail)
        return "; ".join(f"{p['name']}: {p['msg']}" if p["name"] else p["msg"] for p in parts) or "Invalid request."
    return str(detail)


# DRF's own errors, by their code: Wow's name where Wow has one, else the code in Wow's PascalCase style.
_DRF_CODES = {
    "parse_error": ErrorCodes.ILLEGAL_ARGUMENT,  # Wow answers a body it cannot decode with IllegalArgument
    "invalid": ErrorCodes.ILLEGAL_ARGUMENT,
    "not_found": ErrorCodes.NOT_FOUND,
    "throttled": ErrorCodes.TOO_MANY_REQUESTS,
    "request_too_large": ErrorCodes.PAYLOAD_TOO_LARGE,
}


def drf_error_code(exc: drf.APIException) -> str:
    """The ``errorCode`` of a DRF exception (``not_authenticated`` → ``NotAuthenticated``)."""
    code = str(getattr(exc, "default_code", "error"))
    return _DRF_CODES.get(code) or "".join(part.capitalize() for part in code.split("_"))


def error_response(exc: BaseException) -> Response | None:
    """The JSON error response for ``exc`` (its code repeated in ``Wow-Error-Code``), or ``None`` when it is
    not a client's error."""
    response = _error_response(exc)
    if response is not None and isinstance(response.data, dict) and response.data.get("errorCode"):
        response[WOW_ERROR_CODE_HEADER] = response.data["errorCode"]
    return response


def _error_response(exc: BaseException) -> Response | None:
    if isinstance(exc, WowError):
        for cls, code in _WOW_STATUS:
            if isinstance(exc, cls):
                if exc.error_code in UNAVAILABLE_MESSAGES:
                    return _unavailable(exc.error_code, exc)
                message = str(exc)
                if type(exc) is EventStoreError:
                    # The store's own words (a server's error message, a refused statement) stay in the log: the
                    # answer says what happened, not what the database said.
                    logger.warning("answering %s for a store error: %s", code, message)
                    message = "The command's events could not be stored; nothing was appended."
                body = error_body(exc.error_code, message, getattr(exc, "binding_errors", ()))
                result = getattr(exc, "command_result", None)
                if result is not None:  # a refused command: its result, as Wow answers one (aggregateId, commandId…)
                    body = {**result.to_json(), **body}
                headers = {"Retry-After": RETRY_AFTER_S} if code == status.HTTP_503_SERVICE_UNAVAILABLE else None
                return Response(body, status=code, headers=headers)
        return None
    if isinstance(exc, BrokerError):
        return _unavailable(ErrorCodes.BROKER_UNAVAILABLE, exc)
    if isinstance(exc, DataError):
        # A value the database cannot take (a NUL character, a number out of range): the client's input. The
        # database's own text (parts of the statement) goes to the log, never into the answer.
        logger.warning("answering 400 for a value the database refused: %s: %s", type(exc).__name__, exc)
        return Response(error_body(ErrorCodes.ILLEGAL_ARGUMENT, "A value of the request cannot be stored or "
                                   "looked up (e.g. a NUL character, a number out of range)."),
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        return Response(error_body(ErrorCodes.NOT_FOUND, str(exc) or "Not found."), status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, DjangoPermissionDenied):
        return Response(error_body(ErrorCodes.PERMISSION_DENIED, str(exc) or "Permission denied."),
                        status=status.HTTP_403_FORBIDDEN)
    if isinstance(exc, drf.APIException):
        headers = {}
        auth_header = getattr(exc, "auth_header", None)  # DRF's handle_exception sets it on a 401
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
        wait = getattr(exc, "wait", None)  # Throttled's
        if wait:
            headers["Retry-After"] = str(int(wait))
        binding = _drf_binding_errors(exc.detail) if isinstance(exc.detail, dict | list) else []
        return Response(error_body(drf_error_code(exc), _drf_message(exc.detail), binding), status=exc.status_code,
                        headers=headers or None)
    return None


def _unavailable(code: str, exc: BaseException) -> Response:
    logger.warning("answering 503 %s: %s: %s", code, type(exc).__name__, exc)
    return Response(error_body(code, UNAVAILABLE_MESSAGES[code]), status=status.HTTP_503_SERVICE_UNAVAILABLE,
                    headers={"Retry-After": RETRY_AFTER_S})


def exception_handler(exc: BaseException, context: dict | None = None) -> Response | None:
    """DRF's exception handler for every wow_django view: the JSON error, the transaction rolled back.

    ``None`` (a 500, left to Django) for anything that is not a client's error.
    """
    response = error_response(exc)
    if response is not None:
        set_rollback()
    return response

