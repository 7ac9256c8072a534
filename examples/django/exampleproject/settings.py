"""Settings of the example project: PostgreSQL from DATABASE_URL, runrow's app installed."""

import os
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

# A libpq URL or key=value string: postgresql://user:password@host:5432/dbname
_db = conninfo_to_dict(os.environ.get("DATABASE_URL", "postgresql://localhost/runrow_example"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "an-example-only-key")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "exampleproject.urls"
USE_TZ = True
STATIC_URL = "static/"  # the admin's CSS and JavaScript (django.contrib.staticfiles)
STATIC_ROOT = Path(__file__).resolve().parent.parent / "staticfiles"  # for `manage.py collectstatic`
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
RUNROW_SCHEMA = os.environ.get("RUNROW_SCHEMA", "runrow")  # where runrow_migrate puts runrow's tables

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "runrow.contrib.django",  # runrow_migrate, runrow_worker, the read-only admin of runs
    "notes",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
