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

import functools

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.utils import OpenApiParameter
from pydantic.json_schema import models_json_schema

from wow_django.application.gateway import MAX_ID_LENGTH, WaitStage
from wow_django.conf import wow_settings
from wow_django.domain.aggregate import aggregates
from wow_django.domain.messages import RecoverAggregate
from wow_django.http.headers import (
    AGGREGATE_VERSION_HEADER,
    MAX_WAIT_TIMEOUT_MS,
    REQUEST_ID_HEADER,
    WAIT_STAGE_HEADER,
    WAIT_TIMEOUT_HEADER,
)
from wow_django.persistence.query import SNAPSHOT
from wow_django.persistence.records import MAX_VERSION
from wow_django.query.condition import (
    MAX_LIST_SIZE,
    MAX_SORT_FIELDS,
    OPTION_KEYS,
    DeletionState,
    Direction,
    Operator,
)

REF = "#/components/schemas/{model}"

ERROR_STATUSES = {
    "400": "Invalid body, condition, path parameter or header (bindingErrors name each): CommandValidation "
           "(a command's body or headers), IllegalArgument (a query, path parameter, tenant or malformed JSON), "
           "QueryTooExpensive (a query stopped at the database's time limit).",
    "401": "Not authenticated (NotAuthenticated, AuthenticationFailed).",
    "403": "Not allowed (PermissionDenied).",
    "404": "Unknown aggregate, command or id, or another tenant's (NotFound).",
    "406": "The Accept header excludes application/json (NotAcceptable).",
    "413": "The body is too large (PayloadTooLarge).",
    "415": "The body is not application/json (UnsupportedMediaType).",
    "503": "The store or broker is unavailable (StoreUnavailable, BrokerUnavailable); retry (see Retry-After).",
}


def _nullable(schema: dict) -> dict:
    if spectacular_settings.OAS_VERSION.startswith("3.0"):
        return {**schema, "nullable": True}
    return {**schema, "type": [schema["type"], "null"]}


def _ref(name: str) -> dict:
    return {"$ref": REF.format(model=name)}


def _integer(minimum: int, maximum: int) -> dict:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


# --- the API's own components --------------------------------------------------------------


