"""Schema names and the NOTIFY channel names derived from them."""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

from ._errors import InvalidInput

DEFAULT_SCHEMA = "runrow"
_PLAIN = re.compile(r"^[a-z_][a-z0-9_]{0,19}$")
# Postgres truncates identifiers (LISTEN's channel among them) at 63 bytes.
MAX_IDENTIFIER_BYTES = 63


def check_schema(schema: str) -> str:
    """Validates a schema name the host chose; any text that is a legal identifier passes."""
    if not isinstance(schema, str) or not schema:
        raise InvalidInput("schema", "must be a non-empty string")
    if "\x00" in schema:
        raise InvalidInput("schema", "must not contain NUL characters")
    if len(schema.encode()) > MAX_IDENTIFIER_BYTES:
        raise InvalidInput("schema", f"must be at most {MAX_IDENTIFIER_BYTES} bytes")
    return schema


@dataclass(frozen=True)
class Channels:
    """The NOTIFY channels of one runrow schema.

    Channel names are values to ``pg_notify`` and quoted identifiers to ``LISTEN``;
    they never carry user input and always fit Postgres's 63-byte limit.
    """

    prefix: str

    @classmethod
    def for_schema(cls, schema: str) -> Channels:
        if _PLAIN.match(schema):
            return cls(schema)
        # Any other schema name becomes a short, stable, safe prefix.
        return cls("rr" + hashlib.sha256(schema.encode()).hexdigest()[:16])

    @property
    def wake(self) -> str:
        """Queue wake-ups: a run became claimable."""
        return f"{self.prefix}_wake"

    @property
    def cancel(self) -> str:
        """Cancel requests; the payload is the run id."""
        return f"{self.prefix}_cancel"

    @property
    def events_prefix(self) -> str:
        return f"{self.prefix}_ev_"

    def events(self, run_id: uuid.UUID | str) -> str:
        """New journal rows of one run."""
        return self.events_prefix + uuid.UUID(str(run_id)).hex
