"""A Flask app on runrow's synchronous API: a POST enqueues a turn in the request's own
transaction, a GET streams the run's journal as Server-Sent Events.

    DATABASE_URL=postgresql://localhost/mydb flask --app app run
    runrow worker agent:agent          # next to it, from this folder: the agent runs there
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from flask import Flask, Response, jsonify, request
from psycopg_pool import ConnectionPool

import runrow
from runrow import sync

if TYPE_CHECKING:
    from collections.abc import Iterator


def create_app(database_url: str | None = None, *, schema: str = "runrow", poll: float = 0.25) -> Flask:
    """The app, on a pool of synchronous connections to ``database_url`` ($DATABASE_URL)."""
    pool = ConnectionPool(database_url or os.environ["DATABASE_URL"], min_size=1, max_size=10, open=True)
    app = Flask(__name__)
    app.extensions["runrow_pool"] = pool  # (the host closes it: app.extensions["runrow_pool"].close())

    @app.post("/conversations/<conversation_id>/messages")
    def post_message(conversation_id: str) -> tuple[Response, int]:
        body = request.get_json(force=True)
        user_id = request.headers.get("X-User", "anonymous")  # your authentication here
        try:
            with pool.connection() as conn, conn.transaction():
                # Your own writes go here, on `conn`: they commit with the turn, or neither does.
                run = sync.enqueue(
                    conn,  # joins this transaction
                    conversation_id=conversation_id,
                    user_id=user_id,
                    content=body.get("text"),
                    idempotency_key=request.headers.get("Idempotency-Key"),
                    schema=schema,
                )
        except runrow.InvalidInput as exc:
            return jsonify(error=str(exc)), 400
        return jsonify(run_id=str(run.id), created=run.created), 202

    @app.get("/runs/<run_id>/events")
    def run_events(run_id: str) -> Response | tuple[Response, int]:
        # A reconnecting EventSource sends the last id it saw; ?cursor=N does the same by hand.
        cursor = request.headers.get("Last-Event-ID") or request.args.get("cursor", "0")
        if not cursor.isdigit():
            return jsonify(error="the cursor must be a non-negative integer"), 400
        try:
            sync.get_run(pool, run_id, schema=schema)
        except runrow.RunNotFound:
            return jsonify(error="no such run"), 404

        def stream() -> Iterator[str]:
            try:
                for event in sync.tail(pool, run_id, from_seq=int(cursor), schema=schema, poll=poll):
                    if event.keepalive:
                        yield ": keepalive\n\n"
                        continue
                    data = json.dumps(event.to_dict(), ensure_ascii=False, default=str)
                    yield f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"
            except runrow.InvalidInput as exc:  # a cursor past the end of this run's journal
                yield f"event: error\ndata: {json.dumps({'error': str(exc)})}\n\n"

        return Response(stream(), mimetype="text/event-stream", headers={"Cache-Control": "no-store"})

    return app


if __name__ == "__main__":
    create_app().run(threaded=True)
