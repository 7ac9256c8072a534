"""The app's own row, written in the same transaction as the turn it starts."""

from django.db import models


class Note(models.Model):
    """What a user posted (the app's record; the run is runrow's)."""

    user_id = models.TextField()
    conversation_id = models.TextField()
    text = models.TextField()
    run_id = models.UUIDField(null=True)
