"""Thin DRF views over the command gateway and the query services.

Each view is a few small hooks a subclass can replace:

* policy: ``get_authentication_classes()``, ``get_permission_classes()``;
* request facts: ``get_tenant_id()``, ``get_operator()``, ``get_owner_id()``,
  ``get_request_id()``, ``get_wait_stage()``, ``get_wait_timeout()``,
  ``get_expected_version()``, ``get_command_header()``;
* queries: ``get_query_service()``, ``parse_query()``, ``get_scope()``,
  ``run_query()``;
* reads by id: ``load_aggregate()``, ``load_snapshot()``, ``load_events()``.

Routes are built per aggregate by :mod:`wow_django.http.urls`; views get the
aggregate class (and the command, query kind and operation) as ``as_view``
arguments. Permission classes can look at ``view.aggregate``,
``view.action`` (``command``, ``delete``, ``recover``, ``state``,
``snapshot``, ``event_range``, ``snapshot_query``, ``event_query``) and, for
commands, ``view.command``.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.schemas.inspectors import ViewInspector
from rest_framework.settings import api_settings

from wow_django.application import queries
from wow_django.application.gateway import ID_RULE as GATEWAY_ID_RULE
from wow_django.application.gateway import (
    CommandGateway,
    CommandResult,
    WaitFunction,
    WaitStage,
    check_wait_function,
    is_valid_id,
    stage_path,
)
from wow_django.application.runtime import get_runtime
from wow_django.conf import wow_settings
from wow_django.domain.aggregate import Aggregate, aggregate_type
from wow_django.domain.messages import Command, DeleteAggregate, RecoverAggregate
from wow_django.domain.values import stored
from wow_django.exceptions import (
    AggregateIsDeleted,
    CommandValidationError,
    UnknownAggregate,
    UnknownCommand,
    binding_summary,
)
from wow_django.http import contract, sse
from wow_django.http.base import WowView, default_authentication_classes, import_classes
from wow_django.http.errors import InvalidRequest, ResourceNotFound, error_response
from wow_django.http.headers import (
    AGGREGATE_ID_HEADER,
    AGGREGATE_VERSION_HEADER,
    MAX_WAIT_TIMEOUT_MS,
    OWNER_ID_HEADER,
    REQUEST_ID_HEADER,
    WAIT_CONTEXT_HEADER,
    WAIT_FUNCTION_HEADER,
    WAIT_PROCESSOR_HEADER,
    WAIT_STAGE_HEADER,
    WAIT_TAIL_PREFIX,
    WAIT_TIMEOUT_HEADER,
)
from wow_django.http.parsers import CommandJSONParser, QueryJSONParser
from wow_django.http.permissions import ACT_FOR_ANY_OWNER
from wow_django.http.schema import QUERY_BODIES, WowAutoSchema, pydantic_models
from wow_django.http.sse import wants_event_stream
from wow_django.http.tenancy import check_tenant_id
from wow_django.persistence.documents import stream_to_document
from wow_django.persistence.query import EVENT_STREAM, SNAPSHOT, present
from wow_django.persistence.records import MAX_VERSION, AggregateId, EventStream
from wow_django.query.condition import Condition, DeletionState, Operator, SingleQuery, and_conditions

ID_RULE = f"an id is {GATEWAY_ID_RULE}"

logger = logging.getLogger("wow_django.http")


def check_aggregate_id(value: str, name: str = "id") -> str:
    if not is_valid_id(value):
        raise InvalidRequest(name, ID_RULE)
    return value


class WowAPIView(WowView):
    """Policy, request facts and JSON errors shared by every API view."""

    aggregate: type[Aggregate] | None = None
    action = ""
    resolves_tenant = True
    schema: ViewInspector | None = WowAutoSchema()

    # --- policy: the aggregate's own, else WOW's API_*_CLASSES, else DRF's defaults ---------------

    def get_authentication_classes(self) -> list[type]:
        own = getattr(self.aggregate, "api_authentication_classes", None)
        if own is not None:
            return import_classes(own)
        return default_authentication_classes()

    def get_permission_classes(self) -> list[type]:
        own = getattr(self.aggregate, "api_permission_classes", None)
        if own is not None:
            return import_classes(own)
        if wow_settings.API_PERMISSION_CLASSES is not None:
            return import_classes(wow_settings.API_PERMISSION_CLASSES)
        return list(api_settings.DEFAULT_PERMISSION_CLASSES)  # type: ignore[arg-type]  # classes at runtime, not str

    def get_permissions(self):
        return [cls() for cls in self.get_permission_classes()]

    # --- request facts ----------------------------------------------------------------------------

    def dispatch(self, request, *args, **kwargs):
        # Wow's attribution prefixes (tenant/{tenantId}/…, owner/{ownerId}/…): facts of the request, not
        # arguments of its handler.
        self.path_tenant = kwargs.pop("tenant_id", None)
        self.path_owner = kwargs.pop("owner_id", None)
        return super().dispatch(request, *args, **kwargs)

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if self.resolves_tenant:
            self.get_tenant_id()  # a bad or missing tenant fails every route the same way, before any read
            self.get_path_owner()

    def get_tenant_id(self) -> str:
        """The tenant this request acts for, from ``WOW["TENANT_RESOLVER"]`` (asked once per request); under a
        ``tenant/{tenantId}/`` prefix the resolver decides whether the path's tenant is the request's."""
        if not hasattr(self, "_tenant_id"):
            resolver = wow_settings.TENANT_RESOLVER()
            claimed = getattr(self, "path_tenant", None)
            if claimed is None:
                self._tenant_id = resolver.resolve(self.request)
            else:
                check_tenant_id(claimed, "tenantId")
                self._tenant_id = resolver.resolve_for_path(self.request, claimed)
        return self._tenant_id

    def get_path_owner(self) -> str | None:
        """The owner an ``owner/{ownerId}/`` prefix names (None without one): the request's own operator, or any
        owner for a user with the permission ``wow_django.act_for_any_owner`` (403 otherwise). Queries under it
        see that owner's aggregates only, reads by id find only theirs, commands act as that owner."""
        owner = getattr(self, "path_owner", None)
        if owner is None:
            return None
        if not is_valid_id(owner):
            raise InvalidRequest("ownerId", f"an owner id is {GATEWAY_ID_RULE}")
        if owner != self.get_operator() and not self.may_act_for_any_owner():
            raise PermissionDenied(f"The path names an owner other than you: it needs the {ACT_FOR_ANY_OWNER!r} "
                                   "permission.")
        return owner

    def may_act_for_any_owner(self) -> bool:
        user = getattr(self.request, "user", None)
        return bool(user is not None and user.is_authenticated and user.has_perm(ACT_FOR_ANY_OWNER))

    def owned_by_path_owner(self, owner_id: str) -> bool:
        """Whether an aggregate owned by ``owner_id`` is visible under this request's owner prefix (if any)."""
        owner = self.get_path_owner()
        return owner is None or owner == owner_id

    def get_operator(self) -> str:
        """Who acts: the authenticated user's primary key, or "" for anonymous requests."""
        user = getattr(self.request, "user", None)
        if user is None or not user.is_authenticated:
            return ""
        key = getattr(user, "pk", None)
        return str(key) if key is not None else str(user.get_username())

    def get_owner_id(self) -> str:
        """The owner the request acts as: the operator, or the ``Command-Owner-Id`` header — honoured when it
        names the operator, or when the user may act for any owner (the permission
        ``wow_django.act_for_any_owner``, as the owner policy's); refused (403) otherwise."""
        if not hasattr(self, "_owner_id"):
            self._owner_id = self._requested_owner()
        return self._owner_id

    def _requested_owner(self) -> str:
        operator = self.get_operator()
        value = self.request.headers.get(OWNER_ID_HEADER)
        path_owner = self.get_path_owner()
        if path_owner is not None:
            if value is not None and value != path_owner:
                raise InvalidRequest(OWNER_ID_HEADER, "names another owner than the path (owner/{ownerId}/…)")
            return path_owner
        if value is None or value == operator:
            return operator
        if not is_valid_id(value):
            raise InvalidRequest(OWNER_ID_HEADER, f"an owner id is {GATEWAY_ID_RULE}")
        if self.may_act_for_any_owner():
            return value
        raise PermissionDenied(f"{OWNER_ID_HEADER} names another owner than you: it needs the "
                               f"{ACT_FOR_ANY_OWNER!r} permission.")

    def get_gateway(self) -> CommandGateway:
        return get_runtime().gateway


