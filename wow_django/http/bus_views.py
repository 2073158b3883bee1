"""DRF endpoints of the bus. Thin: they parse, check permissions and call :class:`EventBus`.

Errors are ``{errorCode, errorMsg, bindingErrors}`` with 400 (bad input),
401 (not authenticated), 403 (not allowed), 404 (unknown event or trace),
409 (re-push refused), 503 (broker or store unavailable). The OpenAPI schema
describes every endpoint (:class:`~wow_django.http.schema.WowBusSchema`), and
each body and query parameter is held to it after the bus's own checks
(:mod:`wow_django.http.contract`).
"""

from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.response import Response

from wow_django.application.runtime import get_runtime
from wow_django.bus.context import bus_context
from wow_django.bus.envelope import build_envelope, check_consumer_id, check_topic
from wow_django.exceptions import EnvelopeValidationError
from wow_django.http import contract
from wow_django.http.base import WowView
from wow_django.http.bus_authentication import ConsumerTokenAuthentication
from wow_django.http.bus_permissions import CanManageConsumers, CanRepush, CanSendEvents, CanViewBus, IsConsumer
from wow_django.http.schema import WowBusSchema


class BusView(WowView):
    """Base of the bus endpoints: the project's authentication, JSON errors, the process's bus."""

    schema = WowBusSchema()

    def get_authenticate_header(self, request):
        # DRF asks only the first authenticator; session authentication has no
        # header, which would turn "not authenticated" into 403. Any scheme that
        # can answer a challenge makes it a 401.
        for authenticator in self.get_authenticators():
            header = authenticator.authenticate_header(request)
            if header:
                return header
        return None

    @property
    def bus(self):
        return get_runtime().bus

    @staticmethod
    def body(request) -> dict:
        if not isinstance(request.data, dict):
            raise EnvelopeValidationError.from_errors("request", [{"name": "(body)", "msg": "must be a JSON object"}])
        return request.data

    @staticmethod
    def int_param(request, name: str, default: int) -> int:
        """The query parameter ``name`` as written digits (as the schema's integer), or ``default`` without it."""
        raw = request.query_params.get(name)
        if raw is None:
            return default
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
            raise EnvelopeValidationError.from_errors("query", [{"name": name, "msg": "must be an integer"}])
        return int(raw)

    @staticmethod
    def conform(what: str, instance, component: str, name: str | None = None) -> None:
        """Refuse ``instance`` (a body, or the query parameter ``name``) unless it is what the schema's
        ``component`` says (after the bus's own checks)."""
        errors = contract.violations(instance, component)
        if errors:
            if name is not None:
                errors = [{"name": name, "msg": error["msg"]} for error in errors]
            raise EnvelopeValidationError.from_errors(what, errors)


def _user_name(request) -> str:
    user = request.user
    return user.get_username() if user and user.is_authenticated else ""


class EventListView(BusView):
    """``GET``: events filtered by status, topic, service (initiator.service), since/until, traceId; paged.
    ``POST``: send an event (wire-form envelope)."""

    def get_permissions(self):
        return [CanSendEvents()] if self.request.method == "POST" else [CanViewBus()]

    def get(self, request):
        """By page number (``page``, with ``total``), or by cursor (``cursor``: empty for the first page,
        then each answer's ``next``; no total): a deep page by cursor costs what the first does."""
        params = request.query_params
        for name, component in (("since", "WowBusTime"), ("until", "WowBusTime")):
            if params.get(name):
                self.conform("event query", params[name], component, name=name)
        filters = {"status": params.get("status") or None, "topic": params.get("topic") or None,
                   "service": params.get("service") or None, "since": params.get("since") or None,
                   "until": params.get("until") or None, "trace_id": params.get("traceId") or None,
                   "user_id": params.get("userId") or None, "client_request_id": params.get("clientRequestId") or None,
                   "key": params.get("key") or None}
        size = self.int_param(request, "size", 20)
        if "cursor" not in params and "before" not in params:
            return Response(self.bus.list_events(**filters, page=self.int_param(request, "page", 1), size=size))
        if "page" in params:
            raise EnvelopeValidationError.from_errors("event query", [
                {"name": "page", "msg": "page and cursor are two ways of paging: give one of them"}])
        page = self.bus.events_page(self.bus.query_of(**filters), cursor=params.get("cursor") or None,
                                    before=params.get("before") or None, size=size)
        return Response({"size": size, **page})

    def post(self, request):
        data = self.body(request)
        for name in ("contractVersion", "sequence"):  # 2.0 is the whole number 2, as the schema's integers count it
            if isinstance(data.get(name), float) and data[name].is_integer():
                data[name] = int(data[name])
        build_envelope(data, default_service=self.bus.service_name)  # the bus's own rules, their own words first
        self.conform("envelope", data, "WowEnvelope")
        with bus_context(user_id=_user_name(request) or None,
                         client_request_id=request.headers.get("X-Request-Id") or None):
            result = self.bus.send_envelope(data)
        code = status.HTTP_201_CREATED if result.stored and not result.duplicate else status.HTTP_200_OK
        return Response(result.to_json(), status=code)


