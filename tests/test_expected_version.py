"""The expected aggregate version (Wow's ``Command-Aggregate-Version``): optimistic concurrency from the client.

A command sent with ``expected_version=N`` (the header over HTTP) is handled only when the aggregate is at
version N (0: not created yet); otherwise it is refused with ``CommandExpectVersionConflict`` (409), nothing
appended and the store unchanged. On the Python API and over HTTP, on every backend (in-memory,
mongomock://, django on SQLite), with a race where two commands expect the same version.
"""

from __future__ import annotations

import threading

import pytest
from rest_framework.test import APIClient

from sample_project.orders.aggregates import ChangeDisplayName, RegisterCustomer
from wow_django.application import WaitStage
from wow_django.application.gateway import CommandGateway, CommandMessage
from wow_django.application.runtime import get_runtime
from wow_django.exceptions import (
    AggregateNotFound,
    CommandExpectVersionConflict,
    CommandValidationError,
    RequestIdReused,
)
from wow_django.persistence.records import AggregateId

from .support import RivalReads

pytestmark = pytest.mark.usefixtures("queued_commands")


@pytest.fixture
def backend(every_backend):
    return every_backend


@pytest.fixture
def api(backend):
    return APIClient()


def register(name: str = "ada", **options):
    return get_runtime().gateway.send(RegisterCustomer(username=name, display_name=name.title()), tenant_id="t1",
                                      wait=WaitStage.SNAPSHOT, **options)


def rename(customer_id: str, display_name: str, **options):
    return get_runtime().gateway.send(ChangeDisplayName(display_name=display_name), aggregate_id=customer_id,
                                      tenant_id="t1", wait=WaitStage.SNAPSHOT, **options)


def stored(customer_id: str) -> list[tuple[int, str]]:
    """(version, display name) of every stored stream of the customer."""
    streams = get_runtime().event_store.load(AggregateId("customer", customer_id, tenant_id="t1"))
    return [(s.version, s.body[0].body.get("display_name")) for s in streams]


def snapshot_version(customer_id: str) -> int:
    return get_runtime().snapshot_store.load(AggregateId("customer", customer_id, tenant_id="t1")).version


# --- the Python API ---------------------------------------------------------------------------------------------


def test_the_expected_version_is_checked_before_the_command_is_handled(backend):
    customer = register().aggregate_id
    accepted = rename(customer, "Ada L.", expected_version=1)
    assert (accepted.aggregate_version, accepted.succeeded) == (2, True)

    with pytest.raises(CommandExpectVersionConflict) as refused:
        rename(customer, "Ada Lovelace", expected_version=1)  # read at version 1; it is at 2 now
    assert (refused.value.expected_version, refused.value.actual_version) == (1, 2)
    assert refused.value.error_code == "CommandExpectVersionConflict"
    assert "version 2, not the expected version 1" in str(refused.value)
    assert stored(customer) == [(1, "Ada"), (2, "Ada L.")]  # nothing appended
    assert snapshot_version(customer) == 2

    with pytest.raises(CommandExpectVersionConflict):
        rename(customer, "Ada Lovelace", expected_version=3)  # ahead of the aggregate: refused too
    assert rename(customer, "Ada Lovelace", expected_version=2).aggregate_version == 3
    assert rename(customer, "Countess").aggregate_version == 4  # without it: any version


def test_zero_expects_an_aggregate_not_created_yet(backend):
    created = register("grace", aggregate_id="cust-g", expected_version=0)
    assert created.aggregate_version == 1
    with pytest.raises(CommandExpectVersionConflict) as refused:
        register("grace2", aggregate_id="cust-g", expected_version=0)  # it exists now: checked before the rest
    assert (refused.value.expected_version, refused.value.actual_version) == (0, 1)
    with pytest.raises(AggregateNotFound):
        rename("cust-missing", "x", expected_version=0)  # the version matches; the aggregate still does not exist
    with pytest.raises(CommandExpectVersionConflict) as missing:
        rename("cust-missing", "x", expected_version=4)
    assert missing.value.actual_version == 0
    assert stored("cust-g") == [(1, "Grace")]


def test_another_tenants_aggregate_is_at_version_zero(backend):
    customer = register().aggregate_id
    gateway = get_runtime().gateway
    with pytest.raises(CommandExpectVersionConflict) as refused:
        gateway.send(ChangeDisplayName(display_name="x"), aggregate_id=customer, tenant_id="t2", expected_version=1)
    assert refused.value.actual_version == 0  # t2 learns nothing about t1's aggregate
    assert stored(customer) == [(1, "Ada")]


