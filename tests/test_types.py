"""The package's annotations hold: mypy, with Django's and DRF's stubs and plugins (setup.cfg [mypy]), finds no
error in wow_django, and the package ships ``py.typed`` so that its users' type checkers read them (PEP 561)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mypy", reason="the type check needs the test extra (mypy, django-stubs, DRF stubs)")


@pytest.mark.timeout(900)  # above the subprocess' own 600 s, so that a slow mypy fails with its own output
def test_mypy_finds_no_error_in_the_package(tmp_path):
    # A cache of its own: xdist workers and a developer's own mypy runs never share one.
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def test_the_package_says_it_is_typed():
    assert (ROOT / "wow_django" / "py.typed").is_file()
    setup = (ROOT / "setup.cfg").read_text()
    assert "py.typed" in setup.split("[options.package_data]")[1].split("[")[0]  # shipped in the wheel
