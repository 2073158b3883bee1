"""Wow's TypeScript client against a live server (issue 24): the requests it sends, as it sends them.

The calls are those of ``@ahoo-wang/fetcher-wow`` (its ``CommandClient.send`` and ``SnapshotQueryClient``:
``singleState``, ``listState``, ``pagedState``, ``getStateById`` = ``singleState`` by ``AGGREGATE_ID``,
``getStateByIds`` = ``listState`` by ``AGGREGATE_IDS`` with ``limit`` the number of ids), with its headers
(``Command-*``, ``Accept: application/json``), over real HTTP; the answers are checked against what Wow's own
server answers: bare states, Wow's ``CommandResult`` fields, Wow's statuses and ``Wow-Error-Code``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from types import SimpleNamespace

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

    # Wow's document fields and conditions: spaceId and tags, SPACE_ID, BEFORE_TODAY's time of day.
    status, _, snapshot = client.call("POST", "order/snapshot/single", {
        "condition": {"operator": "AGGREGATE_ID", "value": "order-ts-1"}})
    assert (snapshot["spaceId"], snapshot["tags"]) == ("", {})
    status, _, events = client.call("POST", "order/event/list", {
        "condition": {"operator": "AGGREGATE_ID", "value": "order-ts-1"}, "limit": 1})
    assert events[0]["spaceId"] == ""
    status, _, nothing = client.call("POST", "order/snapshot/list", {
        "condition": {"operator": "SPACE_ID", "value": "space-1"}, "limit": 10})
    assert (status, nothing) == (200, [])
    status, _, earlier = client.call("POST", "order/snapshot/count", {  # today at 00:00: nothing of today
        "field": "snapshotTime", "operator": "BEFORE_TODAY", "value": 0})
    assert (status, earlier) == (200, 0)
    # Over HTTP the time of day is whole seconds (the documented difference): text and 86400 are refused.
    for bad in ("00:30", 86_400):
        status, _, refused = client.call("POST", "order/snapshot/count", {
            "field": "snapshotTime", "operator": "BEFORE_TODAY", "value": bad})
        assert status == 400 and refused["bindingErrors"][0]["name"].endswith("value"), refused


def read_events(body: bytes) -> list[dict]:
    """The events of an event stream: ``{"id", "event", "data"}`` each, data parsed as JSON."""
    events = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append({"id": fields.get("id"), "event": fields.get("event"), "data": json.loads(fields["data"])})
    return events


def stream(client: WowClient, path: str, body: dict, **headers) -> tuple[int, dict, list[dict]]:
    sent = {"Content-Type": "application/json", "Accept": "text/event-stream", "Command-Tenant-Id": client.tenant,
            **{name.replace("_", "-"): str(value) for name, value in headers.items()}}
    request = urllib.request.Request(client.base + path, data=json.dumps(body).encode(), method="POST", headers=sent)
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - the live server
        return response.status, dict(response.headers), read_events(response.read())


def test_wows_client_streams_a_commands_stages_and_lists(client):
    # sendAndWaitStream: an event per stage reached, up to the one asked, then the end of the stream.
    status, headers, events = stream(client, "order/place_order", ORDER, Command_Wait_Stage="SNAPSHOT",
                                     Command_Request_Id="sse-1")
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert [e["event"] for e in events] == ["PROCESSED", "SNAPSHOT"]
    assert all(e["data"]["requestId"] == "sse-1" and e["data"]["succeeded"] for e in events)
    assert events[0]["data"]["aggregateId"] == events[1]["data"]["aggregateId"]
    assert [e["id"] for e in events] == [e["data"]["id"] for e in events]
    assert events[0]["data"]["duplicate"] is False and events[1]["data"]["duplicate"] is False
    order = events[0]["data"]["aggregateId"]
    _, _, queued = stream(client, f"order/{order}/ship_order", {"tracking_number": "T"}, Command_Wait_Stage="SENT")
    assert [e["event"] for e in queued] == ["SENT"]
    # A refusal: one event named after its code, the result with the error; status 200, as Wow streams it.
    status, _, refused = stream(client, f"order/{order}/pay_order", {"amount": "1.00", "payment_id": "p"},
                                Command_Wait_Stage="PROJECTED")
    assert status == 200 and [e["event"] for e in refused] == ["AMOUNT_MISMATCH"]
    assert refused[0]["data"]["aggregateId"] == order and refused[0]["data"]["errorCode"] == "AMOUNT_MISMATCH"
    # A refusal before streaming (a bad header) keeps its status, written as one event.
    try:
        stream(client, "order/place_order", ORDER, Command_Wait_Stage="SOON")
    except urllib.error.HTTPError as error:
        assert error.code == 400 and read_events(error.read())[0]["event"] == "CommandValidation"
    else:
        raise AssertionError("a bad wait stage streamed")

    # listStream, listStateStream, event listStream: an event per document.
    _, _, snapshots = stream(client, "order/snapshot/list", {"condition": {"operator": "ALL"}, "limit": 10})
    assert [e["data"]["aggregateId"] for e in snapshots] == [order]
    _, _, states = stream(client, "order/snapshot/list/state", {"condition": {"operator": "ALL"}, "limit": 10})
    assert [e["data"]["customer_id"] for e in states] == ["c-1"]
    _, _, streams = stream(client, "order/event/list", {"condition": {"operator": "AGGREGATE_ID", "value": order},
                                                        "sort": [{"field": "version", "direction": "ASC"}]})
    assert [e["data"]["version"] for e in streams] == list(range(1, len(streams) + 1)) and len(streams) >= 1
    # Not a list: no stream.
    try:
        stream(client, "order/snapshot/paged", {})
    except urllib.error.HTTPError as error:
        assert error.code == 406
    else:
        raise AssertionError("paged streamed")


def test_wows_client_waits_for_a_named_processor_and_for_sagas(client):
    """Command-Wait-Stage EVENT_HANDLED/SAGA_HANDLED with Command-Wait-Context/-Processor/-Function, as the
    client's ``waitStrategy`` sends them: answered once that follower has handled the command's events (each
    handler here is slow, so an answer that did not wait would find nothing handled yet)."""
    from wow_django.application.followers import follower
    from wow_django.domain import event_processor

    handled: dict[str, list[str]] = {"relay": [], "saga": []}

    @event_processor("order", events=["order_placed"], name="placed-relay")
    def relay(message):
        time.sleep(0.3)
        handled["relay"].append(message.aggregate_id.id)

    @follower("placed-saga", aggregates={"order"}, events={"order_placed"})
    def saga(item):
        time.sleep(0.3)
        handled["saga"].append(item.stream.aggregate_id.id)

    status, _, relayed = client.send("order/place_order", ORDER, stage="EVENT_HANDLED",
                                     Command_Wait_Context="order-service", Command_Wait_Processor="placed-relay")
    assert status == 200 and (relayed["stage"], relayed["succeeded"]) == ("EVENT_HANDLED", True), relayed
    assert relayed["aggregateId"] in handled["relay"]
    status, _, sagaed = client.send("order/place_order", ORDER, stage="SAGA_HANDLED",
                                    Command_Wait_Processor="placed-saga", Command_Wait_Function="saga")
    assert status == 200 and sagaed["stage"] == "SAGA_HANDLED" and sagaed["aggregateId"] in handled["saga"]
    # The server-sent stream: PROCESSED, then the stage.
    _, _, events = stream(client, "order/place_order", ORDER, Command_Wait_Stage="EVENT_HANDLED",
                          Command_Wait_Function="relay")
    assert [e["event"] for e in events] == ["PROCESSED", "EVENT_HANDLED"]
    assert events[-1]["data"]["aggregateId"] in handled["relay"]

    # Refused before anything runs, naming the header: no such follower, another context, a stage that waits
    # for no follower, and Wow's tail waits (not supported).
    for headers, name in [
        ({"Command_Wait_Processor": "no-such-relay"}, "Command-Wait-Processor"),
        ({"Command_Wait_Context": "billing", "Command_Wait_Processor": "placed-relay"}, "Command-Wait-Context"),
        ({"Command_Wait_Function": "saga"}, "Command-Wait-Function"),  # a saga's function, not a processor's
        ({"Command_Wait_Tail_Stage": "PROCESSED"}, "Command-Wait-Tail-Stage"),
    ]:
        request_id = uuid.uuid4().hex
        status, _, refused = client.send("order/place_order", ORDER, stage="EVENT_HANDLED", request_id=request_id,
                                         **headers)
        assert (status, refused["errorCode"]) == (400, "CommandValidation"), (headers, refused)
        assert refused["bindingErrors"][0]["name"] == name
        status, _, found = client.call("GET", f"order/request/{request_id}/status")
        assert status == 404, found  # nothing was stored
    status, _, refused = client.send("order/place_order", ORDER, stage="SNAPSHOT",
                                     Command_Wait_Processor="placed-relay")
    assert status == 400 and "narrows the stages" in refused["bindingErrors"][0]["msg"]


def test_the_stream_runs_under_asgi_too(every_backend):
    """Django's ASGI handler (AsyncClient): the command's stages arrive as an asynchronous stream, each event
    taken in Django's thread for synchronous code."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    async def run() -> tuple[int, list[bytes], bool]:
        response = await AsyncClient().post(
            "/api/order/place_order", ORDER, content_type="application/json",
            headers={"Accept": "text/event-stream", "Command-Wait-Stage": "SNAPSHOT", "Command-Tenant-Id": "t1"})
        chunks = [chunk async for chunk in response.streaming_content]
        return response.status_code, chunks, response.is_async

    status, chunks, is_async = async_to_sync(run)()
    assert status == 200 and is_async
    assert len(chunks) == 2  # one chunk per event: sent as they come, not gathered
    assert [e["event"] for e in read_events(b"".join(chunks))] == ["PROCESSED", "SNAPSHOT"]


