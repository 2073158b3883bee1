"""Paged snapshot queries per second: through the HTTP API, and straight on the query service.

One run, per backend (the in-memory store, and the Mongo store on the
embedded engine ``mongomock://``):

1. ``--snapshots`` order snapshots are saved for two tenants;
2. the same paged query (status PAID, sorted by amount descending, page
   ``--page`` of ``--page-size``, tenant t1) is run for ``--seconds``:
   a. as ``POST /api/order/snapshot/paged`` through Django's test client
      (``--live``: through a WSGI server on 127.0.0.1, one connection per
      request) - URL routing, middleware, DRF, JSON parsing, query parsing,
      tenant resolution, the query, JSON rendering;
   b. as ``get_runtime().snapshot_queries("order").paged(query, tenant_id="t1")``
      with the query parsed once - the query alone;
3. it prints both rates and their ratio (the share of time the HTTP layer
   leaves to the query), after checking that both return the same page.

The embedded engine and the in-memory store scan in Python, so the query
dominates at large sizes; use a small ``--snapshots`` to see the fixed cost
of the HTTP layer.

    python bench/bench_http.py
    python bench/bench_http.py --snapshots 200 --seconds 3 --live
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sample_project.settings")

import django  # noqa: E402

django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.test import Client, override_settings  # noqa: E402

from wow_django.application.queries import parse_paged_query  # noqa: E402
from wow_django.application.runtime import get_runtime  # noqa: E402
from wow_django.backends.mongo.client import disconnect  # noqa: E402
from wow_django.persistence.records import AggregateId, Snapshot  # noqa: E402

STATUSES = ("PLACED", "PAID", "SHIPPED", "CANCELLED")


def seed(count: int) -> None:
    store = get_runtime().snapshot_store
    for n in range(count):
        tenant = "t1" if n % 4 else "t2"
        state = {"status": STATUSES[n % len(STATUSES) if n % 3 else 1], "amount": (n * 37) % 1000,
                 "customer_id": f"c-{n % 50}", "items": [{"sku": f"S-{n % 9}", "quantity": 1 + n % 5}]}
        store.save(Snapshot(aggregate_id=AggregateId("order", f"o-{n:06d}", "order-service", tenant), version=1,
                            state=state, owner_id=f"u-{n % 7}", event_id=f"e-{n}", first_event_time=n,
                            event_time=n))


def rate(call, seconds: float) -> tuple[float, object]:
    """Calls per second of ``call`` over about ``seconds`` (after a warm-up), and its last result."""
    result = None
    for _ in range(3):
        result = call()
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        result = call()
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - started), result


class LiveServer:
    """The project's WSGI application on 127.0.0.1 in a thread (wsgiref: one request per connection)."""

    def __init__(self):
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args):
                pass

        self.server = make_server("127.0.0.1", 0, get_wsgi_application(), handler_class=Quiet)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def post(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json", **headers})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def run(backend: str, args) -> dict:
    uri = f"mongomock://localhost/bench_{uuid.uuid4().hex[:8]}"
    wow = {"CONTEXT_NAME": "order-service", "STORAGE": backend, "MONGO_URI": uri}
    body = {
        "condition": {"field": "state.status", "operator": "EQ", "value": "PAID"},
        "sort": [{"field": "state.amount", "direction": "DESC"}],
        "pagination": {"index": args.page, "size": args.page_size},
    }
    raw = json.dumps(body).encode()
    try:
        with override_settings(WOW=wow, ALLOWED_HOSTS=["*"], DEBUG=False):
            seed(args.snapshots)
            service = get_runtime().snapshot_queries("order")
            query = parse_paged_query(body)

            def direct():
                return service.paged(query, tenant_id="t1").to_json()

            if args.live:
                server = LiveServer()

                def over_http():
                    status, content = server.post("/api/order/snapshot/paged", raw, {"Command-Tenant-Id": "t1"})
                    assert status == 200, content
                    return json.loads(content)
            else:
                client = Client()

                def over_http():
                    response = client.post("/api/order/snapshot/paged", raw, content_type="application/json",
                                           HTTP_COMMAND_TENANT_ID="t1")
                    assert response.status_code == 200, response.content
                    return response.json()

            try:
                service_rate, service_page = rate(direct, args.seconds)
                http_rate, http_page = rate(over_http, args.seconds)
            finally:
                if args.live:
                    server.close()
            if http_page != service_page:
                raise SystemExit(f"{backend}: the HTTP endpoint and the service returned different pages")
            return {"backend": backend, "total": service_page["total"], "rows": len(service_page["list"]),
                    "http": http_rate, "service": service_rate}
    finally:
        disconnect(uri)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshots", type=int, default=1000, help="snapshots saved (default 1000)")
    parser.add_argument("--page", type=int, default=3, help="page index (default 3)")
    parser.add_argument("--page-size", type=int, default=20, help="page size (default 20)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement (default 2)")
    parser.add_argument("--live", action="store_true", help="through a WSGI server on 127.0.0.1, not the test client")
    parser.add_argument("--backend", choices=("in_memory", "mongo", "both"), default="both")
    args = parser.parse_args()
    backends = ("in_memory", "mongo") if args.backend == "both" else (args.backend,)
    transport = "live server on 127.0.0.1" if args.live else "Django test client"
    print(f"paged snapshot query: status PAID, sort amount DESC, page {args.page} of {args.page_size}, tenant t1; "
          f"{args.snapshots} snapshots; HTTP via {transport}; {args.seconds:g}s per figure")
    print(f"{'backend':<22}{'matches':>8}{'rows':>6}{'HTTP q/s':>12}{'service q/s':>13}{'HTTP/service':>14}")
    for backend in backends:
        row = run(backend, args)
        label = "mongo (mongomock://)" if backend == "mongo" else backend
        print(f"{label:<22}{row['total']:>8}{row['rows']:>6}{row['http']:>12.0f}{row['service']:>13.0f}"
              f"{row['http'] / row['service']:>14.2f}")


if __name__ == "__main__":
    main()