def wow_components() -> dict[str, dict]:
    """The components every Wow API schema shares, by name (reads the QUERY_* settings)."""
    string = {"type": "string"}
    string_list = {"type": "array", "items": string, "maxItems": MAX_LIST_SIZE}
    return {
        "WowBindingError": {
            "type": "object",
            "properties": {"name": {**string, "description": "The offending field, path or header."},
                           "msg": {**string, "description": "The rule it breaks."}},
            "required": ["name", "msg"],
        },
        "WowError": {
            "type": "object",
            "description": "Every error: a stable code, a message saying what to do, and the offending inputs.",
            "properties": {
                "errorCode": string,
                "errorMsg": string,
                "bindingErrors": {"type": "array", "items": _ref("WowBindingError")},
            },
            "required": ["errorCode", "errorMsg", "bindingErrors"],
        },
        "WowConditionOptions": {
            "type": "object",
            "properties": {
                "ignoreCase": {"type": "boolean"},
                "zoneId": {**string, "description": "IANA zone of the date operators (default UTC)."},
                "datePattern": {**string, "description": "Java-style pattern of a text date field (yyyy-MM-dd)."},
            },
            "additionalProperties": False,
        },
        "WowCondition": {
            "type": "object",
            "description": (
                "A condition node. `field` is a path of letters, digits and '_' joined by '.'; `value` is the "
                "operator's argument (DELETED takes " + ", ".join(s.value for s in DeletionState) + "); "
                "AND, OR, NOR and ELEM_MATCH take `children`. RAW is refused unless the server allows it. "
                f"Options: {', '.join(OPTION_KEYS)}."
            ),
            "properties": {
                "field": string,
                "operator": {"type": "string", "enum": [o.value for o in Operator]},
                "value": {"description": "Any JSON value; its shape depends on the operator."},
                "children": {"type": "array", "items": _ref("WowCondition"), "maxItems": MAX_LIST_SIZE},
                "options": _ref("WowConditionOptions"),
            },
            "required": ["operator"],
            "additionalProperties": False,
        },
        "WowProjection": {
            "type": "object",
            "description": "Return only `include`d fields (plus the id), or all but `exclude`d ones; not both.",
            "properties": {"include": string_list, "exclude": string_list},
            "additionalProperties": False,
        },
        "WowSortField": {
            "type": "object",
            "properties": {"field": string, "direction": {"type": "string", "enum": [d.value for d in Direction]}},
            "required": ["field"],
            "additionalProperties": False,
        },
        "WowPagination": {
            "type": "object",
            "properties": {
                "index": _integer(1, 2**31 - 1),
                "size": _integer(1, wow_settings.QUERY_MAX_PAGE_SIZE),
            },
            "additionalProperties": False,
        },
        **{
            name: {
                "type": "object",
                "properties": {
                    "condition": _ref("WowCondition"),
                    "projection": _ref("WowProjection"),
                    "sort": {"type": "array", "items": _ref("WowSortField"), "maxItems": MAX_SORT_FIELDS},
                    **extra,
                },
                "additionalProperties": False,
            }
            for name, extra in (
                ("WowSingleQuery", {}),
                ("WowListQuery", {"limit": _integer(1, wow_settings.QUERY_MAX_LIMIT)}),
                ("WowPagedQuery", {"pagination": _ref("WowPagination")}),
            )
        },
        "WowCommandResult": {
            "type": "object",
            "properties": {
                "commandId": string,
                "requestId": string,
                "aggregateName": string,
                "aggregateId": string,
                "tenantId": string,
                "aggregateVersion": _nullable({"type": "integer"}),
                "stage": {"type": "string", "enum": [s.value for s in WaitStage]},
                "events": {"type": "array", "items": string},
                "duplicate": {"type": "boolean"},
                "errorCode": {**string, "description": "Ok, or why the asked stage was not confirmed "
                              "(RequestTimeout, DispatchFailed): the events are stored either way."},
                "errorMsg": string,
                "bindingErrors": {"type": "array", "items": _ref("WowBindingError")},
            },
            "required": ["commandId", "requestId", "aggregateName", "aggregateId", "tenantId", "aggregateVersion",
                         "stage", "events", "duplicate", "errorCode", "errorMsg", "bindingErrors"],
        },
        "WowSnapshot": {
            "type": "object",
            "description": "A snapshot (read model); a projection may leave fields out.",
            "properties": {
                "aggregateId": string, "contextName": string, "aggregateName": string, "tenantId": string,
                "ownerId": string, "version": {"type": "integer"}, "eventId": string, "firstOperator": string,
                "operator": string, "firstEventTime": {"type": "integer"}, "eventTime": {"type": "integer"},
                "snapshotTime": {"type": "integer"}, "deleted": {"type": "boolean"},
                "state": {"type": "object", "description": "The aggregate's state."},
            },
        },
        "WowDomainEvent": {
            "type": "object",
            "properties": {"id": string, "name": string, "revision": string, "bodyType": string,
                           "body": {"type": "object"}},
        },
        "WowEventStream": {
            "type": "object",
            "description": "The events one command produced; a projection may leave fields out.",
            "properties": {
                "id": string, "contextName": string, "aggregateName": string, "aggregateId": string,
                "tenantId": string, "ownerId": string, "requestId": string, "commandId": string,
                "version": {"type": "integer"}, "header": {"type": "object"},
                "body": {"type": "array", "items": _ref("WowDomainEvent")}, "size": {"type": "integer"},
                "createTime": {"type": "integer", "description": "Epoch milliseconds."},
            },
        },
        "WowPagedSnapshotList": {
            "type": "object",
            "properties": {"total": {"type": "integer", "minimum": 0},
                           "list": {"type": "array", "items": _ref("WowSnapshot")}},
            "required": ["total", "list"],
        },
        "WowPagedEventStreamList": {
            "type": "object",
            "properties": {"total": {"type": "integer", "minimum": 0},
                           "list": {"type": "array", "items": _ref("WowEventStream")}},
            "required": ["total", "list"],
        },
    }


@functools.lru_cache(maxsize=8)
def _pydantic_schemas(models: tuple[tuple[type, str], ...]) -> tuple[dict, dict]:
    keys, definitions = models_json_schema(list(models), ref_template=REF)
    return keys, definitions.get("$defs", {})


def pydantic_models() -> tuple[tuple[type, str], ...]:
    """Every command (validation) and state (serialization) of the registered aggregates, in a stable order."""
    found: dict[tuple[type, str], None] = {(RecoverAggregate, "validation"): None}
    for _, cls in sorted(aggregates().items()):
        for command_name in sorted(cls.handlers):
            found[(cls.handlers[command_name].command, "validation")] = None
        found[(cls.state_class, "serialization")] = None
    return tuple(found)


# --- the inspector -------------------------------------------------------------------------------


