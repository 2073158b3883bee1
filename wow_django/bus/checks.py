"""System checks for the bus settings."""

from __future__ import annotations

from django.core import checks

from wow_django.bus.envelope import CONSUMER_ID_RE
from wow_django.conf import validate_user_settings

MIN_TOKEN_LENGTH = 24


@checks.register("wow_django")
def check_callback_tokens(app_configs=None, **kwargs):
    from django.conf import settings

    user = getattr(settings, "WOW", None) or {}
    if validate_user_settings(user) or not isinstance(user, dict):
        return []  # wow_django.E001 reports it
    messages = []
    for consumer_id, token in (user.get("BUS_CALLBACK_TOKENS") or {}).items():
        if not CONSUMER_ID_RE.match(consumer_id):
            messages.append(checks.Error(
                f"WOW['BUS_CALLBACK_TOKENS'] key {consumer_id!r} is not a valid consumer id.",
                hint="Use the consumer id of topic_consumers (letters, digits, '.', '_', '-').",
                id="wow_django.E101"))
        elif len(token) < MIN_TOKEN_LENGTH:
            messages.append(checks.Warning(
                f"WOW['BUS_CALLBACK_TOKENS'][{consumer_id!r}] is shorter than {MIN_TOKEN_LENGTH} characters.",
                hint="Use a long random token, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
                id="wow_django.W102"))
    return messages
