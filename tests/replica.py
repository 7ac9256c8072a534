"""A primary and a streaming hot standby of it, started by the tests themselves.

The standby is a ``pg_basebackup -R`` of the primary, started on its own port and socket
by runrow's launcher (``runrow.embedded``: as an unprivileged account when run as root),
so it can be stopped, restarted, paused (``pg_wal_replay_pause()``) like the primary.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import psycopg

from runrow.embedded import EmbeddedPostgres, _gid, _uid, find_bin_dir

if TYPE_CHECKING:
    from collections.abc import Iterator


def start_standby(primary: EmbeddedPostgres) -> EmbeddedPostgres:
    """A hot standby of ``primary`` (a running launcher), streaming from it."""
    standby = EmbeddedPostgres(fast=True, settings={"hot_standby": "on", "max_connections": "200"})
    bin_dir = find_bin_dir(standby.user)
    standby._prepare_dirs()
    out = subprocess.run(
        [
            str(bin_dir / "pg_basebackup"),
            "-D",
            str(standby.data_dir),
            "-h",
            str(primary.socket_dir),
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--no-sync",
            "-c",
            "fast",
        ],
        capture_output=True,
        check=False,
        user=_uid(standby.user),
        group=_gid(standby.user),
    )
    if out.returncode != 0:
        raise RuntimeError(f"pg_basebackup failed:\n{out.stderr.decode(errors='replace')}")
    standby.start()
    return standby


def primary_and_standby() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """A primary ready to be streamed from, and its standby; both stopped afterwards."""
    primary = EmbeddedPostgres(
        fast=True,
        settings={"wal_level": "replica", "max_wal_senders": "4", "max_connections": "200"},
    )
    primary.start()
    try:
        # Trust for replication connections over the socket (initdb's default lines
        # cover it with --auth=trust).
        standby = start_standby(primary)
        try:
            yield primary, standby
        finally:
            standby.stop()
    finally:
        primary.stop()


def replayed(standby_dsn: str, primary_dsn: str) -> bool:
    """Whether the standby has replayed everything the primary has written so far. (The
    insert position: the test servers commit with synchronous_commit off, so a commit may
    still sit in the WAL buffers, past pg_current_wal_lsn(), as sql/replica.sql says.)"""
    with (
        psycopg.connect(primary_dsn, autocommit=True) as p,
        psycopg.connect(standby_dsn, autocommit=True) as s,
    ):
        lsn = p.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        assert lsn is not None
        row = s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn[0],)).fetchone()
        return bool(row and row[0])
