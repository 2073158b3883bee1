"""Collections, index names and database ownership (DESIGN parts A, B, D, E).

Index names are part of the error-mapping contract and are pinned by tests.
Reconciliation creates what is missing, verifies what exists, refuses an index
that has the right name but other keys/options or the right keys under another
name, and never drops anything.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime

from pymongo import errors as pymongo_errors

from wow_django.backends.mongo.errors import recoverable_errors
from wow_django.exceptions import DatabaseOwnershipError, RecoverableStoreError, SchemaConflictError
from wow_django.persistence.schema import SchemaReport

METADATA_COLLECTION = "wow_database_metadata"
NAMESPACE_EXISTS = 48  # server error code when a collection is created twice
# What the server answers when an index cannot be built as asked because of what is there: a conflict to
# report (IndexOptionsConflict, IndexKeySpecsConflict, CannotCreateIndex, DuplicateKey — existing data
# breaks the uniqueness — and InvalidIndexSpecificationOption). Any other failure is not the schema's.
INDEX_CONFLICT_CODES = {85, 86, 67, 11000, 197}
# The ownership marker is Wow's document: {_id: "boundedContext", contextName, layoutVersion: 1}. wow_django
# adds "writer": a marker without it was written by a Wow (Kotlin) service. Earlier wow_django versions wrote
# {_id: "bounded_context", contextName}; it is still recognised as this service's claim.
OWNERSHIP_ID = "boundedContext"
LEGACY_OWNERSHIP_ID = "bounded_context"
LAYOUT_VERSION = 1
WRITER = "wow_django"
# Collections that hold a bounded context's documents (each with its contextName), as Wow names them.
CONTEXT_COLLECTION_SUFFIXES = ("_event_stream", "_snapshot", "_snapshot_checkpoint")


@dataclass(frozen=True)
class IndexSpec:
    name: str
    keys: tuple[tuple[str, int | str], ...]
    unique: bool = False
    expire_after_seconds: int | None = None

    def create_kwargs(self) -> dict:
        # The simple (binary) collation, explicitly: a collection's default collation would otherwise slip
        # into the index (and a unique index would count ids differing in case or accents as one).
        kwargs: dict = {"name": self.name, "collation": {"locale": "simple"}}
        if self.unique:
            kwargs["unique"] = True
        if self.expire_after_seconds is not None:
            kwargs["expireAfterSeconds"] = self.expire_after_seconds
        return kwargs

    def describe(self) -> str:
        parts = [f"{{{', '.join(f'{k}: {v!r}' for k, v in self.keys)}}}"]
        if self.unique:
            parts.append("unique")
        if self.expire_after_seconds is not None:
            parts.append(f"expireAfterSeconds={self.expire_after_seconds}")
        return " ".join(parts)


@dataclass(frozen=True)
class CollectionSpec:
    name: str
    indexes: tuple[IndexSpec, ...]
    # Uniqueness that must not exist (the other request-id mode's): refused by its fields when unique,
    # whatever the index is called and whatever its key order and directions; a non-unique index with
    # those keys is only a lookup index.
    forbidden: tuple[tuple[IndexSpec, str], ...] = ()  # (index, why)
    # Why the collection must not be sharded, if it must not (a unique index a shard key cannot carry).
    unshardable: str | None = None


def event_stream_collection(aggregate_name: str) -> str:
    return f"{aggregate_name}_event_stream"


def snapshot_collection(aggregate_name: str) -> str:
    return f"{aggregate_name}_snapshot"


def prepare_collection(key_name: str) -> str:
    return f"prepare_{key_name}"


AGGREGATE_ID_HASHED = IndexSpec("aggregateId_hashed", (("aggregateId", "hashed"),))
AGGREGATE_ID_VERSION = IndexSpec("aggregateId_1_version_1", (("aggregateId", 1), ("version", 1)), unique=True)
AGGREGATE_REQUEST_ID = IndexSpec("aggregateId_1_requestId_1", (("aggregateId", 1), ("requestId", 1)), unique=True)
GLOBAL_REQUEST_ID = IndexSpec("requestId_1", (("requestId", 1),), unique=True)
TENANT_ID_HASHED = IndexSpec("tenantId_hashed", (("tenantId", "hashed"),))
OWNER_ID_HASHED = IndexSpec("ownerId_hashed", (("ownerId", "hashed"),))
ID_HASHED = IndexSpec("_id_hashed", (("_id", "hashed"),))
DELETED_HASHED = IndexSpec("deleted_hashed", (("deleted", "hashed"),))
TTL_AT = IndexSpec("ttlAt_1", (("ttlAt", 1),), expire_after_seconds=0)
# Followers read a context's streams by global position (wow_django.backends.mongo.followers).
CONTEXT_POSITION = IndexSpec("contextName_1_position_1", (("contextName", 1), ("position", 1)))


def event_stream_spec(aggregate_name: str, request_id_index: str = "aggregate") -> CollectionSpec:
    if request_id_index == "global":
        request, other = GLOBAL_REQUEST_ID, AGGREGATE_REQUEST_ID
        why = "WOW['REQUEST_ID_INDEX'] is 'global' but the per-aggregate request-id index exists"
    elif request_id_index == "aggregate":
        request, other = AGGREGATE_REQUEST_ID, GLOBAL_REQUEST_ID
        why = "WOW['REQUEST_ID_INDEX'] is 'aggregate' but the global request-id index exists"
    else:
        raise ValueError(f"request_id_index must be 'aggregate' or 'global', got {request_id_index!r}")
    return CollectionSpec(
        event_stream_collection(aggregate_name),
        (AGGREGATE_ID_HASHED, AGGREGATE_ID_VERSION, request, TENANT_ID_HASHED, OWNER_ID_HASHED, CONTEXT_POSITION),
        forbidden=((other, why + "; drop it or change the setting"),),
        unshardable=(
            "WOW['REQUEST_ID_INDEX'] is 'global': its unique requestId_1 index cannot be built on a collection "
            "sharded by hashed aggregateId. Use REQUEST_ID_INDEX 'aggregate' (the default) to shard event "
            "streams" if request_id_index == "global" else None),
    )


POSITIONS_COLLECTION = "wow_position"
VOID_POSITIONS_COLLECTION = "wow_void_position"
FOLLOWERS_COLLECTION = "wow_follower"
FOLLOWER_GAPS_COLLECTION = "wow_follower_gap"
FOLLOWER_SKIPS_COLLECTION = "wow_follower_skip"


def positions_spec() -> CollectionSpec:
    """One counter document per bounded context: the last position allocated."""
    return CollectionSpec(POSITIONS_COLLECTION, ())


def void_positions_spec() -> CollectionSpec:
    """Positions allocated to appends the event store refused."""
    return CollectionSpec(VOID_POSITIONS_COLLECTION, (
        IndexSpec("contextName_1_position_1", (("contextName", 1), ("position", 1))),))


def follower_specs() -> tuple[CollectionSpec, ...]:
    """Followers' state, the gaps they skipped and the audit of skipped poison events."""
    by_follower = IndexSpec("follower_1_at_1", (("follower", 1), ("at", 1)))
    return (
        CollectionSpec(FOLLOWERS_COLLECTION, ()),
        CollectionSpec(FOLLOWER_GAPS_COLLECTION, (by_follower,)),
        CollectionSpec(FOLLOWER_SKIPS_COLLECTION, (by_follower,)),
    )


