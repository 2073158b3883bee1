"""OpenAPI for the API through drf-spectacular: every route, body and error.

:class:`WowAutoSchema` describes each generated view from what it serves:

* command bodies are the commands' pydantic JSON schemas (validation mode),
  the ``GET .../state`` body the aggregate state's (serialization mode); all
  pydantic models are rendered together so shared sub-models get one name;
* query bodies are the condition DSL (``WowCondition``, recursive) with
  projection, sort, limit and pagination, bounded by the ``QUERY_*`` settings;
* every operation lists its error responses as ``WowError``
  (``{errorCode, errorMsg, bindingErrors}``) and the headers it reads.

Pydantic emits JSON Schema 2020-12, which is what OpenAPI 3.1 uses: set
``SPECTACULAR_SETTINGS["OAS_VERSION"] = "3.1.0"`` (the sample project does).
"""

from __future__ import annotations

import copy
import functools
from typing import Protocol, cast

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent
from drf_spectacular.utils import OpenApiParameter
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from wow_django.application.followers import STAGE_KINDS, stage_candidates
from wow_django.application.gateway import WaitStage, printable_characters
from wow_django.bus.service import MAX_FILTER_LENGTH, MAX_PAGE
from wow_django.conf import wow_settings
from wow_django.domain.aggregate import Aggregate, aggregates
from wow_django.domain.messages import Command, RecoverAggregate
from wow_django.http import contract
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
    WAIT_TIMEOUT_HEADER,
)
from wow_django.http.sse import EVENT_STREAM
from wow_django.persistence.bus import EventStatus
from wow_django.persistence.query import SNAPSHOT
from wow_django.persistence.records import MAX_VERSION

ERROR_STATUSES = {
    "400": "Invalid body, condition, path parameter or header (bindingErrors name each): CommandValidation "
           "(a command's body or headers), IllegalArgument (a query, path parameter, tenant or malformed JSON), "
           "QueryTooExpensive (a query stopped at the database's time limit); and, as Wow's server answers them, "
           "a command refused in the aggregate's state: a business rule (its own code), DuplicateAggregateId, "
           "DuplicateRequestId (a request id used before for another command or body), KeyAlreadyPrepared, "
           "KeyNotHeld, AggregateNotDeleted.",
    "401": "Not authenticated (NotAuthenticated, AuthenticationFailed).",
    "403": "Not allowed (PermissionDenied; IllegalAccessOwnerAggregate: another user's aggregate).",
    "404": "Unknown aggregate, command or id, or another tenant's (NotFound).",
    "406": "The Accept header excludes application/json (NotAcceptable).",
    "413": "The body is too large (PayloadTooLarge).",
    "415": "The body is not application/json (UnsupportedMediaType).",
    "503": "The store or broker is unavailable (StoreUnavailable, BrokerUnavailable); retry (see Retry-After).",
}


#: The component of each query operation's body.
QUERY_BODIES = {"single": "WowSingleQuery", "list": "WowListQuery", "paged": "WowPagedQuery",
                "count": "WowCountQuery"}


def _ref(name: str) -> dict:
    return contract.ref(name)


def _integer(minimum: int, maximum: int) -> dict:
    return contract.integer(minimum, maximum)


def wow_components() -> dict[str, dict]:
    """The components every Wow API schema shares, by name (reads the QUERY_* settings)."""
    return contract.wow_components()


def _pydantic_schemas(models: tuple[contract.ModelMode, ...]) -> tuple[dict, dict]:
    return contract.pydantic_schemas(models)


def pydantic_models() -> tuple[contract.ModelMode, ...]:
    """Every command (validation) and state (serialization) of the registered aggregates, in a stable order."""
    found: dict[contract.ModelMode, None] = {(RecoverAggregate, "validation"): None}
    for _, cls in sorted(aggregates().items()):
        for command_name in sorted(cls.handlers):
            found[(cls.handlers[command_name].command, "validation")] = None
        found[(cls.state_class, "serialization")] = None
    return tuple(found)


@functools.cache
def _nul_exempt() -> frozenset[str]:
    """The components that do not carry the NUL-free patterns: the query grammar (conditions, the JSON values
    they compare with, the query bodies), which is recursive — schemathesis' generator recursed without end
    (RecursionError) intersecting patterns in it. The server refuses a NUL there all the same (400 naming
    it); the bus components and the parameters carry the patterns."""
    return frozenset(contract.wow_components()) - frozenset(contract.bus_components(1))


