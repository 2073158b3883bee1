"""The command status lookup, pinned where a mutation pass found it unpinned (see tests/test_command_status.py).

The book (:class:`CommandStatusBook`) on a PrepareKey store of its own, and the gateway's ``status``,
``process_message`` and the SENT branch of ``send`` on a gateway over in-memory stores.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from sample_project.orders.aggregates import OrderLine, PayOrder, PlaceOrder, RegisterCustomer
from wow_django.application.command_status import STATUS_STORE_NAME, CommandStatusBook, status_key
from wow_django.application.gateway import CommandGateway, CommandResult, WaitStage
from wow_django.application.ports import TaskQueue
from wow_django.backends.memory.stores import InMemoryEventStore, InMemoryPrepareKey, InMemorySnapshotStore
from wow_django.exceptions import CommandValidationError, EventVersionConflict
from wow_django.persistence.records import AggregateId

# --- the book ------------------------------------------------------------------------------------------


def result(stage: str, request_id: str = "r-1", tenant: str = "t1", aggregate: str = "order", **extra) -> dict:
    return {"commandId": "c-1", "requestId": request_id, "aggregateName": aggregate, "aggregateId": "a-1",
            "tenantId": tenant, "aggregateVersion": None if stage == "SENT" else 1, "stage": stage, "events": [],
            "duplicate": False, "errorCode": "Ok", "errorMsg": "", "bindingErrors": [], **extra}


class Clock:
    def __init__(self):
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_an_outcome_replaces_the_sent_record_and_a_later_outcome_the_earlier_one():
    book = CommandStatusBook(InMemoryPrepareKey(STATUS_STORE_NAME), timedelta(days=7))
    book.record(result("SENT"))
    assert book.get("order", "t1", "r-1")["stage"] == "SENT"
    book.record(result("PROCESSED"))
    assert book.get("order", "t1", "r-1")["stage"] == "PROCESSED"
    book.record(result("PROJECTED"))  # a redelivered message processed again: the latest word
    assert book.get("order", "t1", "r-1")["stage"] == "PROJECTED"
    book.record(result("SENT"))  # a re-sent request: not news
    assert book.get("order", "t1", "r-1")["stage"] == "PROJECTED"


def test_the_key_holds_the_aggregate_type_the_tenant_and_the_request_id():
    book = CommandStatusBook(InMemoryPrepareKey(STATUS_STORE_NAME), timedelta(days=7))
    book.record(result("PROCESSED", aggregate="order"))
    assert book.get("customer", "t1", "r-1") is None
    assert book.get("order", "t2", "r-1") is None
    assert book.get("order", "t1", "r-2") is None
    assert len({status_key(*triple) for triple in [("order", "t1", "r-1"), ("customer", "t1", "r-1"),
                                                   ("order", "t1 r-1", ""), ("order", "t1", "r-1 ")]}) == 4


def test_a_record_is_kept_for_the_ttl_and_no_longer():
    clock = Clock()
    book = CommandStatusBook(InMemoryPrepareKey(STATUS_STORE_NAME, clock=clock), timedelta(hours=1))
    book.record(result("PROCESSED"))
    clock.now += timedelta(minutes=59)
    assert book.get("order", "t1", "r-1") is not None
    clock.now += timedelta(minutes=2)
    assert book.get("order", "t1", "r-1") is None


class Racing(InMemoryPrepareKey):
    """A store on which another process's record lands between each read and the write that follows it."""

    def __init__(self, name: str, *, races: int, expire: bool = False):
        super().__init__(name)
        self.races, self.expire = races, expire

    def get(self, key):
        found = super().get(key)
        if self.races and found is not None:
            self.races -= 1
            if self.expire:  # the record expired just after prepare found it taken
                self.rollback(key)
                return None
            super().reprepare(key, {**found.value, "errorMsg": f"changed {self.races}"})
        return found


