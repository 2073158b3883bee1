"""The operators' console (admin/wow/) through Django's test client: permissions, pages, actions, bad input."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client, override_settings

from wow_django.backends.mongo.client import disconnect
from wow_django.bus import get_bus
from wow_django.bus.envelope import Envelope
from wow_django.console.models import PERMISSIONS, ConsoleAudit
from wow_django.log import describe_failure
from wow_django.testing.bus import delete_amqp_entities, unique_exchange

from .support import CONSUMERS, fresh_wow, poisoned_follower

pytestmark = pytest.mark.django_db

EVERYTHING = tuple(PERMISSIONS)


@pytest.fixture(params=["in_memory", "mongo"])
def console_bus(request):
    """The bus on a fresh store, with member-service and message-service on order.purchased, and a few events:
    evt-failed (member failed, message consumed), evt-sent (just sent), its child evt-child."""
    settings = fresh_wow("in_memory", SERVICE_NAME="order-service", BUS_EXCHANGE=unique_exchange(),
                         BUS_STORE=request.param)
    with override_settings(WOW=settings):
        bus = get_bus()
        for consumer in CONSUMERS:
            bus.set_topic_consumer("order.purchased", consumer)
        bus.set_topic_consumer("points.added", "message-service")
        bus.send("order.purchased", {"orderId": "o-1", "secret": "card-4242"}, event_id="evt-failed",
                 trace_id="trace-1", occurred_at="2024-01-01T10:00:00Z")
        bus.record_feedback("evt-failed", "member-service", False, "points store down")
        bus.record_feedback("evt-failed", "message-service", True)
        bus.send("order.purchased", {"orderId": "o-2"}, event_id="evt-sent", trace_id="trace-2",
                 occurred_at="2024-01-01T11:00:00Z", span_id="span-sent",
                 initiator={"service": "order-service", "userId": "u-1", "clientRequestId": "req-9"})
        bus.send("points.added", {"points": 5}, event_id="evt-child", trace_id="trace-2",
                 parent_event_id="evt-sent", initiator={"service": "member-service"},
                 occurred_at="2024-01-01T11:00:01Z")
        yield bus
        delete_amqp_entities("memory://", settings["BUS_EXCHANGE"], CONSUMERS)
    disconnect(settings["MONGO_URI"])


def user_with(*codenames, name="operator", staff=True) -> Client:
    user = get_user_model().objects.create_user(name, f"{name}@example.com", "pw", is_staff=staff)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="wow_django", codename=codename))
    client = Client()
    client.force_login(user)
    return client


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- permissions ----------------------------------------------------------------------------------------------


def test_every_permission_is_real_and_the_console_is_linked_from_the_admin_index(console_bus):
    assert set(Permission.objects.filter(content_type__app_label="wow_django").values_list("codename", flat=True)) \
        >= set(PERMISSIONS)
    admin = user_with(*EVERYTHING)
    index = admin.get("/admin/")
    assert index.status_code == 200 and b"/admin/wow_django/console/" in index.content
    assert admin.get("/admin/wow_django/console/")["Location"] == "/admin/wow/"
    page = admin.get("/admin/wow/")
    assert page.status_code == 200
    assert b"admin/wow/events/" in page.content and b"admin/wow/audit/" in page.content


def test_a_staff_user_without_permissions_is_refused_and_sees_no_link(console_bus):
    staff = user_with(name="staff")
    assert b"/admin/wow_django/console/" not in staff.get("/admin/").content
    for url in ("/admin/wow/", "/admin/wow/audit/", "/admin/wow/events/", "/admin/wow/events/evt-failed/",
                "/admin/wow/events/evt-failed/repush/"):
        assert staff.get(url).status_code == 403, url
    assert staff.post("/admin/wow/events/evt-failed/repush/").status_code == 403
    assert get_bus().store.get_event("evt-failed")["retryCount"] == 0


def test_anonymous_and_non_staff_users_are_sent_to_the_login(console_bus):
    assert Client().get("/admin/wow/events/")["Location"].startswith("/admin/login/")
    outsider = user_with(*EVERYTHING, name="outsider", staff=False)
    assert outsider.get("/admin/wow/events/")["Location"].startswith("/admin/login/")


def test_each_section_and_action_needs_its_own_permission(console_bus):
    viewer = user_with("view_bus_events", name="viewer")
    index = viewer.get("/admin/wow/")
    assert b"admin/wow/events/" in index.content and b"admin/wow/audit/" not in index.content
    assert viewer.get("/admin/wow/audit/").status_code == 403
    detail = viewer.get("/admin/wow/events/evt-failed/")
    assert detail.status_code == 200
    assert b"card-4242" not in detail.content and b"Hidden: viewing payloads" in detail.content
    assert b"repush/" not in detail.content  # no re-push offered without the permission
    assert viewer.get("/admin/wow/events/evt-failed/repush/").status_code == 403
    assert viewer.post("/admin/wow/events/evt-failed/repush/").status_code == 403
    reader = user_with("view_bus_events", "view_payloads", name="reader")
    assert b"card-4242" in reader.get("/admin/wow/events/evt-failed/").content


# --- bus events -------------------------------------------------------------------------------------------------


def test_the_event_list_filters_searches_and_shows_what_was_consumed(console_bus):
    client = user_with("view_bus_events")
    listed = client.get("/admin/wow/events/")
    assert [e["eventId"] for e in listed.context["events"]] == ["evt-child", "evt-sent", "evt-failed"]
    assert b"1/2 consumed" in listed.content and b"0/2 consumed" in listed.content

    def ids(**params):
        response = client.get("/admin/wow/events/", params)
        assert response.status_code == 200
        return [e["eventId"] for e in response.context["events"]]

    assert ids(status="PARTIAL") == ["evt-failed"]
    assert ids(status="FAILED") == []
    for typed in ("FAILED,PARTIAL", "PARTIAL, FAILED"):
        failing = client.get("/admin/wow/events/", {"status": typed})
        assert [e["eventId"] for e in failing.context["events"]] == ["evt-failed"]
        assert b'<option value="FAILED,PARTIAL" selected>failed for some consumer' in failing.content
    other = client.get("/admin/wow/events/", {"status": "SENT,PARTIAL"})
    assert b'<option value="PARTIAL,SENT" selected>PARTIAL,SENT</option>' in other.content
    # a consumer's failure is the event's last error, in the list too
    assert b"consumer member-service, attempt 1: points store down" in failing.content
    assert ids(topic="points.added") == ["evt-child"]
    assert ids(service="member-service") == ["evt-child"]
    assert ids(user="u-1") == ["evt-sent"] and ids(request="req-9") == ["evt-sent"] and ids(user="nobody") == []
    assert b'<a href="?user=u-1" class="wow-user"' in listed.content  # a user's other events, one click away
    assert ids(since="2024-01-01T10:30:00Z") == ["evt-child", "evt-sent"]
    assert ids(until="2024-01-01T10:30") == ["evt-failed"]
    assert ids(q="evt-sent") == ["evt-sent"]  # an eventId
    assert ids(q="trace-2") == ["evt-child", "evt-sent"]  # a traceId
    assert ids(q="trace-2", topic="order.purchased") == ["evt-sent"]
    assert ids(q="nothing-like-it") == []


def test_the_search_finds_events_by_key_or_payload_field_and_links_them_to_their_aggregate(console_bus, monkeypatch):
    from wow_django.bus.envelope import aggregate_keys

    monkeypatch.setattr(console_bus, "search_fields", ("orderId",))  # WOW['BUS_SEARCH_FIELDS']
    console_bus.send("order.purchased", {"orderId": "o-77"}, event_id="evt-o77", keys=aggregate_keys("order", "o-77"))
    console_bus.send("order.purchased", {"orderId": "o-78"}, event_id="evt-o78")
    client = user_with("view_bus_events", "view_aggregates", "view_payloads")

    def ids(**params):
        response = client.get("/admin/wow/events/", params)
        assert response.status_code == 200
        return [e["eventId"] for e in response.context["events"]]

    assert ids(q="orderId=o-77") == ["evt-o77"] and ids(q="orderId=o-78") == ["evt-o78"]
    assert ids(q="o-77") == ["evt-o77"]  # a value of a search field, or an aggregate id
    assert ids(q="aggregate=order/o-77") == ["evt-o77"]
    assert ids(q="aggregate=order/o-77", topic="points.added") == [] and ids(q="orderId=o-79") == []
    assert ids(q="trace-2") == ["evt-child", "evt-sent"] and ids(q="evt-sent") == ["evt-sent"]  # as before
    bad = client.get("/admin/wow/events/", {"q": "bad name=x"})
    assert bad.status_code == 200 and bad.context["events"] == []
    assert any(m.startswith("search: key:") for m in messages_of(bad))
    long = client.get("/admin/wow/events/", {"q": "x" * 300})
    assert long.status_code == 200 and long.context["events"] == []
    detail = client.get("/admin/wow/events/evt-o77/")
    assert b'href="/admin/wow/events/?q=aggregate%3Dorder%2Fo-77"' in detail.content
    assert b'href="/admin/wow/events/?q=orderId%3Do-77"' in detail.content
    assert b'href="/admin/wow/aggregates/order/id/o-77"' in detail.content  # to the aggregate it comes from
    reader = user_with("view_bus_events", "view_payloads", name="reader").get("/admin/wow/events/evt-o77/")
    assert b"aggregate%3Dorder" in reader.content and b"/admin/wow/aggregates/" not in reader.content
    # A key may be a payload field's value: without view_payloads, no key is shown nor searched.
    viewer = user_with("view_bus_events", name="viewer")
    hidden = viewer.get("/admin/wow/events/evt-o77/")
    assert b"o-77" not in hidden.content.split(b'id="envelope"')[0] and b'"keys"' not in hidden.content
    assert b"aggregate%3Dorder" not in hidden.content and b"orderId=o-77" not in hidden.content
    refused = viewer.get("/admin/wow/events/", {"q": "orderId=o-77"})
    assert refused.context["events"] == [] and any("permission to view payloads" in m for m in messages_of(refused))
    assert viewer.get("/admin/wow/events/", {"q": "o-77"}).context["events"] == []  # no bare value either
    assert viewer.get("/admin/wow/events/", {"q": "trace-2"}).context["events"]  # a trace is not payload
    repush = user_with("view_bus_events", "repush_bus_events", name="pusher")
    monkeypatch.setattr(console_bus, "repush_timeout_s", 0)
    assert b"orderId" not in repush.get("/admin/wow/events/evt-o77/repush/").content
    # Bad input: a message, never an error.
    for bad in ("a\x00b", "orderId=a\x00b", "x\ny"):
        response = client.get("/admin/wow/events/", {"q": bad})
        assert response.status_code == 200 and any(m.startswith("search:") for m in messages_of(response)), bad


def test_the_event_list_pages_by_cursor(console_bus, monkeypatch):
    from wow_django.console import bus_views

    monkeypatch.setattr(bus_views, "PAGE_SIZE", 2)
    client = user_with("view_bus_events")
    first = client.get("/admin/wow/events/", {"topic": ""})
    assert [e["eventId"] for e in first.context["events"]] == ["evt-child", "evt-sent"]
    second = client.get("/admin/wow/events/" + first.context["next_url"])
    assert [e["eventId"] for e in second.context["events"]] == ["evt-failed"]
    assert second.context["next_url"] is None and b"first page" in second.content
    assert first.context["total"] == 3 and b"3 events match" in first.content
    monkeypatch.setattr(bus_views, "MAX_COUNTED", 2)  # counted no further than that
    assert b"More than 2 events match" in client.get("/admin/wow/events/").content
    assert b"1 event matches" in client.get("/admin/wow/events/", {"topic": "points.added"}).content
    assert first.context["previous_url"] is None and b"first page" not in first.content
    back = client.get("/admin/wow/events/" + second.context["previous_url"])  # the page before, by key
    assert [e["eventId"] for e in back.context["events"]] == ["evt-child", "evt-sent"]
    assert back.context["previous_url"] is None and back.context["next_url"] == first.context["next_url"]

    def jump(at, **params):
        response = client.get("/admin/wow/events/", {"at": at, **params})
        assert response.status_code == 200
        return [e["eventId"] for e in response.context["events"]], response

    assert jump("2024-01-01T10:30:00Z")[0] == ["evt-failed"]  # the events at or before that time
    at_sent, response = jump("2024-01-01T11:00:00Z")
    assert at_sent == ["evt-sent", "evt-failed"] and response.context["next_url"] is None
    assert [e["eventId"] for e in client.get("/admin/wow/events/" + response.context["previous_url"])
            .context["events"]] == ["evt-child"]
    assert "at=" not in response.context["previous_url"]  # the jump is not kept in the page links
    assert jump("2024-01-01T11:00:00Z", topic="points.added")[0] == []
    assert jump("2030-01-01T00:00:00Z")[0] == ["evt-child", "evt-sent"]
    assert jump("2024-01-01T10:30:00Z", until="2024-01-01T09:00:00Z")[0] == []  # the earlier end wins
    assert jump("9999-12-31T23:59:59.999Z")[0] == ["evt-child", "evt-sent"]  # the last instant there is
    bad = client.get("/admin/wow/events/", {"at": "noon"})
    assert bad.status_code == 200 and any(m.startswith("at:") for m in messages_of(bad))


def test_a_consumers_deliveries_are_listed_newest_first_filtered_by_outcome_and_paged(console_bus, monkeypatch):
    from wow_django.console import bus_views

    time.sleep(0.002)  # each report in a millisecond of its own: the order is by time
    console_bus.record_feedback("evt-sent", "member-service", True)
    time.sleep(0.002)
    console_bus.record_feedback("evt-failed", "member-service", False, "InvalidOperation: bad amount\n\nTraceback…")
    client = user_with("view_bus_events")
    # The event list's consumer filter leads to the consumer's deliveries.
    listed = client.get("/admin/wow/events/")
    assert b'<option value="member-service">member-service</option>' in listed.content
    picked = client.get("/admin/wow/events/", {"consumer": "member-service", "outcome": "failed"})
    assert picked.status_code == 302 and picked["Location"] == "/admin/wow/consumers/member-service/?outcome=failed"
    page = client.get("/admin/wow/consumers/member-service/")
    assert page.status_code == 200
    assert [(r["eventId"], r["attemptNo"], r["success"]) for r in page.context["rows"]] == [
        ("evt-failed", 2, False), ("evt-sent", 1, True), ("evt-failed", 1, False)]  # newest report first
    assert page.context["rows"][0]["event"]["status"] == "PARTIAL"
    assert page.context["rows"][0]["errorHead"] == "InvalidOperation: bad amount"  # the whole error in its title
    assert b'title="InvalidOperation: bad amount\n\nTraceback' in page.content
    assert b">InvalidOperation: bad amount</div>" in page.content
    assert b'href="/admin/wow/events/evt-sent/#consumer-member-service"' in page.content
    failed = client.get("/admin/wow/consumers/member-service/", {"outcome": "failed"})
    assert [r["attemptNo"] for r in failed.context["rows"]] == [2, 1]
    succeeded = client.get("/admin/wow/consumers/member-service/", {"outcome": "succeeded"})
    assert [r["eventId"] for r in succeeded.context["rows"]] == ["evt-sent"]
    message = client.get("/admin/wow/consumers/message-service/")
    assert [r["eventId"] for r in message.context["rows"]] == ["evt-failed"]
    monkeypatch.setattr(bus_views, "PAGE_SIZE", 2)
    first = client.get("/admin/wow/consumers/member-service/")
    second = client.get("/admin/wow/consumers/member-service/" + first.context["next_url"])
    assert [r["attemptNo"] for r in first.context["rows"] + second.context["rows"]] == [2, 1, 1]
    assert second.context["next_url"] is None and b"first page" in second.content
    # Links to it from an event's consumers and from the topic consumers.
    assert b'href="/admin/wow/consumers/member-service/"' in client.get("/admin/wow/events/evt-failed/").content
    assert b'href="/admin/wow/consumers/message-service/"' in client.get("/admin/wow/topic-consumers/").content
    # Bad input: a message or a 404, never an error.
    assert client.get("/admin/wow/consumers/no%20spaces/").status_code == 404
    bad = client.get("/admin/wow/consumers/member-service/", {"outcome": "maybe", "cursor": "W10"})
    assert bad.status_code == 200 and {m.split(":")[0] for m in messages_of(bad)} == {"outcome", "cursor"}
    typed = client.get("/admin/wow/events/", {"consumer": "no spaces"})
    assert typed.status_code == 200 and any(m.startswith("consumerId:") for m in messages_of(typed))
    assert user_with(name="nobody").get("/admin/wow/consumers/member-service/").status_code == 403
    monkeypatch.setattr(console_bus, "max_page_size", 2)  # WOW['QUERY_MAX_PAGE_SIZE'] below the console's pages
    for url in ("/admin/wow/consumers/member-service/", "/admin/wow/events/", "/admin/wow/not-consumed/"):
        assert client.get(url).status_code == 200, url
    assert len(client.get("/admin/wow/consumers/member-service/").context["rows"]) == 2


def test_events_not_consumed_in_time_are_listed_and_re_pushed_after_a_confirmation(console_bus, monkeypatch):
    from wow_django.console import bus_views

    viewer = user_with("view_bus_events", name="viewer")
    waiting = viewer.get("/admin/wow/not-consumed/")
    assert waiting.status_code == 200 and waiting.context["rows"] == []  # sent just now: not late yet
    assert b"has been consumed or has failed" in waiting.content
    monkeypatch.setattr(console_bus, "repush_timeout_s", 0)
    late = viewer.get("/admin/wow/not-consumed/")
    assert [(r["event"]["eventId"], r["waiting"]) for r in late.context["rows"]] == [
        ("evt-child", ["message-service"]), ("evt-sent", ["member-service", "message-service"])]  # not evt-failed
    assert b'type="checkbox"' not in late.content  # no re-push without the permission
    monkeypatch.setattr(bus_views, "PAGE_SIZE", 1)
    first = viewer.get("/admin/wow/not-consumed/")
    second = viewer.get("/admin/wow/not-consumed/" + first.context["next_url"])
    assert [r["event"]["eventId"] for r in first.context["rows"] + second.context["rows"]] == ["evt-child", "evt-sent"]
    assert second.context["next_url"] is None and b"first page" in second.content
    bad = viewer.get("/admin/wow/not-consumed/", {"cursor": "W10"})
    assert len(bad.context["rows"]) == 1 and any(m.startswith("cursor:") for m in messages_of(bad))
    monkeypatch.setattr(bus_views, "PAGE_SIZE", 25)
    assert viewer.get("/admin/wow/not-consumed/repush/", {"event": "evt-sent"}).status_code == 403
    console_bus.record_feedback("evt-sent", "member-service", True)
    operator = user_with("view_bus_events", "repush_bus_events")
    shown = operator.get("/admin/wow/not-consumed/")
    assert [r["waiting"] for r in shown.context["rows"]] == [["message-service"], ["message-service"]]
    assert b'name="event" value="evt-sent"' in shown.content and b"Not consumed" in shown.content
    confirm = operator.get("/admin/wow/not-consumed/repush/", {"event": ["evt-sent", "evt-failed", "evt-none"]})
    assert confirm.status_code == 200
    assert [r["eventId"] for r in confirm.context["ready"]] == ["evt-sent", "evt-failed"]  # PARTIAL may be re-pushed
    assert [(r["eventId"], r["why"]) for r in confirm.context["refused"]] == [("evt-none", "there is no such event")]
    odd = operator.get("/admin/wow/not-consumed/repush/", {"event": ["a\x00b", "x" * 300]}, follow=True)
    assert any("2 value(s) are not event ids" in m for m in messages_of(odd))
    assert console_bus.store.get_event("evt-sent")["retryCount"] == 0  # a GET changes nothing
    done = operator.post("/admin/wow/not-consumed/repush/", {"event": ["evt-sent", "evt-none"]}, follow=True)
    assert any("Re-pushed 1 event(s)" in m for m in messages_of(done))
    assert any("Not re-pushed evt-none" in m for m in messages_of(done))
    stored = console_bus.store.get_event("evt-sent")
    assert (stored["status"], stored["retryCount"]) == ("RETRYING", 1)
    entry = ConsoleAudit.objects.get(action="repush.bulk")
    assert entry.target == "not-consumed" and entry.detail["published"] == ["evt-sent"]
    assert entry.detail["refused"] == [{"eventId": "evt-none", "error": "there is no such event"}]
    # Nothing chosen, too many, or the limit reached: a message, nothing re-pushed.
    none = operator.post("/admin/wow/not-consumed/repush/", {}, follow=True)
    assert any("Choose the events" in m for m in messages_of(none))
    many = operator.get("/admin/wow/not-consumed/repush/", {"event": [f"evt-{n}" for n in range(201)]},
                        follow=True)
    assert any(m.startswith("event: at most 200") for m in messages_of(many))
    monkeypatch.setattr(console_bus, "repush_max_count", 1)
    limited = operator.get("/admin/wow/not-consumed/")
    row = next(r for r in limited.context["rows"] if r["event"]["eventId"] == "evt-sent")
    assert row["refusal"] is not None and b'value="evt-sent"' not in limited.content
    again = operator.post("/admin/wow/not-consumed/repush/", {"event": "evt-sent"}, follow=True)
    assert any("Not re-pushed evt-sent" in m and "limit" in m for m in messages_of(again))
    assert console_bus.store.get_event("evt-sent")["retryCount"] == 1
    monkeypatch.setattr(console_bus, "repush_max_count", 5)
    odd_post = operator.post("/admin/wow/not-consumed/repush/", {"event": ["a\x00b", "evt-child"]}, follow=True)
    assert any("1 value(s) are not event ids" in m for m in messages_of(odd_post))
    assert ConsoleAudit.objects.filter(action="repush.bulk").latest("id").detail["published"] == ["evt-child"]
    # A failure the page cannot turn into a message still leaves what was re-pushed in the audit.
    real_repush = console_bus.repush

    def repush_then_fail(event_id, **options):
        if event_id == "evt-failed":
            raise RuntimeError("the store went away")
        return real_repush(event_id, **options)

    monkeypatch.setattr(console_bus, "repush", repush_then_fail)
    with pytest.raises(RuntimeError):
        operator.post("/admin/wow/not-consumed/repush/", {"event": ["evt-child", "evt-failed"]})
    assert ConsoleAudit.objects.filter(action="repush.bulk").latest("id").detail["published"] == ["evt-child"]
    monkeypatch.setattr(console_bus, "repush", real_repush)


@pytest.mark.parametrize("params, named", [
    ({"status": "DONE"}, "status"),
    ({"topic": "no spaces please"}, "topic"),
    ({"since": "yesterday"}, "since"),
    ({"until": "2024-13-45"}, "until"),
    ({"cursor": "not-a-cursor"}, "cursor"),
    ({"cursor": "W10"}, "cursor"),
    ({"before": "W10"}, "before"),
    ({"at": "2024-02-30T00:00:00Z"}, "at"),
])
def test_bad_filters_and_cursors_are_a_message_not_an_error(console_bus, params, named):
    response = user_with("view_bus_events").get("/admin/wow/events/", params)
    assert response.status_code == 200
    assert any(m.startswith(f"{named}:") for m in messages_of(response)), messages_of(response)


def test_the_event_detail_shows_envelope_feedback_history_parent_and_children(console_bus):
    client = user_with("view_bus_events", "view_payloads")
    failed = client.get("/admin/wow/events/evt-failed/")
    assert failed.status_code == 200
    consumers = {c["consumerId"]: c for c in failed.context["detail"]["consumers"]}
    assert consumers["member-service"]["state"] == "FAILED"
    assert [a["error"] for a in consumers["member-service"]["attempts"]] == [None, "points store down"]
    assert b"points store down" in failed.content and b"&quot;traceId&quot;: &quot;trace-1&quot;" in failed.content
    assert b'id="last-error">Last error: <span class="wow-last-error">consumer member-service, attempt 1: ' \
           b'points store down' in failed.content
    parent = client.get("/admin/wow/events/evt-sent/")
    assert b"/admin/wow/events/evt-child/" in parent.content and b'id="last-error"' not in parent.content
    child = client.get("/admin/wow/events/evt-child/")
    assert child.context["detail"]["parent"]["eventId"] == "evt-sent"


def test_a_consumers_traceback_is_kept_and_shown_folded_under_its_first_line(console_bus):
    bus = get_bus()
    bus.send("order.purchased", {"amount": "12,50"}, event_id="evt-bad-amount")

    def handle(event, ctx):
        return Decimal(event.payload["amount"])  # decimal.InvalidOperation, whose message says little

    try:
        handle(Envelope.from_document(bus.store.get_event("evt-bad-amount")), None)
    except InvalidOperation as exc:
        error = describe_failure(exc)
    bus.record_feedback("evt-bad-amount", "member-service", False, error, dead_lettered=True)
    page = user_with("view_bus_events").get("/admin/wow/events/evt-bad-amount/")
    assert b"<details class=\"wow-error\"><summary>InvalidOperation: [&lt;class &#x27;decimal.ConversionSyntax&#x27;&gt;]" \
           b"</summary><pre>InvalidOperation" in page.content
    assert b"return Decimal(event.payload[&quot;amount&quot;])" in page.content  # the line that broke


def test_unknown_events_are_404(console_bus):
    client = user_with("view_bus_events", "repush_bus_events")
    assert client.get("/admin/wow/events/evt-nope/").status_code == 404
    assert client.get("/admin/wow/events/evt-nope/repush/").status_code == 404
    assert client.post("/admin/wow/events/evt-nope/repush/").status_code == 404
    assert client.get("/admin/wow/events/evt-failed/repush/", {"consumer": "no such!"}).status_code == 404


# --- re-push --------------------------------------------------------------------------------------------------


def test_re_push_to_one_consumer_is_confirmed_then_posted_and_audited(console_bus):
    client = user_with("view_bus_events", "repush_bus_events", "view_console_audit")
    detail = client.get("/admin/wow/events/evt-failed/")
    assert b"repush/?consumer=member-service" in detail.content
    assert b"repush/?consumer=message-service" not in detail.content  # it consumed the event
    confirm = client.get("/admin/wow/events/evt-failed/repush/", {"consumer": "member-service"})
    assert confirm.status_code == 200 and b"member-service only" in confirm.content
    assert b"csrfmiddlewaretoken" in confirm.content and b"hidden: you lack the permission" in confirm.content
    assert get_bus().store.get_event("evt-failed")["retryCount"] == 0  # a GET changes nothing

    done = client.post("/admin/wow/events/evt-failed/repush/", {"consumer": "member-service"}, follow=True)
    assert done.redirect_chain[-1][0] == "/admin/wow/events/evt-failed/"
    assert any("Re-pushed evt-failed to member-service" in m for m in messages_of(done))
    event = get_bus().store.get_event("evt-failed")
    assert (event["status"], event["retryCount"]) == ("RETRYING", 1)
    [entry] = ConsoleAudit.objects.all()
    assert (entry.username, entry.action, entry.target) == ("operator", "repush",
                                                            "event:evt-failed consumer:member-service")
    assert entry.detail["outcome"] == "published"
    audit = client.get("/admin/wow/audit/", {"action": "repush"})
    assert b"event:evt-failed consumer:member-service" in audit.content


def test_a_re_push_the_bus_does_not_allow_is_a_message_and_changes_nothing(console_bus):
    client = user_with("view_bus_events", "repush_bus_events")
    detail = client.get("/admin/wow/events/evt-sent/")
    assert b"Re-push not offered" in detail.content and b"id=\"repush-all\"" not in detail.content
    for request in (client.get, client.post):
        response = request("/admin/wow/events/evt-sent/repush/", follow=True)
        assert response.status_code == 200
        assert any("Not re-pushed" in m and "REPUSH" not in m for m in messages_of(response))
    refused = client.post("/admin/wow/events/evt-failed/repush/", {"consumer": "message-service"}, follow=True)
    assert any("already consumed" in m for m in messages_of(refused))
    assert get_bus().store.get_event("evt-sent")["retryCount"] == 0
    assert not ConsoleAudit.objects.exists()


def test_a_re_push_refused_between_the_page_and_the_post_is_a_message(console_bus, monkeypatch):
    client = user_with("view_bus_events", "repush_bus_events")
    monkeypatch.setattr(type(console_bus), "repush_refusal", lambda self, event, consumer=None: None)
    response = client.post("/admin/wow/events/evt-sent/repush/", follow=True)
    assert response.status_code == 200 and any("Not re-pushed" in m for m in messages_of(response))
    assert ConsoleAudit.objects.get().detail["outcome"] == "refused"


@pytest.mark.parametrize("use_tz", [True, False])
def test_the_audit_shows_when_in_the_sites_zone_with_or_without_time_zone_support(console_bus, settings, use_tz):
    """A model's time is aware under USE_TZ, naive local time without it: both read the same, in the zone."""
    settings.USE_TZ, settings.TIME_ZONE = use_tz, "Asia/Shanghai"
    client = user_with("view_bus_events", "repush_bus_events", "view_console_audit")
    client.post("/admin/wow/events/evt-failed/repush/", {"consumer": "member-service"})
    entry = ConsoleAudit.objects.get()
    at = entry.at if use_tz else entry.at.replace(tzinfo=ZoneInfo("Asia/Shanghai"))
    local = at.astimezone(ZoneInfo("Asia/Shanghai"))
    page = client.get("/admin/wow/audit/").content.decode()
    assert f">{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} CST</time>" in page
    assert "<pre class=\"wow-json\">{\n  &quot;consumer&quot;: &quot;member-service&quot;" in page  # not a repr


