"""The bus records as Django models of the ``wow_bus`` app: one table per collection of seed 004.

``wow_bus_event``, ``wow_bus_topic_consumer``, ``wow_bus_consumption``,
``wow_bus_inbox``, ``wow_bus_sequence`` and ``wow_bus_repush`` hold what the
Mongo store keeps in ``events``, ``topic_consumers``, ``event_consumptions``,
``consumer_inbox``, ``consumer_sequences`` and ``event_repushes``. Model fields
are named after the records' camelCase keys (the columns are snake_case), so
``F("statusRevision")`` reads as the record does.

A record is a dict with any keys, as a MongoDB document is. The tables of
records read back whole (events, consumptions, re-pushes) keep their known keys
in columns and the rest in ``extra`` (JSON); ``absent`` is a bit set of the
``RECORD_KEYS`` the record does not have, so a missing key and a ``None`` stay
apart (an event never written by the rollup has no ``statusRevision``; an
event out of a relay lease has no ``relayLeaseUntil``). Bit *i* is
``RECORD_KEYS[i]``: append new keys at the end, never reorder.

Indexes follow seed 004 §2.7 where a query of the store uses them in SQL;
the seed's ``event_consumptions`` index on ``eventId`` alone is the prefix of
the unique (eventId, consumerId, attemptNo) and is not repeated, nor is
``topic_consumers``' (topic, enabled): the unique (topic, consumerId) serves it.
The listing indexes of ``wow_bus_event`` are in the store's sort order, which
PostgreSQL only follows when told (a missing ``occurredAt`` sorts first, as in
MongoDB; ids in code-point order): migration 0002 creates them with the
database's own SQL, so they are not declared here.
"""

from __future__ import annotations

from django.db import models

APP_LABEL = "wow_bus"
ID_LENGTH = 255  # ids, topics, consumer ids and partition keys (the envelope allows ≤ 200 characters)
KEY_LENGTH = 300  # a search key: a name of ≤ 64 characters, '=', a value of ≤ 200


class RecordFields(models.Model):
    """What the tables of records read back whole share: the keys without a column, and the missing ones."""

    extra = models.JSONField(default=dict)
    absent = models.BigIntegerField(default=0)

    #: The record keys kept in columns; bit i of ``absent`` is set when the record has no ``RECORD_KEYS[i]``.
    RECORD_KEYS: tuple[str, ...] = ()

    class Meta:
        abstract = True


class EventRecord(RecordFields):
    """``events``: an envelope with its delivery status."""

    id = models.BigAutoField(primary_key=True)
    eventId = models.CharField(max_length=ID_LENGTH, db_column="event_id")
    traceId = models.CharField(max_length=ID_LENGTH, null=True, db_column="trace_id")
    spanId = models.CharField(max_length=ID_LENGTH, null=True, db_column="span_id")
    parentEventId = models.CharField(max_length=ID_LENGTH, null=True, db_column="parent_event_id")
    topic = models.CharField(max_length=ID_LENGTH, null=True, db_column="topic")
    payload = models.JSONField(null=True, db_column="payload")
    payloadType = models.CharField(max_length=ID_LENGTH, null=True, db_column="payload_type")
    initiator = models.JSONField(null=True, db_column="initiator")
    # initiator.service, copied on insert (the initiator never changes): what the listing filters on.
    initiatorService = models.CharField(max_length=ID_LENGTH, null=True, db_column="initiator_service")
    # initiator.userId and .clientRequestId, copied the same way: what an operator searches by.
    initiatorUserId = models.CharField(max_length=ID_LENGTH, null=True, db_column="initiator_user_id")
    initiatorRequestId = models.CharField(max_length=ID_LENGTH, null=True, db_column="initiator_request_id")
    occurredAt = models.DateTimeField(null=True, db_column="occurred_at")
    sentAt = models.DateTimeField(null=True, db_column="sent_at")
    contractVersion = models.BigIntegerField(null=True, db_column="contract_version")
    partitionKey = models.CharField(max_length=ID_LENGTH, null=True, db_column="partition_key")
    sequence = models.BigIntegerField(null=True, db_column="sequence")
    expireAt = models.DateTimeField(null=True, db_column="expire_at")
    status = models.CharField(max_length=32, null=True, db_column="status")
    statusAt = models.DateTimeField(null=True, db_column="status_at")
    statusRevision = models.BigIntegerField(null=True, db_column="status_revision")
    retryCount = models.BigIntegerField(null=True, db_column="retry_count")
    lastSentAt = models.DateTimeField(null=True, db_column="last_sent_at")
    lastError = models.TextField(null=True, db_column="last_error")
    consumers = models.JSONField(null=True, db_column="consumers")
    createdAt = models.DateTimeField(null=True, db_column="created_at")
    relayLeaseUntil = models.DateTimeField(null=True, db_column="relay_lease_until")

    RECORD_KEYS = (
        "eventId", "traceId", "spanId", "parentEventId", "topic", "payload", "payloadType", "initiator",
        "occurredAt", "sentAt", "contractVersion", "partitionKey", "sequence", "expireAt", "status", "statusAt",
        "statusRevision", "retryCount", "lastSentAt", "lastError", "consumers", "createdAt", "relayLeaseUntil",
    )

    class Meta:
        app_label = APP_LABEL
        db_table = "wow_bus_event"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["eventId"], name="wow_bus_event_id_uniq")]
        # The listing indexes (by status, topic, initiator.service, traceId, parentEventId, and none,
        # each then by occurredAt and eventId) are made by migration 0002 in SQL of the database.
        indexes = [models.Index(fields=["status", "statusAt"], name="wow_bus_event_status_at"),  # relay, purge
                   models.Index(fields=["expireAt"], name="wow_bus_event_expire_at")]  # the purge

    def __str__(self) -> str:
        return f"bus event {self.eventId}"