def test_a_record_that_changed_under_it_is_tried_again():
    store = Racing(STATUS_STORE_NAME, races=2)
    book = CommandStatusBook(store, timedelta(days=1))
    store.prepare(status_key("order", "t1", "r-1"), result("SENT"))
    book.record(result("PROCESSED"))
    assert book.get("order", "t1", "r-1")["stage"] == "PROCESSED"


def test_a_record_that_expired_under_it_is_prepared_again():
    store = Racing(STATUS_STORE_NAME, races=1, expire=True)
    book = CommandStatusBook(store, timedelta(days=1))
    store.prepare(status_key("order", "t1", "r-1"), result("SENT"))
    book.record(result("PROCESSED"))
    assert book.get("order", "t1", "r-1")["stage"] == "PROCESSED"


class Broken(InMemoryPrepareKey):
    def prepare(self, key, value, ttl=None):
        raise OSError("the store is down")


def test_a_record_that_cannot_be_written_is_logged_not_raised(caplog):
    book = CommandStatusBook(Broken(STATUS_STORE_NAME), timedelta(days=1))
    with caplog.at_level(logging.ERROR, logger="wow_django.application.command_status"):
        book.record(result("PROCESSED"))  # the command itself stands
    assert "could not record the status of request r-1" in caplog.text


# --- the gateway -----------------------------------------------------------------------------------------


class HeldQueue(TaskQueue):
    """Queued messages are held (a worker that has not run yet); ``refuse`` makes queueing fail."""

    def __init__(self):
        self.held: list[dict] = []
        self.refuse = False

    def process_command(self, message: dict) -> None:
        if self.refuse:
            raise ConnectionError("the broker is down")
        self.held.append(message)

    def request_snapshot(self, aggregate_name: str, aggregate_id: str) -> bool:
        return True

    def rollup(self, event_id: str) -> bool:
        return False


@pytest.fixture
def gateway():
    queue = HeldQueue()
    keys: dict[str, InMemoryPrepareKey] = {}
    gateway = CommandGateway(InMemoryEventStore(), InMemorySnapshotStore(), context_name="order-service",
                             prepare_keys=lambda name: keys.setdefault(name, InMemoryPrepareKey(name)),
                             tasks=lambda: queue, retry_limit=0, storage_timeout_s=None)
    gateway.queue = queue
    yield gateway
    gateway.close()


def place(gateway, request_id=None, wait="SNAPSHOT", price="5.00"):
    return gateway.send(PlaceOrder(customer_id="c-1", items=[OrderLine(sku="A-1", quantity=1,
                                                                       unit_price=Decimal(price))]),
                        tenant_id="t1", request_id=request_id or uuid.uuid4().hex, wait=wait)


def run_held(gateway):
    from wow_django.application.gateway import CommandMessage

    for message in gateway.queue.held:
        try:
            gateway.process_message(CommandMessage.from_dict(message), wait=WaitStage.SNAPSHOT)
        except Exception:  # noqa: BLE001,S110 - refusals are recorded; the test reads the status
            pass
    gateway.queue.held.clear()


def test_a_queued_command_not_yet_processed_is_at_sent(gateway):
    sent = place(gateway, request_id="r-q", wait="SENT")
    status = gateway.status("order", "r-q", tenant_id="t1")
    assert (status.stage, status.command_id, status.aggregate_version) == (WaitStage.SENT, sent.command_id, None)
    run_held(gateway)
    assert gateway.status("order", "r-q", tenant_id="t1").stage is WaitStage.SNAPSHOT  # its outcome


def test_a_command_whose_queueing_failed_has_no_status(gateway):
    gateway.queue.refuse = True
    with pytest.raises(ConnectionError):
        place(gateway, request_id="r-refused", wait="SENT")
    assert gateway.status("order", "r-refused", tenant_id="t1") is None