def test_a_time_the_zone_cannot_show_is_shown_as_it_is_not_an_error(console_bus, settings):
    settings.TIME_ZONE = "Asia/Shanghai"  # 9999-12-31T23:00Z is past the year 9999 there
    console_bus.send("order.purchased", {}, event_id="evt-far", occurred_at="9999-12-31T23:00:00Z")
    listed = user_with("view_bus_events").get("/admin/wow/events/")
    assert listed.status_code == 200 and [e["eventId"] for e in listed.context["events"]][0] == "evt-far"
    from wow_django.console.base import moment

    assert moment(-10**14 + 1) is None and moment(10**14) is None and moment(True) is None
    assert moment(1704103200123)["ms"] == 1704103200123 and moment(99_999_999_999_999)["ms"] == 99_999_999_999_999
    settings.TIME_ZONE = "UTC"
    assert moment("0500-01-01T00:00:00Z")["iso"] == "0500-01-01T00:00:00.000Z"


def test_the_audit_page_takes_any_page_number(console_bus):
    client = user_with("view_console_audit")
    for number in ("x", "-1", "999999", ""):
        assert client.get("/admin/wow/audit/", {"page": number}).status_code == 200


# --- topic consumers ------------------------------------------------------------------------------------------


def test_topic_consumers_are_listed_created_edited_and_toggled_with_confirmation(console_bus):
    viewer = user_with("view_bus_events", name="viewer")
    listed = viewer.get("/admin/wow/topic-consumers/")
    assert listed.status_code == 200 and b"member-service" in listed.content and b"/disable/" not in listed.content
    assert viewer.get("/admin/wow/topic-consumers/new/").status_code == 403
    assert viewer.post("/admin/wow/topic-consumers/order.purchased/member-service/disable/").status_code == 403

    client = user_with("view_bus_events", "manage_topic_consumers")
    created = client.post("/admin/wow/topic-consumers/new/", {"topic": "order.shipped", "consumerId": "ship-service",
                                                              "description": "ships", "enabled": "on"}, follow=True)
    assert created.redirect_chain[-1][0] == "/admin/wow/topic-consumers/"
    assert console_bus.store.enabled_consumers("order.shipped") == ["ship-service"]
    again = client.post("/admin/wow/topic-consumers/new/", {"topic": "order.shipped", "consumerId": "ship-service"})
    assert again.status_code == 200 and any("already configured" in m for m in messages_of(again))
    edited = client.post("/admin/wow/topic-consumers/order.shipped/ship-service/edit/", {"description": "new text"})
    assert edited.status_code == 302
    [record] = console_bus.topic_consumers(topic="order.shipped")
    assert (record["description"], record["enabled"]) == ("new text", True)

    confirm = client.get("/admin/wow/topic-consumers/order.shipped/ship-service/disable/")
    assert b"No other consumer is enabled for this topic" in confirm.content
    assert console_bus.store.enabled_consumers("order.shipped") == ["ship-service"]  # GET changes nothing
    assert client.post("/admin/wow/topic-consumers/order.shipped/ship-service/disable/").status_code == 302
    assert console_bus.store.enabled_consumers("order.shipped") == []
    assert b"keeps 1 enabled consumer" in client.get(
        "/admin/wow/topic-consumers/order.purchased/member-service/disable/").content
    assert client.post("/admin/wow/topic-consumers/order.shipped/ship-service/enable/").status_code == 302
    assert console_bus.store.enabled_consumers("order.shipped") == ["ship-service"]
    assert list(ConsoleAudit.objects.order_by("id").values_list("action", flat=True)) == [
        "topic_consumer.create", "topic_consumer.edit", "topic_consumer.disable", "topic_consumer.enable"]


