"""Wow's TypeScript client against a live server (issue 24): the requests it sends, as it sends them.

The calls are those of ``@ahoo-wang/fetcher-wow`` (its ``CommandClient.send`` and ``SnapshotQueryClient``:
``singleState``, ``listState``, ``pagedState``, ``getStateById`` = ``singleState`` by ``AGGREGATE_ID``,
``getStateByIds`` = ``listState`` by ``AGGREGATE_IDS`` with ``limit`` the number of ids), with its headers
(``Command-*``, ``Accept: application/json``), over real HTTP; the answers are checked against what Wow's own
server answers: bare states, Wow's ``CommandResult`` fields, Wow's statuses and ``Wow-Error-Code``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import pytest

ORDER = {"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "3.50"}]}
WOW_RESULT = {"id", "waitCommandId", "stage", "contextName", "aggregateName", "tenantId", "aggregateId",
              "aggregateVersion", "requestId", "commandId", "function", "errorCode", "errorMsg", "bindingErrors",
              "result", "signalTime", "succeeded"}


class WowClient:
    """What the TS client puts on the wire: JSON both ways, the tenant as a header."""

    def __init__(self, base: str, tenant: str):
        self.base = base.rstrip("/") + "/api/"
        self.tenant = tenant

    def call(self, method: str, path: str, body=None, **headers) -> tuple[int, dict, object]:
        sent = {"Content-Type": "application/json", "Accept": "application/json", "Command-Tenant-Id": self.tenant,
                **{name.replace("_", "-"): str(value) for name, value in headers.items()}}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - the live server
                return response.status, dict(response.headers), json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read() or b"null")

    def send(self, path: str, body: dict, *, stage: str = "SNAPSHOT", request_id: str | None = None, **headers):
        return self.call("POST", path, body, Command_Wait_Stage=stage,
                         Command_Request_Id=request_id or uuid.uuid4().hex, **headers)


@pytest.fixture
def client(every_backend, live_server):
    return WowClient(live_server.url, "t1")


def test_wows_client_drives_commands_and_state_queries(client):
    # send(): a create with a client-chosen id, Wow's CommandResult back.
    status, _, placed = client.send("order/place_order", ORDER, Command_Aggregate_Id="order-ts-1",
                                    request_id="ts-place-1")
    assert status == 200, placed
    assert WOW_RESULT <= set(placed)
    assert (placed["aggregateId"], placed["aggregateVersion"], placed["stage"]) == ("order-ts-1", 1, "SNAPSHOT")
    assert placed["succeeded"] is True and placed["errorCode"] == "Ok" and placed["waitCommandId"] == placed["commandId"]
    assert placed["function"]["name"] == "place_order" and placed["function"]["processorName"] == "order"
    status, _, other = client.send("order/place_order", {**ORDER, "customer_id": "c-2"})
    assert status == 200
    second = other["aggregateId"]

    # getStateById, getStateByIds, listState, pagedState, singleState: bare states.
    status, _, state = client.call("POST", "order/snapshot/single/state",
                                   {"condition": {"operator": "AGGREGATE_ID", "value": "order-ts-1"}})
    assert status == 200 and state["customer_id"] == "c-1" and "aggregateId" not in state
    status, _, states = client.call("POST", "order/snapshot/list/state", {
        "condition": {"operator": "AGGREGATE_IDS", "value": ["order-ts-1", second]}, "limit": 2,
        "sort": [{"field": "state.customer_id", "direction": "ASC"}]})
    assert status == 200 and [s["customer_id"] for s in states] == ["c-1", "c-2"]
    status, _, page = client.call("POST", "order/snapshot/paged/state", {
        "condition": {"operator": "ALL"}, "pagination": {"index": 1, "size": 10}})
    assert status == 200 and page["total"] == 2 and {s["customer_id"] for s in page["list"]} == {"c-1", "c-2"}
    status, headers, missing = client.call("POST", "order/snapshot/single/state",
                                           {"condition": {"operator": "AGGREGATE_ID", "value": "no-such"}})
    assert (status, missing["errorCode"], headers["Wow-Error-Code"]) == (404, "NotFound", "NotFound")

    # Failures as Wow's server answers them: the status, Wow-Error-Code, and the command's result as the body.
    status, headers, short = client.send("order/order-ts-1/pay_order", {"amount": "1.00", "payment_id": "p-1"})
    assert (status, short["errorCode"], headers["Wow-Error-Code"]) == (400, "AMOUNT_MISMATCH", "AMOUNT_MISMATCH")
    assert WOW_RESULT <= set(short) and short["aggregateId"] == "order-ts-1" and short["succeeded"] is False
    status, _, taken = client.send("order/place_order", ORDER, Command_Aggregate_Id="order-ts-1")
    assert (status, taken["errorCode"], taken["aggregateId"]) == (400, "DuplicateAggregateId", "order-ts-1")
    status, _, reused = client.send("order/place_order", {**ORDER, "customer_id": "c-9"}, request_id="ts-place-1",
                                    Command_Aggregate_Id="order-ts-1")
    assert (status, reused["errorCode"]) == (400, "DuplicateRequestId")
    status, _, stale = client.send("order/order-ts-1/pay_order", {"amount": "7.00", "payment_id": "p-1"},
                                   Command_Aggregate_Version=5)
    assert (status, stale["errorCode"]) == (409, "CommandExpectVersionConflict")
    # Our documented difference: the same request again answers its first result, marked as a repeat.
    status, _, repeated = client.send("order/place_order", ORDER, Command_Aggregate_Id="order-ts-1",
                                      request_id="ts-place-1")
    assert status == 200 and repeated["duplicate"] is True and repeated["commandId"] == placed["commandId"]

    status, _, paid = client.send("order/order-ts-1/pay_order", {"amount": "7.00", "payment_id": "p-1"},
                                  Command_Aggregate_Version=1)
    assert status == 200 and paid["aggregateVersion"] == 2
    status, _, state = client.call("POST", "order/snapshot/single/state",
                                   {"condition": {"operator": "AGGREGATE_ID", "value": "order-ts-1"}})
    assert state["status"] == "PAID"
