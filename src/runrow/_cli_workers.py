"""``runrow workers``: the live dispatchers (the registry); ``runrow workers wait
--version OLD``, which returns once no run claimed by a worker of that version is running,
for deploy scripts (docs/howto/upgrading.md#deploying); ``runrow workers stranded``, the
runs no live worker's version resumes."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ._cli_support import database_url, out

if TYPE_CHECKING:
    import argparse

    from ._gateway.workers import UnservedKey, WorkerRow

__all__ = ["EXIT_NOT_DRAINED", "cmd_workers"]

EXIT_NOT_DRAINED = 7
"""``workers wait``'s exit status when its ``--timeout`` passed first."""


def _unserved_lines(unserved: list[UnservedKey]) -> list[str]:
    """A warning per agent key with queued runs that no live worker serves."""
    return [
        f"warning: {u.runs} queued run(s) of agent "
        f"{repr(u.agent_key) if u.agent_key else '(default)'} that no live worker serves "
        f"(oldest queued {u.oldest:%Y-%m-%d %H:%M:%S})"
        for u in unserved
    ]


def _lines(workers: list[WorkerRow]) -> str:
    if not workers:
        return "(no live workers)"
    now = datetime.now(UTC)
    idw = max(len("WORKER"), *(len(w.id) for w in workers))
    vw = max(len("VERSION"), *(len(w.version or "-") for w in workers))
    lines = [f"{'WORKER':<{idw}}  {'VERSION':<{vw}}  {'RUNS':>9}  {'BEAT':>6}  AGENT"]
    for w in workers:
        beat = f"{(now - w.heartbeat_at).total_seconds():.0f}s ago"
        stale = "  (lease lapsed)" if w.expires_at < now else ""
        lines.append(
            f"{w.id:<{idw}}  {w.version or '-':<{vw}}  {f'{w.in_flight}/{w.concurrency}':>9}  "
            f"{beat:>6}  {w.agent}{_keys(w)}{stale}"
        )
    return "\n".join(lines)


def _keys(w: WorkerRow) -> str:
    """The agent keys a worker serves, after its agent's name (none: the default only)."""
    if not w.agent_keys:
        return ""
    keys = ", ".join(w.agent_keys)
    return f" [{keys}{'' if w.serves_default is False else ', (default)'}]"


async def cmd_workers(args: argparse.Namespace) -> int:
    """Lists the registry, or (``wait``) waits for a version to drain."""
    from ._workers import list_workers, stranded_runs, unserved_runs, wait_version_drained

    url = database_url(args)
    if getattr(args, "workers_command", None) == "stranded":
        found = await stranded_runs(url, older_than=args.older_than, schema=args.schema)
        lines = [
            f"{r.id}  {r.conversation_id}  version {r.version}  queued since {r.queued_since:%Y-%m-%d %H:%M:%S}"
            for r in found
        ]
        out(args, [r._asdict() for r in found], "\n".join(lines) or "(no stranded runs)")
        return 0
    if getattr(args, "workers_command", None) != "wait":
        workers = await list_workers(url, schema=args.schema)
        unserved = await unserved_runs(url, schema=args.schema)
        text = "\n".join([_lines(workers), *_unserved_lines(unserved)])
        out(args, [w._asdict() for w in workers], text)
        return 0
    seen: list[int] = []

    def progress(n: int) -> None:
        if not seen or seen[-1] != n:  # (a line per change, not per poll)
            sys.stderr.write(f"runrow workers wait: {n} run(s) of version {args.version} running\n")
        seen.append(n)

    drained = await wait_version_drained(
        url,
        args.version,
        timeout=args.timeout,
        interval=args.interval,
        schema=args.schema,
        progress=progress,
    )
    data: dict[str, Any] = {"version": args.version, "drained": drained}
    text = (
        f"version {args.version}: no run of it is running"
        if drained
        else f"version {args.version}: still running after {args.timeout:g}s"
    )
    out(args, data, text)
    return 0 if drained else EXIT_NOT_DRAINED
