"""The sample ships a logging configuration (issue 26, item 6): errors reach stderr with the request id the
client sent, wow_django's warnings too; nothing is lost with DEBUG off."""

from __future__ import annotations

import io
import logging
import logging.config

from django.test import RequestFactory

from wow_django.log import RequestIdFilter


def configured(stream: io.StringIO):
    """The sample's LOGGING with its handler writing to ``stream``."""
    import copy

    from sample_project import settings as sample

    config = copy.deepcopy(sample.LOGGING)
    config["handlers"]["stderr"]["stream"] = stream
    return config


def test_a_500_is_logged_with_its_request_id_and_traceback():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("django").handlers[:],
             logging.getLogger("django").propagate, logging.getLogger("django").level)
    try:
        logging.config.dictConfig(configured(stream))
        request = RequestFactory().post("/api/order/place_order", HTTP_COMMAND_REQUEST_ID="req-42\nforged")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("django.request").error("Internal Server Error: %s", request.path, exc_info=True,
                                                      extra={"status_code": 500, "request": request})
        logging.getLogger("wow_django.bus").warning("bus: the broker went away")
        logging.getLogger("wow_django.bus").info("not shown at the default level")
    finally:
        root.handlers[:], django_logger = saved[0], logging.getLogger("django")
        root.setLevel(saved[1])
        django_logger.handlers[:], django_logger.propagate = saved[2], saved[3]
        django_logger.setLevel(saved[4])
    text = stream.getvalue()
    assert "ERROR django.request [request req-42?forged] Internal Server Error: /api/order/place_order" in text
    assert "RuntimeError: boom" in text  # the traceback
    assert "WARNING wow_django.bus [request -] bus: the broker went away" in text
    assert "not shown" not in text


def test_the_filter_never_drops_and_bounds_what_a_client_sends():
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "m", (), None)
    assert RequestIdFilter().filter(record) and record.request_id == "-"
    record.request = RequestFactory().get("/", HTTP_X_REQUEST_ID="r" * 500)
    RequestIdFilter().filter(record)
    assert record.request_id == "r" * 128