# --- Wow's attribution prefixes and the context alias (issue 24, item 6) -----------------------------------


def test_the_tenant_prefix_names_the_tenant_as_the_header_would(every_backend):
    from rest_framework.test import APIClient

    api = APIClient()
    placed = api.post("/api/tenant/t9/order/place_order", ORDER, format="json", HTTP_COMMAND_WAIT_STAGE="SNAPSHOT")
    assert placed.status_code == 200 and placed.json()["tenantId"] == "t9"
    order = placed.json()["aggregateId"]
    assert api.get(f"/api/tenant/t9/order/{order}/state").status_code == 200
    assert api.get(f"/api/order/{order}/state", HTTP_COMMAND_TENANT_ID="t9").status_code == 200  # the same tenant
    assert api.get(f"/api/tenant/t8/order/{order}/state").status_code == 404  # another's
    assert api.post("/api/tenant/t8/order/snapshot/count", {}, format="json").json() == 0
    assert api.post("/api/tenant/t9/order/snapshot/list/state", {}, format="json").json()[0]["customer_id"] == "c-1"
    clash = api.get(f"/api/tenant/t9/order/{order}/state", HTTP_COMMAND_TENANT_ID="t8")
    assert clash.status_code == 400 and clash.json()["bindingErrors"][0]["name"] == "Command-Tenant-Id"
    assert api.get(f"/api/tenant/{'x' * 129}/order/{order}/state").status_code == 400