def test_bad_topic_consumer_input_is_a_message_or_404(console_bus):
    client = user_with("view_bus_events", "manage_topic_consumers")
    bad = client.post("/admin/wow/topic-consumers/new/", {"topic": "no spaces", "consumerId": "ok"})
    assert bad.status_code == 200 and messages_of(bad)[0].startswith("topic:")
    bad = client.post("/admin/wow/topic-consumers/new/", {"topic": "order.purchased", "consumerId": "!bad"})
    assert bad.status_code == 200 and messages_of(bad)[0].startswith("consumerId:")
    empty = client.post("/admin/wow/topic-consumers/new/", {})
    assert empty.status_code == 200 and messages_of(empty)
    long = client.post("/admin/wow/topic-consumers/order.purchased/member-service/edit/", {"description": "x" * 501})
    assert long.status_code == 200 and any(m.startswith("description:") for m in messages_of(long))
    for url in ("/admin/wow/topic-consumers/order.nothing/member-service/edit/",
                "/admin/wow/topic-consumers/order.nothing/member-service/disable/",
                "/admin/wow/topic-consumers/order.purchased/nobody/enable/"):
        assert client.get(url).status_code == 404 and client.post(url).status_code == 404
    assert not ConsoleAudit.objects.exists()


# --- followers ------------------------------------------------------------------------------------------------


