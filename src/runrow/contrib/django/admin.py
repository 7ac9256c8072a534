"""Read-only admin pages for runrow's runs, each with its journal."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from .models import Event, Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Runs, newest first: filter by status, search by id, conversation or user; no edits."""

    list_display = ("id", "status", "conversation_id", "user_id", "tenant_id", "attempt", "created_at")
    list_filter = ("status",)
    search_fields = ("=id", "conversation_id", "user_id", "tenant_id")
    readonly_fields = (*(f.name for f in Run._meta.fields), "journal")
    actions = None

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        """runrow's API enqueues runs, not the admin."""
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        """Runs change through runrow's API (``runrow runs cancel|retry``)."""
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        """``runrow trim`` deletes runs."""
        return False

    @admin.display(description="journal")
    def journal(self, obj: Run) -> str:
        """The run's events in order: seq, type, time and payload."""
        rows = Event.objects.filter(run_id=obj.id).order_by("seq")
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            ((e.seq, e.type, e.created_at, e.payload) for e in rows),
        )
        return format_html(
            "<table><tr><th>seq</th><th>type</th><th>at</th><th>payload</th></tr>{}</table>", body
        )
