"""The Django app ``runrow.contrib.django`` (label ``runrow``)."""

from __future__ import annotations

from django.apps import AppConfig


class RunrowConfig(AppConfig):
    """runrow's app: its management commands and the read-only admin of runs."""

    name = "runrow.contrib.django"
    label = "runrow"
    verbose_name = "runrow"
    default_auto_field = "django.db.models.BigAutoField"
