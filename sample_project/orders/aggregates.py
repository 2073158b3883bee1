"""The sample order service: orders and customers.

Found by wow_django's autodiscovery because this module is called
``aggregates`` in an installed app.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StringConstraints, WithJsonSchema

from wow_django.domain import (
    Aggregate,
    Command,
    CommandContext,
    DomainError,
    Event,
    State,
    creates,
    declare_prepare_key,
    handles,
    sourcing,
)

Money = Annotated[Decimal, Field(ge=0, max_digits=12, decimal_places=2)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class OrderLine(BaseModel):
    sku: Annotated[str, StringConstraints(pattern=r"^[A-Z0-9-]{1,32}$")]
    quantity: Annotated[int, Field(ge=1, le=1000)]
    unit_price: Money


# --- commands ------------------------------------------------------------------


class PlaceOrder(Command, name="place_order"):
    customer_id: Text
    items: Annotated[list[OrderLine], Field(min_length=1, max_length=100)]
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "CNY"


class PayOrder(Command, name="pay_order"):
    amount: Annotated[Decimal, Field(gt=0, max_digits=12, decimal_places=2)]
    payment_id: Text


class ShipOrder(Command, name="ship_order"):
    tracking_number: Text


class CancelOrder(Command, name="cancel_order"):
    reason: Text


# --- events ----------------------------------------------------------------------


class OrderPlaced(Event, name="order_placed"):
    customer_id: str
    items: list[OrderLine]
    total_amount: Decimal
    currency: str


class OrderPaid(Event, name="order_paid"):
    amount: Decimal
    payment_id: str


class OrderShipped(Event, name="order_shipped"):
    tracking_number: str


class OrderCancelled(Event, name="order_cancelled"):
    reason: str


# --- state and aggregate -----------------------------------------------------------


class OrderState(State):
    status: str = "NEW"
    customer_id: str = ""
    items: list[OrderLine] = []
    total_amount: Decimal = Decimal("0")
    paid_amount: Decimal = Decimal("0")
    currency: str = ""
    payment_id: str = ""
    tracking_number: str = ""
    cancel_reason: str = ""

    @sourcing(OrderPlaced)
    def _placed(self, event: OrderPlaced) -> None:
        self.status = "PLACED"
        self.customer_id = event.customer_id
        self.items = list(event.items)
        self.total_amount = event.total_amount
        self.currency = event.currency

    @sourcing(OrderPaid)
    def _paid(self, event: OrderPaid) -> None:
        self.status = "PAID"
        self.paid_amount = event.amount
        self.payment_id = event.payment_id

    @sourcing(OrderShipped)
    def _shipped(self, event: OrderShipped) -> None:
        self.status = "SHIPPED"
        self.tracking_number = event.tracking_number

    @sourcing(OrderCancelled)
    def _cancelled(self, event: OrderCancelled) -> None:
        self.status = "CANCELLED"
        self.cancel_reason = event.reason


class Order(Aggregate, name="order", state=OrderState):
    @creates(PlaceOrder)
    def place(self, command: PlaceOrder) -> OrderPlaced:
        total = sum((line.unit_price * line.quantity for line in command.items), Decimal("0"))
        return OrderPlaced(customer_id=command.customer_id, items=command.items,
                           total_amount=total.quantize(Decimal("0.01")), currency=command.currency)

    def _refuse_when_closed(self, action: str) -> None:
        if self.state.status == "CANCELLED":
            raise DomainError("ORDER_CANCELLED", f"Order {self.id} is cancelled and cannot be {action}.")

    @handles(PayOrder)
    def pay(self, command: PayOrder) -> OrderPaid:
        self._refuse_when_closed("paid")
        if self.state.status != "PLACED":
            raise DomainError("ORDER_ALREADY_PAID", f"Order {self.id} is already {self.state.status.lower()}.")
        if command.amount != self.state.total_amount:
            raise DomainError(
                "AMOUNT_MISMATCH",
                f"Order {self.id} totals {self.state.total_amount} {self.state.currency}; "
                f"a payment of {command.amount} does not match.",
            )
        return OrderPaid(amount=command.amount, payment_id=command.payment_id)

    @handles(ShipOrder)
    def ship(self, command: ShipOrder) -> OrderShipped:
        self._refuse_when_closed("shipped")
        if self.state.status == "SHIPPED":
            raise DomainError("ORDER_ALREADY_SHIPPED", f"Order {self.id} has already shipped.")
        if self.state.status != "PAID":
            raise DomainError("ORDER_NOT_PAID", f"Order {self.id} must be paid before it ships.")
        return OrderShipped(tracking_number=command.tracking_number)

    @handles(CancelOrder)
    def cancel(self, command: CancelOrder) -> OrderCancelled:
        if self.state.status == "CANCELLED":
            raise DomainError("ORDER_ALREADY_CANCELLED", f"Order {self.id} is already cancelled.")
        if self.state.status == "SHIPPED":
            raise DomainError("ORDER_ALREADY_SHIPPED", f"Order {self.id} has shipped and cannot be cancelled.")
        return OrderCancelled(reason=command.reason)


# --- customers: a unique username through PrepareKey -----------------------------------

USERNAMES = declare_prepare_key("username")


def username_key(tenant_id: str, username: str) -> str:
    """The PrepareKey key of ``username`` in ``tenant_id``: a username is unique within its tenant only, so a
    user of one tenant never learns which names another tenant's customers have. A username holds no ':',
    so the key names one (tenant, username) pair even when the tenant id holds one."""
    return f"{tenant_id}:{username}"

_USERNAME = re.compile(r"^[a-z][a-z0-9_.-]{2,31}$")


def _check_username(value: str) -> str:
    value = value.strip().lower()
    if not _USERNAME.match(value):
        raise ValueError("must be 3-32 characters: a letter, then letters, digits, '_', '.' or '-'")
    return value


# The rule as JSON Schema says it, for the OpenAPI document (and the API holds requests to it): pydantic cannot
# see into the validator. Spaces around it are dropped and letters lowercased, as the validator does.
Username = Annotated[str, AfterValidator(_check_username), WithJsonSchema({
    "type": "string", "pattern": "^ *[A-Za-z][A-Za-z0-9_.-]{2,31} *$",
    "description": "3-32 characters: a letter, then letters, digits, '_', '.' or '-' (stored in lower case).",
})]


class RegisterCustomer(Command, name="register_customer"):
    username: Username
    display_name: Text


class ChangeDisplayName(Command, name="change_display_name"):
    display_name: Text


class CustomerRegistered(Event, name="customer_registered"):
    username: str
    display_name: str


class DisplayNameChanged(Event, name="display_name_changed"):
    display_name: str


class CustomerState(State):
    username: str = ""
    display_name: str = ""

    @sourcing(CustomerRegistered)
    def _registered(self, event: CustomerRegistered) -> None:
        self.username = event.username
        self.display_name = event.display_name

    @sourcing(DisplayNameChanged)
    def _renamed(self, event: DisplayNameChanged) -> None:
        self.display_name = event.display_name


class Customer(Aggregate, name="customer", state=CustomerState):
    @creates(RegisterCustomer)
    def register(self, command: RegisterCustomer, ctx: CommandContext) -> CustomerRegistered:
        # Reserved for this customer; released again if the append fails.
        if not ctx.prepare(USERNAMES, username_key(self.tenant_id, command.username), self.id):
            raise DomainError("USERNAME_TAKEN", f"The username {command.username!r} is taken.")
        return CustomerRegistered(username=command.username, display_name=command.display_name)

    @handles(ChangeDisplayName)
    def change_display_name(self, command: ChangeDisplayName) -> DisplayNameChanged:
        if command.display_name == self.state.display_name:
            raise DomainError("NOTHING_CHANGED", "That is already the display name.")
        return DisplayNameChanged(display_name=command.display_name)
