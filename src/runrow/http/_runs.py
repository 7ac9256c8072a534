"""The routes of one run: its state, place in line, events, cancel, retry and input."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response

import runrow

from . import _streams, _turns
from ._base import MAX_INPUT_KEY, RUN_404, STOP, UNAUTHORIZED, Endpoints
from ._errors import ApiError
from ._openapi import Doc, documented, error, json_response

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["RunRoutes"]

_EVENTS_PARAMETERS = (
    {
        "name": "format",
        "in": "query",
        "description": "runrow (default): one SSE message per journal event; ai-sdk: the AI SDK UI "
        "message stream v1; ag-ui: AG-UI events",
        "schema": {"enum": list(_streams.STREAM_FORMATS)},
    },
    {
        "name": "from",
        "in": "query",
        "description": "resume after this event id (runrow: a seq; a protocol: N or N.K)",
        "schema": {"type": "string"},
    },
    {
        "name": "Last-Event-ID",
        "in": "header",
        "description": "wins over ?from=",
        "schema": {"type": "string"},
    },
    {
        "name": "tree",
        "in": "query",
        "description": "true: the stream of the tree this root turn spawned (its sub-agents' events "
        "too, each with its run_id and run_seq; ids are the tree's own positions); a child's id is "
        "refused",
        "schema": {"type": "boolean"},
    },
)


class RunRoutes:
    """``/v1/runs/{run_id}`` and below."""

    def __init__(self, api: Endpoints) -> None:
        self.api = api

    @documented(
        Doc(
            summary="A run's state",
            responses={"200": json_response("Run", "The run"), "401": UNAUTHORIZED, "404": RUN_404},
        )
    )
    async def get_run(self, request: Request) -> Response:
        info = await self.api.own_run(request, await self.api.user(request))
        usage = await runrow.run_usage(self.api.pool, info.id, schema=self.api.schema)
        return JSONResponse({**_turns.run_json(info, self.api.base(request)), "usage": asdict(usage)})

    @documented(
        Doc(
            summary="A queued run's place in line and estimated wait",
            responses={
                "200": json_response(
                    "Position",
                    "position (null unless queued), exact (false: an estimate past the first "
                    "thousand), estimated_wait_seconds (the median duration of the last 20 completed "
                    "runs times the rounds of runs ahead; null with fewer than 3 of them, in "
                    "finished_samples)",
                ),
                "401": UNAUTHORIZED,
                "404": RUN_404,
            },
        )
    )
    async def get_position(self, request: Request) -> Response:
        info = await self.api.own_run(request, await self.api.user(request))
        pos = await runrow.queue_position(self.api.pool, info.id, schema=self.api.schema)
        durations = await _turns.recent_durations(self.api.pool, schema=self.api.schema)
        wait = _turns.estimate_wait(durations, pos.position, self.api.worker_slots)
        return JSONResponse(
            {
                "run_id": str(info.id),
                "status": pos.status,
                "position": pos.position,
                "exact": pos.exact,
                "estimated_wait_seconds": None if wait is None else round(wait, 3),
                "finished_samples": len(durations),
            }
        )

    @documented(
        Doc(
            summary="The run's journal as Server-Sent Events, live, until it ends",
            description=(
                "In runrow's format `id:` is the event's seq, `event:` its type and `data:` its "
                "JSON; with `format=ai-sdk` or `format=ag-ui` the journal is encoded for that "
                "protocol and `id:` is `N` or `N.K` (the K-th frame of event N). Resume after an "
                "id with `?from=` or the `Last-Event-ID` header (which wins). Idle streams get "
                "`: keepalive` comments."
            ),
            parameters=_EVENTS_PARAMETERS,
            responses={
                "200": {
                    "description": "An event stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                "204": {
                    "description": "The run has finished and nothing follows the cursor (a "
                    "trimmed run's journal is its synthesised ending alone, at 1): an EventSource "
                    "stops reconnecting"
                },
                "400": error("Bad cursor or format"),
                "401": UNAUTHORIZED,
                "404": RUN_404,
            },
        )
    )
    async def events(self, request: Request) -> Response:
        info = await self.api.own_run(request, await self.api.user(request))
        fmt = _streams.stream_format(request.query_params.get("format"))
        cursor = _streams.read_cursor(request.headers, request.query_params, fmt)
        tree = _streams.tree_flag(request.query_params.get("tree"), info)
        return await _streams.stream_run(
            self.api.pool,
            info,
            fmt=fmt,
            cursor=cursor,
            hub=self.api.hub,
            keepalive=self.api.keepalive,
            schema=self.api.schema,
            tree=tree,
            read_from=self.api.read_pool,
        )

    @documented(
        Doc(
            summary="Stop one run",
            responses={"200": STOP, "401": UNAUTHORIZED, "404": RUN_404},
        )
    )
    async def cancel(self, request: Request) -> Response:
        info = await self.api.own_run(request, await self.api.user(request))
        result = await runrow.cancel_run(self.api.pool, info.id, schema=self.api.schema)
        return JSONResponse(_turns.stop_json(result))

    @documented(
        Doc(
            summary="Retry a run that ended without completing: a new run answers the same message",
            description=(
                "The retry is the same turn: it keeps the turn's deadline, if the host set one. "
                "A deadline that has passed is refused (`deadline_passed`): only the host can "
                "retry that turn, with a new deadline or none (`runrow.retry_run(..., deadline=...)`)."
            ),
            responses={
                "202": json_response("Accepted", "The new run (the same one again for a repeat)"),
                "401": UNAUTHORIZED,
                "404": RUN_404,
                "409": error(
                    "`not_retryable`: the run is still active or completed, or was trimmed; "
                    "`deadline_passed`: the turn's deadline has passed"
                ),
            },
        )
    )
    async def retry(self, request: Request) -> Response:
        info = await self.api.own_run(request, await self.api.user(request))
        try:
            run = await runrow.retry_run(self.api.pool, info.id, schema=self.api.schema)
        except runrow.DeadlinePassed as exc:  # (a deadline is the host's to move, not the user's)
            raise ApiError(409, "deadline_passed", str(exc)) from None
        except runrow.InvalidInput as exc:  # still active or completed, or trimmed
            raise ApiError(409, "not_retryable", str(exc)) from None
        return _turns.accepted(run, self.api.base(request))

    @documented(
        Doc(
            summary="Answer a waiting run: the input it asked for",
            description=(
                "A run that called `wait_for_input(key, request)` is `waiting`: its journal has an "
                "`input_requested` event `{key, request, expires_at}`. This records `value` for "
                "`key` (an `input_provided` event) and queues the run again; a worker resumes it."
            ),
            body={
                "type": "object",
                "required": ["key", "value"],
                "properties": {
                    "key": {"type": "string", "minLength": 1, "maxLength": MAX_INPUT_KEY},
                    "value": {"description": "Any JSON value"},
                },
            },
            responses={
                "200": {
                    "description": "`recorded`: true when this call recorded the value, false when "
                    "the same value had been recorded already (a repeat is harmless)",
                    "content": {
                        "application/json": {
                            "schema": {"type": "object", "properties": {"recorded": {"type": "boolean"}}}
                        }
                    },
                },
                "400": error("Malformed body"),
                "401": UNAUTHORIZED,
                "404": RUN_404,
                "409": json_response(
                    "NotWaiting",
                    "`not_waiting_for_input`: the run is not waiting for this key (an unknown key, a "
                    "run that is not waiting or has finished, or another value already recorded); "
                    "`status` is the run's",
                ),
                "413": error("`too_large`: the body or the value is over its size limit"),
                "422": error("`invalid_input`: key missing or not a string, value missing"),
            },
        )
    )
    async def provide_input(self, request: Request) -> Response:
        # Someone else's run answers 404 whatever the body says, like an unknown one.
        info = await self.api.own_run(request, await self.api.user(request))
        data = await self.api.json_body(request)
        key = data.get("key")
        if not isinstance(key, str) or not key.strip() or len(key) > MAX_INPUT_KEY:
            raise ApiError(
                422, "invalid_input", f"key must be a non-empty string of at most {MAX_INPUT_KEY} characters"
            )
        if "value" not in data:
            raise ApiError(422, "invalid_input", "value is required (any JSON value)")
        recorded = await runrow.provide_input(
            self.api.pool, info.id, key, data["value"], schema=self.api.schema
        )
        return JSONResponse({"recorded": recorded})
