"""The application entry: the runtime, and sending commands.

::

    from wow_django.application import WaitStage, get_runtime, send

    result = send(PlaceOrder(customer_id="c-1", amount=10), request_id="req-1", wait=WaitStage.PROJECTED)
    result.aggregate_id, result.aggregate_version

    get_runtime().gateway            # the CommandGateway (send_json, repository, …)
    get_runtime().snapshot_queries("order").paged(query, tenant_id="t-1")
"""

from wow_django.application.gateway import CommandGateway, CommandMessage, CommandResult, WaitFunction, WaitStage
from wow_django.application.ports import TaskQueue
from wow_django.application.repository import DomainEventMessage
from wow_django.application.runtime import Runtime, close_runtime, get_runtime


def send(command, **options) -> CommandResult:
    """Send ``command`` through the process's gateway (see :meth:`CommandGateway.send` for the options)."""
    return get_runtime().gateway.send(command, **options)


__all__ = [
    "CommandGateway", "CommandMessage", "CommandResult", "DomainEventMessage", "Runtime",
    "TaskQueue", "WaitFunction", "WaitStage", "close_runtime", "get_runtime", "send",
]
