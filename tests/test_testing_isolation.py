"""wow_django.testing's per-test isolation of every store (IsolatedWowMixin, isolated_wow, the pytest fixture
wow_isolation), tested the way a project's tests meet it.

The user's report: two tests of a project that send a command with the same request id; the second got
``duplicate=True``. Here such tests are written as a user writes them (a ``TestCase`` and a
``TransactionTestCase`` with the settings on the class) and run, in both orders, on each backend:
in-memory, the embedded Mongo engine (``mongomock://``), and the django backend on SQLite (``wow_sqlite``)
and PostgreSQL (``wow_pg``). Without the isolation the same tests show the leak — so these tests would
see one: the second request is answered as a duplicate (in-memory, mongomock), or, in a ``TestCase`` on
PostgreSQL, the snapshot the dispatch lane committed through its own connection outlives the test's
rollback and the second create finds an aggregate whose events are gone. The pytest fixture and the
mixin are also run in a new ``django-admin startproject`` (``manage.py test`` and pytest), in subprocesses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import unittest
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase, TransactionTestCase, override_settings
from kombu import Connection

from sample_project.orders.aggregates import OrderLine, PlaceOrder
from sample_project.orders.models import OrderSummary
from wow_django.application import WaitStage, get_runtime, send
from wow_django.application.followers import FollowerRegistry, use_followers
from wow_django.application.following import wait_caught_up
from wow_django.application.repository import encode_events
from wow_django.application.runtime import close_runtime, inline_background
from wow_django.backends.mongo.client import connect, disconnect
from wow_django.bus.consumer import ConsumerRegistry, use_consumers
from wow_django.domain import Aggregate, Command, Event, State, creates, event_processor, projection, sourcing
from wow_django.domain.registry import Registry, use_registry
from wow_django.persistence.records import AggregateId, EventStream, now_ms
from wow_django.testing import (
    IsolatedWowMixin,
    WowTestCase,
    isolated_wow,
    real_mongo_uri,
    requires_real_mongo,
)
from wow_django.testing.isolation import _isolated_settings

ROOT = Path(__file__).resolve().parent.parent
MONGOMOCK_URI = "mongomock://localhost/isolation_tests"  # one database for the whole run, as in a project
BACKENDS = {
    "in_memory": {"STORAGE": "in_memory"},
    "mongomock": {"STORAGE": "mongo", "MONGO_URI": MONGOMOCK_URI},
    "django-sqlite": {"STORAGE": "django", "DATABASE_ALIAS": "wow_sqlite"},
    "django-pg": {"STORAGE": "django", "DATABASE_ALIAS": "wow_pg"},
}
ALL_DATABASES = ["default", "wow_sqlite", "wow_pg"]
ON_EVERY_DATABASE = pytest.mark.django_db(databases=ALL_DATABASES, transaction=True)


def wow_settings_for(backend: str, **extra) -> dict:
    return {"CONTEXT_NAME": "shop", "BUS_TRANSPORT_URL": "memory://", "COMMAND_RETRY_BACKOFF_MS": 0.5,
            **BACKENDS[backend], **extra}


@pytest.fixture
def shop():
    """A registry holding only the shop's cart (the sample's declarations and followers out of the way);
    afterwards nothing of a run is left: runtime closed, the embedded engine's data dropped."""
    with use_registry(Registry()), use_followers(FollowerRegistry()), use_consumers(ConsumerRegistry()):
        declared = declare_cart()
        try:
            yield declared
        finally:
            close_runtime()
            disconnect(MONGOMOCK_URI)


def declare_cart() -> dict:
    class OpenCart(Command, name="open_cart"):
        customer: str

    class CartOpened(Event, name="cart_opened"):
        customer: str

    class CartState(State):
        customer: str = ""

        @sourcing(CartOpened)
        def _opened(self, event):
            self.customer = event.customer

    class Cart(Aggregate, name="cart", state=CartState):
        @creates(OpenCart)
        def open(self, command):
            return CartOpened(customer=command.customer)

    return {"OpenCart": OpenCart, "CartOpened": CartOpened, "Cart": Cart}


# --- the user's tests ------------------------------------------------------------------------------------


