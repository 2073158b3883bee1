"""The follower of the fault tests (tests/test_follower_faults.py): ``slow-probe`` takes every order stream,
slowly (``WOW_FAULT_DELAY_S`` each), and records each call in ``fault_calls``; while the file
``WOW_FAULT_GATE`` names exists, a call holds after recording itself."""

from __future__ import annotations

import os
import time

from django.db import connection

from wow_django.application.followers import follower


def create_tables() -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS fault_calls (position integer NOT NULL)")


@follower("slow-probe", aggregates={"order"})
def probe(item) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fault_calls (position) VALUES (%s)", [item.position])
    gate = os.environ.get("WOW_FAULT_GATE")  # a file: while it exists, the handler holds (at most 60 s)
    deadline = time.monotonic() + 60
    while gate and os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(float(os.environ.get("WOW_FAULT_DELAY_S", "0.3")))
