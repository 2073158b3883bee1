"""The README's snippets, run as written (issue 13: every snippet is exercised). Each test names its snippet.

A snippet is found by a text only it contains (``SNIPPETS``) and run statement by statement
(:func:`run`): what it defines lands in a namespace the test then checks, and the value of each of its
bare expression lines (``result.aggregate_id, result.aggregate_version, result.stage``) is returned, so
the test can check what the README says they are. A snippet that presupposes names of the reader's
project (a model, the URLconf's imports) gets them in its namespace, and the test says so. The last test
fails when a python block of the README is covered by no test.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import subprocess
import sys
import types
import unittest
from decimal import Decimal
from pathlib import Path

import pytest
from django.test import override_settings

from wow_django.application.followers import FollowerRegistry, use_followers
from wow_django.bus.consumer import ConsumerRegistry, use_consumers
from wow_django.domain.registry import Registry, use_registry
from wow_django.testing import isolated_wow
from wow_django.testing.bus import delete_amqp_entities, unique_exchange

from .support import fresh_wow, wait_for

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)

#: Each python block of the README, by a name of this module: a text that only that block contains.
SNIPPETS = {
    "settings": 'INSTALLED_APPS = [..., "rest_framework"',
    "conformance": "class TestMyEventStore(",
    "follower": '@follower("order-totals"',
    "modeling": "class Order(Aggregate",
    "aggregate spec": "from wow_django.testing import AggregateSpec",
    "isolation": "from wow_django.testing import IsolatedWowMixin",
    "gateway": 'request_id="client-req-1"',
    "expected version": "except CommandExpectVersionConflict",
    "projections": '@projection("order", events=[OrderPaid]',
    "status": 'get_runtime().gateway.status("order"',
    "reading": "runtime.snapshot_queries(",
    "api urls": 'include("wow_django.http.urls")',
    "bus": "@consumer(\"member-service\"",
    "console urls": 'include("wow_django.console.urls")',
    "celery": "app.autodiscover_tasks()",
    "tenant resolver": 'attribute = "membership.tenant_id"',
}


def block(name: str) -> str:
    """The README's python block ``SNIPPETS[name]`` picks (exactly one)."""
    [found] = [code for code in PYTHON_BLOCKS if SNIPPETS[name] in code]
    return found


def run(name: str, namespace: dict) -> list:
    """Run the snippet ``name`` as written in ``namespace``, one top-level statement after another (compiled
    without this module's ``from __future__`` flags, line numbers those of README.md); the values of its
    bare expression statements, in order."""
    code = block(name)
    tree = ast.parse(code, "README.md")
    ast.increment_lineno(tree, README[: README.index(code)].count("\n"))
    values = []
    for statement in tree.body:
        if isinstance(statement, ast.Expr):
            expression = ast.Expression(statement.value)
            values.append(eval(compile(expression, f"README.md ({name})", "eval", dont_inherit=True), namespace))
        else:
            module = ast.Module([statement], type_ignores=[])
            exec(compile(module, f"README.md ({name})", "exec", dont_inherit=True), namespace)
    return values


@contextlib.contextmanager
def fresh_declarations():
    """Empty domain, follower and consumer registries: the README's "order" (and its followers and
    consumer) beside the sample project's own, gone afterwards."""
    with use_registry(Registry()), use_followers(FollowerRegistry()), use_consumers(ConsumerRegistry()):
        yield


@contextlib.contextmanager
def readme_world(*, inline: bool = False, **wow):
    """Fresh declarations, and in-memory stores (``fresh_wow("in_memory", **wow)``) isolated as a project's
    tests isolate them (:func:`wow_django.testing.isolated_wow`); ``inline``: the runtime's background work
    in the calling thread."""
    with fresh_declarations(), override_settings(WOW=fresh_wow("in_memory", **wow)), isolated_wow(inline=inline):
        yield