def user_tests(base: type, *, isolated: bool, wow: dict, open_cart: type, seen: list) -> type:
    """Two tests as the user wrote them: each opens a cart with request id "req-1" (the settings on the class)."""

    def opening_a_cart(self):
        try:
            result = send(open_cart(customer="c-1"), request_id="req-1", wait=WaitStage.SNAPSHOT)
        except Exception as exc:
            seen.append(type(exc).__name__)
            raise
        seen.append("duplicate" if result.duplicate else "new")
        self.assertFalse(result.duplicate)
        self.assertEqual(result.error_code, "Ok", result.error_msg)

    bases = (IsolatedWowMixin, base) if isolated else (base,)
    cls = type("CartTests", bases, {"databases": {"default", wow.get("DATABASE_ALIAS", "default")},
                                     "test_first": opening_a_cart, "test_second": opening_a_cart,
                                     "__module__": __name__})
    return override_settings(WOW=wow)(cls)


def run_in_order(cls: type, names: list[str]) -> unittest.TestResult:
    result = unittest.TestResult()
    unittest.TestSuite(cls(name) for name in names).run(result)
    return result


def problems(result: unittest.TestResult) -> list[str]:
    return [text for _test, text in result.errors + result.failures]


@ON_EVERY_DATABASE
@pytest.mark.parametrize("order", [["test_first", "test_second"], ["test_second", "test_first"]])
@pytest.mark.parametrize("base", [TestCase, TransactionTestCase])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_two_tests_reusing_a_request_id_both_get_a_new_command_with_the_mixin(shop, backend, base, order):
    seen: list[str] = []
    result = run_in_order(user_tests(base, isolated=True, wow=wow_settings_for(backend), open_cart=shop["OpenCart"],
                                     seen=seen), order)
    assert problems(result) == [] and result.testsRun == 2
    assert seen == ["new", "new"]


#: What the second of the same two tests sees without the isolation.
LEAKS = {
    # The runtime (and its in-memory stores) lives as long as the settings do: the class's.
    ("in_memory", TestCase): "duplicate", ("in_memory", TransactionTestCase): "duplicate",
    # The embedded engine keeps its data for the process: nothing clears it.
    ("mongomock", TestCase): "duplicate", ("mongomock", TransactionTestCase): "duplicate",
    # The snapshot step ran in a dispatch lane, whose own connection committed the snapshot outside the
    # test's transaction: the rollback took the events, the snapshot stayed, and the second create finds
    # an aggregate (the derived id of the same request id) whose request is nowhere.
    ("django-pg", TestCase): "DuplicateAggregateId",
    # Django's flush after each test cleans the tables; the snapshot was written before it (wait=SNAPSHOT).
    ("django-pg", TransactionTestCase): "new", ("django-sqlite", TransactionTestCase): "new",
}


@ON_EVERY_DATABASE
@pytest.mark.parametrize("backend, base", sorted(LEAKS, key=str))
def test_without_the_isolation_the_same_tests_see_the_leak(shop, backend, base):
    seen: list[str] = []
    # The leaks of the dispatch lane's snapshot (SNAPSHOT_MODE "inline"); the snapshot follower's thread reads
    # only committed streams, so inside a test's transaction it would wait out the SNAPSHOT stage instead.
    wow = wow_settings_for(backend, SNAPSHOT_MODE="inline")
    result = run_in_order(user_tests(base, isolated=False, wow=wow, open_cart=shop["OpenCart"],
                                     seen=seen), ["test_first", "test_second"])
    assert seen == ["new", LEAKS[backend, base]]
    assert result.wasSuccessful() is (LEAKS[backend, base] == "new")


# --- inside the test's transaction: the background work in the test's thread -----------------------------