def test_the_tenant_prefix_never_reaches_another_tenant_when_the_user_has_one(every_backend):
    from django.test import override_settings
    from rest_framework.test import APIClient

    api = APIClient()
    with override_settings(WOW={**every_backend, "TENANT_RESOLVER": "wow_django.http.tenancy.UserTenantResolver"}):
        api.force_authenticate(SimpleNamespace(pk=1, username="u", tenant_id="acme", is_authenticated=True))
        assert api.post("/api/tenant/acme/order/place_order", ORDER, format="json").status_code == 200
        refused = api.post("/api/tenant/globex/order/snapshot/count", {}, format="json")
        assert refused.status_code == 403 and refused.json()["errorCode"] == "PermissionDenied"


@pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
def test_the_owner_prefix_shows_and_acts_for_that_owner_only(every_backend):
    from django.contrib.auth.models import Permission, User
    from django.test import override_settings
    from rest_framework.test import APIClient

    alice = User.objects.create_user("alice", "alice@example.com", "pw")
    bob = User.objects.create_user("bob", "bob@example.com", "pw")
    staff = User.objects.create_user("staff", "staff@example.com", "pw")
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="wow_django",
                                                      codename="act_for_any_owner"))
    api = APIClient()
    with override_settings(WOW=every_backend):
        def place(user, owner):
            api.force_authenticate(user)
            answer = api.post(f"/api/owner/{owner.pk}/order/place_order", ORDER, format="json",
                              HTTP_COMMAND_TENANT_ID="t1", HTTP_COMMAND_WAIT_STAGE="SNAPSHOT")
            assert answer.status_code == 200, answer.content
            return answer.json()["aggregateId"]

        mine, theirs = place(alice, alice), place(bob, bob)
        api.force_authenticate(alice)
        listed = api.post(f"/api/owner/{alice.pk}/order/snapshot/list", {}, format="json", HTTP_COMMAND_TENANT_ID="t1")
        assert [s["aggregateId"] for s in listed.json()] == [mine] and listed.json()[0]["ownerId"] == str(alice.pk)
        assert api.post("/api/order/snapshot/count", {}, format="json", HTTP_COMMAND_TENANT_ID="t1").json() == 2
        for path in (f"{theirs}/state", f"{theirs}/snapshot", f"{theirs}/event/1/1"):
            assert api.get(f"/api/owner/{alice.pk}/order/{path}", HTTP_COMMAND_TENANT_ID="t1").status_code == 404
        assert api.get(f"/api/owner/{alice.pk}/order/{mine}/state", HTTP_COMMAND_TENANT_ID="t1").status_code == 200
        # Her prefix does not act on his aggregate; his prefix is not hers to use.
        paid = api.post(f"/api/owner/{alice.pk}/order/{theirs}/pay_order", {"amount": "7.00", "payment_id": "p"},
                        format="json", HTTP_COMMAND_TENANT_ID="t1")
        assert paid.status_code == 403 and paid.json()["errorCode"] == "IllegalAccessOwnerAggregate"
        refused = api.post(f"/api/owner/{bob.pk}/order/snapshot/list", {}, format="json", HTTP_COMMAND_TENANT_ID="t1")
        assert refused.status_code == 403 and refused.json()["errorCode"] == "PermissionDenied"
        # A user with the permission uses any owner's prefix: creates for them, sees theirs.
        for_bob = place(staff, bob)
        api.force_authenticate(User.objects.get(pk=staff.pk))
        listed = api.post(f"/api/owner/{bob.pk}/order/snapshot/list", {}, format="json", HTTP_COMMAND_TENANT_ID="t1")
        assert sorted(s["aggregateId"] for s in listed.json()) == sorted([theirs, for_bob])
        both = api.get(f"/api/tenant/t1/owner/{bob.pk}/order/{for_bob}/state")
        assert both.status_code == 200