def urlconf_module(monkeypatch, name: str, urlpatterns: list, **attributes) -> str:
    """A module ``name`` holding ``urlpatterns`` (and ``attributes``), importable for ``ROOT_URLCONF``."""
    module = types.ModuleType(name)
    module.urlpatterns = urlpatterns
    vars(module).update(attributes)
    monkeypatch.setitem(sys.modules, name, module)
    return name


class Recorded:
    """A stand-in for a model of the reader's project (``OrderTotal``, ``PaidOrder``): its manager records
    the calls and keeps ``get_or_create``'s rows by their lookup."""

    def __init__(self, on_call=None):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.rows: dict[tuple, dict] = {}
        self.on_call = on_call
        self.objects = self

    def create(self, *args, **kwargs):
        self.calls.append(("create", args, kwargs))
        if self.on_call:
            self.on_call()

    def get_or_create(self, defaults=None, **lookup):
        self.calls.append(("get_or_create", (), {"defaults": defaults, **lookup}))
        key = tuple(sorted(lookup.items()))
        created = key not in self.rows
        self.rows.setdefault(key, {**lookup, **(defaults or {})})
        return self.rows[key], created


# --- Installing in your project ------------------------------------------------------------------------


def test_the_settings_snippet_defines_what_it_says_and_passes_the_system_checks(outside_tests):
    """"## Installing in your project": the INSTALLED_APPS / REST_FRAMEWORK / WOW settings. Run as written
    (``...`` in INSTALLED_APPS is the project's own apps); its WOW passes ``manage.py check``'s wow_django
    checks (run outside Django's test environment, as ``manage.py check`` is, in a DEBUG project: the
    warnings about DEBUG-off deployments are the Settings section's business) and puts the stores in the
    project's database; with the commented MONGO_URI line enabled, in MongoDB."""
    from django.core import checks

    from wow_django.conf import validate_user_settings, wow_settings

    namespace: dict = {}
    assert run("settings", namespace) == []
    assert namespace["INSTALLED_APPS"] == [..., "rest_framework", "drf_spectacular", "wow_django", "wow_django.bus"]
    assert namespace["REST_FRAMEWORK"] == {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
    assert namespace["SPECTACULAR_SETTINGS"] == {"OAS_VERSION": "3.1.0"}
    assert namespace["WOW"] == {"CONTEXT_NAME": "order-service"}
    # With these settings the API's schema is a valid OpenAPI document (without OAS_VERSION it is not:
    # a 3.0.3 header over 3.1 forms, found by a new user running `manage.py spectacular --validate`).
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.validation import validate_schema

    with override_settings(SPECTACULAR_SETTINGS=namespace["SPECTACULAR_SETTINGS"],
                           REST_FRAMEWORK=namespace["REST_FRAMEWORK"]):
        schema = SchemaGenerator().get_schema(request=None, public=True)
        assert schema["openapi"] == "3.1.0"
        validate_schema(schema)
    assert validate_user_settings(namespace["WOW"]) == []
    with override_settings(WOW=namespace["WOW"], REST_FRAMEWORK=namespace["REST_FRAMEWORK"], DEBUG=True):
        assert checks.run_checks(tags=["wow_django"]) == []
        assert (wow_settings.CONTEXT_NAME, wow_settings.STORAGE, wow_settings.DATABASE_ALIAS) == (
            "order-service", "django", "default")
        assert {wow_settings.storage_for(p) for p in ("EVENT_STORE", "SNAPSHOT_STORE", "PREPARE_STORE",
                                                      "BUS_STORE")} == {"django"}

    commented = '# "MONGO_URI": "mongodb://db:27017/orders",'
    assert commented in block("settings")
    with_mongo: dict = {}
    exec(compile(block("settings").replace(commented, commented[2:]), "README.md (settings, MONGO_URI)", "exec",
                 dont_inherit=True), with_mongo)
    assert with_mongo["WOW"] == {"CONTEXT_NAME": "order-service", "MONGO_URI": "mongodb://db:27017/orders"}
    with override_settings(WOW=with_mongo["WOW"], DEBUG=True):
        assert checks.run_checks(tags=["wow_django"]) == []  # a database named, a server's URI: no E002, no W001
        assert wow_settings.STORAGE == "mongo"


# --- Storage ---------------------------------------------------------------------------------------------


def test_the_conformance_suite_snippet_runs_the_event_store_contract():
    """"### Conformance suite": the TestMyEventStore case, run with unittest: every test of the
    EventStoreContract passes on the embedded engine."""
    from wow_django.testing import EventStoreContract

    namespace: dict = {"__name__": "README"}
    run("conformance", namespace)
    case = namespace["TestMyEventStore"]
    contract = [name for name in dir(EventStoreContract) if name.startswith("test")]
    assert contract
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
    assert result.errors + result.failures == [] and result.testsRun == len(contract)


# --- Followers -------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_follower_snippet_declares_a_transactional_follower_that_runs():
    """"## Followers": the @follower declaration, on the README's Order. ``OrderTotal`` is the reader's
    model, which the snippet presupposes: a stand-in records the ``create(...)`` calls (and whether they
    run inside a transaction of the database the checkpoint is written to). On the suite's settings —
    the django backend, which a transactional follower needs — isolated as a project's tests are."""
    from django.db import connections

    from wow_django.application import send
    from wow_django.application.followers import followers
    from wow_django.application.following import wait_caught_up
    from wow_django.conf import wow_settings
    from wow_django.persistence.followers import PositionedStream

    def in_transaction():
        atomic.append(connections[wow_settings.DATABASE_ALIAS].in_atomic_block)

    atomic: list[bool] = []
    order_total = Recorded(on_call=in_transaction)
    namespace: dict = {"__name__": "README", "OrderTotal": order_total}
    with fresh_declarations(), isolated_wow():
        run("modeling", namespace)
        run("follower", namespace)
        declared = followers().get("order-totals")
        assert declared.handler is namespace["order_totals"]
        assert (declared.aggregates, declared.events, declared.transactional) == (
            frozenset({"order"}), frozenset({"order_placed"}), True)

        placed = send(namespace["PlaceOrder"](customer_id="c-1", amount=Decimal("9.90")))
        send(namespace["PayOrder"](amount=Decimal("9.90")), aggregate_id=placed.aggregate_id)  # no order_placed
        assert wait_caught_up(["order-totals"], timeout=20)
    assert order_total.calls == [("create", (...,), {})]  # once: the stream holding order_placed
    assert atomic == [True]
    assert PositionedStream.__dataclass_fields__.keys() == {"position", "stream"}  # "item: PositionedStream(...)"


# --- Modeling ----------------------------------------------------------------------------------------------


def test_the_modeling_snippet_and_its_aggregate_spec_tests_run_as_written():
    """"## Modeling": the Order declarations, then the AggregateSpec tests written against them."""
    namespace: dict = {}
    with use_registry(Registry()):  # the README's "order" beside the sample's own
        run("modeling", namespace)
        run("aggregate spec", namespace)
        tests = [name for name in namespace if name.startswith("test_")]
        assert tests == ["test_paying_the_total", "test_a_wrong_amount_is_refused"]
        for name in tests:
            namespace[name]()


@pytest.mark.django_db(transaction=True)
def test_the_isolation_snippet_runs_as_written(wow_isolation):
    """"### Testing your aggregates": the TestCase with the mixin (its two tests in both orders, each
    reusing one request id) and the pytest function with the fixture, on the suite's settings (the django
    backend) and the README's Order."""
    namespace: dict = {"__name__": "README"}
    with use_registry(Registry()), use_followers(FollowerRegistry()):
        run("modeling", namespace)
        run("isolation", namespace)
        cases = namespace["PlacingOrders"]
        names = ["test_placing_an_order", "test_the_same_request_in_another_test"]
        for order in (names, names[::-1]):
            result = unittest.TestResult()
            unittest.TestSuite(cases(name) for name in order).run(result)
            assert result.errors + result.failures == [] and result.testsRun == 2
        namespace["test_placing_an_order"](wow_isolation)


# --- The command gateway -----------------------------------------------------------------------------------


def test_the_gateway_snippet_runs_as_written():
    """"## The command gateway": the two sends on the modeling snippet's Order (in-memory stores, the
    runtime's background work in threads as in production), and what its expression lines show."""
    from wow_django.application import WaitStage, get_runtime
    from wow_django.application.gateway import CommandGateway

    namespace: dict = {}
    with readme_world():
        run("modeling", namespace)
        ids, paid, gateway = run("gateway", namespace)
        result = namespace["result"]
        assert ids == (result.aggregate_id, 1, WaitStage.PROJECTED) and not result.duplicate
        assert (paid.aggregate_id, paid.aggregate_version, paid.stage) == (result.aggregate_id, 2,
                                                                           WaitStage.PROCESSED)  # the default
        assert isinstance(gateway, CommandGateway) and gateway is get_runtime().gateway
        assert all(callable(getattr(gateway, name)) for name in ("send_json", "process_message"))
        order = gateway.repository.load(namespace["Order"], result.aggregate_id, tenant_id="acme")
        assert (order.version, order.state.status) == (2, "PAID")


def test_the_expected_version_snippet_runs_as_written():
    """"## The command gateway", **Expected version**: on the modeling snippet's Order, in-memory stores."""
    namespace: dict = {}
    with use_registry(Registry()), override_settings(WOW=fresh_wow("in_memory")):
        run("modeling", namespace)
        run("expected version", namespace)
        from wow_django.application.runtime import get_runtime
        from wow_django.persistence.records import AggregateId

        stored = get_runtime().event_store.load(AggregateId("order", namespace["placed"].aggregate_id))
        assert [s.version for s in stored] == [1, 2]  # the third send was refused: nothing appended


def test_the_projection_and_event_processor_snippet_runs_as_written():
    """"## The command gateway": the paid-orders projection and the order-purchased-relay processor, on the
    modeling snippet's Order, in-memory stores and the memory:// bus. ``PaidOrder`` is the reader's model,
    which the snippet presupposes: a stand-in keeps ``get_or_create``'s rows. The bus section's set-up — an
    enabled consumer of order.purchased — is done first, or the relay's send stores nothing. Then each
    message is handed to both handlers again (at least once): still one row, one bus record."""
    from wow_django.application import WaitStage, get_runtime, send
    from wow_django.application.following import wait_caught_up
    from wow_django.application.repository import stream_messages
    from wow_django.bus import get_bus
    from wow_django.persistence.records import AggregateId

    exchange = unique_exchange()
    paid_order = Recorded()
    namespace: dict = {"__name__": "README", "PaidOrder": paid_order}
    try:
        with readme_world(BUS_EXCHANGE=exchange):
            run("modeling", namespace)
            run("projections", namespace)
            get_bus().set_topic_consumer("order.purchased", "member-service")
            placed = send(namespace["PlaceOrder"](customer_id="c-1", amount=Decimal("9.90")))
            paid = send(namespace["PayOrder"](amount=Decimal("9.90")), aggregate_id=placed.aggregate_id,
                        wait=WaitStage.PROJECTED)
            assert paid.stage == WaitStage.PROJECTED
            row = {"order_id": placed.aggregate_id, "amount": Decimal("9.90")}
            assert list(paid_order.rows.values()) == [row]  # PROJECTED: the projection has passed it
            assert wait_caught_up(["order-purchased-relay"], timeout=20)  # processors are not waited for

            [paid_stream] = [s for s in get_runtime().event_store.load(AggregateId("order", placed.aggregate_id))
                             if s.version == 2]
            [message] = list(stream_messages(paid_stream))
            bus = get_bus()
            event = bus.get_event(f"evt-{message.event_id}")
            assert (event["topic"], event["payload"]) == ("order.purchased", {"orderId": placed.aggregate_id})
            namespace["record_paid"](message)
            namespace["publish_purchase"](message)  # handed again
            assert list(paid_order.rows.values()) == [row]
            assert bus.list_events(topic="order.purchased")["total"] == 1
    finally:
        delete_amqp_entities("memory://", exchange, ["member-service"])


def test_the_status_snippet_runs_as_written(queued_commands):
    """"### What became of a command": a SENT create command, then its status by request id. The worker is
    the suite's ``queued_commands`` (the Celery task run in-line when queued): "once a worker ran it"."""
    from wow_django.application import WaitStage

    namespace: dict = {"Decimal": Decimal}
    with readme_world():
        run("modeling", namespace)
        [shown] = run("status", namespace)
        assert namespace["queued"].stage == WaitStage.SENT and len(queued_commands) == 1
        assert shown == (WaitStage.PROJECTED, "Ok", 1)


def test_the_reading_snippet_runs_after_the_gateway_snippet():
    """"### Reading from Python": ``result`` and ``Order`` are the gateway and modeling snippets', run first
    in the same namespace (in-memory stores; inline, so the PayOrder's snapshot is written before its
    ``send`` returns and the snapshot queries find the order PAID)."""
    namespace: dict = {}
    with readme_world(inline=True):
        run("modeling", namespace)
        run("gateway", namespace)
        state, listed, paged, count = run("reading", namespace)
        result = namespace["result"]
        assert state == (2, "PAID", Decimal("9.90")) and type(state[2]) is Decimal
        assert [(d["aggregateId"], d["version"], d["state"]["status"]) for d in listed] == [
            (result.aggregate_id, 2, "PAID")]
        assert paged.total == 1 and [d["aggregateId"] for d in paged.list] == [result.aggregate_id]
        assert count == 1
        runtime = namespace["runtime"]
        assert runtime.gateway.repository.load(namespace["Order"], "absent", tenant_id="acme") is None
        assert runtime.snapshot_queries("order").count(namespace["paid"], tenant_id="other") == 0  # the tenant


# --- Queries and the HTTP API ------------------------------------------------------------------------------


def test_the_api_urlconf_snippet_serves_the_schema_the_docs_and_the_api(monkeypatch, client):
    """"## Queries and the HTTP API": the URLconf, run as written into a module that is the ROOT_URLCONF:
    the schema and the docs answer 200, another api/ path is a JSON 404, and a Host header Django does not
    allow is a JSON 400 on the API's routes (handler400) and Django's own page elsewhere."""
    namespace: dict = {}
    run("api urls", namespace)
    urls = urlconf_module(monkeypatch, "readme_api_urls", namespace["urlpatterns"],
                          handler400=namespace["handler400"])
    with override_settings(ROOT_URLCONF=urls, ALLOWED_HOSTS=["testserver"], WOW=fresh_wow("in_memory")):
        schema = client.get("/api/schema/?format=json")
        assert schema.status_code == 200 and schema.json()["openapi"].startswith("3.")
        assert any(route.startswith("/api/") for route in schema.json()["paths"])
        docs = client.get("/api/docs/")
        assert docs.status_code == 200 and b"swagger" in docs.content.lower()
        missing = client.get("/api/no-such-thing/")
        assert missing.status_code == 404 and missing["Content-Type"] == "application/json"
        api_route = str(next(iter(schema.json()["paths"]))).replace("{", "").replace("}", "")
        refused = client.get(api_route, HTTP_HOST="evil.example")
        assert refused.status_code == 400 and refused["Content-Type"] == "application/json"
        elsewhere = client.get("/elsewhere/", HTTP_HOST="evil.example")
        assert elsewhere.status_code == 400 and elsewhere["Content-Type"].startswith("text/html")


# --- The integration-event bus -----------------------------------------------------------------------------


def test_the_bus_snippet_runs_as_written():
    """"## The integration-event bus": the topic consumer, a send, the member-service consumer; on in-memory
    stores and the memory:// transport, the consumer declared in a fresh consumer registry. A worker of
    member-service then handles the event (CONSUMED) and its child: the test enables a consumer of
    points.added first (without one that send stores nothing), so the child's trace can be checked."""
    from wow_django.bus import get_bus
    from wow_django.bus.consumer import consumers
    from wow_django.testing.bus import RunningConsumers, event_status

    exchange = unique_exchange()
    namespace: dict = {"__name__": "README"}
    try:
        with readme_world(BUS_EXCHANGE=exchange):
            run("bus", namespace)
            bus = get_bus()
            [sent] = bus.list_events(topic="order.purchased")["list"]
            assert (sent["payload"], sent["partitionKey"]) == ({"orderId": "o-1", "amount": "199.00"}, "o-1")
            assert [c["consumerId"] for c in bus.topic_consumers(topic="order.purchased")] == ["member-service"]
            assert consumers().handlers_of("member-service")["order.purchased"].fn is namespace["add_points"]

            bus.set_topic_consumer("points.added", "message-service")
            with RunningConsumers("member-service"):
                wait_for(lambda: event_status(sent["eventId"]) == "CONSUMED", what="CONSUMED")
            [child] = bus.list_events(topic="points.added")["list"]
            assert child["payload"] == {"points": 199}
            assert (child["traceId"], child["parentEventId"]) == (sent["traceId"], sent["eventId"])
    finally:
        delete_amqp_entities("memory://", exchange, ["member-service", "message-service"])


# --- Console -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_console_urlconf_snippet_mounts_the_console_before_the_admin(monkeypatch, admin_client):
    """"## Console": the URLconf lines. The snippet presupposes the URLconf's imports (``path``,
    ``include``, ``admin``: given here) and its ``...`` stands for the project's other routes (left out
    of the mounted urlpatterns). A superuser reaches the console at admin/wow/ and the admin's link to
    it; mounted after the admin's own URLs instead, admin/wow/ is not the console."""
    from django.contrib import admin
    from django.urls import include, path

    namespace: dict = {"path": path, "include": include, "admin": admin}
    run("console urls", namespace)
    assert namespace["urlpatterns"][-1] is ...
    mounted = [pattern for pattern in namespace["urlpatterns"] if pattern is not ...]
    with override_settings(ROOT_URLCONF=urlconf_module(monkeypatch, "readme_console_urls", mounted),
                           WOW=fresh_wow("in_memory", BUS_EXCHANGE=unique_exchange())):
        console = admin_client.get("/admin/wow/")
        assert console.status_code == 200 and b"/admin/wow/events/" in console.content
        assert admin_client.get("/admin/wow_django/console/")["Location"] == "/admin/wow/"
        index = admin_client.get("/admin/")
        assert index.status_code == 200 and b"/admin/wow_django/console/" in index.content
    with override_settings(ROOT_URLCONF=urlconf_module(monkeypatch, "readme_console_urls_after", mounted[::-1])):
        assert admin_client.get("/admin/wow/").status_code == 404  # the admin takes it: no app "wow"


# --- Celery ------------------------------------------------------------------------------------------------

#: Runs the Celery snippet in a new interpreter, as ``celery -A myproject worker`` imports it (its app
#: becomes Celery's current app there, not in this process): DJANGO_SETTINGS_MODULE is set already.
CELERY_PROBE = """
import json, sys
namespace = {"__name__": "myproject.celery"}
exec(compile(sys.stdin.read(), "README.md (celery)", "exec", dont_inherit=True), namespace)
app = namespace["app"]
try:
    app.loader.import_default_modules()  # what a worker does at start: the autodiscovery runs
    print(json.dumps({"main": app.main, "discovered": sorted(app.loader.task_modules), "tasks": sorted(app.tasks),
                      "beat": app.conf.beat_schedule, "eager": app.conf.task_always_eager}))
finally:
    app.close()
"""


def test_the_celery_snippet_configures_the_app_from_django_and_discovers_wow_django_tasks():
    """"### Setting up Celery in a new project": ``myproject/celery.py``, run in a new interpreter with
    DJANGO_SETTINGS_MODULE already set (the suite's settings; ``myproject.settings`` is only its default).
    The app reads the CELERY_* settings (the suite's CELERY_TASK_ALWAYS_EAGER), its autodiscovery finds
    wow_django.tasks (Celery's own record of the task modules it discovered) and so wow_django's tasks, and
    its beat schedule is wow_django's: the relay and the resweep, the purge and the followers once
    configured (checked below, on beat_schedule() itself)."""
    from django.conf import settings

    from wow_django.tasks import beat_schedule

    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-c", CELERY_PROBE], input=block("celery"), capture_output=True,
                          text=True, cwd=ROOT, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert (probe["main"], probe["eager"]) == ("myproject", settings.CELERY_TASK_ALWAYS_EAGER)
    assert "wow_django.tasks" in probe["discovered"]
    assert {"wow_django.process_command", "wow_django.bus.relay_pending", "wow_django.bus.resweep",
            "wow_django.bus.purge", "wow_django.follow"} <= set(probe["tasks"])
    assert {name: entry["task"] for name, entry in probe["beat"].items()} == {
        "wow-bus-relay-pending": "wow_django.bus.relay_pending", "wow-bus-resweep": "wow_django.bus.resweep"}
    with override_settings(WOW=fresh_wow("in_memory", BUS_RETENTION_DAYS=30, FOLLOWERS_RUN="celery")):
        assert {entry["task"] for entry in beat_schedule().values()} == {
            "wow_django.bus.relay_pending", "wow_django.bus.resweep", "wow_django.bus.purge", "wow_django.follow"}


# --- every snippet ------------------------------------------------------------------------------------------


def test_every_python_block_of_the_readme_is_covered_by_a_test():
    """Each python block of the README is picked by exactly one name of SNIPPETS, and each name is run by
    some test of this module: a new snippet without a test fails here."""
    assert len(PYTHON_BLOCKS) == len(SNIPPETS)
    for number, code in enumerate(PYTHON_BLOCKS):
        names = [name for name, text in SNIPPETS.items() if text in code]
        assert len(names) == 1, f"README python block #{number} is picked by {names or 'no name'}:\n{code}"
    source = ast.parse(Path(__file__).read_text())
    used = {call.args[0].value for test in source.body
            if isinstance(test, ast.FunctionDef) and test.name.startswith("test_")
            for call in ast.walk(test)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("run", "block")
            and call.args and isinstance(call.args[0], ast.Constant)}
    assert used == set(SNIPPETS)


def test_the_tenant_resolver_snippet_reads_the_tenant_of_the_users_membership():
    """"## Queries and the HTTP API": a UserTenantResolver pointed at a field of the project's own."""
    from rest_framework.exceptions import PermissionDenied

    from wow_django.http.tenancy import UserTenantResolver

    namespace: dict = {"UserTenantResolver": UserTenantResolver}
    run("tenant resolver", namespace)
    resolver = namespace["MembershipTenantResolver"]()

    def request(user):
        return types.SimpleNamespace(user=user, headers={})

    member = types.SimpleNamespace(is_authenticated=True, membership=types.SimpleNamespace(tenant_id="shop-eu"))
    assert resolver.resolve(request(member)) == "shop-eu"
    stranger = types.SimpleNamespace(is_authenticated=True)
    with pytest.raises(PermissionDenied, match="belongs to no tenant"):
        resolver.resolve(request(stranger))