@ON_EVERY_DATABASE
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_in_a_testcase_projections_and_processors_run_in_the_tests_thread(shop, backend):
    """A projection keeps a read model, a processor sends a command: both done, inside the test's transaction,
    by the time send returns — PROJECTED included — and no follower thread or dispatch lane was started."""
    open_cart = shop["OpenCart"]
    read_model: dict[str, list[str]] = {}
    processed: list[str] = []
    seen: list[str] = []

    @projection("cart", name="carts-by-customer")
    def by_customer(message):
        read_model.setdefault(message.event.customer, []).append(message.aggregate_id.id)

    @event_processor("cart", name="welcome-carts")
    def welcome(message):
        processed.append(message.event.customer)
        if message.event.customer == "c-1":  # a command from inside a follower: run again from there
            send(open_cart(customer="welcome-c-1"), request_id="welcome-req-1", wait=WaitStage.PROJECTED)

    class Carts(IsolatedWowMixin, TestCase):
        databases = {"default", BACKENDS[backend].get("DATABASE_ALIAS", "default")}

        def test_projected(self):
            result = send(open_cart(customer="c-1"), request_id="req-1", wait=WaitStage.PROJECTED)
            self.assertEqual((result.stage, result.error_code), (WaitStage.PROJECTED, "Ok"), result.error_msg)
            self.assertTrue(self.wow_isolation.inline)
            self.assertEqual(sorted(read_model), ["c-1", "welcome-c-1"])
            self.assertEqual(processed, ["c-1", "welcome-c-1"])
            self.assertTrue(wait_caught_up(timeout=0))
            seen.extend(t.name for t in threading.enumerate() if t.name.startswith("wow-"))

    Carts = override_settings(WOW=wow_settings_for(backend))(Carts)
    result = run_in_order(Carts, ["test_projected"])
    assert problems(result) == [] and seen == []


@pytest.mark.django_db(databases=["default", "wow_sqlite"])
def test_an_append_outside_the_gateway_is_followed_when_the_test_waits_for_the_followers(shop):
    handled: list[int] = []

    @projection("cart", name="cart-versions")
    def versions(message):
        handled.append(message.version)

    with override_settings(WOW=wow_settings_for("django-sqlite")), isolated_wow() as isolation:
        assert isolation.inline
        get_runtime().event_store.append(EventStream(
            id="s-1", aggregate_id=AggregateId("cart", "cart-1", "shop"), version=1,
            body=encode_events([shop["CartOpened"](customer="c-9")]), request_id="r-1", command_id="c-1",
            create_time=now_ms()))
        assert handled == []  # nothing runs on its own in the test's thread
        assert wait_caught_up(timeout=0) and handled == [1]


def test_catch_up_followers_is_for_an_inline_runtime_only(shop):
    with override_settings(WOW=wow_settings_for("in_memory")), inline_background(False):
        with pytest.raises(RuntimeError, match="inline"):
            get_runtime().catch_up_followers()


@pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
@pytest.mark.parametrize("mode, thread", [("follower", "wow-follower-wow-snapshots"), ("inline", "wow-dispatch-")])
def test_outside_a_transaction_the_background_work_runs_as_in_production_and_is_finished_after(shop, mode, thread):
    saved: list[int] = []
    with override_settings(WOW=wow_settings_for("django-sqlite", SNAPSHOT_MODE=mode)):
        with isolated_wow() as isolation:
            assert not isolation.inline
            result = send(shop["OpenCart"](customer="c-1"), request_id="req-1")  # PROCESSED: saved later
            assert any(t.name.startswith(thread) for t in threading.enumerate())
        # Leaving closed the runtime: the lane, or the snapshot follower catching up, saved the snapshot before
        # anything was cleared or flushed.
        saved.append(get_runtime().snapshot_store.load(AggregateId("cart", result.aggregate_id, "shop")).version)
    assert saved == [1]


# --- the sample's read model in a TestCase ------------------------------------------------------------------

LINE = OrderLine(sku="A-1", quantity=2, unit_price=Decimal("3.50"))


class TestSampleOrdersInATestCase(WowTestCase):
    """The sample's settings (the django backend on ``default``) and its ORM read model, ``OrderSummary``,
    kept by the projection ``order-summaries``: each test places order "order-req-1" anew, and finds only
    its own summary row (written in the test's transaction, rolled back with it)."""

    @classmethod
    def setUpTestData(cls):
        # What setUpTestData sends stays for every test on the django backend (the class's transaction).
        cls.setup_order = send(PlaceOrder(customer_id="c-0", items=[LINE]), request_id="setup-req",
                               wait=WaitStage.PROJECTED)

    def place(self):
        result = send(PlaceOrder(customer_id="c-1", items=[LINE]), request_id="order-req-1", wait=WaitStage.PROJECTED)
        self.assertFalse(result.duplicate)
        self.assertEqual((result.stage, result.error_code), (WaitStage.PROJECTED, "Ok"), result.error_msg)
        self.assertEqual(sorted(OrderSummary.objects.values_list("customer_id", flat=True)), ["c-0", "c-1"])
        self.assertEqual(self.setup_order.stage, WaitStage.PROJECTED)

    def test_placing_an_order(self):
        self.place()

    def test_placing_the_same_order_in_another_test(self):
        self.place()