# --- commands ---------------------------------------------------------------------------------------


class CommandSenderView(WowAPIView):
    """Sends ``command`` through the gateway with the request's facts; subclasses add the HTTP method."""

    action = "command"
    command: type[Command] | None = None
    # Accept: text/event-stream streams the stages (wow_django.http.sse).
    renderer_classes = [JSONRenderer, sse.EventStreamRenderer, BrowsableAPIRenderer]
    #: Whether the gateway refuses the command on an aggregate another user owns (set by the owner policy,
    #: :class:`~wow_django.http.permissions.IsOwnerOrPermitted`).
    owner_only = False
    # Decimals as sent: the command's model judges them (decimal_places, max_digits), not a float.
    parser_classes = [CommandJSONParser]

    def get_request_id(self) -> str | None:
        """``Command-Request-Id``, or None without the header (an empty one is refused, as the schema says)."""
        value = self.request.headers.get(REQUEST_ID_HEADER)
        if value is not None and not is_valid_id(value):
            # Named as the client sent it (the header), not as the gateway's argument; never echoed in full.
            rule = f"must be {GATEWAY_ID_RULE} (got {len(value)} characters)"
            raise CommandValidationError(f"{REQUEST_ID_HEADER} {rule}", [{"name": REQUEST_ID_HEADER, "msg": rule}])
        return value

    def get_wait_stage(self) -> WaitStage:
        """``Command-Wait-Stage``: one of the stages, spelled as the schema's enum; PROCESSED without the header."""
        value = self.request.headers.get(WAIT_STAGE_HEADER)
        if value is None:
            return WaitStage.PROCESSED
        if value not in WaitStage.__members__:
            _refuse_wait_stage(value)
        return WaitStage(value)

    def get_wait_function(self, stage: WaitStage) -> WaitFunction:
        """``Command-Wait-Context``/``-Processor``/``-Function``: which followers a handler stage waits for
        (refused with a 400 naming the header when they name none of this aggregate's, another context, or
        narrow a stage that waits for no follower). Wow's ``Command-Wait-Tail-*`` (a wait for the command a saga
        sends) is refused: not supported."""
        assert self.aggregate is not None  # as_view(aggregate=...) sets it
        for name in self.request.headers:
            if name.lower().startswith(WAIT_TAIL_PREFIX.lower()):
                raise CommandValidationError(
                    f"{name} is not supported: wow_django does not wait for the commands a follower sends",
                    [{"name": name, "msg": "not supported (leave it out)"}])
        only = WaitFunction(*(self.request.headers.get(name, "") for name in
                              (WAIT_CONTEXT_HEADER, WAIT_PROCESSOR_HEADER, WAIT_FUNCTION_HEADER)))
        for name in (WAIT_CONTEXT_HEADER, WAIT_PROCESSOR_HEADER, WAIT_FUNCTION_HEADER):
            if self.request.headers.get(name) == "":
                raise CommandValidationError(f"{name} is empty", [{"name": name, "msg": "must not be empty"}])
        alias = wow_settings.CONTEXT_ALIAS
        checked = check_wait_function(
            self.aggregate.aggregate_name, stage, only, wow_settings.CONTEXT_NAME,
            fields={"context": WAIT_CONTEXT_HEADER, "processor": WAIT_PROCESSOR_HEADER,
                    "function": WAIT_FUNCTION_HEADER},
            aliases=(alias,) if alias else ())
        return dataclasses.replace(checked, context="")  # this service's (its name or alias): checked

    def get_wait_timeout(self) -> float | None:
        """``Command-Wait-Timeout`` (whole milliseconds) in seconds, at most ``COMMAND_WAIT_TIMEOUT_S``; None
        without the header (the gateway's default)."""
        milliseconds = _whole_number_header(self.request, WAIT_TIMEOUT_HEADER, MAX_WAIT_TIMEOUT_MS,
                                            "whole milliseconds")
        if milliseconds is None:
            return None
        return min(milliseconds / 1000, wow_settings.COMMAND_WAIT_TIMEOUT_S)

    def get_expected_version(self) -> int | None:
        """``Command-Aggregate-Version``: the version the aggregate must be at (0: not created yet)."""
        return _whole_number_header(self.request, AGGREGATE_VERSION_HEADER, MAX_VERSION,
                                    "the aggregate version the command expects (0: not created yet)")

    def get_command_header(self) -> dict:
        """Extra entries for the event stream's ``header`` (empty by default)."""
        return {}

    def get_aggregate_owner(self, aggregate_id: str) -> str | None:
        """The owner of this tenant's aggregate ``aggregate_id`` ("" for none), or None when the tenant has no
        such aggregate (for :class:`~wow_django.http.permissions.IsOwnerOrPermitted`; one read of its last
        event stream: the owner is set when the aggregate is created and never changes)."""
        assert self.aggregate is not None  # as_view(aggregate=...) sets it
        key = AggregateId(self.aggregate.aggregate_name, aggregate_id, wow_settings.CONTEXT_NAME,
                          self.get_tenant_id())
        last = get_runtime().event_store.last(key)
        if last is None or last.aggregate_id.tenant_id != key.tenant_id:
            return None
        return last.owner_id

    def get_aggregate_id(self, path_id: str | None) -> str | None:
        """The aggregate the command acts on: the path's id, else ``Command-Aggregate-Id`` (a create command's id
        chosen by the client), else None (a create derives or draws one). A header naming another aggregate than
        the path is refused."""
        value = self.request.headers.get(AGGREGATE_ID_HEADER)
        if value is not None and not is_valid_id(value):
            raise CommandValidationError(f"{AGGREGATE_ID_HEADER} must be {GATEWAY_ID_RULE}",
                                         [{"name": AGGREGATE_ID_HEADER, "msg": f"must be {GATEWAY_ID_RULE}"}])
        if path_id is not None:
            check_aggregate_id(path_id)
            if value is not None and value != path_id:
                raise CommandValidationError(
                    f"{AGGREGATE_ID_HEADER} names another aggregate than the path",
                    [{"name": AGGREGATE_ID_HEADER, "msg": "must be the path's aggregate id (or be left out)"}])
            return path_id
        return value

    def send_command(self, *, aggregate_id: str | None, body) -> Response:
        assert self.aggregate is not None and self.command is not None  # as_view(aggregate=..., command=...)
        aggregate_id = self.get_aggregate_id(aggregate_id)
        if self.get_path_owner() is not None:
            self.owner_only = True  # owner/{ownerId}/…: only that owner's aggregates
        self.check_body(body)
        if wants_event_stream(self.request):
            return self.stream_command(aggregate_id, body)
        wait = self.get_wait_stage()
        wait_for = self.get_wait_function(wait)
        result = self.get_gateway().send_json(
            self.aggregate.aggregate_name,
            self.command.command_name,
            body,
            aggregate_id=aggregate_id,
            request_id=self.get_request_id(),
            tenant_id=self.get_tenant_id(),
            owner_id=self.get_owner_id(),
            operator=self.get_operator(),
            header=self.get_command_header(),
            wait=wait,
            timeout=self.get_wait_timeout(),
            expected_version=self.get_expected_version(),
            owner_only=self.owner_only,
            wait_for=wait_for,
        )
        return Response(result.to_json(), status=self.result_status(result))

    def stream_command(self, aggregate_id: str | None, body):
        """``Accept: text/event-stream``: one event per stage reached, up to the one asked, within the wait
        timeout (see :mod:`wow_django.http.sse`). The request's facts are read (and refused) before streaming;
        the stages after PROCESSED are waited for by sending the same request again, which the gateway answers
        from what is stored once the stage is reached, appending nothing."""
        assert self.aggregate is not None and self.command is not None  # as_view(aggregate=..., command=...)
        asked = self.get_wait_stage()
        wait_for = self.get_wait_function(asked)
        timeout = self.get_wait_timeout()
        deadline = time.monotonic() + (timeout if timeout is not None else wow_settings.COMMAND_WAIT_TIMEOUT_S)
        facts = dict(
            aggregate_id=aggregate_id, request_id=self.get_request_id(),
            tenant_id=self.get_tenant_id(), owner_id=self.get_owner_id(), operator=self.get_operator(),
            header=self.get_command_header(), expected_version=self.get_expected_version(),
            owner_only=self.owner_only,
        )
        gateway, aggregate, command = self.get_gateway(), self.aggregate.aggregate_name, self.command.command_name
        stages = stage_path(asked)

        def events():
            first = None
            try:
                for stage in stages:
                    remaining = max(0.0, deadline - time.monotonic())
                    # The later stages send the first request again (its request id: the client's, or the one
                    # the gateway gave it), which the gateway answers from what is stored.
                    again = {"aggregate_id": first.aggregate_id, "request_id": first.request_id} if first else {}
                    result = gateway.send_json(aggregate, command, body, wait=stage, timeout=remaining,
                                               wait_for=wait_for if stage is asked else None,
                                               **{**facts, **again})
                    if first is None:
                        first = result
                    else:  # the same command, waited for further: not a repeat of the client's
                        result = dataclasses.replace(result, duplicate=first.duplicate)
                    yield sse.event(result.to_json(), name=result.stage.value, event_id=result.to_json()["id"])
                    if not result.succeeded:  # the stage was not confirmed in time: nothing more will come
                        return
            except Exception as exc:  # after the 200: an event says what became of it, as the JSON answer would
                answer = error_response(exc)
                if answer is None:  # not the client's error: logged as the JSON path's 500 would be
                    logger.exception("streaming %s %s failed", aggregate, command)
                    yield sse.event({"errorCode": "InternalServerError", "errorMsg": "The command's stream failed; "
                                     "look its request id up (request/{requestId}/status).", "bindingErrors": []},
                                    name="InternalServerError")
                else:
                    yield sse.event(answer.data, name=answer.data.get("errorCode"))

        return sse.streaming_response(self.request, events())

    def check_body(self, body) -> None:
        """The command's own validation first (pydantic's words), then the OpenAPI schema's, which also refuses
        what pydantic would coerce (``"5"`` for an integer, ``" 1.5"`` for a Decimal): CommandValidationError."""
        if self.command is DeleteAggregate:  # no body: nothing to check
            return
        assert self.command is not None  # as_view(command=...) sets it
        self.command.from_json(body if body is not None else {})
        models = pydantic_models()
        if (self.command, "validation") not in models:  # declared after the schema's models were listed
            models = ((self.command, "validation"),)
        errors = contract.violations(body, contract.component_name(self.command, "validation", models), models)
        if errors:
            raise CommandValidationError(f"Invalid {self.command.command_name!r} command: "
                                         f"{binding_summary(errors)}", errors)

    @staticmethod
    def result_status(result: CommandResult) -> int:
        """200 when the asked stage was reached; 202 when queued (SENT) or stored but the stage not confirmed."""
        if result.stage is WaitStage.SENT or not result.succeeded:
            return status.HTTP_202_ACCEPTED
        return status.HTTP_200_OK


