"""Token authentication of external consumers' HTTP callbacks.

``Authorization: Bearer <token>``; each consumer id has its own token in
``WOW['BUS_CALLBACK_TOKENS']``. The token is compared with every configured
token in constant time, so neither the match nor its position leaks through
timing.
"""

from __future__ import annotations

import hmac

from rest_framework import authentication, exceptions

from wow_django.conf import wow_settings

REALM = "wow-bus"


class ConsumerPrincipal:
    """``request.user`` for an authenticated consumer."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, consumer_id: str):
        self.consumer_id = consumer_id

    def get_username(self) -> str:
        return f"consumer:{self.consumer_id}"

    def has_perm(self, perm, obj=None) -> bool:
        return False

    def __str__(self) -> str:
        return self.get_username()


def consumer_for_token(token: str) -> str | None:
    """The consumer id whose token is ``token``, comparing against all of them in constant time."""
    given = token.encode()
    found = None
    for consumer_id, expected in sorted(wow_settings.BUS_CALLBACK_TOKENS.items()):
        if hmac.compare_digest(given, expected.encode()) and found is None:
            found = consumer_id
    return found


class ConsumerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>' with one token.")
        try:
            token = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token must be ASCII text.")
        consumer_id = consumer_for_token(token)
        if consumer_id is None:
            raise exceptions.AuthenticationFailed("Unknown consumer token.")
        return ConsumerPrincipal(consumer_id), token

    def authenticate_header(self, request) -> str:
        return f'{self.keyword} realm="{REALM}"'
