"""``manage.py runrow_migrate``: create or upgrade runrow's tables (``runrow migrate``)."""

from __future__ import annotations

from runrow.contrib.django._command import RunrowCommand


class Command(RunrowCommand):
    """Creates or upgrades runrow's schema (``settings.RUNROW_SCHEMA``) in Django's database."""

    help = "Create or upgrade runrow's tables in Django's database (runrow migrate)."
    cli_command = "migrate"
