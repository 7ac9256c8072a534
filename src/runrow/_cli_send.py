"""``runrow send CONVERSATION TEXT``: a turn from the shell, so that a worker, the
dashboard and the other commands can be tried without writing Python; with ``--wait``,
the answer as it streams and an exit status for how the run ended."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from ._cli_support import database_url, jsonable, out

if TYPE_CHECKING:
    import argparse

    from ._events import Event

__all__ = ["ENDING_EXIT", "cmd_send"]

ENDING_EXIT = {"completed": 0, "failed": 4, "cancelled": 5, "expired": 6}
"""``send --wait``'s exit status for each ending (the help's epilog lists them)."""


def _write(text: str, *, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text)
    stream.flush()  # as it streams: a person watches, or a pipe reads line by line


def _shown(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content)


async def cmd_send(args: argparse.Namespace) -> int:
    """Enqueues ``args.text`` as a turn of ``args.conversation_id``; with ``args.wait``,
    follows the run's journal to its ending."""
    # The public API only: what an application calls, whatever runrow does inside it.
    from . import enqueue, tail, transcript

    url = database_url(args)
    run = await enqueue(
        url,
        conversation_id=args.conversation_id,
        user_id=args.user,
        content=args.text,
        tenant_id=args.tenant,
        schema=args.schema,
    )
    if not args.wait:
        out(
            args,
            run,
            f"queued run {run.id} in conversation {run.conversation_id}; "
            f"follow it with: runrow runs tail {run.id}",
        )
        return 0
    if args.json:
        out(args, run, "")
    streamed = False
    ending: dict[str, Any] = {}
    async for event in tail(url, run.id, schema=args.schema):
        if event.keepalive:
            continue
        if args.json:
            _write(json.dumps(event.to_dict()) + "\n")
        elif event.type == "content_delta" and "stream" not in event.payload:
            _write(event.payload["delta"])  # the default stream: the answer's text
            streamed = True
        elif event.type == "input_requested":
            _asked(run.id, event)
        if event.type == "complete":
            ending = event.payload
    status = str(ending.get("status", "failed"))
    if not args.json:
        if streamed:
            _write("\n")
        elif status == "completed":  # an answer written, not streamed: the run's own messages
            said = await transcript(url, run.conversation_id, schema=args.schema)
            _write("".join(f"{_shown(m.content)}\n" for m in said if m.run_id == run.id and m.role != "user"))
    if status != "completed":
        error = ending.get("error") or {}
        why = ": ".join(str(error[k]) for k in ("type", "message") if error.get(k))
        what = "was cancelled" if status == "cancelled" else status
        _write(f"runrow: run {run.id} {what}{f': {why}' if why else ''}\n", err=True)
    return ENDING_EXIT.get(status, ENDING_EXIT["failed"])


def _asked(run_id: Any, event: Event) -> None:
    """A run that parked for a person's input: say how to answer it (the wait goes on)."""
    key = event.payload.get("key")
    request = json.dumps(jsonable(event.payload.get("request")))
    _write(
        f"runrow: run {run_id} waits for input {key} ({request}); "
        f"answer it with: runrow runs input {run_id} {key} VALUE\n",
        err=True,
    )