def test_the_context_alias_prefixes_every_route(every_backend):
    from django.test import override_settings
    from rest_framework.test import APIClient

    api = APIClient()
    with override_settings(ROOT_URLCONF="tests.alias_urls"):
        placed = api.post("/api/sample/order/place_order", ORDER, format="json", HTTP_COMMAND_TENANT_ID="t1",
                          HTTP_COMMAND_WAIT_STAGE="SNAPSHOT")
        assert placed.status_code == 200
        order = placed.json()["aggregateId"]
        assert api.post("/api/sample/tenant/t1/order/snapshot/count", {}, format="json").json() == 1
        assert api.get(f"/api/sample/order/{order}/state", HTTP_COMMAND_TENANT_ID="t1").status_code == 200
        assert api.post("/api/order/snapshot/count", {}, format="json", HTTP_COMMAND_TENANT_ID="t1").json() == 1
        other = api.post("/api/other/order/snapshot/count", {}, format="json")
        assert other.status_code == 404 and other.json()["errorCode"] == "NotFound"


def test_the_schema_marks_the_operations_below_an_alias_given_to_build_urlpatterns():
    """An alias passed to build_urlpatterns (not the setting, which is unset here) still gives the operations
    below it their own operationIds."""
    from drf_spectacular.generators import SchemaGenerator

    from wow_django.conf import wow_settings

    assert not wow_settings.CONTEXT_ALIAS
    schema = SchemaGenerator(urlconf="tests.alias_urls").get_schema(request=None, public=True)
    ids = [op["operationId"] for item in schema["paths"].values() for op in item.values() if isinstance(op, dict)]
    assert len(ids) == len(set(ids)) and {"order_place_order", "alias_order_place_order",
                                          "alias_tenant_order_snapshot_count"} <= set(ids)


