"""POST a message: the app's row and the agent's turn commit together, or neither does."""

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from runrow.contrib import django as runrow_django

from .models import Note


class Rejected(Exception):
    """The app changed its mind after the enqueue (say, a quota check): all of it rolls back."""


@csrf_exempt  # an API endpoint for the example; keep CSRF on for browser forms
@require_POST
def post_message(request: HttpRequest, conversation_id: str) -> JsonResponse:
    body = json.loads(request.body)
    user_id = request.headers.get("X-User", "anonymous")
    try:
        with transaction.atomic():
            note = Note.objects.create(user_id=user_id, conversation_id=conversation_id, text=body["text"])
            run = runrow_django.enqueue(
                conversation_id=conversation_id, user_id=user_id, content=body["text"]
            )
            note.run_id = run.id
            note.save(update_fields=["run_id"])
            if body.get("reject"):
                raise Rejected()
    except Rejected:
        return JsonResponse({"status": "rejected"}, status=409)
    return JsonResponse({"run_id": str(run.id)}, status=202)
