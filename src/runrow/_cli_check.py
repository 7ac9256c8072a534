"""``runrow check module:agent [--failed-since DURATION]``: replays the waiting (and
recently failed) runs against new code without side effects, one line per run, and exits
8 if any would not resume cleanly: a deploy gate (docs/howto/upgrading.md#deploying)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ._cli_support import database_url, load_agent, out

if TYPE_CHECKING:
    import argparse

    from ._check import CheckResult

__all__ = ["EXIT_MISMATCH", "cmd_check"]

EXIT_MISMATCH = 8
"""``check``'s exit status when a run would not resume cleanly."""


def _lines(results: list[CheckResult]) -> str:
    if not results:
        return "no run to check (none waiting, none failed in the window)"
    lines = []
    for r in results:
        verdict = (
            "ok"
            if r.ok
            else "MISMATCH"
            if r.position is not None and r.stopped == "step mismatch"
            else "FAILS"
        )
        lines.append(f"{r.run_id}  {r.status:<7}  {r.version or '-'}  {verdict}  {r.problem or r.stopped}")
    bad = sum(not r.ok for r in results)
    lines.append(f"{len(results)} run(s) checked, {bad} would not resume cleanly")
    return "\n".join(lines)


async def cmd_check(args: argparse.Namespace) -> int:
    """Replays and reports; exit 0 when every run would resume cleanly, else 8."""
    from ._check import check_runs

    agent = load_agent(args.agent)
    results = await check_runs(
        database_url(args),
        agent,
        failed_since=args.failed_since,
        timeout=args.timeout,
        schema=args.schema,
    )
    bad = sum(not r.ok for r in results)
    data = {"runs": [dataclasses.asdict(r) for r in results], "checked": len(results), "mismatches": bad}
    out(args, data, _lines(results))
    return EXIT_MISMATCH if bad else 0
