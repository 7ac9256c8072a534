"""Unmanaged, read-only models over runrow's tables in ``settings.RUNROW_SCHEMA``.

runrow owns these tables (``manage.py runrow_migrate`` creates them; Django's
``migrate`` never touches them). Read them; change runs only through runrow's API.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from . import schema

_SCHEMA = schema()


def _table(name: str) -> str:
    # Django quotes db_table as one identifier: this spells "schema"."name".
    return f'{_SCHEMA}"."{name}'


class _ReadOnly(models.Model):
    """Rows runrow writes: saving or deleting one through Django is refused."""

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Refused: runrow writes its tables."""
        raise TypeError(f"{type(self).__name__} is read-only: change runs through runrow's API")

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: runrow deletes its rows (``runrow trim``)."""
        raise TypeError(f"{type(self).__name__} is read-only: change runs through runrow's API")


class Run(_ReadOnly):
    """A row of ``agent_run``: one turn of a conversation."""

    id = models.UUIDField(primary_key=True)
    conversation_id = models.TextField()
    user_id = models.TextField()
    tenant_id = models.TextField(null=True)
    status = models.TextField()
    priority = models.IntegerField()
    attempt = models.IntegerField()
    worker_id = models.TextField(null=True)
    cancel_requested = models.BooleanField()
    request = models.JSONField(null=True)
    error = models.JSONField(null=True)
    retry_of = models.UUIDField(null=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = _table("agent_run")
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class Event(_ReadOnly):
    """A row of ``run_event``: one entry of a run's journal.

    Its key is (``run_id``, ``seq``); Django's model knows ``run_id`` as the key only so
    that it can read the rows: read a run's journal with ``Event.objects.filter(run_id=...)``.
    """

    run_id = models.UUIDField(primary_key=True)
    seq = models.IntegerField()
    type = models.TextField()
    payload = models.JSONField()
    created_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = _table("run_event")
        ordering = ("run_id", "seq")

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"