def _refuse_wait_stage(value: str) -> None:
    allowed = ", ".join(s.value for s in WaitStage)
    shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}… ({len(value)} characters)"
    raise CommandValidationError(f"{WAIT_STAGE_HEADER} {shown} is not one of {allowed}",
                                 [{"name": WAIT_STAGE_HEADER, "msg": f"must be one of {allowed}"}])


def _whole_number_header(request, name: str, maximum: int, meaning: str) -> int | None:
    """The header ``name`` as a whole number from 0 to ``maximum`` (decimal digits only), or None when absent."""
    value = request.headers.get(name)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 10 and int(value) <= maximum):
        rule = f"must be a whole number from 0 to {maximum}: {meaning}"
        shown = repr(value) if len(value) <= 40 else f"{value[:40]!r}… ({len(value)} characters)"
        raise CommandValidationError(f"{name} {rule} (got {shown})", [{"name": name, "msg": rule}])
    return int(value)


class CommandView(CommandSenderView):
    """``POST {aggregate}/{command}`` (create) and ``POST {aggregate}/{id}/{command}``."""

    def post(self, request, id: str | None = None):
        return self.send_command(aggregate_id=id, body=request.data)


class DeleteAggregateView(CommandSenderView):
    """``DELETE {aggregate}/{id}``: the built-in soft delete."""

    action = "delete"
    command = DeleteAggregate

    def delete(self, request, id: str):
        return self.send_command(aggregate_id=id, body={})

    def http_method_not_allowed(self, request, *args, **kwargs):
        # POST {aggregate}/{segment}: the client meant a create command this aggregate does not have.
        if request.method == "POST":
            raise UnknownCommand(_misrouted(self.aggregate, kwargs.get("id"), with_id=False))
        return super().http_method_not_allowed(request, *args, **kwargs)


