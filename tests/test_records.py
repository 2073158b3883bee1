"""Records read back from a store (``stored_stream``/``stored_events``) are the records appended."""

import pytest

from wow_django.persistence.contracts import check_version_range
from wow_django.persistence.followers import check_position
from wow_django.persistence.records import (
    MAX_VERSION,
    AggregateId,
    DomainEventRecord,
    EventStream,
    stored_events,
    stored_stream,
)


def test_a_stream_read_back_equals_and_hashes_as_the_one_built_the_usual_way():
    agg = AggregateId("order", "o-1", context_name="shop", tenant_id="t1")
    built = EventStream(
        id="s-1", aggregate_id=agg, version=3,
        body=(DomainEventRecord(id="e-1", name="created", revision="2", body_type="x.Created", body={"n": 1}),),
        request_id="r-1", command_id="c-1", owner_id="u-1", header={"k": "v"}, create_time=1_700_000_000_000)
    read = stored_stream("s-1", agg, 3, stored_events(
        [{"id": "e-1", "name": "created", "revision": "2", "bodyType": "x.Created", "body": {"n": 1}}]),
        "r-1", "c-1", "u-1", {"k": "v"}, 1_700_000_000_000)
    assert type(read) is EventStream and type(read.body[0]) is DomainEventRecord
    assert read == built and hash(read.aggregate_id) == hash(built.aggregate_id)
    assert repr(read) == repr(built)
    with pytest.raises(AttributeError):  # still frozen
        read.version = 4


def test_absent_optional_fields_read_as_empty():
    agg = AggregateId("order", "o-1")
    read = stored_stream("s-1", agg, 1, stored_events([{"id": "e-1", "name": "created", "revision": None}]),
                         "r-1", "c-1", None, None, 5)
    event = read.body[0]
    assert (event.revision, event.body_type, event.body) == ("", "", {})
    assert (read.owner_id, read.header) == ("", {})


def test_a_stored_event_without_its_id_or_name_or_a_stream_without_events_is_refused():
    with pytest.raises(KeyError):
        stored_events([{"name": "created"}])
    with pytest.raises(KeyError):
        stored_events([{"id": "e-1"}])
    with pytest.raises(ValueError, match="no event"):
        stored_events([])


# --- the argument checks every store shares -------------------------------------------------------


@pytest.mark.parametrize(("head", "tail"), [(1, 1), (1, MAX_VERSION), (2, 5), (5, 5)])
def test_a_version_range_from_one_up_to_its_tail_passes(head, tail):
    check_version_range(head, tail)


@pytest.mark.parametrize(("head", "tail", "message"), [
    (0, 5, "head_version must be ≥ 1, got 0"),
    (-3, 5, "head_version must be ≥ 1, got -3"),
    (3, 2, r"tail_version \(2\) must be ≥ head_version \(3\)"),
    (True, 2, "head_version must be an integer, got True"),
    (1, 2.0, "tail_version must be an integer, got 2.0"),
    ("1", 2, "head_version must be an integer, got '1'"),
])
def test_a_version_range_outside_the_rules_is_refused_naming_the_argument(head, tail, message):
    with pytest.raises(ValueError, match=message):
        check_version_range(head, tail)


def test_a_checkpoint_position_is_an_integer_from_zero():
    for position in (0, 1, 2**40):
        check_position(position)
    for position, shown in ((-1, "-1"), (True, "True"), (1.0, "1.0"), ("3", "'3'"), (None, "None")):
        with pytest.raises(ValueError, match=f"position must be an integer ≥ 0, got {shown}"):
            check_position(position)