def test_an_alias_must_be_a_path_segment():
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from wow_django.conf import wow_settings

    for alias in ("a/b", "tenant", "", 5):
        with override_settings(WOW={"CONTEXT_ALIAS": alias}), pytest.raises(ImproperlyConfigured, match="CONTEXT_ALIAS"):
            _ = wow_settings.CONTEXT_ALIAS


def test_a_header_resolver_with_its_own_check_is_held_to_it_under_the_tenant_prefix(every_backend):
    from django.test import override_settings
    from rest_framework.test import APIClient

    api = APIClient()
    with override_settings(WOW={**every_backend, "TENANT_RESOLVER": "tests.tenant_resolvers.OnlyAcme"}):
        assert api.post("/api/tenant/acme/order/snapshot/count", {}, format="json",
                        HTTP_COMMAND_TENANT_ID="acme").status_code == 200
        refused = api.post("/api/tenant/globex/order/snapshot/count", {}, format="json",
                           HTTP_COMMAND_TENANT_ID="acme")
        assert refused.status_code == 403  # its resolve() says acme: the path may not say otherwise


def test_an_aggregate_named_as_a_prefix_or_the_alias_is_refused(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from wow_django.http import urls

    real = urls.aggregates()
    order = real["order"]
    for clash, alias in (("tenant", None), ("owner", None), ("sample", "sample")):
        monkeypatch.setattr(urls, "aggregates", lambda clash=clash: {**real, clash: order})
        with pytest.raises(ImproperlyConfigured, match=repr(clash)):
            urls.build_urlpatterns(context_alias=alias)
    monkeypatch.setattr(urls, "aggregates", lambda: real)
    assert urls.build_urlpatterns(context_alias="sample")  # no clash: routes


def test_the_context_alias_names_this_service_in_command_wait_context(every_backend):
    from django.test import override_settings
    from rest_framework.test import APIClient

    api = APIClient()
    with override_settings(WOW={**every_backend, "CONTEXT_ALIAS": "sample"}):
        for context in ("sample", "order-service"):
            placed = api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_WAIT_STAGE="EVENT_HANDLED",
                              HTTP_COMMAND_WAIT_CONTEXT=context, HTTP_COMMAND_WAIT_PROCESSOR="order-purchased-relay")
            assert placed.status_code == 200 and placed.json()["stage"] == "EVENT_HANDLED", placed.content
        empty = api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_WAIT_STAGE="EVENT_HANDLED",
                         HTTP_COMMAND_WAIT_PROCESSOR="")
        assert empty.status_code == 400 and empty.json()["bindingErrors"][0]["name"] == "Command-Wait-Processor"
