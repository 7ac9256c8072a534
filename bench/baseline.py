"""The standing baseline: the checkout against the pinned commit (bench/baseline.txt).

    python bench/baseline.py [--rounds 5] [--server system] [--ref main] [--report FILE]

Checks the pinned commit out into a temporary worktree (``git worktree add --detach``),
then runs bench/ab.py with side A the baseline and side B this checkout (or ``--ref``,
checked out likewise): no-op drains at 1, 10, 40 and 160 in flight and the agent-shaped
turn (issue #39) at 1, 16 and 160, rounds interleaved, one server. It writes a Markdown
report (median per case, B/A, min-max, every round) and ab.py's JSON beside it, and
removes the worktrees. A baseline without ``run.step`` runs the turn without its steps
on both sides; the report says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
PIN = BENCH_DIR / "baseline.txt"
CORE = (1, 10, 40, 160)
TURN = (1, 16, 160)


def pinned() -> str:
    """The pinned commit: the first line of bench/baseline.txt that is not a comment."""
    for line in PIN.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line.split()[0]
    raise SystemExit(f"{PIN}: no commit pinned")


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def checkout(ref: str, into: Path) -> str:
    """``git worktree add --detach`` of ``ref``; returns the full commit id."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    _git("worktree", "add", "--detach", str(into), commit)
    return commit


def report(data: dict[str, Any], pin: str, b_label: str, seconds: float) -> str:
    cases = data["cases"]
    lines = [
        f"# Standing baseline: {b_label} (B) against {pin} (A)",
        "",
        f"bench/ab.py, {len(next(iter(cases.values()))['a'])} interleaved rounds, server {data['server']}; "
        f"took {seconds / 60:.1f} min. runs/s (turn: turns/s), median over rounds; B/A >= 1.0 is as fast.",
        "",
    ]
    if data.get("turn_steps") is False:
        lines += ["The baseline has no `run.step`: the turn ran without its 3 steps on both sides.", ""]
    lines += [
        "| case | A median | B median | B/A | A min-max | B min-max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case, e in cases.items():
        if "cpu" in case:
            continue
        a, b = e["a"], e["b"]
        lines.append(
            f"| {case} | {statistics.median(a):,.1f} | {statistics.median(b):,.1f} | {e['ratio']:.2f} | "
            f"{min(a):,.0f}-{max(a):,.0f} | {min(b):,.0f}-{max(b):,.0f} |"
        )
    cpu = [(c, e) for c, e in cases.items() if "cpu" in c]
    if cpu:
        lines += [
            "",
            "Worker CPU per run (µs; lower is better):",
            "",
            "| case | A | B | B/A |",
            "|---|---:|---:|---:|",
        ]
        for case, e in cpu:
            a, b = statistics.median(e["a"]), statistics.median(e["b"])
            lines.append(f"| {case} | {a:,.0f} | {b:,.0f} | {e['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1200, help="as bench/ab.py")
    parser.add_argument("--server", default="system", help="as bench/run.py (default: system)")
    parser.add_argument("--ref", help="side B: this ref checked out (default: this checkout's src)")
    parser.add_argument("--pin", help="side A instead of bench/baseline.txt's commit")
    parser.add_argument("--core", default=",".join(map(str, CORE)), help="no-op drains' in-flight counts")
    parser.add_argument("--turn", default=",".join(map(str, TURN)), help="the turn's in-flight counts")
    parser.add_argument(
        "--report", type=Path, help="Markdown report (default bench/results/baseline-DATE.md)"
    )
    args = parser.parse_args()
    pin = args.pin or pinned()
    stamp = time.strftime("%Y%m%d-%H%M")
    out = args.report or BENCH_DIR / "results" / f"baseline-{stamp}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="runrow-baseline-") as tmp:
        trees: list[Path] = []
        try:
            base = Path(tmp) / "a"
            pin_full = checkout(pin, base)
            trees.append(base)
            if args.ref:
                b_tree = Path(tmp) / "b"
                b_commit = checkout(args.ref, b_tree)
                trees.append(b_tree)
                b_label = f"{args.ref} ({b_commit[:9]})"
            else:
                b_tree = ROOT
                dirty = " + uncommitted changes" if _git("status", "--porcelain", "--", "src") else ""
                b_label = f"this checkout ({_git('rev-parse', '--short=9', 'HEAD')}{dirty})"
            cases = [f"core c{c}" for c in args.core.split(",") if c]
            cases += [f"turn c{c}" for c in args.turn.split(",") if c]
            js = out.with_suffix(".json")
            cmd = [
                sys.executable,
                str(BENCH_DIR / "ab.py"),
                "--a", str(base / "src"),
                "--b", str(b_tree / "src"),
                "--rounds", str(args.rounds),
                "--runs", str(args.runs),
                "--concurrency", args.core,
                "--turn-concurrency", args.turn,
                "--cases", ",".join(cases),
                "--server", args.server,
                "--json", str(js),
            ]  # fmt: skip
            t0 = time.monotonic()
            subprocess.run(cmd, check=True)
            data = json.loads(js.read_text())
        finally:
            for tree in trees:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
                )
    text = report(data, f"{pin} ({pin_full[:9]})", b_label, time.monotonic() - t0)
    out.write_text(text)
    print(f"\n{text}\nWritten: {out} (and {js.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