def _nul_free(parameters: list) -> list:
    """The parameters' schemas saying that no NUL character is taken (a path, query or header value holding
    one is a 400)."""
    for parameter in parameters:
        if isinstance(parameter, OpenApiParameter) and isinstance(parameter.type, dict):
            parameter.type = contract.forbid_nul(copy.deepcopy(parameter.type))
    return parameters


class _Components:
    """Registers the API's components with drf-spectacular's registry and refers to them."""

    registry: ComponentRegistry  # drf-spectacular's AutoSchema sets it for each operation

    def _register(self, name: str, schema: dict) -> dict:
        component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name)
        if component not in self.registry:
            # A copy: drf-spectacular's post-processing hooks change the registered schemas in place, and these
            # are the very schemas the API holds requests to (contract.violations). Copied once per schema
            # document: every operation registers every component again (copying each time cost seconds).
            component.schema = copy.deepcopy(schema)
            if name not in _nul_exempt():
                contract.forbid_nul(component.schema)
            self.registry.register_on_missing(component)
        return component.ref

    def _wow(self, name: str) -> dict:
        # Register them all, once per schema document: they refer to each other by name.
        if not getattr(self.registry, "wow_components_registered", False):
            for other, schema in wow_components().items():
                self._register(other, schema)
            self.registry.wow_components_registered = True  # type: ignore[attr-defined]  # our mark on the registry
        return _ref(name)

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        if body is not None and self.method == "POST":
            body["required"] = True  # a POST without a JSON body is a 415: send {} for no arguments
        return body


# --- the inspector -------------------------------------------------------------------------------


class _DescribedView(Protocol):
    """What :class:`WowAutoSchema` reads of the view it describes: a :class:`~wow_django.http.views.WowAPIView`
    as :mod:`wow_django.http.urls` routes it, so with its aggregate. ``command`` is a command view's (read for the
    action ``command`` only), ``kind`` and ``operation`` a query view's (``snapshot_query``, ``event_query``)."""

    aggregate: type[Aggregate]
    action: str
    command: type[Command]
    kind: str
    operation: str