class RecoverAggregateView(CommandSenderView):
    """``PUT {aggregate}/{id}/recover``: undo a soft delete."""

    action = "recover"
    command = RecoverAggregate

    def put(self, request, id: str):
        return self.send_command(aggregate_id=id, body=request.data)


# --- reads by id ----------------------------------------------------------------------------------------


class StateView(WowAPIView):
    """``GET {aggregate}/{id}/state``: the current state (snapshot plus later events)."""

    action = "state"

    def get(self, request, id: str, version: int | None = None, create_time: int | None = None):
        # As stored and as queries answer: Decimals as JSON numbers, times as canonical UTC text.
        return Response(stored(self.load_aggregate(id, version=version, create_time=create_time).state))

    def load_aggregate(self, aggregate_id: str, *, version: int | None = None,
                       create_time: int | None = None) -> Aggregate:
        """The tenant's aggregate: current, at ``version`` (``{id}/state/{version}``: its state after that version,
        or the current one below it), or as it was at ``create_time`` (``{id}/state/time/{createTime}``, epoch
        ms), as Wow's routes answer."""
        assert self.aggregate is not None  # as_view(aggregate=...) sets it
        check_aggregate_id(aggregate_id)
        repository = self.get_gateway().repository
        if version is not None:
            if not 1 <= version <= MAX_VERSION:
                raise InvalidRequest("version", f"a version is a whole number from 1 to {MAX_VERSION}")
            aggregate = repository.load(self.aggregate, aggregate_id, tenant_id=self.get_tenant_id(),
                                        tail_version=version)
        elif create_time is not None:
            if not 0 <= create_time < 2**63:
                raise InvalidRequest("createTime", "a time is epoch milliseconds, a whole number from 0")
            aggregate = repository.load_at_time(self.aggregate, aggregate_id, tenant_id=self.get_tenant_id(),
                                                create_time=create_time)
        else:
            aggregate = repository.load(self.aggregate, aggregate_id, tenant_id=self.get_tenant_id())
        if (aggregate is None or aggregate.tenant_id != self.get_tenant_id()
                or not self.owned_by_path_owner(aggregate.owner_id)):
            raise ResourceNotFound(f"{self.aggregate.aggregate_name} {aggregate_id!r} does not exist.")
        if aggregate.deleted:
            raise AggregateIsDeleted(
                f"{self.aggregate.aggregate_name} {aggregate_id!r} is deleted; recover it to see its state."
            )
        return aggregate