# --- MongoDB: the test databases of a server, and its data ---------------------------------------------------


def test_on_a_server_the_stores_use_the_test_databases():
    user = {"MONGO_URI": "mongodb://db.invalid:27017/shop", "BUS_DATABASE": "bus",
            "SNAPSHOT_DATABASE": "test_snapshots"}
    with override_settings(WOW=user):
        wow, databases = _isolated_settings()
    assert wow == {**user, "EVENT_STREAM_DATABASE": "test_shop", "PREPARE_DATABASE": "test_shop",
                   "BUS_DATABASE": "test_bus"}
    uri = user["MONGO_URI"]
    assert databases == [(uri, "test_shop"), (uri, "test_snapshots"), (uri, "test_bus")]
    with override_settings(WOW={**user, "MONGO_URI": "mongomock://localhost/shop"}):  # nothing to protect
        wow, databases = _isolated_settings()
    assert "EVENT_STREAM_DATABASE" not in wow and databases[0] == ("mongomock://localhost/shop", "shop")
    with override_settings(WOW={"MONGO_URI": "mongodb://db.invalid:27017"}):  # no database: the runtime says so
        assert _isolated_settings()[1] == []
        with pytest.raises(ImproperlyConfigured):
            get_runtime().event_store  # noqa: B018
    disconnect("mongodb://db.invalid:27017")


def test_the_embedded_engine_is_emptied_before_and_after_each_test(shop):
    with override_settings(WOW=wow_settings_for("mongomock")):
        leftover = connect(MONGOMOCK_URI).database("isolation_tests")["users_own_read_model"]
        leftover.insert_one({"_id": "from-an-earlier-run"})
        with isolated_wow() as isolation:
            assert isolation.mongo_databases == ("isolation_tests",)
            assert leftover.count_documents({}) == 0
            send(shop["OpenCart"](customer="c-1"), request_id="req-1")
            leftover.insert_one({"_id": "from-this-test"})
        assert leftover.count_documents({}) == 0
        assert connect(MONGOMOCK_URI).database("isolation_tests")["cart_event_stream"].count_documents({}) == 0


@requires_real_mongo
@ON_EVERY_DATABASE
@pytest.mark.parametrize("base", [TestCase, TransactionTestCase])
def test_on_a_real_server_two_tests_reusing_a_request_id(shop, base):
    uri = real_mongo_uri().rstrip("/") + "/isolation_tests"
    try:
        seen: list[str] = []
        tests = user_tests(base, isolated=True, wow={**wow_settings_for("in_memory"), "STORAGE": "mongo", "MONGO_URI": uri},
                           open_cart=shop["OpenCart"], seen=seen)
        result = run_in_order(tests, ["test_first", "test_second"])
        assert problems(result) == [] and seen == ["new", "new"]
        database = connect(uri).database("test_isolation_tests")
        assert all(database[name].count_documents({}) == 0 for name in database.list_collection_names())
        assert "isolation_tests" not in connect(uri).client.list_database_names()
    finally:
        connect(uri).client.drop_database("test_isolation_tests")
        disconnect(uri)


def test_messages_left_on_the_memory_bus_are_dropped(shop):
    with override_settings(WOW=wow_settings_for("in_memory", BUS_EXCHANGE="isolation.bus")):
        with Connection("memory://") as connection:
            queue = connection.SimpleQueue("isolation.bus.member-service")
            other = connection.SimpleQueue("another.exchange.member-service")
            queue.put({"left": "by an earlier test"})
            other.put({"not": "ours"})
            with isolated_wow():
                assert queue.qsize() == 0
                queue.put({"left": "by this test"})
            assert queue.qsize() == 0 and other.qsize() == 1
            other.clear()


# --- where users meet it: a new project -------------------------------------------------------------------------

APP_AGGREGATES = '''
from wow_django.domain import Aggregate, Command, Event, State, creates, projection, sourcing

class OpenCart(Command, name="open_cart"):
    customer: str

class CartOpened(Event, name="cart_opened"):
    customer: str

class CartState(State):
    customer: str = ""

    @sourcing(CartOpened)
    def _opened(self, event):
        self.customer = event.customer

class Cart(Aggregate, name="cart", state=CartState):
    @creates(OpenCart)
    def open(self, command):
        return CartOpened(customer=command.customer)
'''

