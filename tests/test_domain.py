"""The modeling API: names, revisions, upcasters, validation, declaration errors."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sample_project.orders.aggregates import Order, OrderPlaced, OrderState, PayOrder, PlaceOrder
from wow_django.domain import Aggregate, Command, Event, State, creates, handles, sourcing, upcaster
from wow_django.domain.aggregate import aggregate_for_command, aggregate_type
from wow_django.domain.ids import generate_id
from wow_django.domain.messages import command_type, event_type
from wow_django.exceptions import CommandValidationError, DeclarationError
from wow_django.testing import isolated_registry


def test_names_are_stable_and_registered():
    assert PlaceOrder.command_name == "place_order"
    assert command_type("place_order") is PlaceOrder
    assert OrderPlaced.event_name == "order_placed" and OrderPlaced.revision == 1
    assert event_type("order_placed") is OrderPlaced
    assert aggregate_type("order") is Order
    assert aggregate_for_command("pay_order") is Order
    assert Order.handlers["place_order"].create and not Order.handlers["pay_order"].create


def test_default_name_is_snake_case_of_the_class():
    class ArchiveTheThing(Command):
        pass

    assert ArchiveTheThing.command_name == "archive_the_thing"


def test_two_commands_with_one_name_is_an_error_naming_both():
    with pytest.raises(DeclarationError) as caught:
        class Impostor(Command, name="place_order"):
            pass
    message = str(caught.value)
    assert "sample_project.orders.aggregates.PlaceOrder" in message
    assert "test_domain" in message and "Impostor" in message


def test_two_events_with_one_name_is_an_error():
    with pytest.raises(DeclarationError, match="Two events are named 'order_paid'"):
        class OtherPaid(Event, name="order_paid"):
            pass


def test_two_aggregates_with_one_name_is_an_error_naming_both():
    class ThingCreated(Event, name="dup_thing_created"):
        pass

    class CreateThing(Command, name="dup_create_thing"):
        pass

    with pytest.raises(DeclarationError) as caught:
        class OtherOrder(Aggregate, name="order", state=OrderState):
            @creates(CreateThing)
            def create(self, command):
                return ThingCreated()
    assert "sample_project.orders.aggregates.Order" in str(caught.value)
    assert "OtherOrder" in str(caught.value)


def test_a_command_handled_by_two_aggregates_is_an_error():
    class Made(Event, name="twice_made"):
        pass

    with pytest.raises(DeclarationError, match="'pay_order' is handled by two aggregates"):
        class Rival(Aggregate, name="rival", state=State):
            @creates(PayOrder)
            def make(self, command):
                return Made()


def test_aggregate_declaration_errors():
    class Go(Command, name="decl_go"):
        pass

    with pytest.raises(DeclarationError, match="name='...', state=..."):
        class NoName(Aggregate):
            pass
    with pytest.raises(DeclarationError, match="no @creates handler"):
        class NoCreate(Aggregate, name="no_create", state=State):
            @handles(Go)
            def go(self, command):
                raise AssertionError
    with pytest.raises(DeclarationError, match=r"must take \(self, command\)"):
        class BadSignature(Aggregate, name="bad_signature", state=State):
            @creates(Go)
            def go(self):
                raise AssertionError


def test_command_validation_names_each_field_and_rule():
    with pytest.raises(CommandValidationError) as caught:
        PlaceOrder.from_json({"customer_id": "", "items": [{"sku": "bad sku", "quantity": 0, "unit_price": "1"}],
                              "coupon": "X"})
    errors = {e["name"]: e["msg"] for e in caught.value.binding_errors}
    assert set(errors) == {"customer_id", "items.0.sku", "items.0.quantity", "coupon"}
    assert "at least 1 character" in errors["customer_id"]
    assert "greater than or equal to 1" in errors["items.0.quantity"]
    assert errors["coupon"] == "unknown field: not part of this command"
    with pytest.raises(CommandValidationError, match="must be a JSON object"):
        PlaceOrder.from_json(["not", "an", "object"])


def test_upcasters_bring_old_revisions_up_to_date():
    class PriceSet(Event, name="price_set", revision=3):
        amount: Decimal
        currency: str

    @upcaster(PriceSet, from_revision=1)
    def _rename(body):
        return {"amount": body["price"]}

    @upcaster(PriceSet, from_revision=2)
    def _currency(body):
        return {**body, "currency": "CNY"}

    assert PriceSet.from_stored("1", {"price": "2.50"}) == PriceSet(amount=Decimal("2.50"), currency="CNY")
    assert PriceSet.from_stored("2", {"amount": "3"}) == PriceSet(amount=Decimal("3"), currency="CNY")
    assert PriceSet.from_stored("3", {"amount": "4", "currency": "EUR"}).currency == "EUR"
    with pytest.raises(ValueError, match="newer than this code's 3"):
        PriceSet.from_stored("4", {})
    with pytest.raises(DeclarationError, match="from_revision must be between 1 and 2"):
        upcaster(PriceSet, from_revision=3)(lambda b: b)


def test_missing_upcaster_is_a_clear_error():
    class Renamed(Event, name="renamed_thing", revision=2):
        title: str

    with pytest.raises(ValueError, match=r"no upcaster from revision 1 to 2; declare one with @upcaster"):
        Renamed.from_stored("1", {"name": "x"})


def test_state_applies_events_through_sourcing_handlers():
    state = OrderState()
    state.apply(OrderPlaced(customer_id="c", items=[], total_amount=Decimal("5"), currency="CNY"))
    assert state.status == "PLACED" and state.total_amount == Decimal("5")


def test_sourcing_handlers_are_inherited_and_unknown_events_ignored():
    class Bumped(Event, name="inherit_bumped"):
        pass

    class Other(Event, name="inherit_other"):
        pass

    class Base(State):
        count: int = 0

        @sourcing(Bumped)
        def _bump(self, event):
            self.count += 1

    class Child(Base):
        pass

    child = Child()
    child.apply(Bumped())
    child.apply(Other())
    assert child.count == 1


def test_generated_ids_are_unique_and_sortable():
    ids = [generate_id() for _ in range(5000)]
    assert len(set(ids)) == 5000
    assert ids == sorted(ids)
    assert all(len(i) == 32 for i in ids)


def test_an_isolated_registry_forgets_what_was_declared_in_it():
    def declare(tag: str):
        class Ping(Command, name="iso_ping"):
            pass

        class Ponged(Event, name="iso_ponged"):
            pass

        class Pinger(Aggregate, name="pinger", state=State):
            @creates(Ping)
            def ping(self, command):
                return Ponged()

        Pinger.tag = tag
        return Pinger

    with isolated_registry():
        first = declare("first")
        assert aggregate_type("pinger") is first and aggregate_for_command("iso_ping") is first
        assert aggregate_type("order") is Order  # what was declared before stays visible inside
    assert aggregate_type("pinger") is None and aggregate_for_command("iso_ping") is None
    assert command_type("iso_ping") is None and event_type("iso_ponged") is None
    with isolated_registry():  # the same names again: no "two aggregates are named" error
        second = declare("second")
        assert aggregate_type("pinger") is second and second is not first
    assert aggregate_type("pinger") is None


def test_isolated_registry_swaps_the_current_registry_and_restores_it():
    from wow_django.domain import registry

    before = registry.current()
    with isolated_registry() as (inner, _):
        assert registry.current() is inner and inner is not before
    assert registry.current() is before
