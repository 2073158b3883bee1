"""Settings for the test suite: the sample project on embedded defaults."""

from sample_project.settings import *  # noqa: F401,F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
