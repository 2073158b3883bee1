"""Schema initialisation for everything this process declared (DESIGN part E)."""

from __future__ import annotations

from wow_django import registry
from wow_django.conf import wow_settings
from wow_django.mongo import database_name, get_connection
from wow_django.mongo.schema import (
    CollectionSpec,
    SchemaReport,
    claim_database,
    event_stream_spec,
    prepare_spec,
    reconcile_collection,
    snapshot_spec,
)

_extra_specs: list[tuple[str, object]] = []  # (purpose, callable returning specs)


def register_specs(purpose: str, provider) -> None:
    """Add collections another part of wow_django owns (e.g. the bus)."""
    _extra_specs.append((purpose, provider))


def planned_specs() -> list[tuple[str, CollectionSpec]]:
    """``(database purpose, spec)`` for every collection the settings ask for."""
    plan: list[tuple[str, CollectionSpec]] = []
    mongo = {p: wow_settings.storage_for(s) == "mongo" for p, s in
             (("EVENT_STREAM", "EVENT_STORE"), ("SNAPSHOT", "SNAPSHOT_STORE"), ("PREPARE", "PREPARE_STORE"))}
    for name in registry.aggregate_names():
        if mongo["EVENT_STREAM"]:
            plan.append(("EVENT_STREAM", event_stream_spec(name, wow_settings.REQUEST_ID_INDEX)))
        if mongo["SNAPSHOT"]:
            plan.append(("SNAPSHOT", snapshot_spec(name)))
    if mongo["PREPARE"]:
        for name in registry.prepare_key_names():
            plan.append(("PREPARE", prepare_spec(name)))
    for purpose, provider in _extra_specs:
        plan.extend((purpose, spec) for spec in provider())
    return plan


def initialize(*, check_only: bool = False) -> SchemaReport:
    """Claim each database and reconcile each collection; report, raise nothing."""
    connection = get_connection()
    report = SchemaReport()
    claimed: set[str] = set()
    refused: set[str] = set()  # owned by another context: touch nothing there
    for purpose, spec in planned_specs():
        db = connection.database(database_name(purpose))
        if purpose == "BUS":  # shared by the services on the bus: reconciled, never claimed
            report.merge(reconcile_collection(db, spec, check_only=check_only))
            continue
        if db.name not in claimed:
            claimed.add(db.name)
            ownership = claim_database(db, wow_settings.CONTEXT_NAME, check_only=check_only)
            report.merge(ownership)
            if ownership.ownership:
                refused.add(db.name)
        if db.name in refused:
            continue
        report.merge(reconcile_collection(db, spec, check_only=check_only))
    return report