def snapshot_spec(aggregate_name: str) -> CollectionSpec:
    return CollectionSpec(
        snapshot_collection(aggregate_name), (TENANT_ID_HASHED, OWNER_ID_HASHED, ID_HASHED, DELETED_HASHED)
    )


def prepare_spec(key_name: str) -> CollectionSpec:
    return CollectionSpec(prepare_collection(key_name), (TTL_AT,))


# --- reconciliation ------------------------------------------------------------


def _normalise_keys(key) -> tuple[tuple[str, int | str], ...]:
    items = key.items() if hasattr(key, "items") else key
    out = []
    for name, direction in items:
        if isinstance(direction, float) and direction.is_integer():
            direction = int(direction)
        out.append((name, direction))
    return tuple(out)


def _fields(key) -> frozenset[str]:
    """The fields of an index key, without order or direction: what a unique index makes unique
    (``{requestId: -1}`` refuses the same documents as ``{requestId: 1}``)."""
    return frozenset(name for name, _ in _normalise_keys(key))


def _option_problems(spec: IndexSpec, existing: dict) -> list[str]:
    problems = []
    if bool(existing.get("unique", False)) != spec.unique:
        problems.append(f"unique={bool(existing.get('unique', False))}, expected unique={spec.unique}")
    ttl = existing.get("expireAfterSeconds")
    if ttl is not None:
        ttl = int(ttl)
    if ttl != spec.expire_after_seconds:
        problems.append(f"expireAfterSeconds={ttl}, expected {spec.expire_after_seconds}")
    for option in ("partialFilterExpression", "sparse"):
        if existing.get(option):
            problems.append(f"{option} is set, expected none")
    collation = existing.get("collation")
    if collation and collation.get("locale", "simple") != "simple":
        problems.append(f"collation {collation.get('locale')!r}, expected the simple (binary) comparison: with "
                        "another collation ids that differ in case or accents would count as one")
    return problems