class CommandStatusView(WowAPIView):
    """``GET {aggregate}/request/{requestId}/status``: what became of the command sent with that request id.

    The stage it reached and its error, if any (a command result, as the command's own answer has it);
    ``?aggregateId=`` finds a command on an existing aggregate that was not sent with wait stage SENT.
    404 when nothing is known of the request in this tenant.
    """

    action = "status"

    def get(self, request, request_id: str):
        assert self.aggregate is not None  # as_view(aggregate=...) sets it
        check_aggregate_id(request_id, "requestId")
        aggregate_id = request.query_params.get("aggregateId")
        if aggregate_id is not None:
            check_aggregate_id(aggregate_id, "aggregateId")
        result = self.get_gateway().status(self.aggregate, request_id, tenant_id=self.get_tenant_id(),
                                           aggregate_id=aggregate_id)
        if result is not None and self.get_path_owner() is not None:  # under owner/{ownerId}/: that owner's only
            last = get_runtime().event_store.last(AggregateId(
                self.aggregate.aggregate_name, result.aggregate_id, wow_settings.CONTEXT_NAME, self.get_tenant_id()))
            if last is None or not self.owned_by_path_owner(last.owner_id):
                result = None
        if result is None:
            where = " (a command on an existing aggregate needs ?aggregateId=)" if aggregate_id is None else ""
            raise ResourceNotFound(f"Nothing is known of request {request_id!r} to "
                                   f"{self.aggregate.aggregate_name}{where}.")
        return Response(result.to_json())


