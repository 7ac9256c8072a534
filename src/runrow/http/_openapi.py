"""The API's OpenAPI 3.1 document, generated from its routes.

Each endpoint carries its own :class:`Doc` (set by :func:`documented`, next to the code it
describes); :func:`openapi_document` walks the mounted routes, so a route without a
``Doc`` is an error, and the paths, methods and path parameters are always the ones the
router answers. The shared shapes (errors, a run, a stop's result) are components.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.routing import BaseRoute, Route

from .._status import STATUSES
from ._origin import SAFE_METHODS

__all__ = ["Doc", "documented", "error", "json_response", "openapi_document"]

F = TypeVar("F", bound=Callable[..., Any])

_DOC_ATTRIBUTE = "__runrow_openapi__"

# Path parameters, by name: every route that has one shares its schema.
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "run_id": {"type": "string", "format": "uuid"},
    "conversation_id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
    "chat_id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
}


@dataclass(frozen=True, slots=True)
class Doc:
    """What one endpoint's operation object says besides its path and parameters."""

    summary: str
    responses: Mapping[str, dict[str, Any]]
    description: str | None = None
    parameters: tuple[dict[str, Any], ...] = ()  # query and header parameters
    body: dict[str, Any] | None = None  # the JSON request body's schema
    tags: tuple[str, ...] = field(default=("runs",))


def documented(doc: Doc) -> Callable[[F], F]:
    """Attaches ``doc`` to an endpoint function."""

    def mark(fn: F) -> F:
        setattr(fn, _DOC_ATTRIBUTE, doc)
        return fn

    return mark


def error(description: str) -> dict[str, Any]:
    """A response whose body is the API's error object."""
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def json_response(schema_name: str, description: str) -> dict[str, Any]:
    """A JSON response of a named component schema."""
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}},
    }


_CROSS_SITE = "`cross_site`: sent by another site's page (see `Sec-Fetch-Site`, `Origin`)"
_NOT_JSON = error("`unsupported_media_type`: the body is not sent as `application/json`")


def _refusals(method: str, doc: Doc) -> dict[str, dict[str, Any]]:
    """The answers every route of its kind shares: a change from another site (403) and
    a body not sent as JSON (415), next to the route's own."""
    responses = dict(doc.responses)
    if method not in SAFE_METHODS:
        own = responses.get("403", {}).get("description")
        responses["403"] = error(_CROSS_SITE if own is None else f"{own}; or {_CROSS_SITE}")
    if doc.body is not None:
        responses["415"] = _NOT_JSON
    return dict(sorted(responses.items()))


def _operation(route: Route, doc: Doc, method: str) -> dict[str, Any]:
    params = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": PATH_PARAMETERS.get(name, {"type": "string"}),
        }
        for name in route.param_convertors
    ]
    op: dict[str, Any] = {
        "summary": doc.summary,
        "tags": list(doc.tags),
        "parameters": [*params, *doc.parameters],
        "responses": _refusals(method, doc),
    }
    if doc.description:
        op["description"] = doc.description
    if doc.body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": doc.body}}}
    return op


def openapi_document(routes: Sequence[BaseRoute], *, title: str, description: str) -> dict[str, Any]:
    """The document for ``routes`` (each :class:`~starlette.routing.Route` must be documented)."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Route):
            continue
        doc = getattr(route.endpoint, _DOC_ATTRIBUTE, None)
        if doc is None:
            raise TypeError(f"route {route.path} has no OpenAPI Doc (decorate it with @documented)")
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue
            paths.setdefault(route.path, {})[method.lower()] = _operation(route, doc, method)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": description},
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": SCHEMAS,
        },
    }


_STRINGS = {"type": "array", "items": {"type": "string"}}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "field": {"type": "string"},
                },
            }
        },
    },
    "NotWaiting": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "code": {"const": "not_waiting_for_input"},
                    "message": {"type": "string"},
                    "key": {"type": "string"},
                    "status": {"type": "string"},
                },
            }
        },
    },
    "Accepted": {
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "status": {"type": "string"},
            "conversation_id": {"type": "string"},
            "created": {"type": "boolean"},
            "events_url": {"type": "string"},
        },
    },
    "Run": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "conversation_id": {"type": "string"},
            "status": {"enum": list(STATUSES)},
            "cancel_requested": {"type": "boolean"},
            "error": {
                "type": ["object", "null"],
                "description": "A failed run's error. traceback: the agent's, if it raised and the "
                "worker records tracebacks (at most 8 KiB, innermost frames kept).",
                "properties": {
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                    "traceback": {"type": "string"},
                },
            },
            "retry_of": {"type": ["string", "null"], "format": "uuid"},
            "absorbed_into": {
                "type": ["string", "null"],
                "format": "uuid",
                "description": "an `absorbed` run (a steering message): the run whose turn read it",
            },
            "user_message_id": {"type": "string", "format": "uuid"},
            "created_at": {"type": "string", "format": "date-time"},
            "started_at": {"type": ["string", "null"], "format": "date-time"},
            "finished_at": {"type": ["string", "null"], "format": "date-time"},
            "worker_id": {"type": ["string", "null"]},
            "version": {
                "type": ["string", "null"],
                "description": "The code version the run started with (its first worker's; a retry "
                "keeps its turn's); null if unversioned or not yet claimed.",
            },
            "usage": {
                "type": "object",
                "description": "What the run recorded with RunContext.record_usage (GET /v1/runs/{run_id} "
                "only; zero once its journal is trimmed).",
                "properties": {
                    "input_tokens": {"type": "integer"},
                    "output_tokens": {"type": "integer"},
                    "cost": {"type": "number"},
                    "records": {"type": "integer"},
                },
            },
            "events_url": {"type": "string"},
        },
    },
    "Position": {
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "status": {"type": "string"},
            "position": {"type": ["integer", "null"]},
            "exact": {"type": "boolean"},
            "estimated_wait_seconds": {"type": ["number", "null"]},
            "finished_samples": {"type": "integer"},
        },
    },
    "StopResult": {
        "type": "object",
        "properties": {
            "noop": {"type": "boolean"},
            "cancelled": _STRINGS,
            "cancel_requested": _STRINGS,
            "drafts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "run_id": {"type": "string"},
                        "message_id": {"type": "string"},
                        "content": {},
                    },
                },
            },
        },
    },
    "Conversation": {
        "type": "object",
        "properties": {
            "conversation_id": {"type": "string"},
            "owner": {"type": ["string", "null"]},
            "turns": {"type": "array", "items": {"type": "object"}},
            "messages": {"type": "array", "items": {"type": "object"}},
        },
    },
}