class WowAutoSchema(_Components, AutoSchema):
    """Describes the generated Wow views (see the module docstring)."""

    @property
    def _wow_view(self) -> _DescribedView:
        return cast(_DescribedView, self.view)  # DRF's stubs say APIView: it is the schema of WowAPIView

    def _pydantic(self, model: type[BaseModel], mode: JsonSchemaMode) -> dict:
        keys, definitions = _pydantic_schemas(pydantic_models())
        for name, schema in definitions.items():
            self._register(name, schema)
        if (model, mode) not in keys:  # registered after the schema cache was filled
            keys, definitions = _pydantic_schemas(((model, mode),))
            for name, schema in definitions.items():
                self._register(name, schema)
        return keys[(model, mode)]

    # --- naming -------------------------------------------------------------------------------

    @property
    def _aggregate_name(self) -> str:
        return self._wow_view.aggregate.aggregate_name

    def _key(self) -> str:
        view = self._wow_view
        action = view.action
        if action == "command":
            return view.command.command_name
        if action in ("snapshot_query", "event_query"):
            states = "_state" if getattr(view, "states", False) else ""
            return f"{'snapshot' if view.kind == SNAPSHOT else 'event'}_{view.operation}{states}"
        if action == "state" and "{version}" in self.path:
            return "state_at_version"
        if action == "state" and "{create_time}" in self.path:
            return "state_at_time"
        return {"snapshot": "snapshot_by_id", "event_range": "event_range"}.get(action, action)

    def _attribution(self) -> str:
        """The prefix of an operation below an attribution or alias prefix (``alias_``, ``tenant_``,
        ``owner_``), so that every route keeps an operationId of its own."""
        marks = []
        before = self.path.split(f"/{self._aggregate_name}/")[0] + "/"
        aliases = {*contract.MOUNTED_ALIASES, wow_settings.CONTEXT_ALIAS} - {None, ""}
        if any(f"/{alias}/" in before for alias in aliases):
            marks.append("alias")
        if "{tenant_id}" in self.path:
            marks.append("tenant")
        if "{owner_id}" in self.path:
            marks.append("owner")
        return "".join(f"{mark}_" for mark in marks)

    def get_operation_id(self) -> str:
        return f"{self._attribution()}{self._aggregate_name}_{self._key()}"

    def get_tags(self) -> list[str]:
        return [self._aggregate_name]

    def get_summary(self) -> str:
        view, name = self._wow_view, self._aggregate_name
        action = view.action
        if action == "command":
            doc = (view.command.__doc__ or "").strip().splitlines()
            if doc:
                return doc[0]
            handler = view.aggregate.handlers.get(view.command.command_name)
            creates = handler is not None and handler.create
            return f"{view.command.command_name}: " + (f"creates a new {name}" if creates else f"acts on one {name}")
        return {
            "delete": f"Soft-delete one {name}",
            "recover": f"Recover one deleted {name}",
            "state": (f"State of one {name} after a version (its current state below it)" if "{version}" in self.path
                      else f"State of one {name} as it was at a time (epoch ms)" if "{create_time}" in self.path
                      else f"Current state of one {name}"),
            "snapshot": f"Stored snapshot of one {name}, deleted or not",
            "event_range": f"Event streams of one {name}, versions head to tail",
            "snapshot_query": (f"Query {name} states: {getattr(view, 'operation', '')}" if getattr(view, "states", False)
                               else f"Query {name} snapshots: {getattr(view, 'operation', '')}"),
            "event_query": f"Query {name} event streams: {getattr(view, 'operation', '')}",
            "status": f"What became of a command to {name}, by its request id",
        }[action]

    def get_description(self) -> str:  # type: ignore[override]  # drf-spectacular's signature (it ignores DRF's too)
        action = self._wow_view.action
        if action in ("command", "delete", "recover"):
            return (
                "The command's events are stored for the resolved tenant. 200 when the wait stage was reached; "
                "202 when queued (SENT) or stored but the stage not confirmed (errorCode says why). A repeated "
                "Command-Request-Id returns the first result with duplicate=true. Business rules answer 409 with "
                "their own code; an aggregate not at Command-Aggregate-Version answers 409 "
                "CommandExpectVersionConflict."
            )
        if action == "snapshot_query":
            return ("Snapshots of deleted aggregates are left out unless the condition mentions deletion "
                    "(DELETED, or the `deleted` field). `id` and `aggregateId` name the aggregate id.")
        if action == "event_query":
            return "`id` names the event stream id."
        if action == "status":
            return ("The stage the command reached and its error, if any (errorCode Ok when it succeeded). Known "
                    "for every command sent with Command-Wait-Stage SENT (for COMMAND_STATUS_TTL_S) and for every "
                    "command that stored events: a create command by its request id, a command on an existing "
                    "aggregate with ?aggregateId= too.")
        return ""

    # --- inputs -------------------------------------------------------------------------------

    def get_override_parameters(self) -> list:
        view = self._wow_view
        parameters: list = []
        path_id, any_id = self._wow("WowPathId"), self._wow("WowId")
        if "{id}" in self.path:
            parameters.append(OpenApiParameter("id", path_id, OpenApiParameter.PATH, description="The aggregate id."))
        if "{request_id}" in self.path:
            parameters.append(OpenApiParameter(
                "request_id", path_id, OpenApiParameter.PATH,
                description="The command's request id (Command-Request-Id).",
            ))
            parameters.append(OpenApiParameter(
                "aggregateId", any_id, OpenApiParameter.QUERY,
                description="For a command on an existing aggregate that was not queued: the aggregate it was sent to.",
            ))
        for name in ("head", "tail", "version"):
            if f"{{{name}}}" in self.path:
                parameters.append(OpenApiParameter(
                    name, _integer(1, MAX_VERSION), OpenApiParameter.PATH,
                    description={"head": "First version (inclusive).", "tail": "Last version (inclusive).",
                                 "version": "The version whose state to answer (past the last: the current state)."}[name],
                ))
        if "{create_time}" in self.path:
            parameters.append(OpenApiParameter(
                "create_time", _integer(0, 2**63 - 1), OpenApiParameter.PATH,
                description="A moment (epoch ms): the state of the streams created at or before it.",
            ))
        if view.action in ("command", "delete", "recover"):
            parameters.append(OpenApiParameter(
                WAIT_STAGE_HEADER, {"type": "string", "enum": [s.value for s in WaitStage]},
                OpenApiParameter.HEADER,
                description="How far to go before answering (default PROCESSED): SENT (queued), PROCESSED "
                "(events stored), SNAPSHOT (a snapshot at or past them stored), PROJECTED (then the aggregate's "
                "projections passed them), EVENT_HANDLED (its event processors passed them), SAGA_HANDLED (the "
                "followers declared with @follower that take them passed them).",
            ))
            parameters.extend(self._wait_function_parameters())
            parameters.append(OpenApiParameter(
                WAIT_TIMEOUT_HEADER, _integer(0, MAX_WAIT_TIMEOUT_MS), OpenApiParameter.HEADER,
                description="How long to wait for the stage, in whole milliseconds (at most the server's "
                f"COMMAND_WAIT_TIMEOUT_S, {wow_settings.COMMAND_WAIT_TIMEOUT_S:g} s, its default).",
            ))
            parameters.append(OpenApiParameter(
                REQUEST_ID_HEADER, any_id, OpenApiParameter.HEADER,
                description="Idempotency key: a retry with the same id is recognised and appends nothing. A create "
                "command's aggregate id is derived from it.",
            ))
            if "{id}" not in self.path:  # a create: on a route with the id in its path the header may only repeat it
                parameters.append(OpenApiParameter(
                    AGGREGATE_ID_HEADER, any_id, OpenApiParameter.HEADER,
                    description="The new aggregate's id, chosen by the client (an id already taken: 400 "
                    "DuplicateAggregateId); without it the id derives from Command-Request-Id, or is drawn.",
                ))
            parameters.append(OpenApiParameter(
                OWNER_ID_HEADER, any_id, OpenApiParameter.HEADER,
                description="The owner the command acts as (of what it creates): your own id, or another's with "
                "the wow_django.act_for_any_owner permission (403 PermissionDenied without it).",
            ))
            parameters.append(OpenApiParameter(
                AGGREGATE_VERSION_HEADER, _integer(0, MAX_VERSION), OpenApiParameter.HEADER,
                description="The version the aggregate must be at (0: not created yet), as read by the client: "
                "if it moved on, the command is refused with 409 CommandExpectVersionConflict and nothing is "
                "appended.",
            ))
        for spec in wow_settings.TENANT_RESOLVER().schema_parameters():
            parameters.append(OpenApiParameter(
                spec["name"], spec.get("schema", {"type": "string"}), spec.get("in", OpenApiParameter.HEADER),
                required=spec.get("required", False), description=spec.get("description", ""),
            ))
        return _nul_free(parameters)

    def _wait_function_parameters(self) -> list[OpenApiParameter]:
        """``Command-Wait-Context``/``-Processor``/``-Function``: the values this aggregate's followers allow
        (a header this aggregate has no value for is left out: any value of it is refused)."""
        contexts = [wow_settings.CONTEXT_NAME] + ([wow_settings.CONTEXT_ALIAS] if wow_settings.CONTEXT_ALIAS else [])
        candidates = [(stage, *found) for stage in STAGE_KINDS
                      for found in stage_candidates(stage, self._aggregate_name)]
        processors = sorted({name for _, name, _, _ in candidates})
        functions = sorted({fn for _, _, fn, _ in candidates if fn})
        rule = ("Narrows the wait stages PROJECTED, EVENT_HANDLED and SAGA_HANDLED only (with another stage: 400), "
                "to followers of that stage's kind (projections, event processors, followers declared with "
                "@follower; another's: 400).")
        parameters = [OpenApiParameter(
            WAIT_CONTEXT_HEADER, {"type": "string", "enum": contexts}, OpenApiParameter.HEADER,
            description="The context whose followers a handler stage waits for: this service's own.",
        )]
        if processors:
            by_stage = "; ".join(f"{stage}: " + ", ".join(sorted({n for s, n, _, _ in candidates if s == stage}))
                                 for stage in STAGE_KINDS if any(s == stage for s, *_ in candidates))
            parameters.append(OpenApiParameter(
                WAIT_PROCESSOR_HEADER, {"type": "string", "enum": processors}, OpenApiParameter.HEADER,
                description=f"Wait for the follower of this name only. {rule} {by_stage}.",
            ))
        if functions:
            parameters.append(OpenApiParameter(
                WAIT_FUNCTION_HEADER, {"type": "string", "enum": functions}, OpenApiParameter.HEADER,
                description=f"Wait for the followers whose function has this name only (with "
                f"{WAIT_PROCESSOR_HEADER}: the one named both ways, else 400). {rule}",
            ))
        return parameters

    def get_request_serializer(self):
        view = self._wow_view
        if view.action == "command":
            return {"application/json": self._pydantic(view.command, "validation")}
        if view.action == "recover":
            return {"application/json": self._pydantic(RecoverAggregate, "validation")}
        if view.action in ("snapshot_query", "event_query"):
            return {"application/json": self._wow(QUERY_BODIES[view.operation])}
        return None

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        if body is not None and self._wow_view.action == "recover":
            body["required"] = False  # a body-less PUT recovers too
        return body

    # --- outputs ------------------------------------------------------------------------------

    def _success(self) -> dict:
        view = self._wow_view
        action = view.action
        if action in ("command", "delete", "recover"):
            result = self._wow("WowCommandResult")
            return {"200": result, "202": result}
        if action == "state":
            return {"200": self._pydantic(view.aggregate.state_class, "serialization")}
        if action == "snapshot":
            return {"200": self._wow("WowSnapshot")}
        if action == "status":
            return {"200": self._wow("WowCommandResult")}
        if action == "event_range":
            return {"200": {"type": "array", "items": self._wow("WowEventStream")}}
        if getattr(view, "states", False):
            # The states only: what a projection leaves of them (the schema's fields, none required).
            state = {"type": "object", "description": f"A {self._aggregate_name} state (its fields as a projection "
                                                      "left them)."}
            return {"200": {
                "single": state,
                "list": {"type": "array", "items": state},
                "paged": {"type": "object", "required": ["total", "list"], "additionalProperties": False,
                          "properties": {"total": {"type": "integer", "minimum": 0},
                                         "list": {"type": "array", "items": state}}},
            }[view.operation]}
        item = self._wow("WowSnapshot" if view.kind == SNAPSHOT else "WowEventStream")
        paged = "WowPagedSnapshotList" if view.kind == SNAPSHOT else "WowPagedEventStreamList"
        return {"200": {
            "single": item,
            "list": {"type": "array", "items": item},
            "paged": self._wow(paged),
            "count": {"type": "integer", "minimum": 0},
        }[view.operation]}

    def get_response_serializers(self):
        responses = self._success()
        error = self._wow("WowError")
        commands = self._wow_view.action in ("command", "delete", "recover")
        if commands:
            # A command refused once its request was read answers its result (as Wow's server does), with the
            # error's code and message; one refused before (its body, a header) answers the error alone.
            error = {"anyOf": [self._wow("WowCommandResult"), error]}
        for code in ERROR_STATUSES:
            responses[code] = error
        if commands:
            responses["409"] = error
        if self._wow_view.action in ("command", "delete", "state"):
            responses["410"] = error
        return responses

    def _get_response_for_code(self, serializer, status_code, media_types=None, direction="response"):
        response = super()._get_response_for_code(serializer, status_code, media_types, direction)
        stream = response.get("content", {}).get(EVENT_STREAM)
        if stream is not None:  # Accept: text/event-stream (wow_django.http.sse): events, each with JSON data
            data = stream.get("schema", {})
            stream["schema"] = {
                "type": "object", "required": ["data"],
                "description": "One server-sent event. A command's: one per stage reached (event: the stage; data: "
                "the WowCommandResult), or a refusal (event: its errorCode; data: the result or WowError). A "
                "list's: one per document. An error before streaming: one event named after its errorCode.",
                "properties": {
                    "id": {"type": "string"}, "event": {"type": "string"},
                    "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": data},
                },
            }
        if status_code in ERROR_STATUSES:
            response["description"] = ERROR_STATUSES[status_code]
        elif status_code == "409":
            response["description"] = ("A version conflict: CommandExpectVersionConflict (not at "
                                       "Command-Aggregate-Version) or EventVersionConflict (concurrent writers).")
        elif status_code == "410":
            response["description"] = "The aggregate is deleted (IllegalAccessDeletedAggregate); recover it first."
        elif status_code == "202":
            response["description"] = "Queued, or stored without the asked stage confirmed."
        return response