class SnapshotView(WowAPIView):
    """``GET {aggregate}/{id}/snapshot``: the stored snapshot, deleted or not."""

    action = "snapshot"

    def get(self, request, id: str):
        return Response(self.load_snapshot(id))

    def load_snapshot(self, aggregate_id: str) -> dict:
        assert self.aggregate is not None  # as_view(aggregate=...) sets it
        check_aggregate_id(aggregate_id)
        parts = [Condition(operator=Operator.ID, value=aggregate_id),
                 Condition(operator=Operator.DELETED, value=DeletionState.ALL)]
        owner = self.get_path_owner()
        if owner is not None:
            parts.append(Condition(operator=Operator.OWNER_ID, value=owner))
        condition = and_conditions(*parts)
        service = get_runtime().snapshot_queries(self.aggregate.aggregate_name)
        found = service.single(SingleQuery(condition=condition), tenant_id=self.get_tenant_id())
        if found is None:
            raise ResourceNotFound(f"{self.aggregate.aggregate_name} {aggregate_id!r} has no snapshot.")
        return found


class EventRangeView(WowAPIView):
    """``GET {aggregate}/{id}/event/{head}/{tail}``: the event streams with ``head <= version <= tail`` (none when
    ``tail < head``); 404 when the aggregate does not exist for this tenant."""

    action = "event_range"

    def get(self, request, id: str, head: int, tail: int):
        streams = self.load_events(id, head, tail)
        return Response([present(EVENT_STREAM, stream_to_document(stream)) for stream in streams])

    def load_events(self, aggregate_id: str, head: int, tail: int) -> list[EventStream]:
        assert self.aggregate is not None  # as_view(aggregate=...) sets it
        check_aggregate_id(aggregate_id)
        for name, value in (("head", head), ("tail", tail)):
            if not 1 <= value <= MAX_VERSION:
                raise InvalidRequest(name, f"a version is a whole number from 1 to {MAX_VERSION}")
        store = get_runtime().event_store
        key = AggregateId(self.aggregate.aggregate_name, aggregate_id, wow_settings.CONTEXT_NAME,
                          self.get_tenant_id())
        # Versions are contiguous: reading up to head + limit loads at most limit + 1 streams, whatever the tail.
        # A tail below the head is an empty range (no version lies in it), as any range past the last version.
        limit = wow_settings.QUERY_MAX_LIMIT
        streams = store.load(key, head, min(tail, head + limit)) if head <= tail else []
        owner = streams[0] if streams else store.last(key)
        if (owner is None or owner.aggregate_id.tenant_id != self.get_tenant_id()
                or not self.owned_by_path_owner(owner.owner_id)):
            raise ResourceNotFound(f"{self.aggregate.aggregate_name} {aggregate_id!r} does not exist.")
        if len(streams) > limit:
            raise InvalidRequest("tail", f"versions {head} to {tail} hold more than {limit} event streams "
                                         f"(QUERY_MAX_LIMIT): ask for at most {limit} at a time, e.g. "
                                         f"{head}/{head + limit - 1}")
        return streams


