"""``manage.py runrow_worker module:agent``: a runrow worker on Django's database."""

from __future__ import annotations

from runrow.contrib.django._command import RunrowCommand


class Command(RunrowCommand):
    """Runs a worker (``runrow worker``) for an agent; drains on SIGTERM or SIGINT."""

    help = (
        "Run a runrow worker for module:callable on Django's database (runrow worker); "
        "SIGTERM or SIGINT drains it."
    )
    cli_command = "worker"
