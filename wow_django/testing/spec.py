"""Given/when/expect tests of one aggregate, in the spirit of Wow's aggregate spec.

::

    from wow_django.testing import AggregateSpec

    def test_a_paid_order_cannot_be_cancelled():
        (AggregateSpec(Order)
            .given(OrderPlaced(customer_id="c-1", items=[...], total=Decimal("7.00")), OrderPaid(...))
            .when(CancelOrder(reason="too late"))
            .expect_error(DomainError, code="ORDER_ALREADY_PAID"))

    def test_paying_an_order():
        result = (AggregateSpec(Order)
                  .given(OrderPlaced(...))
                  .when(PayOrder(amount=Decimal("7.00"), payment_id="p-1"))
                  .expect_events(OrderPaid)
                  .expect_state(status="PAID"))
        assert result.state.paid_amount == Decimal("7.00")

The command goes through a real :class:`~wow_django.application.gateway.CommandGateway`
on in-memory stores of its own (nothing touches the project's stores or
settings): validation, the handler, prepared keys, deletion and recovery
behave as in production. The given events are stored first as one stream per
``given`` call; ``when`` sends one command; the ``expect_*`` methods assert
and return the spec, so they chain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from wow_django.application.gateway import CommandGateway, CommandResult
from wow_django.application.repository import decode_event, encode_events
from wow_django.backends.memory.stores import InMemoryEventStore, InMemoryPrepareKey, InMemorySnapshotStore
from wow_django.domain.aggregate import Aggregate
from wow_django.domain.ids import generate_id
from wow_django.domain.messages import Command, Event
from wow_django.exceptions import WowError
from wow_django.persistence.records import DEFAULT_TENANT_ID, AggregateId, EventStream, now_ms

SPEC_CONTEXT = "aggregate-spec"


class AggregateSpec:
    """One aggregate instance of ``aggregate``: its history (``given``), a command (``when``), what came of it."""

    def __init__(self, aggregate: type[Aggregate], aggregate_id: str | None = None, *,
                 tenant_id: str = DEFAULT_TENANT_ID, owner_id: str = "owner"):
        if not (isinstance(aggregate, type) and issubclass(aggregate, Aggregate)):
            raise TypeError(f"AggregateSpec takes an Aggregate class, got {aggregate!r}")
        self.aggregate = aggregate
        self.aggregate_id = aggregate_id or generate_id()
        self.tenant_id = tenant_id
        self.owner_id = owner_id
        self.event_store = InMemoryEventStore()
        prepared: dict[str, InMemoryPrepareKey] = {}
        self.gateway = CommandGateway(
            self.event_store, InMemorySnapshotStore(), context_name=SPEC_CONTEXT,
            prepare_keys=lambda name: prepared.setdefault(name, InMemoryPrepareKey(name)),
            retry_limit=0, storage_timeout_s=None,
        )
        self.version = 0
        self.result: CommandResult | None = None
        self.error: BaseException | None = None
        self._sent = False

    # --- given / when ---------------------------------------------------------------------------

    def given(self, *events: Event) -> AggregateSpec:
        """Store ``events`` as the aggregate's next stream (call again for more streams)."""
        if self._sent:
            raise RuntimeError("given() comes before when()")
        if not events:
            return self
        for event in events:
            if not isinstance(event, Event):
                raise TypeError(f"given() takes Event instances, got {type(event).__name__}")
        self.version += 1
        self.event_store.append(EventStream(
            id=generate_id(), aggregate_id=self._key(), version=self.version, body=encode_events(list(events)),
            request_id=generate_id(), command_id=generate_id(), owner_id=self.owner_id,
            header={"command_operator": "given", "command": "given"}, create_time=now_ms(),
        ))
        return self

    def when(self, command: Command, **send: Any) -> AggregateSpec:
        """Send ``command`` to this aggregate (``send`` takes :meth:`CommandGateway.send`'s keywords, e.g.
        ``request_id``, ``operator``). An error is kept for :meth:`expect_error`, not raised."""
        if self._sent:
            raise RuntimeError("one when() per spec: start a new AggregateSpec for another command")
        self._sent = True
        try:
            self.result = self.gateway.send(command, aggregate=self.aggregate, aggregate_id=self.aggregate_id,
                                            tenant_id=self.tenant_id, owner_id=self.owner_id, **send)
        except WowError as exc:
            self.error = exc
        else:
            self.aggregate_id = self.result.aggregate_id
        finally:
            self.gateway.close()
        return self

    # --- what came of it --------------------------------------------------------------------------

    @property
    def events(self) -> list[Event]:
        """The events the command appended (empty when it was refused)."""
        self._require_sent()
        if self.result is None or self.result.aggregate_version is None:
            return []
        [stream] = self.event_store.load(self._key(), self.result.aggregate_version, self.result.aggregate_version)
        return [decode_event(record) for record in stream.body]

    @property
    def state(self) -> Any:
        """The aggregate's state after the command (after the given events when it was refused)."""
        return self.loaded().state

    def loaded(self) -> Aggregate:
        """The aggregate as the repository loads it now (version, deleted, owner, state)."""
        self._require_sent()
        aggregate = self.gateway.repository.load(self.aggregate, self.aggregate_id, tenant_id=self.tenant_id,
                                                 use_snapshot=False)
        if aggregate is None:
            raise AssertionError(f"{self.aggregate.aggregate_name} {self.aggregate_id!r} has no events")
        return aggregate

    def expect_events(self, *expected: Event | type[Event]) -> AggregateSpec:
        """The command appended exactly these events, in order: each an instance (compared whole) or a class."""
        self._require_success()
        got = self.events
        if len(got) != len(expected) or not all(
                type(event) is item if isinstance(item, type) else event == item for event, item in zip(got, expected, strict=True)):
            raise AssertionError(f"expected events {[_name(e) for e in expected]}, got {[repr(e) for e in got]}")
        return self

    def expect_no_events(self) -> AggregateSpec:
        """The command was accepted and appended nothing new (e.g. a repeated request)."""
        self._require_sent()
        if self.error is not None:
            raise AssertionError(f"expected no events and no error, got {self.error!r}")
        if self.result is not None and not self.result.duplicate:
            raise AssertionError(f"expected no events, got {[repr(e) for e in self.events]}")
        return self

    def expect_state(self, check: Callable[[Any], Any] | None = None, **fields: Any) -> AggregateSpec:
        """The state after the command: ``field=value`` pairs compared with ``==``, and/or ``check(state)``
        returning something truthy (or asserting itself)."""
        self._require_sent()
        state = self.state
        wrong = {name: getattr(state, name, "<missing>") for name, value in fields.items()
                 if getattr(state, name, object()) != value}
        if wrong:
            raise AssertionError(f"state fields differ: expected {fields}, got {wrong}")
        if check is not None and check(state) is False:
            raise AssertionError(f"state check {getattr(check, '__name__', check)!r} failed for {state!r}")
        return self

    def expect_error(self, error: type[BaseException] = WowError, *, code: str | None = None,
                     match: str | None = None) -> AggregateSpec:
        """The command was refused with ``error`` (its ``error_code`` equal to ``code``, its message
        containing ``match``), and nothing was appended."""
        self._require_sent()
        if self.error is None:
            raise AssertionError(f"expected {error.__name__}, but the command appended "
                                 f"{[repr(e) for e in self.events]}")
        if not isinstance(self.error, error):
            raise AssertionError(f"expected {error.__name__}, got {self.error!r}")
        if code is not None and getattr(self.error, "error_code", None) != code:
            raise AssertionError(f"expected error code {code!r}, got {getattr(self.error, 'error_code', None)!r}")
        if match is not None and match not in str(self.error):
            raise AssertionError(f"expected {match!r} in the error message, got {str(self.error)!r}")
        stored = self.event_store.last(self._key())
        if (stored.version if stored is not None else 0) != self.version:
            raise AssertionError("the refused command appended events")
        return self

    # --- helpers ----------------------------------------------------------------------------------

    def _key(self) -> AggregateId:
        return AggregateId(self.aggregate.aggregate_name, self.aggregate_id, SPEC_CONTEXT, self.tenant_id)

    def _require_sent(self) -> None:
        if not self._sent:
            raise RuntimeError("call when() first")

    def _require_success(self) -> None:
        self._require_sent()
        if self.error is not None:
            raise AssertionError(f"the command was refused: {self.error!r}")


def _name(item: Event | type[Event] | Iterable) -> str:
    return item.__name__ if isinstance(item, type) else repr(item)