# --- queries ----------------------------------------------------------------------------------------


class QueryView(WowAPIView):
    """``POST {aggregate}/snapshot/{operation}`` and ``POST {aggregate}/event/{operation}``; with ``states``,
    ``POST {aggregate}/snapshot/{operation}/state``: the same snapshot query answering the aggregates' states
    only (Wow's ``listState``, ``pagedState``, ``singleState``)."""

    kind = SNAPSHOT
    operation = "list"
    states = False
    #: The snapshot operations that have a ``…/state`` route.
    STATE_OPERATIONS = ("single", "list", "paged")
    parser_classes = [QueryJSONParser]  # 5.0 is the whole number 5, as the schema's integers count it
    OPERATIONS = {
        SNAPSHOT: ("single", "list", "paged", "count"),
        EVENT_STREAM: ("list", "paged", "count"),
    }
    PARSERS = {
        "single": queries.parse_single_query,
        "list": queries.parse_list_query,
        "paged": queries.parse_paged_query,
        "count": queries.parse_count_query,
    }

    @property
    def action(self) -> str:
        return self.__dict__.get("_action") or ("snapshot_query" if self.kind == SNAPSHOT else "event_query")

    @action.setter
    def action(self, value: str | None) -> None:  # DRF's browsable API sets it while it renders its forms
        self.__dict__["_action"] = value

    renderer_classes = [JSONRenderer, sse.EventStreamRenderer, BrowsableAPIRenderer]

    def get_renderers(self):
        """The list operations also stream (``Accept: text/event-stream``: one event per document)."""
        renderers = super().get_renderers()
        if self.operation != "list":
            renderers = [renderer for renderer in renderers if not isinstance(renderer, sse.EventStreamRenderer)]
        return renderers

    def post(self, request):
        query = self.parse_query(request.data)
        self.check_body(request.data)
        found = self.run_query(self.get_query_service(), query)
        if wants_event_stream(request):
            return sse.streaming_response(request, (sse.event(item) for item in found))
        return Response(found)

    def check_body(self, data) -> None:
        """After the parser (its words first): the OpenAPI schema's, which also refuses what the parser lets by."""
        errors = contract.violations(data, QUERY_BODIES[self.operation])
        if errors:
            refusal = InvalidRequest(errors[0]["name"], errors[0]["msg"])
            refusal.binding_errors = errors
            raise refusal

    def get_query_service(self):
        name = self.aggregate.aggregate_name
        if self.kind == SNAPSHOT:
            return get_runtime().snapshot_queries(name)
        return get_runtime().event_queries(name)

    def parse_query(self, data):
        return self.PARSERS[self.operation](data)

    def get_scope(self) -> Condition | None:
        """A server-side condition ANDed to every query of this view (none by default)."""
        return None

    def _scope_with_owner(self) -> Condition | None:
        scope, owner = self.get_scope(), self.get_path_owner()
        if owner is None:
            return scope
        mine = Condition(operator=Operator.OWNER_ID, value=owner)
        return mine if scope is None else and_conditions(mine, scope)

    def run_query(self, service, query):
        scope = {"tenant_id": self.get_tenant_id(), "scope": self._scope_with_owner()}
        if self.operation == "single":
            found = service.single(query, **scope)
            if found is None:
                raise ResourceNotFound(f"No {self.aggregate.aggregate_name} {self.kind.replace('_', ' ')} matches.")
            return _state(found) if self.states else found
        if self.operation == "list":
            found = service.list(query, **scope)
            return [_state(document) for document in found] if self.states else found
        if self.operation == "paged":
            page = service.paged(query, **scope).to_json()
            if self.states:
                page["list"] = [_state(document) for document in page["list"]]
            return page
        return service.count(query, **scope)