APP_PROJECTIONS = '''
from wow_django.domain import projection
from shop.models import CartSummary

@projection("cart", name="cart-summaries")
def summarise(message):
    CartSummary.objects.get_or_create(cart_id=message.aggregate_id.id,
                                      defaults={"customer": message.event.customer})
'''

APP_MODELS = '''
from django.db import models

class CartSummary(models.Model):
    cart_id = models.CharField(max_length=64, unique=True)
    customer = models.CharField(max_length=64)
'''

APP_TESTS = '''
from django.test import TestCase, TransactionTestCase, override_settings
from wow_django.application import WaitStage, send
from wow_django.testing import IsolatedWowMixin

from shop.aggregates import OpenCart
from shop.models import CartSummary

ON = {
    "memory": {"CONTEXT_NAME": "shop", "STORAGE": "in_memory"},
    "mongomock": {"CONTEXT_NAME": "shop", "MONGO_URI": "mongomock://localhost/shop"},
}


class OpeningCarts(IsolatedWowMixin, TestCase):
    def open(self):
        result = send(OpenCart(customer="c-1"), request_id="req-1", wait=WaitStage.PROJECTED)
        self.assertFalse(result.duplicate)
        self.assertEqual(result.stage, WaitStage.PROJECTED)
        self.assertEqual(list(CartSummary.objects.values_list("customer", flat=True)), ["c-1"])

    def test_a_cart(self):
        self.open()

    def test_the_same_cart_again(self):
        self.open()


class OpeningCartsCommitted(IsolatedWowMixin, TransactionTestCase):
    test_a_cart = OpeningCarts.open
    test_the_same_cart_again = OpeningCarts.open


@override_settings(WOW=ON["memory"])
class OpeningCartsInMemory(OpeningCarts):
    pass


@override_settings(WOW=ON["mongomock"])
class OpeningCartsOnMongomock(OpeningCarts):
    pass


@override_settings(WOW=ON["mongomock"])
class OpeningCartsOnMongomockCommitted(OpeningCartsCommitted):
    pass
'''

APP_PYTEST = '''
import pytest
from wow_django.application import WaitStage, send
from wow_django.exceptions import DuplicateAggregateId

from shop.aggregates import OpenCart
from shop.models import CartSummary


def open_cart(wait=WaitStage.PROCESSED):
    return send(OpenCart(customer="c-1"), request_id="req-1", wait=wait)


@pytest.mark.django_db
def test_leaky_first():
    assert not open_cart().duplicate


@pytest.mark.django_db
def test_leaky_second():
    try:
        print("LEAKY-SECOND duplicate=%s" % open_cart().duplicate)
    except DuplicateAggregateId:  # the first test's snapshot, committed by a background lane, outlived its rollback
        print("LEAKY-SECOND error=DuplicateAggregateId")


@pytest.mark.parametrize("round", [1, 2])
def test_isolated_a(wow_isolation, round):
    assert not open_cart().duplicate


@pytest.mark.parametrize("round", [1, 2])
def test_isolated_b(wow_isolation, round):
    assert not open_cart().duplicate


@pytest.mark.django_db
@pytest.mark.parametrize("round", [1, 2])
def test_isolated_read_model(wow_isolation, round):
    result = open_cart(WaitStage.PROJECTED)
    assert not result.duplicate and result.stage == WaitStage.PROJECTED
    assert list(CartSummary.objects.values_list("customer", flat=True)) == ["c-1"]
    assert wow_isolation.inline


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round", [1, 2])
def test_isolated_committed(wow_isolation, round):
    result = open_cart(WaitStage.PROJECTED)
    assert not result.duplicate and result.stage == WaitStage.PROJECTED and not wow_isolation.inline
    assert list(CartSummary.objects.values_list("customer", flat=True)) == ["c-1"]
'''

SETTINGS_TAIL = '''
import os
INSTALLED_APPS += ["rest_framework", "wow_django", "shop"]
WOW = {"CONTEXT_NAME": "shop"}  # the django backend on "default", as in a new project
if os.environ.get("SHOP_STORAGE") == "in_memory":
    WOW["STORAGE"] = "in_memory"
elif os.environ.get("SHOP_STORAGE") == "mongomock":
    WOW["MONGO_URI"] = "mongomock://localhost/shop"
CELERY_TASK_ALWAYS_EAGER = True
SILENCED_SYSTEM_CHECKS = ["wow_django.W002", "wow_django.W004", "wow_django.W006", "wow_django.W007"]
'''