# --- the bus endpoints ---------------------------------------------------------------------------------


class ConsumerTokenScheme(OpenApiAuthenticationExtension):
    """The consumers' callback token (``Authorization: Bearer <token>``, ``WOW["BUS_CALLBACK_TOKENS"]``)."""

    target_class = "wow_django.http.bus_authentication.ConsumerTokenAuthentication"
    name = "consumerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "A consumer's callback token (WOW['BUS_CALLBACK_TOKENS'])."}


#: (view name, method) → (operationId, summary, request body component, {status: response component}).
BUS_OPERATIONS = {
    ("EventListView", "GET"): ("bus_events_list", "Bus events, newest first, by page or by cursor", None,
                               {"200": "WowBusEventPage"}),
    ("EventListView", "POST"): ("bus_events_send", "Send an integration event", "WowEnvelope",
                                {"200": "WowSendResult", "201": "WowSendResult"}),
    ("EventDetailView", "GET"): ("bus_event_detail", "One event: feedback per consumer, parent, children, "
                                 "re-pushes", None, {"200": "WowBusEventDetail"}),
    ("RepushView", "POST"): ("bus_event_repush", "Re-push an event, to every consumer or to one", "WowRepush",
                             {"200": "WowRepushResult"}),
    ("TraceView", "GET"): ("bus_trace", "Every event of a trace: time line and parent → child tree", None,
                           {"200": "WowTrace"}),
    ("TopicConsumersView", "GET"): ("bus_topic_consumers_list", "Who consumes which topic", None,
                                    {"200": "WowTopicConsumerList"}),
    ("TopicConsumersView", "POST"): ("bus_topic_consumers_set", "Create, update, enable or disable a topic consumer",
                                     "WowTopicConsumerChange", {"200": "WowTopicConsumer"}),
    ("CallbackView", "POST"): ("bus_callback", "A consumer's feedback on an event (its callback token)",
                               "WowFeedback", {"201": "WowFeedbackResult"}),
}

