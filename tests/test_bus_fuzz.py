"""Whatever a client sends to the bus endpoints, the answer is never a 500.

Generated bodies, query strings and path ids (hypothesis, derandomised and
bounded) against the bus's HTTP routes; every refusal is a JSON error body.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from wow_django.bus import get_bus

from .support import TOKENS, callback, client_with

FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["order.purchased", "2024-02-28T10:00:00Z", "0001-01-01T00:00:00+01:00", "$where", "\x00",
                     "evt-1", "application/json", "text/plain", "PENDING", "FAILED"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
ENVELOPE_KEYS = ["eventId", "traceId", "spanId", "parentEventId", "topic", "payload", "payloadType", "initiator",
                 "occurredAt", "sentAt", "contractVersion", "partitionKey", "sequence", "expireAt"]
# Envelope-shaped bodies: a valid topic most of the time, so validation reaches every other field.
envelopes = st.fixed_dictionaries(
    {"topic": st.one_of(st.just("order.purchased"), scalars)},
    optional={key: values for key in ENVELOPE_KEYS if key != "topic"},
)
bodies = st.one_of(
    envelopes,
    st.dictionaries(st.sampled_from(ENVELOPE_KEYS + ["success", "error", "consumerId", "x"]), values, max_size=8),
    values,
)
raw_texts = st.one_of(envelopes.map(json.dumps), bodies.map(json.dumps), st.text(max_size=60),
                      st.sampled_from(['{"a": 1e400}', '{"payload": NaN}', "[" * 500, '{"topic": "\\ud800"}']))
path_ids = st.text(alphabet=st.characters(blacklist_characters="/?#%", blacklist_categories=("Cs",)),
                   min_size=1, max_size=30)


def assert_no_server_error(response):
    assert response.status_code < 500, (response.status_code, response.content[:300])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"errorCode", "errorMsg", "bindingErrors"}


@pytest.fixture
def operator_client(db):
    return client_with("view_busevent", "repush_event", "send_event", "manage_topic_consumers", name="fuzzer")


@FUZZ
@given(text=raw_texts)
@example(text='{"topic": "order.purchased", "payload": {}, "occurredAt": "0001-01-01T00:00:00+01:00"}')
@example(text='{"topic": "order.purchased", "payload": {"n": 100000000000000000000000}}')
def test_sending_anything_is_never_a_500(bus_http_env, operator_client, text):  # noqa: F811
    response = operator_client.post("/bus/events/", text, content_type="application/json")
    assert_no_server_error(response)


@FUZZ
@given(body=bodies)
def test_feedback_of_anything_is_never_a_500(bus_http_env, body):  # noqa: F811
    get_bus().send("order.purchased", {"n": 1}, event_id="evt-fuzz")
    assert_no_server_error(callback(TOKENS["member-service"], body))


@FUZZ
@given(params=st.dictionaries(st.sampled_from(["status", "topic", "service", "since", "until", "traceId", "page",
                                               "size", "x"]), st.text(max_size=25), max_size=5))
def test_listing_with_any_parameters_is_never_a_500(bus_http_env, operator_client, params):  # noqa: F811
    assert_no_server_error(operator_client.get("/bus/events/", params))


@FUZZ
@given(event_id=path_ids, body=bodies)
def test_any_path_id_is_never_a_500(bus_http_env, operator_client, event_id, body):  # noqa: F811
    assert_no_server_error(operator_client.get(f"/bus/events/{event_id}/"))
    assert_no_server_error(operator_client.get(f"/bus/traces/{event_id}/"))
    assert_no_server_error(operator_client.post(f"/bus/events/{event_id}/repush/", body, format="json"))


@FUZZ
@given(body=bodies)
def test_configuring_consumers_with_anything_is_never_a_500(bus_http_env, operator_client, body):  # noqa: F811
    assert_no_server_error(operator_client.post("/bus/topic-consumers/", body, format="json"))