@pytest.fixture(scope="module")
def new_project(tmp_path_factory) -> Path:
    """``django-admin startproject mysite`` and ``manage.py startapp shop``: the shop app declares a cart, a
    projection into an ORM model, and tests that use the isolation (nothing installed: the venv's Django
    and this checkout)."""
    root = tmp_path_factory.mktemp("newproject")
    bin_dir = Path(sys.executable).parent
    env = project_env()
    subprocess.run([str(bin_dir / "django-admin"), "startproject", "mysite", str(root)], check=True, env=env)
    subprocess.run([sys.executable, "manage.py", "startapp", "shop"], cwd=root, check=True, env=env)
    (root / "mysite" / "settings.py").write_text((root / "mysite" / "settings.py").read_text() + SETTINGS_TAIL)
    app = root / "shop"
    (app / "aggregates.py").write_text(APP_AGGREGATES)
    (app / "projections.py").write_text(APP_PROJECTIONS)
    (app / "models.py").write_text(APP_MODELS)
    (app / "tests.py").write_text(APP_TESTS)
    (app / "test_with_pytest.py").write_text(APP_PYTEST)
    (root / "conftest.py").write_text('pytest_plugins = ["wow_django.testing.pytest_plugin"]\n')
    subprocess.run([sys.executable, "manage.py", "makemigrations", "shop", "-v", "0"], cwd=root, check=True, env=env)
    return root


def project_env(**extra) -> dict:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DJANGO_", "WOW_", "PYTEST_")) and key != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_a_new_project_runs_its_isolated_tests_with_manage_py_test(new_project):
    done = subprocess.run([sys.executable, "manage.py", "test", "shop", "-v", "2"], cwd=new_project,
                          env=project_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Ran 10 tests" in done.stderr and "OK" in done.stderr


def run_pytest(project: Path, storage: str, tests: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "--ds=mysite.settings",
         *[f"shop/test_with_pytest.py::{name}" for name in tests]],
        cwd=project, env=project_env(SHOP_STORAGE=storage), capture_output=True, text=True, timeout=300)


# The default storage in the default tier; the other two (a new project's pytest run each) in the deep one.
@pytest.mark.parametrize("storage", ["django", pytest.param("in_memory", marks=pytest.mark.deep),
                                     pytest.param("mongomock", marks=pytest.mark.deep)])
def test_a_new_project_runs_its_isolated_tests_with_pytest(new_project, storage):
    # Both orders of the same two tests, then with a read model (TestCase-like and committed).
    order = ["test_isolated_a[1]", "test_isolated_b[1]", "test_isolated_b[2]", "test_isolated_a[2]",
             "test_isolated_read_model[1]", "test_isolated_read_model[2]", "test_isolated_committed[1]",
             "test_isolated_committed[2]"]
    done = run_pytest(new_project, storage, order)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout
    # The same two tests without the fixture: the second one's request was a duplicate, except where the
    # test's rollback took the first one's events (the django backend).
    done = run_pytest(new_project, storage, ["test_leaky_first", "test_leaky_second"])
    assert done.returncode == 0, done.stdout + done.stderr
    if storage == "django":
        # The test's rollback took the first one's events; a snapshot its background lane committed on
        # another connection may or may not have outlived it, by the lane's timing: both are seen.
        assert ("LEAKY-SECOND duplicate=False" in done.stdout
                or "LEAKY-SECOND error=DuplicateAggregateId" in done.stdout), done.stdout
    else:
        assert "LEAKY-SECOND duplicate=True" in done.stdout


# --- the README ------------------------------------------------------------------------------------------------


def test_the_isolation_is_exported_and_the_plugin_declares_its_fixture():
    import wow_django.testing as testing
    from wow_django.testing import pytest_plugin

    assert {"IsolatedWowMixin", "WowTestCase", "WowTransactionTestCase", "WowIsolation",
            "isolated_wow"} <= set(testing.__all__)
    assert pytest_plugin.__all__ == ["wow_isolation"]
    readme = (ROOT / "README.md").read_text()
    assert "wow_django.testing.pytest_plugin" in readme and "IsolatedWowMixin" in readme