BUS_ERRORS = {
    "400": "An invalid envelope, body, query parameter or page cursor (BusValidation, IllegalArgument for "
           "malformed JSON); bindingErrors name each.",
    "401": "Not authenticated (NotAuthenticated, AuthenticationFailed).",
    "403": "Not allowed: the wow_bus permission is missing (PermissionDenied), or a consumer reports on an event "
           "it was not sent or for another consumer (ConsumerNotExpected, PermissionDenied).",
    "404": "No such event or trace (NotFound).",
    "406": "The Accept header excludes application/json (NotAcceptable).",
    "409": "The re-push is refused (RepushNotAllowed, RepushTooEarly, RepushLimitReached, RepushConflict, "
           "AlreadyConsumed, EventExpired, ConsumerNotExpected).",
    "413": "The body is too large (PayloadTooLarge).",
    "415": "The body is not application/json (UnsupportedMediaType).",
    "503": "The store or the broker is unavailable (StoreUnavailable, BusTransportUnavailable, BusError); retry "
           "(see Retry-After).",
}


_ONE_STATUS = "(" + "|".join(s.value for s in EventStatus) + ")"


@functools.cache
def search_key_pattern() -> str:
    """The ``key`` filter of the bus event list: a key name, '=', then printable text of at most 200 characters."""
    return f"^[A-Za-z][A-Za-z0-9_.-]{{0,63}}=[{printable_characters()}]{{1,200}}$"