def _is_sharded(database, name: str) -> bool:
    """Whether the collection is sharded (``collStats`` through mongos says so); False where the engine
    cannot tell (the embedded one)."""
    try:
        with recoverable_errors(f"reading the stats of {database.name}.{name}"):
            return bool(database.command({"collStats": name}).get("sharded"))
    except (pymongo_errors.OperationFailure, NotImplementedError, AttributeError, TypeError):
        return False


def reconcile_collection(database, spec: CollectionSpec, *, check_only: bool = False) -> SchemaReport:
    """Create or verify ``spec`` in ``database``; raise nothing, report everything."""
    report = SchemaReport()
    db_name = database.name
    with recoverable_errors(f"reading indexes of {db_name}.{spec.name}"):
        existing_names = set(database.list_collection_names())
        if spec.name in existing_names:
            existing = {ix["name"]: ix for ix in database[spec.name].list_indexes()}
        else:
            existing = {}
    if spec.name not in existing_names:
        if check_only:
            report.add(db_name, spec.name, "collection", "missing")
        else:
            try:
                database.create_collection(spec.name)
            except pymongo_errors.CollectionInvalid:
                pass  # the driver saw it exists: created concurrently by another process
            except pymongo_errors.OperationFailure as exc:
                if exc.code != NAMESPACE_EXISTS:
                    raise
                # the server saw it exists: another process won the race
            report.add(db_name, spec.name, "collection", "created")
    else:
        report.add(db_name, spec.name, "collection", "verified")

    by_keys = {_normalise_keys(ix["key"]): name for name, ix in existing.items()}
    to_create: list[IndexSpec] = []
    for index in spec.indexes:
        current = existing.get(index.name)
        if current is not None:
            keys = _normalise_keys(current["key"])
            problems = []
            if keys != index.keys:
                problems.append(f"keys {dict(keys)}, expected {dict(index.keys)}")
            problems.extend(_option_problems(index, current))
            if problems:
                report.add(db_name, spec.name, index.name, "conflict")
                report.conflicts.append(
                    f"{db_name}.{spec.name}: index {index.name!r} has " + "; ".join(problems)
                    + f". wow_django needs {index.describe()} under that name: drop or rename the existing index."
                )
            else:
                report.add(db_name, spec.name, index.name, "verified")
            continue
        other = by_keys.get(index.keys)
        if other is not None:
            report.add(db_name, spec.name, index.name, "conflict")
            report.conflicts.append(
                f"{db_name}.{spec.name}: index {other!r} has the keys wow_django needs for {index.name!r} "
                f"({index.describe()}); the name is part of the error-mapping contract. "
                f"Drop or rename {other!r}."
            )
            continue
        if check_only:
            report.add(db_name, spec.name, index.name, "missing")
        else:
            to_create.append(index)
    if spec.unshardable and spec.name in existing_names and _is_sharded(database, spec.name):
        report.add(db_name, spec.name, "shard key", "conflict")
        report.conflicts.append(f"{db_name}.{spec.name} is sharded: {spec.unshardable}.")
    for index, why in spec.forbidden:
        for name, current in existing.items():
            if _fields(current["key"]) == _fields(index.keys) and current.get("unique"):
                report.add(db_name, spec.name, name, "conflict")
                report.conflicts.append(f"{db_name}.{spec.name}: index {name!r} is not allowed "
                                        f"({index.describe()}): {why}.")
    if to_create and not report.conflicts:
        collection = database[spec.name]
        for index in to_create:
            with recoverable_errors(f"creating index {index.name} on {db_name}.{spec.name}"):
                try:
                    collection.create_index(list(index.keys), **index.create_kwargs())
                except pymongo_errors.OperationFailure as exc:
                    if exc.code not in INDEX_CONFLICT_CODES:
                        raise RecoverableStoreError(
                            f"creating index {index.name} on {db_name}.{spec.name} failed ({exc}); retry") from exc
                    report.add(db_name, spec.name, index.name, "conflict")
                    report.conflicts.append(f"{db_name}.{spec.name}: cannot create {index.name!r}: {exc}")
                    continue
            report.add(db_name, spec.name, index.name, "created")
    return report


