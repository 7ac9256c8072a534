"""The demo API's OpenAPI 3.1 document, written by hand (Starlette does not generate one)."""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


_RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
_CONV_ID = {
    "name": "conversation_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
}
_NOT_FOUND = _error("Unknown, or another user's (the two are indistinguishable)")
_NOT_YOURS = _error("`forbidden`: the conversation belongs to another user")
_STOP = {
    "description": "What the stop did",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/StopResult"}}},
}


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "runrow demo chat API",
            "version": "1",
            "description": (
                "The example server bundled with runrow. Authentication is a demo stand-in: "
                "`Authorization: Bearer demo-<name>` makes you user `<name>`. Replace it before "
                "exposing anything."
            ),
        },
        "security": [{"demoBearer": []}],
        "paths": {
            "/v1/conversations/{conversation_id}/messages": {
                "post": {
                    "summary": "Post a user message; starts (or queues) a run",
                    "parameters": [
                        _CONV_ID,
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string", "maxLength": 200},
                        },
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["content"],
                                    "properties": {"content": {"type": "string", "minLength": 1}},
                                }
                            }
                        },
                    },
                    "responses": {
                        "202": {
                            "description": "The run (the first one again for a repeated Idempotency-Key)",
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/Accepted"}}
                            },
                        },
                        "400": _error("Malformed body, conversation id or key"),
                        "401": _error("No demo bearer token"),
                        "403": _NOT_YOURS,
                        "409": _error("The Idempotency-Key was already used for another message"),
                        "413": _error("`too_large`: the body or its content is over its size limit"),
                        "422": _error("Content missing or not text"),
                        "429": _error(
                            "Too many turns already waiting in this conversation (see Retry-After)"
                        ),
                    },
                }
            },
            "/v1/conversations/{conversation_id}": {
                "get": {
                    "summary": "Transcript, turns (runs with their messages and tool calls) and the tool's notes",
                    "parameters": [_CONV_ID],
                    "responses": {
                        "200": {
                            "description": (
                                "The conversation. `owner` is null (and the lists empty) while nobody "
                                "has posted to it: the first message makes it the poster's. A finished "
                                "turn's `tool_calls` lists its calls (`uncertain`: started, never "
                                "finished, its worker lost); a live turn's is null (they stream)."
                            )
                        },
                        "403": _NOT_YOURS,
                    },
                }
            },
            "/v1/conversations/{conversation_id}/stop": {
                "post": {
                    "summary": "Stop every active turn; queued messages come back as drafts",
                    "parameters": [_CONV_ID],
                    "responses": {"200": _STOP, "403": _NOT_YOURS},
                }
            },
            "/v1/runs/{run_id}/position": {
                "get": {
                    "summary": "A queued run's place in line and estimated wait",
                    "parameters": [_RUN_ID],
                    "responses": {
                        "200": {
                            "description": (
                                "position (null unless queued), exact (false: an estimate past the "
                                "first thousand), estimated_wait_seconds (the median duration of the "
                                "last 20 completed runs times the rounds of runs ahead; null with fewer "
                                "than 3 of them, in finished_samples)"
                            ),
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/Position"}}
                            },
                        },
                        "404": {"description": "no such run for this user"},
                    },
                }
            },
            "/v1/runs/{run_id}": {
                "get": {
                    "summary": "A run's state",
                    "parameters": [_RUN_ID],
                    "responses": {
                        "200": {
                            "description": "The run",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}},
                        },
                        "404": _NOT_FOUND,
                    },
                }
            },
            "/v1/runs/{run_id}/cancel": {
                "post": {
                    "summary": "Stop one run",
                    "parameters": [_RUN_ID],
                    "responses": {"200": _STOP, "404": _NOT_FOUND},
                }
            },
            "/v1/runs/{run_id}/events": {
                "get": {
                    "summary": "The run's journal as Server-Sent Events, live, until the terminal event",
                    "description": (
                        "`id:` is the event's seq, `event:` its type, `data:` its JSON. Resume after a "
                        "seq with `?from=N` or the `Last-Event-ID` header (which wins). Idle streams get "
                        "`: keepalive` comments. Also accepts `?access_token=demo-<name>` because "
                        "EventSource cannot send headers."
                    ),
                    "parameters": [
                        _RUN_ID,
                        {
                            "name": "from",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 0, "maximum": 2147483647},
                        },
                        {
                            "name": "Last-Event-ID",
                            "in": "header",
                            "schema": {"type": "integer", "minimum": 0},
                        },
                        {"name": "access_token", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": {
                            "description": "An event stream",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}},
                        },
                        "204": {
                            "description": (
                                "The run has finished and nothing follows the cursor: an EventSource "
                                "stops reconnecting"
                            )
                        },
                        "400": _error("Bad cursor"),
                        "404": _NOT_FOUND,
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {
                "demoBearer": {"type": "http", "scheme": "bearer", "description": "demo-<name>"}
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
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
                        "status": {"enum": ["queued", "running", "completed", "failed", "cancelled"]},
                        "cancel_requested": {"type": "boolean"},
                        "error": {"type": ["object", "null"]},
                        "created_at": {"type": "string", "format": "date-time"},
                        "started_at": {"type": ["string", "null"], "format": "date-time"},
                        "finished_at": {"type": ["string", "null"], "format": "date-time"},
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
                        "cancelled": {"type": "array", "items": {"type": "string"}},
                        "cancel_requested": {"type": "array", "items": {"type": "string"}},
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
            },
        },
    }
