"""Errors as the API answers them: ``{"error": {"code", "message", ...}}`` with a 4xx status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

import runrow

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping
    from typing import Any

    from starlette.requests import Request

__all__ = ["EXCEPTION_HANDLERS", "ApiError", "not_found", "not_yours"]


class ApiError(Exception):
    """An error the API answers as JSON with a 4xx status (``code`` is machine-readable)."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def not_found(what: str = "run") -> ApiError:
    """Unknown, or someone else's: the two answer alike (a run id is a secret)."""
    return ApiError(404, "not_found", f"no such {what}")


def not_yours(conversation_id: str) -> ApiError:
    """A conversation id is a name anyone may pick: saying it is taken gives nothing away."""
    return ApiError(403, "forbidden", f"conversation {conversation_id} belongs to another user")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(
        {"error": {"code": exc.code, "message": exc.message}}, status_code=exc.status, headers=exc.headers
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        {"error": {"code": code, "message": str(exc.detail)}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _idempotency_conflict(request: Request, exc: Exception) -> Response:
    # The key names another turn: a client bug or a reused key, never worth retrying as is.
    assert isinstance(exc, runrow.IdempotencyConflict)
    return JSONResponse(
        {
            "error": {
                "code": "idempotency_conflict",
                "message": str(exc),
                "run_id": str(exc.run_id),
                "fields": list(exc.fields),
            }
        },
        409,
    )


async def _not_waiting(request: Request, exc: Exception) -> Response:
    # The run is not waiting for this input (any more): the client's card is stale.
    assert isinstance(exc, runrow.NotWaitingForInput)
    return JSONResponse(
        {
            "error": {
                "code": "not_waiting_for_input",
                "message": str(exc),
                "key": exc.key,
                "status": exc.status,
            }
        },
        409,
    )


async def _invalid_input(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, runrow.InvalidInput)
    # Too large is too_large, whichever limit caught it (the body's or runrow's).
    status, code = (413, "too_large") if "larger than the limit" in str(exc) else (422, "invalid_input")
    return JSONResponse({"error": {"code": code, "field": exc.field, "message": str(exc)}}, status)


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Coroutine[Any, Any, Response]]] = {
    ApiError: _api_error,
    HTTPException: _http_error,
    runrow.InvalidInput: _invalid_input,
    runrow.IdempotencyConflict: _idempotency_conflict,
    runrow.NotWaitingForInput: _not_waiting,
}