def started_follower(name: str = "order-summaries") -> None:
    """Give the follower a checkpoint at position 0, as its first run does."""
    from datetime import UTC, datetime

    from wow_django.application.runtime import get_runtime

    store = get_runtime().follower_store
    store.acquire(name, "test-owner", 30, now=datetime.now(UTC))
    store.release(name, "test-owner")


def test_followers_are_listed_paused_resumed_and_rewound_with_a_preview(console_bus):
    from wow_django.application.runtime import get_runtime

    assert user_with("view_bus_events", name="viewer").get("/admin/wow/followers/").status_code == 403
    started_follower()
    client = user_with("manage_followers")
    listed = client.get("/admin/wow/followers/")
    assert listed.status_code == 200
    names = [row["name"] for row in listed.context["rows"]]
    assert "order-summaries" in names and b"/admin/wow/followers/order-summaries/pause/" in listed.content

    assert b"stops it after its current batch" in client.get("/admin/wow/followers/order-summaries/pause/").content
    assert client.post("/admin/wow/followers/order-summaries/pause/").status_code == 302
    store = get_runtime().follower_store
    assert store.get("order-summaries").paused
    assert client.post("/admin/wow/followers/order-summaries/resume/").status_code == 302
    assert not store.get("order-summaries").paused

    assert client.post("/admin/wow/followers/order-summaries/rewind/", {"to_position": "7"}).status_code == 302
    preview = client.get("/admin/wow/followers/order-summaries/rewind/", {"to_position": "0"})
    assert preview.context["target"] == 0 and b"replays <strong>0</strong> stream(s)" in preview.content
    assert store.get("order-summaries").position == 7  # a preview changes nothing
    assert client.post("/admin/wow/followers/order-summaries/rewind/", {"to_position": "0"}).status_code == 302
    assert store.get("order-summaries").position == 0
    assert list(ConsoleAudit.objects.order_by("id").values_list("action", flat=True)) == [
        "follower.pause", "follower.resume", "follower.rewind", "follower.rewind"]