class WowAutoSchema(AutoSchema):
    """Describes the generated Wow views (see the module docstring)."""

    def _register(self, name: str, schema: dict) -> dict:
        component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema)
        self.registry.register_on_missing(component)
        return component.ref

    def _wow(self, name: str) -> dict:
        components = wow_components()
        # Register the referenced components too (they refer to each other by name).
        for other, schema in components.items():
            self._register(other, schema)
        return _ref(name)

    def _pydantic(self, model: type, mode: str) -> dict:
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
        return self.view.aggregate.aggregate_name

    def _key(self) -> str:
        view = self.view
        action = view.action
        if action == "command":
            return view.command.command_name
        if action in ("snapshot_query", "event_query"):
            return f"{'snapshot' if view.kind == SNAPSHOT else 'event'}_{view.operation}"
        return {"snapshot": "snapshot_by_id", "event_range": "event_range"}.get(action, action)

    def get_operation_id(self) -> str:
        return f"{self._aggregate_name}_{self._key()}"

    def get_tags(self) -> list[str]:
        return [self._aggregate_name]

    def get_summary(self) -> str:
        view, name = self.view, self._aggregate_name
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
            "state": f"Current state of one {name}",
            "snapshot": f"Stored snapshot of one {name}, deleted or not",
            "event_range": f"Event streams of one {name}, versions head to tail",
            "snapshot_query": f"Query {name} snapshots: {getattr(view, 'operation', '')}",
            "event_query": f"Query {name} event streams: {getattr(view, 'operation', '')}",
            "status": f"What became of a command to {name}, by its request id",
        }[action]

    def get_description(self) -> str:
        action = self.view.action
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
        view = self.view
        parameters: list = []
        if "{id}" in self.path:
            parameters.append(OpenApiParameter(
                "id", {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}, OpenApiParameter.PATH,
                description="The aggregate id.",
            ))
        if "{request_id}" in self.path:
            parameters.append(OpenApiParameter(
                "request_id", {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}, OpenApiParameter.PATH,
                description="The command's request id (Command-Request-Id).",
            ))
            parameters.append(OpenApiParameter(
                "aggregateId", {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
                OpenApiParameter.QUERY,
                description="For a command on an existing aggregate that was not queued: the aggregate it was sent to.",
            ))
        for name in ("head", "tail"):
            if f"{{{name}}}" in self.path:
                parameters.append(OpenApiParameter(
                    name, _integer(1, MAX_VERSION), OpenApiParameter.PATH,
                    description="First version (inclusive)." if name == "head" else "Last version (inclusive).",
                ))
        if view.action in ("command", "delete", "recover"):
            parameters.append(OpenApiParameter(
                WAIT_STAGE_HEADER, {"type": "string", "enum": [s.value for s in WaitStage]}, OpenApiParameter.HEADER,
                description="How far to go before answering (default PROCESSED).",
            ))
            parameters.append(OpenApiParameter(
                WAIT_TIMEOUT_HEADER, _integer(0, MAX_WAIT_TIMEOUT_MS), OpenApiParameter.HEADER,
                description="How long to wait for the stage, in whole milliseconds (at most the server's "
                f"COMMAND_WAIT_TIMEOUT_S, {wow_settings.COMMAND_WAIT_TIMEOUT_S:g} s, its default).",
            ))
            parameters.append(OpenApiParameter(
                REQUEST_ID_HEADER, {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
                OpenApiParameter.HEADER,
                description="Idempotency key: a retry with the same id is recognised and appends nothing. A create "
                "command's aggregate id is derived from it.",
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
        return parameters

    def get_request_serializer(self):
        view = self.view
        if view.action == "command":
            return {"application/json": self._pydantic(view.command, "validation")}
        if view.action == "recover":
            return {"application/json": self._pydantic(RecoverAggregate, "validation")}
        if view.action in ("snapshot_query", "event_query"):
            name = {"single": "WowSingleQuery", "list": "WowListQuery", "paged": "WowPagedQuery",
                    "count": "WowCondition"}[view.operation]
            return {"application/json": self._wow(name)}
        return None

    # --- outputs ------------------------------------------------------------------------------

    def _success(self) -> dict:
        view = self.view
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
        for code in ERROR_STATUSES:
            responses[code] = error
        if self.view.action in ("command", "delete", "recover"):
            responses["409"] = error
            responses["422"] = error  # a request id reused with another command or body
        if self.view.action in ("command", "delete", "state"):
            responses["410"] = error
        return responses

    def _get_response_for_code(self, serializer, status_code, media_types=None, direction="response"):
        response = super()._get_response_for_code(serializer, status_code, media_types, direction)
        if status_code in ERROR_STATUSES:
            response["description"] = ERROR_STATUSES[status_code]
        elif status_code == "409":
            response["description"] = ("Refused in the aggregate's current state: a business rule (its own code), "
                                       "CommandExpectVersionConflict (not at Command-Aggregate-Version), "
                                       "DuplicateAggregateId, EventVersionConflict, KeyAlreadyPrepared or "
                                       "AggregateNotDeleted.")
        elif status_code == "410":
            response["description"] = "The aggregate is deleted (IllegalAccessDeletedAggregate); recover it first."
        elif status_code == "422":
            response["description"] = ("The request id was already used for another command or body "
                                       "(RequestIdReused); send this command with a new one.")
        elif status_code == "202":
            response["description"] = "Queued, or stored without the asked stage confirmed."
        return response