class EventKeyRecord(models.Model):
    """An event's search keys (``searchKeys``: ``name=value`` texts), one row each, written with the event and
    deleted with it: what the listing's ``keys`` filter finds it by (MongoDB: a multikey index)."""

    id = models.BigAutoField(primary_key=True)
    eventId = models.CharField(max_length=ID_LENGTH, db_column="event_id")
    key = models.CharField(max_length=KEY_LENGTH, db_column="search_key")
    occurredAt = models.DateTimeField(null=True, db_column="occurred_at")

    class Meta:
        app_label = APP_LABEL
        db_table = "wow_bus_event_key"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["key", "eventId"], name="wow_bus_event_key_uniq")]
        indexes = [models.Index(fields=["key", "-occurredAt", "eventId"], name="wow_bus_event_key_listing"),
                   models.Index(fields=["eventId"], name="wow_bus_event_key_event")]  # the purge

    def __str__(self) -> str:
        return f"{self.key} of {self.eventId}"


class TopicConsumerRecord(models.Model):
    """``topic_consumers``: one record per (topic, consumerId)."""

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=ID_LENGTH, db_column="topic")
    consumerId = models.CharField(max_length=ID_LENGTH, db_column="consumer_id")
    enabled = models.BooleanField(db_column="enabled")
    description = models.TextField(db_column="description")
    createdAt = models.DateTimeField(db_column="created_at")
    updatedAt = models.DateTimeField(db_column="updated_at")
    updatedBy = models.CharField(max_length=ID_LENGTH, null=True, db_column="updated_by")

    RECORD_KEYS = ("topic", "consumerId", "enabled", "description", "createdAt", "updatedAt", "updatedBy")

    class Meta:
        app_label = APP_LABEL
        db_table = "wow_bus_topic_consumer"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["topic", "consumerId"], name="wow_bus_topic_consumer_uniq")]

    def __str__(self) -> str:
        return f"{self.consumerId} on {self.topic}"