def test_a_follower_stopped_on_poison_says_so_and_is_retried_or_skipped_from_the_console(console_bus):
    store = poisoned_follower()
    client = user_with("manage_followers")
    listed = client.get("/admin/wow/followers/").content.decode()
    row = listed[listed.index('id="follower-order-summaries"'):]
    row = row[:row.index("</tr>")]
    assert "stopped on a poison event at position 4" in row and ">running<" not in row
    assert "<summary class=\"wow-status-FAILED\">at 4 (order/o-4): InvalidOperation: [&lt;class" in row
    assert "/admin/wow/followers/order-summaries/retry/" in row and "/admin/wow/followers/order-summaries/skip/" in row

    # retry: a confirmation that shows the event and its error, then a POST that clears the stop
    confirm = client.get("/admin/wow/followers/order-summaries/retry/")
    assert confirm.status_code == 200 and b"order/o-4" in confirm.content and b'id="poison-error"' in confirm.content
    assert store.get("order-summaries").poison is not None  # a confirmation page changes nothing
    stale = client.post("/admin/wow/followers/order-summaries/retry/", {"position": "3"}, follow=True)
    assert store.get("order-summaries").poison is not None  # not the one shown
    assert any("no longer stopped at the position the page showed" in m for m in messages_of(stale))
    assert client.post("/admin/wow/followers/order-summaries/retry/", {"position": "4"}).status_code == 302
    state = store.get("order-summaries")
    assert state.poison is None and state.position == 3  # it handles position 4 again
    again = client.get("/admin/wow/followers/order-summaries/retry/", follow=True)
    assert any("not stopped on a poison event" in m for m in messages_of(again)), messages_of(again)

    # skip: a reason is required, then the checkpoint passes the event and the store keeps who and why
    poisoned_follower()
    no_reason = client.post("/admin/wow/followers/order-summaries/skip/", {"position": "4", "reason": "  "})
    assert no_reason.status_code == 200 and messages_of(no_reason)[0].startswith("reason:")
    assert store.get("order-summaries").poison is not None
    done = client.post("/admin/wow/followers/order-summaries/skip/", {"position": "4", "reason": "bad amount, refunded"})
    assert done.status_code == 302
    state = store.get("order-summaries")
    assert state.poison is None and state.position == 4
    [skipped] = store.skipped("order-summaries")
    assert (skipped["by"], skipped["reason"], skipped["position"]) == ("operator", "bad amount, refunded", 4)
    assert list(ConsoleAudit.objects.order_by("id").values_list("action", "detail__position")) == [
        ("follower.retry", 4), ("follower.skip", 4)]
    assert user_with("view_bus_events", name="viewer").post(
        "/admin/wow/followers/order-summaries/skip/", {"position": "4", "reason": "x"}).status_code == 403


