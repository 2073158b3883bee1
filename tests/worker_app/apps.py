"""A test app for tests/test_worker_lost.py: makes the first run of each task slow, so the test can kill the
pool process that runs it.

With ``WOW_TEST_SLOW_TASKS`` (a directory) set, the first time a task id starts it writes
``<dir>/<task id>`` holding the pool process's pid, then sleeps ``WOW_TEST_SLOW_TASK_S`` seconds; a
redelivery of the same task id finds the file and runs at once.
"""

import os
import time
from pathlib import Path

from django.apps import AppConfig


def _slow_first_run(sender=None, task_id=None, **kwargs):
    directory = os.environ.get("WOW_TEST_SLOW_TASKS")
    if not directory or not task_id:
        return
    marker = Path(directory) / task_id
    try:
        with open(marker, "x") as out:
            out.write(str(os.getpid()))
    except FileExistsError:
        return  # a redelivery: run at once
    time.sleep(float(os.environ.get("WOW_TEST_SLOW_TASK_S", "30")))


class WorkerAppConfig(AppConfig):
    name = "tests.worker_app"
    label = "worker_app"
    verbose_name = "Worker-lost test"

    def ready(self):
        from celery.signals import task_prerun

        task_prerun.connect(_slow_first_run, weak=False, dispatch_uid="wow-test-slow-first-run")
