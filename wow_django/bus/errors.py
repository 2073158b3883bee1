"""Errors of the integration-event bus. Each has an ``error_code`` and an HTTP status."""

from __future__ import annotations

from wow_django.exceptions import WowError


class BusError(WowError):
    """Base class of bus errors."""

    error_code = "BUS_ERROR"
    http_status = 500

    def __init__(self, message: str, binding_errors: list[dict] | None = None):
        self.binding_errors = list(binding_errors or [])
        super().__init__(message)


class EnvelopeValidationError(BusError):
    """An envelope (or a feedback) is invalid; ``binding_errors`` names each field and rule."""

    error_code = "BUS_VALIDATION"
    http_status = 400

    @classmethod
    def from_errors(cls, what: str, errors: list[dict]) -> EnvelopeValidationError:
        summary = "; ".join(f"{e['name']}: {e['msg']}" for e in errors)
        return cls(f"Invalid {what}: {summary}", errors)


class EventNotFound(BusError):
    error_code = "EVENT_NOT_FOUND"
    http_status = 404

    def __init__(self, event_id: str):
        self.event_id = event_id
        super().__init__(f"There is no bus event with eventId {event_id!r}.")


class TraceNotFound(BusError):
    error_code = "TRACE_NOT_FOUND"
    http_status = 404

    def __init__(self, trace_id: str):
        self.trace_id = trace_id
        super().__init__(f"There is no bus event with traceId {trace_id!r}.")


class ConsumerNotExpected(BusError):
    """The consumer is not one of the event's expected consumers (topic_consumers when it was sent)."""

    error_code = "CONSUMER_NOT_EXPECTED"
    http_status = 403

    def __init__(self, event_id: str, consumer_id: str):
        self.event_id = event_id
        self.consumer_id = consumer_id
        super().__init__(
            f"{consumer_id!r} is not an expected consumer of event {event_id!r}: it was not an enabled "
            "topic consumer of the event's topic when the event was sent."
        )


class RepushRefused(BusError):
    """A re-push is not allowed now (status, expiry, count, or the consumer already consumed)."""

    http_status = 409

    def __init__(self, code: str, message: str):
        self.error_code = code
        super().__init__(message)


class TransportUnavailable(BusError):
    """The message broker could not be reached or did not confirm a publish."""

    error_code = "BUS_TRANSPORT_UNAVAILABLE"
    http_status = 503
