"""Fill the bus context from the current HTTP request (seed 004 §3.3, §6.1).

Add ``"wow_django.http.bus_middleware.BusContextMiddleware"`` to ``MIDDLEWARE``
(after the authentication middleware): events sent while a request is
handled get ``initiator.userId`` from the logged-in user and
``initiator.clientRequestId`` from the ``X-Request-Id`` header, unless the
sender gives them.
"""

from __future__ import annotations

from django.db import DatabaseError

from wow_django.bus.context import bus_context

MAX_REQUEST_ID_LENGTH = 200


class BusContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            user = getattr(request, "user", None)
            user_id = user.get_username() if user is not None and user.is_authenticated else None
        except DatabaseError:  # a session key the database refuses (a NUL in the cookie): not signed in here;
            user_id = None     # the view's authentication answers it (401/403), never a 500

        request_id = request.headers.get("X-Request-Id") or None
        if request_id is not None and (len(request_id) > MAX_REQUEST_ID_LENGTH or not request_id.isprintable()):
            request_id = None  # not a usable id: leave it out rather than fail the request
        with bus_context(user_id=user_id or None, client_request_id=request_id):
            return self.get_response(request)