def _foreign_documents(database, context_name: str) -> str | None:
    """Why ``database`` already belongs to another service, or None. Looked at before a first claim: an
    unclaimed database may still be another service's.

    Two signs: event streams or snapshots of another bounded context; or event streams without a
    ``position``, which every wow_django append writes and Wow's own (Kotlin) services do not.
    """
    for name in sorted(database.list_collection_names()):
        if not name.endswith(CONTEXT_COLLECTION_SUFFIXES):
            continue
        other = database[name].find_one({"contextName": {"$ne": context_name}}, {"contextName": 1})
        if other is not None:
            what = "event streams" if name.endswith("_event_stream") else "snapshots"
            return f"already holds {what} of bounded context {other.get('contextName')!r} (in {name})"
        if not name.endswith("_event_stream"):
            continue
        unpositioned = database[name].find_one({"position": {"$exists": False}}, {"_id": 1})
        if unpositioned is not None:
            return (f"already holds event streams that wow_django did not write (in {name}: stream "
                    f"{unpositioned['_id']!r} has no position) — another service writes here, e.g. a Wow "
                    "(Kotlin) service of this bounded context; two services appending to one database would "
                    "race each other's versions and request ids unseen")
    return None


def _marker_problem(database, marker: dict, context_name: str) -> str | None:
    """Why the ownership ``marker`` does not let ``context_name`` of wow_django use ``database``, or None."""
    owner = marker.get("contextName")
    layout = marker.get("layoutVersion")
    if layout != LAYOUT_VERSION:
        return (f"database {database.name!r} has an ownership marker of layout version {layout!r} "
                f"(in {METADATA_COLLECTION}); wow_django knows layout version {LAYOUT_VERSION} only")
    if owner != context_name:
        return (f"database {database.name!r} belongs to bounded context {owner!r}, not {context_name!r}. "
                "Collection names carry no context prefix, so two contexts must not share a database: point "
                "this context at its own database (WOW['MONGO_URI'] or the *_DATABASE settings), or set "
                "WOW['CONTEXT_NAME'] if this is that context.")
    if marker.get("writer") != WRITER:
        return (f"database {database.name!r} is claimed by a Wow (Kotlin) service of bounded context {owner!r} "
                f"(its marker in {METADATA_COLLECTION} was not written by wow_django): two services appending "
                "to one database would race each other's versions and request ids unseen. Point this service "
                "at its own database.")
    return None