def test_bad_follower_input_is_a_message_or_404(console_bus):
    started_follower()
    client = user_with("manage_followers")
    for url in ("/admin/wow/followers/no-such/pause/", "/admin/wow/followers/no-such/resume/",
                "/admin/wow/followers/no-such/rewind/"):
        assert client.get(url).status_code == 404 and client.post(url).status_code == 404
    for params, named in (({"to_position": "-1"}, "to_position"), ({"to_position": "x"}, "to_position"),
                          ({"to_position": "²"}, "to_position"), ({"to_position": "9" * 30}, "to_position"),
                          ({"to_time": "tomorrow"}, "to_time")):
        for response in (client.get("/admin/wow/followers/order-summaries/rewind/", params),
                         client.post("/admin/wow/followers/order-summaries/rewind/", params)):
            assert response.status_code == 200 and messages_of(response)[0].startswith(named)
    assert not ConsoleAudit.objects.exists()


# --- aggregates -----------------------------------------------------------------------------------------------


@pytest.fixture
def customers():
    """Two customers on the in-memory stores: c-1 renamed twice (version 3) in tenant acme, c-2 in tenant other."""
    from sample_project.orders.aggregates import ChangeDisplayName, RegisterCustomer
    from wow_django.application import WaitStage, send

    # Snapshots saved inline: the stages these tests read are the projections' alone.
    settings = fresh_wow("in_memory", FOLLOWERS_RUN="command", SNAPSHOT_MODE="inline")
    with override_settings(WOW=settings):
        first = send(RegisterCustomer(username="ann", display_name="Ann"), tenant_id="acme", request_id="req-c1",
                     wait=WaitStage.SNAPSHOT)
        for name in ("Annie", "Anna"):
            send(ChangeDisplayName(display_name=name), aggregate_id=first.aggregate_id, tenant_id="acme",
                 wait=WaitStage.SNAPSHOT)
        second = send(RegisterCustomer(username="bob", display_name="Bob"), tenant_id="other",
                      wait=WaitStage.SNAPSHOT)
        yield first.aggregate_id, second.aggregate_id


