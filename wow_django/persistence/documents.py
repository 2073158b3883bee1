"""Wow's document shape of event streams and snapshots.

What the MongoDB backend stores, and what every backend's queries and the
HTTP API present (``_id``, ``aggregateId``, ``body: [...]``, epoch-millisecond
times). Plain dicts; no pymongo.
"""

from __future__ import annotations

from wow_django.persistence.records import AggregateId, EventStream, Snapshot, stored_events, stored_stream


def stream_to_document(stream: EventStream) -> dict:
    agg = stream.aggregate_id
    return {
        "_id": stream.id,
        "contextName": agg.context_name,
        "aggregateName": agg.aggregate_name,
        "aggregateId": agg.id,
        "tenantId": agg.tenant_id,
        "ownerId": stream.owner_id,
        "requestId": stream.request_id,
        "commandId": stream.command_id,
        "version": stream.version,
        "header": dict(stream.header),
        "body": [
            {"id": e.id, "name": e.name, "revision": e.revision, "bodyType": e.body_type, "body": e.body}
            for e in stream.body
        ],
        "size": len(stream.body),
        "createTime": stream.create_time,
    }


def document_to_stream(doc: dict) -> EventStream:
    """The stream of a stored document (checked when it was appended: see :func:`stored_stream`)."""
    return stored_stream(
        doc["_id"],
        AggregateId(aggregate_name=doc["aggregateName"], id=doc["aggregateId"], context_name=doc["contextName"],
                    tenant_id=doc["tenantId"]),
        doc["version"], stored_events(doc["body"]), doc["requestId"], doc["commandId"], doc.get("ownerId"),
        doc.get("header"), doc["createTime"],
    )


def snapshot_to_document(snapshot: Snapshot) -> dict:
    agg = snapshot.aggregate_id
    return {
        "_id": agg.id,
        "contextName": agg.context_name,
        "aggregateName": agg.aggregate_name,
        "tenantId": agg.tenant_id,
        "ownerId": snapshot.owner_id,
        "version": snapshot.version,
        "eventId": snapshot.event_id,
        "firstOperator": snapshot.first_operator,
        "operator": snapshot.operator,
        "firstEventTime": snapshot.first_event_time,
        "eventTime": snapshot.event_time,
        "snapshotTime": snapshot.snapshot_time,
        "deleted": snapshot.deleted,
        "state": snapshot.state,
    }


def document_to_snapshot(doc: dict) -> Snapshot:
    return Snapshot(
        aggregate_id=AggregateId(
            aggregate_name=doc["aggregateName"], id=doc["_id"],
            context_name=doc["contextName"], tenant_id=doc["tenantId"],
        ),
        version=doc["version"],
        state=doc.get("state") or {},
        event_id=doc.get("eventId") or "",
        owner_id=doc.get("ownerId") or "",
        first_operator=doc.get("firstOperator") or "",
        operator=doc.get("operator") or "",
        first_event_time=doc.get("firstEventTime") or 0,
        event_time=doc.get("eventTime") or 0,
        snapshot_time=doc.get("snapshotTime") or 0,
        deleted=bool(doc.get("deleted", False)),
    )
