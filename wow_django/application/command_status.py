"""What became of a command, looked up by its request id: the stage it reached and its error, if any.

A command sent with wait stage SENT is answered before it is processed; the
worker that processes it later may refuse it (a domain rule, a validation, a
version conflict). Its outcome is recorded here so that the client can ask::

    status = get_runtime().gateway.status("order", request_id, tenant_id="acme")
    status.stage, status.error_code        # WaitStage.PROCESSED, "OrderCancelled"

    GET api/order/request/{requestId}/status   (Command-Tenant-Id as for every read)

Where it lives: a PrepareKey store named ``wow_command_status`` (so every
backend keeps it, shared by every process: web workers record SENT, Celery
workers the outcome), one entry per aggregate type, tenant and request id,
kept ``COMMAND_STATUS_TTL_S`` (7 days by default). A command that stored events
is also found in the event store by its request id, whatever wait stage it
was sent with and however old it is. A request a business rule refused (a
``DomainError``), queued or not, is kept here too, with a digest of its
command and body: the gateway answers the same request with the same refusal
for ``COMMAND_STATUS_TTL_S`` and another body under its id with
``RequestIdReused``. Other refusals (validation, version conflicts) of a
synchronous request are not kept: the lookup does not know them (404).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from wow_django.persistence.contracts import PrepareKey

logger = logging.getLogger("wow_django.application.command_status")

STATUS_STORE_NAME = "wow_command_status"


def status_key(aggregate_name: str, tenant_id: str, request_id: str) -> str:
    # JSON: ids may hold any printable character, separators included; no two triples share a key.
    return json.dumps([aggregate_name, tenant_id, request_id], ensure_ascii=False, separators=(",", ":"))


class CommandStatusBook:
    """The recorded outcomes of queued commands (``CommandResult.to_json()`` dicts) on a PrepareKey store."""

    def __init__(self, store: PrepareKey, ttl: timedelta):
        self.store = store
        self.ttl = ttl

    def record(self, result: dict) -> None:
        """Record ``result`` (a command result as JSON) as the latest word on its request.

        A SENT record never replaces an outcome (a redelivered or re-sent message is not news).
        Failures to record are logged, not raised: the command itself stands.
        """
        key = status_key(result["aggregateName"], result["tenantId"], result["requestId"])
        try:
            for _ in range(3):
                if self.store.prepare(key, result, self.ttl):
                    return
                current = self.store.get(key)
                if current is None:
                    continue  # expired in between: prepare again
                if result.get("stage") == "SENT" and current.value.get("stage") != "SENT":
                    return
                if self.store.reprepare(key, result, old_value=current.value, ttl=self.ttl):
                    return
            logger.warning("the status of request %s changed under three attempts to record it",
                           result["requestId"])
        except Exception:  # noqa: BLE001 - the command's own outcome must not depend on this record
            logger.exception("could not record the status of request %s", result["requestId"])

    def get(self, aggregate_name: str, tenant_id: str, request_id: str) -> dict | None:
        found = self.store.get(status_key(aggregate_name, tenant_id, request_id))
        return dict(found.value) if found is not None else None