@pytest.mark.parametrize("value", [-1, 2**31, True, "1", 1.0])
def test_an_expected_version_that_is_no_version_is_refused(backend, value):
    customer = register().aggregate_id
    with pytest.raises(CommandValidationError) as refused:
        rename(customer, "x", expected_version=value)
    assert [e["name"] for e in refused.value.binding_errors] == ["expected_version"]
    assert stored(customer) == [(1, "Ada")]


def test_a_repeated_request_is_still_answered_as_the_duplicate(backend):
    """The request id is checked first: the same request again (same command and body) gets the first result,
    although the aggregate has moved past the version it expected; another body is still RequestIdReused."""
    customer = register().aggregate_id
    first = rename(customer, "Ada L.", request_id="req-1", expected_version=1)
    again = rename(customer, "Ada L.", request_id="req-1", expected_version=1)
    assert (again.duplicate, again.command_id, again.aggregate_version) == (True, first.command_id, 2)
    with pytest.raises(RequestIdReused):
        rename(customer, "Someone else", request_id="req-1", expected_version=2)
    assert stored(customer) == [(1, "Ada"), (2, "Ada L.")]


def test_a_queued_command_carries_its_expected_version(backend, queued_commands):
    customer = register().aggregate_id
    gateway = get_runtime().gateway
    sent = gateway.send(ChangeDisplayName(display_name="x"), aggregate_id=customer, tenant_id="t1",
                        wait=WaitStage.SENT, expected_version=5)
    assert sent.stage is WaitStage.SENT
    assert queued_commands[-1]["expected_version"] == 5  # refused when the task ran: nothing appended
    with pytest.raises(CommandExpectVersionConflict):
        gateway.process_message(CommandMessage.from_dict(queued_commands[-1]))
    assert stored(customer) == [(1, "Ada")]
    old = {k: v for k, v in queued_commands[-1].items() if k != "expected_version"}  # queued before the field
    assert CommandMessage.from_dict(old).expected_version is None


# --- races ---------------------------------------------------------------------------------------------------