def test_the_same_request_id_on_two_aggregate_types_has_two_statuses(gateway):
    place(gateway, request_id="r-shared", wait="SENT")
    assert gateway.status("customer", "r-shared", tenant_id="t1") is None
    gateway.send(RegisterCustomer(username="shared", display_name="S"), tenant_id="t1", request_id="r-shared",
                 wait="SENT")
    run_held(gateway)
    assert gateway.status("order", "r-shared", tenant_id="t1").events == ("order_placed",)
    assert gateway.status("customer", "r-shared", tenant_id="t1").events == ("customer_registered",)


def test_a_queued_command_with_an_invalid_body_reports_its_binding_errors(gateway):
    from wow_django.application.gateway import CommandMessage

    message = CommandMessage(aggregate_name="order", command_name="pay_order", body={"amount": "-1"},
                             aggregate_id="o-1", request_id="r-bad", command_id="c-bad", request_id_given=True,
                             tenant_id="t1", owner_id="", operator="", header={})
    with pytest.raises(CommandValidationError):
        gateway.process_message(message)
    status = gateway.status("order", "r-bad", tenant_id="t1")
    assert status.stage is WaitStage.PROCESSED and status.error_code == CommandValidationError.error_code
    assert {error["name"] for error in status.binding_errors} >= {"amount", "payment_id"}


def test_a_queued_command_that_lost_every_version_race_reports_the_conflict(gateway, monkeypatch):
    order_id = place(gateway).aggregate_id
    pay = PayOrder(amount=Decimal("5.00"), payment_id="p-1")
    gateway.send(pay, aggregate_id=order_id, tenant_id="t1", request_id="r-race", wait="SENT")

    def conflict(stream):
        raise EventVersionConflict("order", order_id, stream.version)

    monkeypatch.setattr(gateway.event_store, "append", conflict)
    run_held(gateway)
    status = gateway.status("order", "r-race", tenant_id="t1")
    assert status.stage is WaitStage.PROCESSED and status.error_code == EventVersionConflict.error_code
    assert status.aggregate_version is None


def test_a_stored_command_is_at_snapshot_only_once_the_snapshot_holds_its_version(gateway):
    placed = place(gateway, request_id="r-place")
    key = AggregateId("order", placed.aggregate_id, "order-service", "t1")
    first = gateway.snapshot_store.load(key)
    assert gateway.status("order", "r-place", tenant_id="t1").stage is WaitStage.SNAPSHOT  # version 1 of 1
    gateway.snapshot_strategy = "none"  # the next command leaves the snapshot behind
    gateway.send(PayOrder(amount=Decimal("5.00"), payment_id="p-1"), aggregate_id=placed.aggregate_id,
                 tenant_id="t1", request_id="r-pay", wait="PROCESSED")
    assert gateway.snapshot_store.load(key).version == first.version == 1
    paid = gateway.status("order", "r-pay", tenant_id="t1", aggregate_id=placed.aggregate_id)
    assert (paid.stage, paid.aggregate_version) == (WaitStage.PROCESSED, 2)


def test_an_outcome_with_an_error_keeps_its_stage_whatever_the_snapshot(gateway):
    placed = place(gateway)
    late = CommandResult(command_id="c-late", request_id="r-late", aggregate_name="order",
                         aggregate_id=placed.aggregate_id, tenant_id="t1", aggregate_version=1,
                         stage=WaitStage.PROCESSED, events=("order_placed",), error_code="RequestTimeout",
                         error_msg="appended, but SNAPSHOT did not finish within 1s")
    gateway._record_status(late)
    assert gateway.status("order", "r-late", tenant_id="t1") == late


@pytest.mark.parametrize("field", ["request_id", "tenant_id", "aggregate_id"])
def test_status_refuses_ids_that_are_no_ids(gateway, field):
    ids = {"request_id": "r-1", "tenant_id": "t1", "aggregate_id": "a-1", field: "x" * 200}
    with pytest.raises(CommandValidationError, match=field):
        gateway.status("order", ids.pop("request_id"), **ids)