#: The ``status`` filter of the bus event list: statuses separated by commas.
STATUS_LIST = f"^ *{_ONE_STATUS} *(, *{_ONE_STATUS} *)*$"


class WowBusSchema(_Components, AutoSchema):
    """Describes the bus endpoints (:mod:`wow_django.http.bus_views`): parameters, bodies, answers, errors."""

    def _key(self):
        for cls in type(self.view).__mro__:
            if (cls.__name__, self.method) in BUS_OPERATIONS:
                return BUS_OPERATIONS[(cls.__name__, self.method)]
        raise KeyError(f"{type(self.view).__name__} {self.method} is not a bus operation")

    def get_operation_id(self) -> str:
        return self._key()[0]

    def get_summary(self) -> str:
        return self._key()[1]

    def get_description(self) -> str:  # type: ignore[override]  # drf-spectacular's signature (it ignores DRF's too)
        return (self.view.__doc__ or "").strip()

    def get_tags(self) -> list[str]:
        return ["bus"]

    def get_override_parameters(self) -> list:
        operation = self._key()[0]
        event_id = {"type": "string", "minLength": 1, "pattern": "^[^/\\u0000]+$"}
        parameters: list = []
        if "{event_id}" in self.path:
            parameters.append(OpenApiParameter("event_id", event_id, OpenApiParameter.PATH, description="eventId."))
        if "{trace_id}" in self.path:
            parameters.append(OpenApiParameter("trace_id", event_id, OpenApiParameter.PATH, description="traceId."))
        if operation == "bus_events_list":
            self._wow("WowBusTime")
            blank = {"const": ""}
            text_filter = {"type": "string", "maxLength": MAX_FILTER_LENGTH, "pattern": "^[^\\u0000]*$"}
            parameters += [
                OpenApiParameter("status", {"anyOf": [blank, {"type": "string", "pattern": STATUS_LIST}]},
                                 OpenApiParameter.QUERY,
                                 description="One status, or several separated by commas (any of them): "
                                 "FAILED,PARTIAL is every event that failed for some consumer."),
                OpenApiParameter("topic", {"anyOf": [blank, _ref("WowTopic")]}, OpenApiParameter.QUERY),
                OpenApiParameter("service", text_filter, OpenApiParameter.QUERY,
                                 description="initiator.service"),
                OpenApiParameter("since", {"anyOf": [blank, _ref("WowBusTime")]}, OpenApiParameter.QUERY,
                                 description="occurredAt at or after (ISO 8601)."),
                OpenApiParameter("until", {"anyOf": [blank, _ref("WowBusTime")]}, OpenApiParameter.QUERY,
                                 description="occurredAt before (ISO 8601)."),
                OpenApiParameter("traceId", text_filter, OpenApiParameter.QUERY),
                OpenApiParameter("userId", text_filter, OpenApiParameter.QUERY,
                                 description="initiator.userId: the events a user's requests sent."),
                OpenApiParameter("clientRequestId", text_filter, OpenApiParameter.QUERY,
                                 description="initiator.clientRequestId: the events one request sent."),
                OpenApiParameter("key", {"anyOf": [blank, {"type": "string", "pattern": search_key_pattern()}]},
                                 OpenApiParameter.QUERY,
                                 description="A search key name=value: the events sent with that key, or whose "
                                 "payload has that field (WOW['BUS_SEARCH_FIELDS']), e.g. orderId=o-1 or "
                                 "aggregate=orders.order/o-1."),
                OpenApiParameter("page", _integer(1, MAX_PAGE), OpenApiParameter.QUERY,
                                 description="Page number, from 1 (default 1; not with cursor)."),
                OpenApiParameter("size", _ref("WowBusPageSize"), OpenApiParameter.QUERY,
                                 description="Events per page (default 20)."),
                OpenApiParameter("cursor", {"type": "string"}, OpenApiParameter.QUERY,
                                 description="Keyset paging: empty for the first page, then the answer's `next` "
                                 "(a cursor only the server issues; not with page)."),
                OpenApiParameter("before", {"type": "string"}, OpenApiParameter.QUERY,
                                 description="Keyset paging back: the answer's `previous` gives the page before it "
                                 "(not with cursor or page)."),
            ]
        if operation == "bus_topic_consumers_list":
            parameters += [OpenApiParameter("topic", {"type": "string"}, OpenApiParameter.QUERY),
                           OpenApiParameter("consumerId", {"type": "string"}, OpenApiParameter.QUERY)]
        if operation == "bus_events_send":
            parameters.append(OpenApiParameter(
                "X-Request-Id", {"type": "string"}, OpenApiParameter.HEADER,
                description="The client's request id, kept as initiator.clientRequestId when the envelope names "
                "none."))
        return _nul_free(parameters)

    def get_request_serializer(self):
        body = self._key()[2]
        return {"application/json": self._wow(body)} if body else None

    def get_response_serializers(self):
        responses = {code: self._wow(name) for code, name in self._key()[3].items()}
        error = self._wow("WowError")
        for code in BUS_ERRORS:
            if code == "409" and self._key()[0] != "bus_event_repush":
                continue
            if code in ("413", "415") and self.method != "POST":
                continue
            responses[code] = error
        return responses

    def _get_response_for_code(self, serializer, status_code, media_types=None, direction="response"):
        response = super()._get_response_for_code(serializer, status_code, media_types, direction)
        if status_code in BUS_ERRORS:
            response["description"] = BUS_ERRORS[status_code]
        elif status_code == "201":
            response["description"] = "Stored (and published, unless the broker is down: then PENDING)."
        return response
