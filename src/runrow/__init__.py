"""runrow: durable AI-agent runs on plain PostgreSQL. A run is not a request; it is a row."""

from __future__ import annotations

from ._db import Database
from ._models import Draft, Message, Run, RunInfo, RunStatus, StopResult
from .enqueue import enqueue, retry_run
from .errors import (
    ConfigurationError,
    InvalidInput,
    LeaseLost,
    RunNotFound,
    RunrowError,
    SchemaOutOfDate,
)
from .migrate import latest_version, migrate

__all__ = [
    "ConfigurationError",
    "Database",
    "Draft",
    "InvalidInput",
    "LeaseLost",
    "Message",
    "Run",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "RunrowError",
    "SchemaOutOfDate",
    "StopResult",
    "enqueue",
    "latest_version",
    "migrate",
    "retry_run",
]

__version__ = "0.1.0.dev0"

# Public names report the package, not the private module that defines them.
for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and getattr(_obj, "__module__", "").startswith("runrow."):
        try:
            _obj.__module__ = "runrow"
        except (AttributeError, TypeError):
            pass
del _name, _obj
