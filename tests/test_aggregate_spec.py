"""wow_django.testing.AggregateSpec: given events, when a command, expect events or an error and the state —
the sample's order and customer rules told that way, and the spec's own failures."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sample_project.orders.aggregates import (
    CancelOrder,
    Customer,
    CustomerRegistered,
    Order,
    OrderCancelled,
    OrderLine,
    OrderPaid,
    OrderPlaced,
    PayOrder,
    PlaceOrder,
    RegisterCustomer,
    ShipOrder,
)
from wow_django.domain import DeleteAggregate
from wow_django.exceptions import AggregateNotFound, DomainError
from wow_django.testing import AggregateSpec

LINE = OrderLine(sku="A-1", quantity=2, unit_price=Decimal("3.50"))
PLACED = OrderPlaced(customer_id="c-1", items=[LINE], total_amount=Decimal("7.00"), currency="CNY")
PAID = OrderPaid(amount=Decimal("7.00"), payment_id="p-1")


def test_placing_an_order():
    spec = (AggregateSpec(Order)
            .when(PlaceOrder(customer_id="c-1", items=[LINE]))
            .expect_events(OrderPlaced)
            .expect_state(status="PLACED", total_amount=Decimal("7.00")))
    assert spec.events == [PLACED] and spec.loaded().version == 1


def test_paying_the_total_pays_the_order():
    (AggregateSpec(Order)
     .given(PLACED)
     .when(PayOrder(amount=Decimal("7.00"), payment_id="p-1"))
     .expect_events(PAID)
     .expect_state(lambda state: state.paid_amount == Decimal("7.00"), status="PAID"))


@pytest.mark.parametrize("history, command, code", [
    ((PLACED, PAID), PayOrder(amount=Decimal("7.00"), payment_id="p-2"), "ORDER_ALREADY_PAID"),
    ((PLACED,), PayOrder(amount=Decimal("6.99"), payment_id="p-1"), "AMOUNT_MISMATCH"),
    ((PLACED,), ShipOrder(tracking_number="T-1"), "ORDER_NOT_PAID"),
    ((PLACED, OrderCancelled(reason="x")), CancelOrder(reason="again"), "ORDER_ALREADY_CANCELLED"),
])
def test_the_rules_refuse_with_their_codes_and_append_nothing(history, command, code):
    spec = AggregateSpec(Order).given(*history).when(command).expect_error(DomainError, code=code)
    assert spec.events == [] and spec.loaded().version == 1  # one given() call: one stream


def test_each_given_call_is_a_stream_and_the_gateways_own_rules_apply():
    spec = AggregateSpec(Order).given(PLACED).given(PAID).when(DeleteAggregate())
    assert spec.loaded().deleted and spec.loaded().version == 3 and spec.result.aggregate_version == 3
    (AggregateSpec(Order).given(PLACED).given(PAID).when(CancelOrder(reason="late"))
     .expect_events(OrderCancelled(reason="late")).expect_state(status="CANCELLED"))
    AggregateSpec(Order).when(PayOrder(amount=Decimal("1"), payment_id="p")).expect_error(AggregateNotFound)
    (AggregateSpec(Order).given(PLACED).when(PlaceOrder(customer_id="c-1", items=[LINE]))
     .expect_error(code="DuplicateAggregateId"))


def test_a_customer_registers_with_a_reserved_username():
    (AggregateSpec(Customer)
     .when(RegisterCustomer(username="ann", display_name="Ann"))
     .expect_events(CustomerRegistered(username="ann", display_name="Ann"))
     .expect_state(display_name="Ann"))


def test_the_spec_says_what_it_expected():
    spec = AggregateSpec(Order).given(PLACED).when(PayOrder(amount=Decimal("7.00"), payment_id="p-1"))
    with pytest.raises(AssertionError, match=r"expected events \['OrderPlaced'\]"):
        spec.expect_events(OrderPlaced)
    with pytest.raises(AssertionError, match="state fields differ"):
        spec.expect_state(status="SHIPPED")
    with pytest.raises(AssertionError, match="expected DomainError, but the command appended"):
        spec.expect_error(DomainError)
    refused = AggregateSpec(Order).given(PLACED).when(ShipOrder(tracking_number="T-1"))
    with pytest.raises(AssertionError, match="the command was refused"):
        refused.expect_events(OrderPaid)
    with pytest.raises(AssertionError, match="expected error code 'ORDER_CANCELLED'"):
        refused.expect_error(DomainError, code="ORDER_CANCELLED")
    with pytest.raises(RuntimeError, match="call when\\(\\) first"):
        AggregateSpec(Order).expect_state(status="NEW")
    with pytest.raises(RuntimeError, match="one when\\(\\) per spec"):
        spec.when(CancelOrder(reason="x"))
    with pytest.raises(TypeError):
        AggregateSpec(PLACED)