def test_aggregates_streams_snapshots_and_state_at_a_version(customers, monkeypatch):
    from wow_django.console import aggregates

    ann, bob = customers
    client = user_with("view_aggregates")
    assert user_with("view_bus_events", name="viewer").get("/admin/wow/aggregates/").status_code == 403
    listed = client.get("/admin/wow/aggregates/")
    assert listed.status_code == 200 and {"customer", "order"} <= set(listed.context["names"])
    both = user_with("view_aggregates", "view_bus_events", "view_payloads", name="both")
    page = both.get(f"/admin/wow/aggregates/customer/id/{ann}")
    assert page.context["bus_events_url"] == f"/admin/wow/events/?q=aggregate%3Dcustomer%2F{ann}"
    assert client.get(f"/admin/wow/aggregates/customer/id/{ann}").context["bus_events_url"] is None

    def versions(url, **params):
        response = client.get(url, params)
        assert response.status_code == 200, messages_of(response)
        return [(d["aggregateId"], d["version"]) for d in response.context["streams" if "events" in url else "rows"]]

    streams = "/admin/wow/aggregates/customer/events/"
    assert sorted(versions(streams)) == sorted([(ann, 1), (ann, 2), (ann, 3), (bob, 1)])
    assert versions(streams, aggregate_id=ann, version_from="2") == [(ann, 3), (ann, 2)]
    assert versions(streams, aggregate_id=ann, version_to="1") == [(ann, 1)]
    assert versions(streams, tenant="other") == [(bob, 1)]
    assert versions(streams, request_id="req-c1") == [(ann, 1)]
    monkeypatch.setattr(aggregates, "PAGE_SIZE", 2)  # keyset pages, forward and back, the filters kept
    first = client.get(streams)
    walked, response = versions(streams), first
    assert len(walked) == 2 and first.context["previous_url"] is None and first.context["first_url"] is None
    while response.context["next_url"]:
        response = client.get(streams + response.context["next_url"])
        walked += [(d["aggregateId"], d["version"]) for d in response.context["streams"]]
    assert sorted(walked) == sorted([(ann, 1), (ann, 2), (ann, 3), (bob, 1)]) and len(walked) == 4
    back = client.get(streams + response.context["previous_url"])
    assert [(d["aggregateId"], d["version"]) for d in back.context["streams"]] == walked[:2]
    assert back.context["next_url"] == first.context["next_url"]
    filtered = client.get(streams, {"tenant": "a&b c", "aggregate_id": ann})
    assert filtered.context["streams"] == [] and filtered.context["next_url"] is None
    acme = client.get(streams, {"tenant": "acme"})
    assert acme.context["next_url"].endswith("&tenant=acme")  # the page links keep the filters, encoded
    assert [d["version"] for d in client.get(streams + acme.context["next_url"]).context["streams"]] == [1]
    monkeypatch.setattr(aggregates, "PAGE_SIZE", 25)
    assert versions(streams, since="2000-01-01T00:00:00Z", tenant="other") == [(bob, 1)]
    assert versions(streams, until="2000-01-01T00:00:00Z") == []
    snapshots = "/admin/wow/aggregates/customer/snapshots/"
    assert sorted(versions(snapshots)) == sorted([(ann, 3), (bob, 1)])
    assert versions(snapshots, tenant="acme", deleted="active") == [(ann, 3)]
    assert versions(snapshots, deleted="deleted") == []

    detail = client.get(f"/admin/wow/aggregates/customer/id/{ann}", {"version": "2"})
    assert detail.status_code == 200 and detail.context["head"] == 3
    assert '"display_name": "Annie"' in detail.context["state_at"]
    assert ['"Ann"' in s["state"] for s in detail.context["states"]] == [True, False, False]
    assert '"display_name": "Anna"' in detail.context["states"][-1]["state"] and detail.context["snapshot"]
    assert b"rewind-here" not in detail.content  # rewinding is for those who manage followers


def test_a_follower_is_rewound_to_a_stream_from_its_row(customers):
    from wow_django.application.runtime import get_runtime

    ann, _ = customers
    started_follower("customer-names")
    store, feed = get_runtime().follower_store, get_runtime().stream_feed
    head = feed.head()
    store.acquire("customer-names", "test-owner", 30, now=datetime.now(UTC))
    store.advance("customer-names", "test-owner", head, now=datetime.now(UTC))
    client = user_with("view_aggregates", "manage_followers")
    detail = client.get(f"/admin/wow/aggregates/customer/id/{ann}")
    assert detail.content.count(b'class="rewind-here"') == 3 and b"<option>customer-names</option>" in detail.content
    chosen = client.get("/admin/wow/followers/rewind-to-stream/", {"follower": "customer-names", "aggregate": "customer",
                                                                   "aggregate_id": ann, "version": "2"}, follow=True)
    position = feed.position_of("customer", ann, 2)
    assert chosen.context["target"] == position - 1 and b'id="stream-target"' in chosen.content
    assert chosen.context["replay"] == feed.count_between(position - 1, head)
    assert store.get("customer-names").position == head  # a preview changes nothing
    assert client.post("/admin/wow/followers/customer-names/rewind/", {"to_position": str(position - 1)}).status_code == 302
    assert store.get("customer-names").position == position - 1
    missing = client.get("/admin/wow/followers/customer-names/rewind/", {"aggregate": "customer", "aggregate_id": ann,
                                                                         "version": "9"})
    assert any(m.startswith("aggregate: no stream") for m in messages_of(missing)) and missing.context["target"] is None
    assert client.get("/admin/wow/followers/rewind-to-stream/", {"follower": "nobody", "version": "1"}).status_code == 404


def test_times_read_as_dates_with_their_zone_and_bodies_as_json(customers, settings):
    """No epoch milliseconds in a column and no Python repr in a body: times in the site's zone, named, with
    the UTC instant and the milliseconds a query takes in the element; decimals as JSON numbers."""
    from sample_project.orders.aggregates import PlaceOrder
    from wow_django.application import WaitStage, send

    settings.TIME_ZONE = "Asia/Shanghai"
    order = send(PlaceOrder(customer_id="c-1", items=[{"sku": "A-1", "quantity": 2, "unit_price": "6.25"}]),
                 tenant_id="acme", wait=WaitStage.SNAPSHOT)
    client = user_with("view_aggregates")
    for url, column in (("/admin/wow/aggregates/order/events/", b'<th scope="col">Created</th>'),
                        ("/admin/wow/aggregates/order/snapshots/", b'<th scope="col">Snapshot time</th>')):
        page = client.get(url)
        [document] = page.context["streams" if "events" in url else "rows"]
        moment = document["createTime" if "events" in url else "snapshotTime"]
        shown = datetime.fromtimestamp(moment / 1000, ZoneInfo("Asia/Shanghai"))
        assert column in page.content and b"(ms)" not in page.content
        element = (f'<time datetime="{datetime.fromtimestamp(moment / 1000, UTC):%Y-%m-%dT%H:%M:%S}.'
                   f'{moment % 1000:03d}Z" title="{moment} ms since 1970-01-01 UTC">'
                   f'{shown:%Y-%m-%d %H:%M:%S}.{moment % 1000:03d} CST</time>')
        assert element.encode() in page.content, url
        assert f">{moment}<".encode() not in page.content
    detail = client.get(f"/admin/wow/aggregates/order/id/{order.aggregate_id}").content.decode()
    assert "Decimal(" not in detail and '&quot;total_amount&quot;: 12.50' in detail  # exact digits, a number
    assert '<pre class="wow-json">{\n  &quot;currency&quot;: &quot;CNY&quot;' in detail


@pytest.mark.parametrize("url, params, named", [
    ("/admin/wow/aggregates/customer/events/", {"version_from": "x"}, "version_from"),
    ("/admin/wow/aggregates/customer/events/", {"version_to": "0"}, "version_to"),
    ("/admin/wow/aggregates/customer/events/", {"since": "soon"}, "since"),
    ("/admin/wow/aggregates/customer/events/", {"cursor": "W10"}, "cursor"),
    ("/admin/wow/aggregates/customer/events/", {"before": "not a cursor"}, "before"),
    ("/admin/wow/aggregates/customer/events/", {"cursor": "WzEsIiJd"}, "cursor"),
    ("/admin/wow/aggregates/customer/events/", {"version_from": "²"}, "version_from"),
    ("/admin/wow/aggregates/customer/events/", {"cursor": "WzEsImEiXQ"}, None),  # past the end: an empty page
    ("/admin/wow/aggregates/customer/snapshots/", {"deleted": "maybe"}, "deleted"),
    ("/admin/wow/aggregates/customer/snapshots/", {"page": "x"}, "page"),
    ("/admin/wow/aggregates/customer/id/{ann}", {"version": "9"}, "version"),
    ("/admin/wow/aggregates/customer/id/{ann}", {"version": "two"}, "version"),
    ("/admin/wow/aggregates/customer/id/{ann}", {"version": "²"}, "version"),
])
def test_bad_aggregate_filters_are_a_message(customers, url, params, named):
    response = user_with("view_aggregates").get(url.format(ann=customers[0]), params)
    assert response.status_code == 200
    if named:
        assert messages_of(response) and messages_of(response)[0].startswith(named), messages_of(response)


