"""The HTTP API: commands, state, snapshots and event streams of every aggregate, over DRF.

Mount it with ``path("api/", include("wow_django.http.urls"))`` (route table
in :mod:`wow_django.http.urls`) and serve its OpenAPI schema with
drf-spectacular (:mod:`wow_django.http.schema`).

Headers (Wow's ``Command-`` names, :mod:`wow_django.http.headers`)
    ``Command-Wait-Stage`` (commands): SENT, PROCESSED (default), SNAPSHOT or
    PROJECTED. ``Command-Wait-Timeout`` (commands): how long to wait for it,
    in milliseconds. ``Command-Request-Id`` (commands): the idempotency key; a
    retry with the same id returns the first result (``duplicate: true``) and
    a create command's aggregate id is derived from it.
    ``Command-Aggregate-Version`` (commands): the version the aggregate must be
    at, else 409 ``CommandExpectVersionConflict``. ``Command-Tenant-Id``: read
    by the default tenant resolver, on every route.

Authentication and permissions
    First match wins: the aggregate's ``api_authentication_classes`` /
    ``api_permission_classes`` (class attributes, classes or dotted paths),
    then ``WOW["API_AUTHENTICATION_CLASSES"]`` / ``WOW["API_PERMISSION_CLASSES"]``,
    then DRF's ``DEFAULT_AUTHENTICATION_CLASSES`` / ``DEFAULT_PERMISSION_CLASSES``.
    Permission classes see ``view.action`` and ``view.command`` (see
    :mod:`wow_django.http.views`); :class:`~wow_django.http.permissions.IsAuthenticatedForCommands`
    is one such class. The operator of a command and the owner of what it
    creates are the authenticated user's primary key ("" when anonymous).

Tenancy
    ``WOW["TENANT_RESOLVER"]`` names the class that decides the tenant of a
    request (:mod:`wow_django.http.tenancy`); the API enforces it on every
    command and read, whatever a body says.

Errors
    ``{errorCode, errorMsg, bindingErrors}`` with Wow's error codes and the
    statuses of :mod:`wow_django.http.errors`.
"""