class EventDetailView(BusView):
    permission_classes = [CanViewBus]

    def get(self, request, event_id: str):
        return Response(self.bus.event_detail(event_id))


class RepushView(BusView):
    """``POST {"consumerId": optional}``: re-push the whole event, or to one consumer's queue."""

    permission_classes = [CanRepush]

    def post(self, request, event_id: str):
        data = self.body(request)
        unknown = set(data) - {"consumerId"}
        if unknown:
            raise EnvelopeValidationError.from_errors(
                "re-push", [{"name": k, "msg": "unknown field: only consumerId is accepted"} for k in sorted(unknown)])
        self.conform("re-push", data, "WowRepush")
        consumer_id = data.get("consumerId") or None
        result = self.bus.repush(event_id, requested_by=_user_name(request), consumer_id=consumer_id)
        return Response(result.to_json())


class TraceView(BusView):
    permission_classes = [CanViewBus]

    def get(self, request, trace_id: str):
        return Response(self.bus.trace(trace_id))


class TopicConsumersView(BusView):
    """``GET``: the topic → consumer configuration (filter by topic, consumerId).
    ``POST {topic, consumerId, enabled, description}``: create or update one."""

    def get_permissions(self):
        return [CanManageConsumers()] if self.request.method == "POST" else [CanViewBus()]

    def get(self, request):
        params = request.query_params
        return Response({"list": self.bus.topic_consumers(topic=params.get("topic") or None,
                                                          consumer_id=params.get("consumerId") or None)})

    def post(self, request):
        data = self.body(request)
        unknown = set(data) - {"topic", "consumerId", "enabled", "description"}
        if unknown:
            raise EnvelopeValidationError.from_errors(
                "topic consumer", [{"name": k, "msg": "unknown field"} for k in sorted(unknown)])
        check_topic(data.get("topic"))
        check_consumer_id(data.get("consumerId"))
        self.conform("topic consumer", data, "WowTopicConsumerChange")
        saved = self.bus.set_topic_consumer(data.get("topic"), data.get("consumerId"),
                                            enabled=data.get("enabled", True), description=data.get("description"),
                                            updated_by=_user_name(request))
        return Response(saved)


class CallbackView(BusView):
    """``POST {eventId, success, error?}`` with ``Authorization: Bearer <consumer token>``.

    Records one feedback row for the token's consumer (a ``consumerId`` in the
    body must be that consumer) and queues the rollup.
    """

    permission_classes = [IsConsumer]

    def get_authenticators(self):
        return [ConsumerTokenAuthentication()]

    def post(self, request):
        data = self.body(request)
        errors = []
        unknown = set(data) - {"eventId", "consumerId", "success", "error"}
        errors.extend({"name": k, "msg": "unknown field"} for k in sorted(unknown))
        event_id = data.get("eventId")
        if not isinstance(event_id, str) or not event_id:
            errors.append({"name": "eventId", "msg": "is required"})
        success = data.get("success")
        if not isinstance(success, bool):
            errors.append({"name": "success", "msg": "is required: true or false"})
        error = data.get("error")
        if error is not None and not isinstance(error, str):
            errors.append({"name": "error", "msg": "must be a string"})
        if errors:
            raise EnvelopeValidationError.from_errors("feedback", errors)
        self.conform("feedback", data, "WowFeedback")
        consumer_id = request.user.consumer_id
        claimed = data.get("consumerId")
        if claimed not in (None, "", consumer_id):
            raise exceptions.PermissionDenied(
                f"This token belongs to consumer {consumer_id!r}; it cannot report for {claimed!r}.")
        row = self.bus.record_feedback(event_id, consumer_id, success, error, source="callback")
        return Response({"eventId": event_id, "consumerId": consumer_id, "attemptNo": row["attemptNo"],
                         "success": success}, status=status.HTTP_201_CREATED)