def test_unknown_aggregates_and_ids_are_404(customers):
    client = user_with("view_aggregates")
    for url in ("/admin/wow/aggregates/nothing/events/", "/admin/wow/aggregates/nothing/snapshots/",
                "/admin/wow/aggregates/nothing/id/x", "/admin/wow/aggregates/customer/id/no-such-customer",
                "/admin/wow/aggregates/customer/id/" + "x" * 5000):
        assert client.get(url).status_code == 404, url


# --- traces, failures, dashboard ------------------------------------------------------------------------------


def test_the_trace_shows_the_tree_with_each_consumers_state_and_the_time_line(console_bus):
    client = user_with("view_bus_events")
    response = client.get("/admin/wow/traces/trace-2/")
    assert response.status_code == 200
    rows = response.context["rows"]
    assert [(r["event"]["eventId"], r["depth"]) for r in rows] == [("evt-sent", 0), ("evt-child", 1)]
    assert {c: s["state"] for c, s in rows[0]["consumers"].items()} == {c: "WAITING" for c in CONSUMERS}
    assert [item["offset_ms"] for item in response.context["timeline"]] == [0, 1000]
    assert b'<td class="span"><code>span-sent</code></td>' in response.content  # span ids in the trace
    assert b"order-service, user u-1, request req-9" in response.content
    failed = client.get("/admin/wow/traces/trace-1/").context["rows"][0]["consumers"]
    assert failed["member-service"] == {"state": "FAILED", "error": "points store down", "attempts": 1}
    get_bus().record_feedback("evt-child", "message-service", False, "KeyError: 'points'\n\nTraceback (most "
                              "recent call last):\n  File ...", dead_lettered=True)
    traced = client.get("/admin/wow/traces/trace-2/")
    assert traced.context["rows"][1]["consumers"]["message-service"]["error"] == "KeyError: 'points'"
    assert b"Traceback" not in traced.content  # a trace shows what failed, the event page shows where
    assert client.get("/admin/wow/traces/no-such-trace/").status_code == 404
    assert client.get("/admin/wow/traces/bad%20id/").status_code == 404
    assert user_with(name="staff").get("/admin/wow/traces/trace-2/").status_code == 403


def fail(bus, event_id: str, consumer: str, error: str) -> None:
    bus.send("order.purchased", {"n": event_id}, event_id=event_id)
    bus.record_feedback(event_id, consumer, False, error)


def test_failures_are_grouped_by_consumer_and_error_and_re_pushed_in_bulk(console_bus):
    fail(console_bus, "evt-f2", "member-service", "points store down")
    fail(console_bus, "evt-f3", "message-service", "smtp timeout\nat line 3")
    client = user_with("view_bus_events", "repush_bus_events")
    listed = client.get("/admin/wow/failures/")
    groups = [(g["consumer"], g["error"], g["count"]) for g in listed.context["groups"]]
    assert groups == [("member-service", "points store down", 2), ("message-service", "smtp timeout", 1)]
    key = listed.context["groups"][0]["key"]
    confirm = client.get(f"/admin/wow/failures/{key}/repush/")
    assert confirm.status_code == 200 and len(confirm.context["ready"]) == 2
    assert console_bus.store.get_event("evt-f2")["retryCount"] == 0  # a GET changes nothing
    done = client.post(f"/admin/wow/failures/{key}/repush/", follow=True)
    assert any("Re-pushed 2 event(s) to member-service" in m for m in messages_of(done))
    assert [console_bus.store.get_event(e)["status"] for e in ("evt-failed", "evt-f2")] == ["RETRYING"] * 2
    entry = ConsoleAudit.objects.get(action="repush.bulk")
    assert entry.target == "consumer:member-service" and sorted(entry.detail["published"]) == ["evt-f2", "evt-failed"]
    # The group is gone from the page only once the consumer reports again; its re-push stays within the limit.
    gone = client.get("/admin/wow/failures/nothing-like-it/repush/", follow=True)
    assert any("gone" in m for m in messages_of(gone))
    assert user_with("view_bus_events", name="viewer").get(f"/admin/wow/failures/{key}/repush/").status_code == 403


def test_a_failure_gets_a_triage_note(console_bus):
    client = user_with("view_bus_events", "repush_bus_events")
    saved = client.post("/admin/wow/failures/note/", {"event_id": "evt-failed", "consumer": "member-service",
                                                      "acknowledged": "on", "note": "points store back at 11:00"})
    assert saved.status_code == 302
    listed = client.get("/admin/wow/failures/")
    [group] = listed.context["groups"]
    assert group["acknowledged"] == 1 and b"acknowledged by operator" in listed.content
    assert b"points store back at 11:00" in listed.content
    assert ConsoleAudit.objects.get().action == "failure.note"
    for bad in ({"event_id": "evt-nope", "consumer": "member-service"}, {"event_id": "evt-failed", "consumer": "x y"},
                {"event_id": "evt-failed", "consumer": "nobody"}, {}):
        assert client.post("/admin/wow/failures/note/", bad).status_code == 404
    too_long = client.post("/admin/wow/failures/note/", {"event_id": "evt-failed", "consumer": "member-service",
                                                         "note": "x" * 2001}, follow=True)
    assert any(m.startswith("note:") for m in messages_of(too_long))
    assert client.get("/admin/wow/failures/note/").status_code == 405
    viewer = user_with("view_bus_events", name="viewer")
    assert viewer.post("/admin/wow/failures/note/", {"event_id": "evt-failed"}).status_code == 403


def test_the_dashboard_draws_its_charts_on_the_server(console_bus):
    started_follower()
    console_bus.send("order.purchased", {}, event_id="evt-now")  # within the last 24 hours
    client = user_with("view_bus_events", "manage_followers")
    response = client.get("/admin/wow/dashboard/")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.count('class="wow-chart"') == 3 and "<script" not in body.split('id="chart-status"')[1]
    assert "member-service" in body.split('id="chart-failures"')[1] and "order-summaries" in body
    assert ": 1 SENT</title></rect>" in body.split('id="chart-status"')[1]
    viewer = user_with("view_bus_events", name="viewer").get("/admin/wow/dashboard/").content.decode()
    assert viewer.count('class="wow-chart"') == 2  # follower lag needs the followers' permission


def test_the_placeholder_model_has_no_admin_pages_but_the_link(console_bus):
    admin = user_with(*EVERYTHING)
    for url in ("/admin/wow_django/console/1/change/", "/admin/wow_django/console/add/",
                "/admin/wow_django/console/1/history/", "/admin/wow_django/console/1/delete/"):
        assert admin.get(url).status_code == 404, url


def test_a_store_that_does_not_answer_is_a_503_page(console_bus, monkeypatch):
    from wow_django.exceptions import RecoverableStoreError

    def down(*args, **kwargs):
        raise RecoverableStoreError("the bus database did not answer")

    monkeypatch.setattr(type(console_bus.store), "events_after", down)
    response = user_with("view_bus_events").get("/admin/wow/events/")
    assert response.status_code == 503 and b"did not answer" in response.content
