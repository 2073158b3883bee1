"""The OpenAPI schema of the API, and a bounded schemathesis run against it.

Schemathesis drives the sample project's WSGI application in-process (no
server, no network) with cases generated from the served schema, on both
local backends. Every response must be no server error, have a documented
status and content type, and match its documented schema.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sample_project.orders.aggregates import PlaceOrder

# Wait stage SENT queues through the queued_commands fixture, not Celery.
pytestmark = pytest.mark.usefixtures("queued_commands")


@pytest.fixture
def openapi(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def operations(schema: dict) -> dict[str, tuple[str, str, dict]]:
    return {op["operationId"]: (path, method, op) for path, item in schema["paths"].items()
            for method, op in item.items()}


def test_schema_is_openapi_3_1_with_every_route(openapi):
    assert openapi["openapi"].startswith("3.1")
    found = {(method.upper(), path) for path, method, _ in operations(openapi).values()}
    for name in ("order", "customer"):
        for operation in ("single", "list", "paged", "count"):
            assert ("POST", f"/api/{name}/snapshot/{operation}") in found
        for operation in ("list", "paged", "count"):
            assert ("POST", f"/api/{name}/event/{operation}") in found
        assert {("DELETE", f"/api/{name}/{{id}}"), ("PUT", f"/api/{name}/{{id}}/recover"),
                ("GET", f"/api/{name}/{{id}}/state"), ("GET", f"/api/{name}/{{id}}/snapshot"),
                ("GET", f"/api/{name}/{{id}}/event/{{head}}/{{tail}}")} <= found
    commands = {("POST", "/api/order/place_order"), ("POST", "/api/order/{id}/pay_order"),
                ("POST", "/api/order/{id}/ship_order"), ("POST", "/api/order/{id}/cancel_order"),
                ("POST", "/api/customer/register_customer"), ("POST", "/api/customer/{id}/change_display_name")}
    assert commands <= found
    assert not any(method == "POST" and path.endswith("/{id}") for method, path in found)


def test_every_command_body_is_its_pydantic_schema(openapi):
    ops = operations(openapi)
    components = openapi["components"]["schemas"]
    for operation_id, component in (("order_place_order", "PlaceOrder"), ("order_pay_order", "PayOrder"),
                                    ("customer_register_customer", "RegisterCustomer"),
                                    ("order_recover", "RecoverAggregate")):
        body = ops[operation_id][2]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{component}"}
    place = components["PlaceOrder"]
    assert set(place["required"]) == {"customer_id", "items"} and place["additionalProperties"] is False
    assert place["properties"]["items"]["items"] == {"$ref": "#/components/schemas/OrderLine-Input"}
    assert components["OrderLine-Input"]["properties"]["sku"]["pattern"] == "^[A-Z0-9-]{1,32}$"
    assert PlaceOrder.model_json_schema()["properties"]["currency"]["pattern"] == \
        place["properties"]["currency"]["pattern"]
    state = ops["order_state"][2]["responses"]["200"]["content"]["application/json"]["schema"]
    assert state == {"$ref": "#/components/schemas/OrderState"}


def test_query_bodies_results_and_errors(openapi):
    ops = operations(openapi)
    components = openapi["components"]["schemas"]

    def body(operation_id):
        return ops[operation_id][2]["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]

    assert [body(f"order_snapshot_{op}") for op in ("single", "list", "paged", "count")] == [
        "WowSingleQuery", "WowListQuery", "WowPagedQuery", "WowCondition"]
    assert [body(f"order_event_{op}") for op in ("list", "paged", "count")] == [
        "WowListQuery", "WowPagedQuery", "WowCondition"]
    condition = components["WowCondition"]
    assert condition["properties"]["children"]["items"] == {"$ref": "#/components/schemas/WowCondition"}
    assert components["WowPagination"]["properties"]["size"]["maximum"] == 200
    assert components["WowListQuery"]["properties"]["limit"]["maximum"] == 1000
    assert components["WowError"]["required"] == ["errorCode", "errorMsg", "bindingErrors"]
    for operation_id, (_, _, operation) in ops.items():
        if not operation_id.startswith(("order_", "customer_")):
            continue
        for status in ("400", "401", "403", "404", "503"):
            schema = operation["responses"][status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/WowError"}, (operation_id, status)
    paged = ops["order_snapshot_paged"][2]["responses"]["200"]["content"]["application/json"]["schema"]
    assert paged == {"$ref": "#/components/schemas/WowPagedSnapshotList"}
    assert "409" in ops["order_pay_order"][2]["responses"]
    reused = ops["order_place_order"][2]["responses"]["422"]
    assert "RequestIdReused" in reused["description"]
    assert reused["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/WowError"}


def test_headers_are_documented(openapi):
    ops = operations(openapi)
    command = {p["name"]: p for p in ops["order_pay_order"][2]["parameters"]}
    assert command["Command-Wait-Stage"]["in"] == "header"
    assert command["Command-Request-Id"]["schema"]["maxLength"] == 128
    assert command["Command-Tenant-Id"]["in"] == "header"
    assert command["Command-Aggregate-Version"]["schema"] == {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
    assert "CommandExpectVersionConflict" in command["Command-Aggregate-Version"]["description"]
    assert command["Command-Wait-Timeout"]["schema"]["type"] == "integer"
    assert "CommandExpectVersionConflict" in ops["order_pay_order"][2]["responses"]["409"]["description"]
    assert command["id"]["in"] == "path" and command["id"]["required"] is True
    query = {p["name"] for p in ops["order_snapshot_list"][2].get("parameters", [])}
    assert query == {"Command-Tenant-Id"}
    event_range = {p["name"]: p for p in ops["order_event_range"][2]["parameters"]}
    assert event_range["head"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}


def test_swagger_ui_is_served(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower() and b"/api/schema/" in response.content


# --- schemathesis ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def without_connection_housekeeping():
    """What Django's test client does: keep requests from closing (or touching) the test database connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


# Loaded once at collection (pytest-django has set Django up by then); the schema needs no store.
with without_connection_housekeeping():
    api_schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application()).include(
        path_regex=r"^/api/(order|customer)/"
    )


@pytest.fixture
def wsgi_requests():
    with without_connection_housekeeping():
        yield


# A few hundred cases per operation and backend (WOW_FUZZ_EXAMPLES changes it for a quick local run). Every
# health check is on but the fixture one: the store is meant to be shared by the cases of one operation (state
# left by one case is what the next may meet in production too).
FUZZ_EXAMPLES = int(os.environ.get("WOW_FUZZ_EXAMPLES", "300"))


@api_schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_api_conforms_to_its_schema(case, every_backend, wsgi_requests):
    """Each operation's cases share one fresh store on each backend."""
    case.call_and_validate(checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                   response_schema_conformance])