def _state(snapshot: dict) -> dict:
    """The state of a snapshot document as a query answered it (a projection may have left part of it, or none)."""
    state = snapshot.get("state")
    return state if isinstance(state, dict) else {}


def _misrouted(aggregate: type[Aggregate], command: str, *, with_id: bool) -> str:
    """Why ``POST {aggregate}/[{id}/]{command}`` has no route, and the route the client meant if there is one."""
    name = aggregate.aggregate_name
    handler = aggregate.handlers.get(command)
    if handler is not None and handler.create and with_id:
        return f"{command!r} creates a new {name}: POST {name}/{command} (no aggregate id in the path)."
    if handler is not None and not handler.create and not with_id:
        return f"{command!r} acts on an existing {name}: POST {name}/{{id}}/{command}."
    return f"{command!r} is not a command of aggregate {name!r}."


# --- everything else under the API prefix ---------------------------------------------------------------


class NotFoundView(WowAPIView):
    """Any other path under the API prefix: a JSON 404 naming the unknown aggregate or command."""

    schema = None  # not an operation
    resolves_tenant = False

    def respond(self, request, path: str = ""):
        segments = path.split("/")
        name = segments[0]
        aggregate = aggregate_type(name) if name else None
        if name and aggregate is None:
            raise UnknownAggregate(f"There is no aggregate named {name!r}.")
        if aggregate is not None and request.method == "POST" and len(segments) in (2, 3) and all(segments):
            raise UnknownCommand(_misrouted(aggregate, segments[-1], with_id=len(segments) == 3))
        raise ResourceNotFound(f"No API route for {request.method} {request.path}.")

    get = post = put = patch = delete = head = options = respond