def _race(senders, customer: str) -> list:
    """Each sender renames the customer expecting version 1, all started together; their outcomes."""
    barrier = threading.Barrier(len(senders), timeout=10)
    outcomes: list = [None] * len(senders)

    def run(n: int) -> None:
        barrier.wait()
        try:
            outcomes[n] = senders[n](f"name-{n}")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test looks at
            outcomes[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(senders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_commands_racing_with_one_expected_version_accept_exactly_one(backend):
    customer = register().aggregate_id
    senders = [lambda name: rename(customer, name, expected_version=1)] * 8
    outcomes = _race(senders, customer)
    accepted = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(accepted) == 1 and accepted[0].aggregate_version == 2, outcomes
    assert all(isinstance(o, CommandExpectVersionConflict) for o in outcomes if isinstance(o, Exception)), outcomes
    assert [v for v, _ in stored(customer)] == [1, 2]


def test_two_processes_expecting_one_version_accept_exactly_one(backend):
    """The loser's append conflicts; its retry reloads, finds version 2 and refuses the command instead of
    handling it again on the new state."""
    customer = register().aggregate_id
    barrier, conflicts = threading.Barrier(2, timeout=10), []
    views = [RivalReads(get_runtime().event_store, barrier, conflicts) for _ in range(2)]
    gateways = [CommandGateway(view, None, context_name="order-service", retry_limit=5, retry_backoff_ms=0.2)
                for view in views]
    for view in views:
        view.armed = True
    try:
        outcomes = _race([lambda name, g=g: g.send(ChangeDisplayName(display_name=name), aggregate_id=customer,
                                                   tenant_id="t1", expected_version=1) for g in gateways], customer)
    finally:
        for gateway in gateways:
            gateway.close()
    accepted = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(accepted) == 1 and accepted[0].aggregate_version == 2, outcomes
    assert len(refused) == 1 and isinstance(refused[0], CommandExpectVersionConflict), outcomes
    assert refused[0].actual_version == 2
    assert conflicts == [2], "the two appends did not conflict: the retry path was not exercised"
    assert [v for v, _ in stored(customer)] == [1, 2]


# --- over HTTP -----------------------------------------------------------------------------------------------------


def http_rename(api, customer: str, display_name: str, **headers):
    return api.post(f"/api/customer/{customer}/change_display_name", {"display_name": display_name}, format="json",
                    HTTP_COMMAND_TENANT_ID="t1", HTTP_COMMAND_WAIT_STAGE="SNAPSHOT", **headers)


def test_the_header_over_http(api):
    created = api.post("/api/customer/register_customer", {"username": "ada", "display_name": "Ada"},
                       format="json", HTTP_COMMAND_TENANT_ID="t1", HTTP_COMMAND_WAIT_STAGE="SNAPSHOT",
                       HTTP_COMMAND_AGGREGATE_VERSION="0")
    assert created.status_code == 200, created.content
    customer = created.json()["aggregateId"]

    accepted = http_rename(api, customer, "Ada L.", HTTP_COMMAND_AGGREGATE_VERSION="1")
    assert accepted.status_code == 200 and accepted.json()["aggregateVersion"] == 2

    refused = http_rename(api, customer, "Ada Lovelace", HTTP_COMMAND_AGGREGATE_VERSION="1")
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert body["errorCode"] == "CommandExpectVersionConflict"
    assert "version 2, not the expected version 1" in body["errorMsg"]
    assert stored(customer) == [(1, "Ada"), (2, "Ada L.")]
    state = api.get(f"/api/customer/{customer}/state", HTTP_COMMAND_TENANT_ID="t1").json()
    assert state["display_name"] == "Ada L."
    snapshot = api.get(f"/api/customer/{customer}/snapshot", HTTP_COMMAND_TENANT_ID="t1").json()
    assert snapshot["version"] == 2

    deleted = api.delete(f"/api/customer/{customer}", HTTP_COMMAND_TENANT_ID="t1", HTTP_COMMAND_AGGREGATE_VERSION="1")
    assert deleted.status_code == 409 and deleted.json()["errorCode"] == "CommandExpectVersionConflict"
    assert [v for v, _ in stored(customer)] == [1, 2]


def test_the_header_with_a_repeated_request_id(api):
    customer = register().aggregate_id
    first = http_rename(api, customer, "Ada L.", HTTP_COMMAND_AGGREGATE_VERSION="1", HTTP_COMMAND_REQUEST_ID="r-1")
    again = http_rename(api, customer, "Ada L.", HTTP_COMMAND_AGGREGATE_VERSION="1", HTTP_COMMAND_REQUEST_ID="r-1")
    assert first.status_code == again.status_code == 200
    assert again.json()["duplicate"] is True and again.json()["commandId"] == first.json()["commandId"]
    assert [v for v, _ in stored(customer)] == [1, 2]


@pytest.mark.parametrize("value", ["-1", "abc", "1.0", " 1", "+1", "2147483648", "１", "99999999999"])
def test_a_header_that_is_no_version_is_a_400(api, value):
    customer = register().aggregate_id
    response = http_rename(api, customer, "x", HTTP_COMMAND_AGGREGATE_VERSION=value)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["errorCode"] == "CommandValidation"
    assert [e["name"] for e in body["bindingErrors"]] == ["Command-Aggregate-Version"]
    assert stored(customer) == [(1, "Ada")]


def test_http_racers_with_one_expected_version_accept_exactly_one(api):
    customer = register().aggregate_id
    outcomes = _race([lambda name: http_rename(APIClient(), customer, name, HTTP_COMMAND_AGGREGATE_VERSION="1")] * 6,
                     customer)
    statuses = sorted(o.status_code for o in outcomes)
    assert statuses == [200, 409, 409, 409, 409, 409], [o.content for o in outcomes]
    assert [v for v, _ in stored(customer)] == [1, 2]


def test_the_wait_timeout_header_is_whole_milliseconds_capped_by_the_setting(api, monkeypatch):
    seen = []
    send_json = CommandGateway.send_json

    def spy(self, *args, **kwargs):
        seen.append(kwargs["timeout"])
        return send_json(self, *args, **kwargs)

    monkeypatch.setattr(CommandGateway, "send_json", spy)
    customer = register().aggregate_id
    assert http_rename(api, customer, "a", HTTP_COMMAND_WAIT_TIMEOUT="1500").status_code == 200
    assert http_rename(api, customer, "b", HTTP_COMMAND_WAIT_TIMEOUT="600000").status_code == 200
    assert http_rename(api, customer, "c").status_code == 200
    assert seen == [1.5, 30, None]  # 600 s asked, COMMAND_WAIT_TIMEOUT_S (30 s) given; none: the default
    for value in ("-5", "1s", "0x10", "2147483648"):
        response = http_rename(api, customer, "d", HTTP_COMMAND_WAIT_TIMEOUT=value)
        assert response.status_code == 400 and response.json()["bindingErrors"][0]["name"] == "Command-Wait-Timeout"
