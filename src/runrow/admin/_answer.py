"""Answering a waiting run's input from its page: ``POST /runs/{run_id}/input``.

The run page draws a form per input the run waits for (see ``RunPage.waiting_section``):
Approve and Deny send ``{"approved": true}`` and ``{"approved": false}``, the approval
convention of runrow's docs and demo; "Send the value" sends what was typed, read as
JSON or taken as a string. The POST calls :func:`runrow.provide_input`, under the same
rules as the other actions (CSRF token, same origin, ``can_act``, not read-only, the
caller's tenant), and redirects (303) to the run's page. A refusal (malformed JSON, an
answered key, an ended run) shows the page's waiting inputs again, with the message
next to the form and what was typed kept.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.responses import RedirectResponse, Response

import runrow

from .._engine.steps import MAX_STEP_BYTES
from ._app import AdminState, form_fields
from ._html import Html, e, link
from ._run import RunPage, visible_run

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["Answers"]

APPROVAL = {"approve": {"approved": True}, "deny": {"approved": False}}
"""What Approve and Deny send: the convention of docs/steps.md and the demo."""

# A value as big as runrow takes (MAX_STEP_BYTES of JSON), URL-encoded (up to 3 bytes a
# byte), with the key and the token besides.
_MAX_BYTES = 3 * MAX_STEP_BYTES + 8192

_ENDED = ("completed", "failed", "cancelled", "expired")


class Answers:
    """``GET`` and ``POST /runs/{run_id}/input``."""

    def __init__(self, state: AdminState) -> None:
        self.state = state
        self.runs = RunPage(state)

    async def answer(self, request: Request) -> Response:
        """``GET``: the run's waiting inputs and their forms. ``POST``: records the answer."""
        access = await self.state.actor(request, max_form_bytes=_MAX_BYTES)
        info = await visible_run(self.state, request, access)
        base = self.state.base(request)
        fields = await form_fields(request, _MAX_BYTES) if request.method == "POST" else {}

        async def again(status_code: int, error: str | None) -> Response:
            """The run's waiting inputs, with ``error`` next to the form the fields came from."""
            fresh = await runrow.get_run(self.state.pool, info.id, schema=self.state.schema)
            waiting = await runrow.waiting_inputs(self.state.pool, run_id=info.id, schema=self.state.schema)
            section = self.runs.waiting_section(request, access, fresh, waiting, error=error, kept=fields)
            if error is not None and not any(w.key == fields.get("key") for w in waiting):
                section = Html(f'<p role="alert" class="error">{e(error)}</p>{section}')
            back = link(f"{base}/runs/{info.id}", "Back to the run")
            body = Html(f"<p>Run {back}</p>{section}")
            return self.state.page(request, access, "Answer an input", body, status_code=status_code)

        if request.method != "POST":  # GET (and HEAD) only ever show the forms
            return await again(200, None)
        key = fields.get("key", "")
        try:
            value = _value(fields)
        except ValueError as exc:
            return await again(400, str(exc))
        try:
            await runrow.provide_input(self.state.pool, info.id, key, value, schema=self.state.schema)
        except runrow.NotWaitingForInput as exc:
            return await again(409, _not_waiting(key, exc.status))
        except runrow.InvalidInput as exc:
            return await again(400, f"This answer cannot be recorded: {exc}")
        # (False: this same value was recorded already, a double submit: nothing changed.)
        return RedirectResponse(f"{base}/runs/{info.id}", status_code=303)


def _value(fields: dict[str, str]) -> Any:
    """The answer the form's button asks for; ValueError, with what to do, if none."""
    decision = fields.get("decision")
    if decision in APPROVAL:
        return APPROVAL[decision]
    if decision != "value":
        raise ValueError("Choose Approve, Deny or Send the value.")
    text = fields.get("value", "")
    if fields.get("as") == "text":
        return text
    if not text.strip():
        raise ValueError("Type a value to send (JSON, or choose to read it as text), or use Approve or Deny.")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f'The value is not JSON ({exc}). Quote text ("yes"), or choose to read the value as text.'
        ) from None


def _not_waiting(key: str, status: str) -> str:
    if status in _ENDED:
        return f"The run has ended ({status}): it no longer waits for input {key!r}."
    if status == "waiting":
        return (
            f"The run does not wait for input {key!r}: it was already answered, or is not one it asked for."
        )
    return f"Input {key!r} was already answered, or is not one the run asked for: the run is {status} now."
