"""The sample's follower: every event stream of the order service, in commit order, from its checkpoint.

Run it with ``manage.py wow_follow order-activity``; ``manage.py wow_followers`` shows where it stands.
"""

from __future__ import annotations

import logging

from wow_django.application.followers import follower
from wow_django.persistence.followers import PositionedStream

logger = logging.getLogger(__name__)


@follower("order-activity", aggregates={"order", "customer"})
def order_activity(item: PositionedStream) -> None:
    """Log what happened to orders and customers (a stand-in for a read model or an outbound feed)."""
    stream = item.stream
    logger.info("%s: %s %s v%s: %s", item.position, stream.aggregate_name, stream.aggregate_id.id, stream.version,
                ", ".join(event.name for event in stream.body))