class ConsumptionRecord(RecordFields):
    """``event_consumptions``: append-only feedback rows, unique per (eventId, consumerId, attemptNo)."""

    id = models.BigAutoField(primary_key=True)
    eventId = models.CharField(max_length=ID_LENGTH, db_column="event_id")
    consumerId = models.CharField(max_length=ID_LENGTH, db_column="consumer_id")
    attemptNo = models.BigIntegerField(db_column="attempt_no")
    success = models.BooleanField(null=True, db_column="success")
    consumedAt = models.DateTimeField(null=True, db_column="consumed_at")
    error = models.TextField(null=True, db_column="error")
    source = models.CharField(max_length=ID_LENGTH, null=True, db_column="source")
    createdAt = models.DateTimeField(null=True, db_column="created_at")

    RECORD_KEYS = ("eventId", "consumerId", "attemptNo", "success", "consumedAt", "error", "source", "createdAt")

    class Meta:
        app_label = APP_LABEL
        db_table = "wow_bus_consumption"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["eventId", "consumerId", "attemptNo"],
                                               name="wow_bus_attempt_uniq")]
        indexes = [models.Index(fields=["consumerId", "-consumedAt"], name="wow_bus_consumer_consumed")]

    def __str__(self) -> str:
        return f"{self.consumerId} on {self.eventId} #{self.attemptNo}"


class InboxEntry(models.Model):
    """``consumer_inbox``: one entry per (consumerId, eventId), so a consumer handles an event once."""

    id = models.BigAutoField(primary_key=True)
    consumerId = models.CharField(max_length=ID_LENGTH, db_column="consumer_id")
    eventId = models.CharField(max_length=ID_LENGTH, db_column="event_id")
    state = models.CharField(max_length=16, db_column="state")
    owner = models.CharField(max_length=ID_LENGTH, db_column="owner")
    leaseUntil = models.DateTimeField(null=True, db_column="lease_until")
    claimedAt = models.DateTimeField(null=True, db_column="claimed_at")
    doneAt = models.DateTimeField(null=True, db_column="done_at")

    class Meta:
        app_label = APP_LABEL
        db_table = "wow_bus_inbox"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["consumerId", "eventId"], name="wow_bus_inbox_uniq")]
        indexes = [models.Index(fields=["eventId"], name="wow_bus_inbox_event")]  # the purge

    def __str__(self) -> str:
        return f"{self.consumerId} inbox: {self.eventId} ({self.state})"


class SequenceRecord(models.Model):
    """``consumer_sequences``: the last applied sequence per (consumerId, partitionKey).

    A row is never deleted: a NULL ``sequence`` is "none stored", so that the
    conditional updates of the store always find the row they decide on.
    """

    id = models.BigAutoField(primary_key=True)
    consumerId = models.CharField(max_length=ID_LENGTH, db_column="consumer_id")
    partitionKey = models.CharField(max_length=ID_LENGTH, db_column="partition_key")
    sequence = models.BigIntegerField(null=True, db_column="sequence")
    updatedAt = models.DateTimeField(null=True, db_column="updated_at")

    class Meta:
        app_label = APP_LABEL
        db_table = "wow_bus_sequence"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["consumerId", "partitionKey"], name="wow_bus_sequence_uniq")]

    def __str__(self) -> str:
        return f"{self.consumerId} at {self.partitionKey}#{self.sequence}"


class RepushRecord(RecordFields):
    """``event_repushes``: who re-pushed what and when."""

    id = models.BigAutoField(primary_key=True)
    eventId = models.CharField(max_length=ID_LENGTH, db_column="event_id")
    requestedAt = models.DateTimeField(null=True, db_column="requested_at")
    consumerId = models.CharField(max_length=ID_LENGTH, null=True, db_column="consumer_id")
    requestedBy = models.CharField(max_length=ID_LENGTH, null=True, db_column="requested_by")
    retryCount = models.BigIntegerField(null=True, db_column="retry_count")
    previousStatus = models.CharField(max_length=32, null=True, db_column="previous_status")
    outcome = models.CharField(max_length=32, null=True, db_column="outcome")
    error = models.TextField(null=True, db_column="error")

    RECORD_KEYS = ("eventId", "requestedAt", "consumerId", "requestedBy", "retryCount", "previousStatus", "outcome",
                   "error")

    class Meta:
        app_label = APP_LABEL
        db_table = "wow_bus_repush"
        default_permissions = ()
        indexes = [models.Index(fields=["eventId", "-requestedAt"], name="wow_bus_repush_event_at")]

    def __str__(self) -> str:
        return f"re-push of {self.eventId} by {self.requestedBy}"