def claim_database(database, context_name: str, *, check_only: bool = False) -> SchemaReport:
    """Claim ``database`` for ``context_name`` with Wow's ownership marker in ``wow_database_metadata``.

    Atomic: the first service to claim wins; a claim by another context, or by a Wow (Kotlin) service, is
    a problem. Before a first claim, the database's event streams and snapshots are looked at.
    """
    report = SchemaReport()
    collection = database[METADATA_COLLECTION]
    with recoverable_errors(f"claiming database {database.name}"):
        claim = collection.find_one({"_id": OWNERSHIP_ID})
        if claim is None:
            legacy = collection.find_one({"_id": LEGACY_OWNERSHIP_ID})
            if legacy is not None:  # an earlier wow_django's claim
                legacy = {"contextName": legacy.get("contextName"), "layoutVersion": LAYOUT_VERSION,
                          "writer": WRITER}
            foreign = _foreign_documents(database, context_name) if legacy is None else None
            if foreign is not None:
                report.add(database.name, METADATA_COLLECTION, "ownership", "conflict")
                report.ownership.append(
                    f"database {database.name!r} has no owner yet but {foreign}; it is not claimed for "
                    f"{context_name!r}. Point this context at its own database, or set WOW['CONTEXT_NAME'] if "
                    "this is that context."
                )
                return report
            owner = context_name if legacy is None else legacy["contextName"]
            if check_only or (legacy is not None and owner != context_name):
                claim = legacy
            else:
                def claim_it():
                    return collection.find_one_and_update(
                        {"_id": OWNERSHIP_ID},
                        {"$setOnInsert": {"contextName": owner, "layoutVersion": LAYOUT_VERSION, "writer": WRITER,
                                          "claimedAt": datetime.now(UTC).replace(tzinfo=None)}},
                        upsert=True,
                        return_document=True,
                    )

                try:
                    claim = claim_it()
                except pymongo_errors.DuplicateKeyError:
                    claim = claim_it()  # two processes claimed at once and the server did not retry: it exists now
    if claim is None:
        report.add(database.name, METADATA_COLLECTION, "ownership", "missing")
        return report
    problem = _marker_problem(database, claim, context_name)
    if problem is not None:
        report.add(database.name, METADATA_COLLECTION, "ownership", "conflict")
        report.ownership.append(problem)
    else:
        report.add(database.name, METADATA_COLLECTION, "ownership", "verified")
    return report


class SchemaGuard:
    """Ensures, once per process, that a database is claimed and a collection reconciled."""

    def __init__(self, context_name: str, *, auto_init: bool = True):
        self.context_name = context_name
        self.auto_init = auto_init
        self._done: set[tuple[str, str]] = set()
        self._claimed: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, database, spec: CollectionSpec, *, claim: bool = True) -> None:
        """Claim ``database`` (unless ``claim`` is False: a store shared by design) and reconcile ``spec``."""
        key = (database.name, spec.name)
        if key in self._done:
            return
        with self._lock:
            if key in self._done:
                return
            if claim and database.name not in self._claimed:
                raise_problems(claim_database(database, self.context_name))
                self._claimed.add(database.name)
            if self.auto_init:
                raise_problems(reconcile_collection(database, spec))
            self._done.add(key)


def raise_problems(report: SchemaReport) -> None:
    if report.ownership:
        raise DatabaseOwnershipError(report.ownership[0])
    if report.conflicts:
        raise SchemaConflictError("\n".join(report.conflicts))
