"""The dispatcher's settings: validated once, frozen afterwards."""

from __future__ import annotations

import functools
import inspect
import math
import os
import socket
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _json
from .._errors import ConfigurationError, InvalidInput
from .._gateway._exec import OWN_TX_IDLE_SECONDS
from .._names import Channels, check_schema
from .._retry import RetryPolicy

if TYPE_CHECKING:
    from .._gateway.claims import ClaimOrder, ResumePolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What a :class:`~runrow.Dispatcher` was configured with (see its docstring for each)."""

    schema: str
    concurrency: int
    lease: float
    heartbeat: float
    grace: float
    poll: float
    reap_interval: float
    flush_interval: float
    finalize_timeout: float
    max_event_bytes: int
    worker_id: str
    claim_order: ClaimOrder
    prepared_statements: bool
    listen_conninfo: str | None
    notifications: bool
    log_error_messages: bool = True
    record_tracebacks: bool = True
    retry: RetryPolicy | None = None
    retry_stamp: str | None = None
    """The retry policy as each claim stamps it on its runs (None: no automatic retry)."""
    version: str | None = None
    """The host's code version, stamped on the runs it claims and the steps it records
    (see :func:`detect_version`); None: unversioned."""
    resume_policy: ResumePolicy = "replay"
    """Who resumes a run with recorded steps: any worker, or one of the run's version."""
    agent_keys: tuple[str, ...] = ()
    """The agent keys served (``Dispatcher(agents=...)``): the runs claimed, and the keys a
    run may spawn."""
    serves_default: bool = True
    """Whether the default agent (``Dispatcher(agent)``) is served: runs with no agent key."""
    max_spawn_depth: int = 8
    """How deep a tree of runs may grow: a root is depth 0, its children 1, and so on."""
    max_children: int = 1000
    """How many runs a tree may spawn in all (per root, every depth counted)."""
    max_running_per_tree: int | None = None
    """How many of a tree's spawned runs (every depth) it starts at once; None: no cap."""
    claim_with_endings: bool = False
    """Whether a slot freed by a run's end is claimed for in that ending's transaction
    (one commit instead of two; the next run waits for the ending to commit) rather than
    at once by the claim loop, beside the ending's write."""
    journal_notify: bool = True
    """False drops the journal's per-flush NOTIFY (tails then poll). Not a constructor
    option: the benchmark that measures what the NOTIFY costs sets it."""

    @property
    def tx_idle_seconds(self) -> float:
        """How long a transaction the worker opens may wait for the worker before the
        server ends it (see ``own_transaction``): at most the grace, so that a worker
        frozen mid-transaction (a spawn's, or any statement's on a pool not in autocommit)
        has let go of its rows by the time the reaper may end its runs; never under a
        second, which no legitimate pause between two statements comes near."""
        return max(1.0, min(OWN_TX_IDLE_SECONDS, self.grace))

    @classmethod
    def validate(
        cls,
        *,
        own_pool: bool,
        schema: str,
        concurrency: int,
        lease: float,
        heartbeat: float,
        grace: float,
        poll: float,
        reap_interval: float | None,
        flush_interval: float,
        finalize_timeout: float | None,
        max_event_bytes: int,
        worker_id: str | None,
        claim_order: ClaimOrder,
        prepared_statements: bool,
        listen_conninfo: str | None,
        notifications: bool,
        log_error_messages: bool = True,
        record_tracebacks: bool = True,
        retry: RetryPolicy | None = None,
        version: str | None = None,
        resume_policy: ResumePolicy = "replay",
        agents: Mapping[str | None, Any] | None = None,
        max_spawn_depth: int = 8,
        max_children: int = 1000,
        max_running_per_tree: int | None = None,
        claim_with_endings: bool = False,
    ) -> Settings:
        """The settings, with defaults filled in, or :class:`ConfigurationError` naming
        what is wrong. ``own_pool``: the dispatcher opens its pool from a conninfo."""
        check_schema(schema)
        if claim_order not in ("fair", "fifo"):
            raise ConfigurationError(f"claim_order must be 'fair' or 'fifo', got {claim_order!r}")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError("concurrency must be a positive integer")
        for name, value in (
            ("lease", lease),
            ("heartbeat", heartbeat),
            ("grace", grace),
            ("poll", poll),
            ("reap_interval", reap_interval),
            ("flush_interval", flush_interval),
            ("finalize_timeout", finalize_timeout),
        ):
            # (inf would pass "> 0" and then never fire: a lease=inf claim never expires
            # and the claim loop's bound never ends a hung claim; nan compares false.)
            if value is not None and not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ConfigurationError(f"{name} must be a finite number of seconds above 0, got {value!r}")
        if heartbeat > lease / 2:
            raise ConfigurationError(
                f"heartbeat ({heartbeat}s) must be at most half the lease ({lease}s), so one "
                "late heartbeat does not cost the claim"
            )
        # The lease is not rolled once a run's ending is handed over (the heartbeat skips
        # finishing runs), and was last rolled up to 2 x heartbeat before (one heartbeat
        # apart, plus up to one heartbeat that the previous beat may take before it gives
        # up). So the reaper may take the run lease + grace - 2 x heartbeat after the
        # hand-over; the ending must be given up, and dead on the server, by then.
        ending_bound = lease + grace - 2 * heartbeat
        if finalize_timeout is None:
            finalize_timeout = min(10.0, ending_bound)
        elif finalize_timeout > ending_bound:
            raise ConfigurationError(
                f"finalize_timeout ({finalize_timeout}s) must be at most {ending_bound:g}s "
                f"(lease + grace - 2 x heartbeat), so a live worker's ending is given up "
                "before the reaper could take its run"
            )
        if not prepared_statements and not own_pool:
            # The flag shapes only the pool the dispatcher opens; a caller's pool prepares
            # as its owner configured it (prepare_threshold), and changing a shared pool's
            # connections behind its owner's back is not ours to do.
            raise ConfigurationError(
                "prepared_statements=False applies only to the pool the dispatcher opens from a "
                "conninfo string; build your pool with kwargs={'prepare_threshold': None} instead"
            )
        if worker_id is not None:
            _json.check_id(worker_id, "worker_id")
        if version is None:
            version = detect_version()
        elif not isinstance(version, str) or not 0 < len(version) <= 200 or "\x00" in version:
            raise ConfigurationError(f"version must be 1 to 200 characters of text, got {version!r}")
        if resume_policy not in ("replay", "same_version"):
            raise ConfigurationError(
                f"resume_policy must be 'replay' or 'same_version', got {resume_policy!r}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(
                f"retry must be a runrow.RetryPolicy or None, got {type(retry).__name__}"
            )
        for name, limit in (("max_spawn_depth", max_spawn_depth), ("max_children", max_children)):
            if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**31:
                raise ConfigurationError(f"{name} must be a non-negative integer below 2**31, got {limit!r}")
        if max_running_per_tree is not None and (
            isinstance(max_running_per_tree, bool)
            or not isinstance(max_running_per_tree, int)
            or not 1 <= max_running_per_tree < 2**31
        ):
            raise ConfigurationError(
                f"max_running_per_tree must be None or a positive integer below 2**31, got {max_running_per_tree!r}"
            )
        if not isinstance(claim_with_endings, bool):
            raise ConfigurationError(f"claim_with_endings must be True or False, got {claim_with_endings!r}")
        return cls(
            schema=schema,
            concurrency=concurrency,
            lease=lease,
            heartbeat=heartbeat,
            grace=grace,
            poll=poll,
            reap_interval=reap_interval if reap_interval is not None else poll,
            flush_interval=flush_interval,
            finalize_timeout=finalize_timeout,
            max_event_bytes=max_event_bytes,
            worker_id=worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
            claim_order=claim_order,
            prepared_statements=prepared_statements,
            listen_conninfo=listen_conninfo,
            notifications=notifications,
            log_error_messages=log_error_messages,
            record_tracebacks=record_tracebacks,
            retry=retry,
            retry_stamp=None if retry is None else retry.stamp(),
            version=version,
            resume_policy=resume_policy,
            agent_keys=tuple(sorted(k for k in agents or () if k is not None)),
            serves_default=agents is None or None in agents,
            max_spawn_depth=max_spawn_depth,
            max_children=max_children,
            max_running_per_tree=max_running_per_tree,
            claim_with_endings=claim_with_endings,
        )

    @property
    def channels(self) -> Channels:
        """The schema's NOTIFY channels."""
        return Channels.for_schema(self.schema)

    @property
    def ending_margin(self) -> float:
        """How much sooner than an ending's budget the server must end its statement, so
        that the server's answer (the error) reaches the worker before it gives up."""
        return min(1.0, 0.1 * self.finalize_timeout)

    @property
    def session_budget(self) -> float:
        """The bound the ending writer's kept connection carries for its session: an
        ending handed over and sent within one more margin, as on the hot path, leaves
        at least this much of its budget, and goes out alone."""
        return self.finalize_timeout - 2 * self.ending_margin


def detect_version() -> str | None:
    """The version a dispatcher stamps when the host names none: ``$RUNROW_VERSION`` if set
    (empty: none), else the short commit hash of the working directory's git checkout,
    else None. Never raises; git is asked once per process and directory."""
    if (env := os.environ.get("RUNROW_VERSION")) is not None:
        return env.strip()[:200] or None
    return _git_head(os.getcwd())


@functools.cache
def _git_head(cwd: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or a hung one
        return None
    head = done.stdout.strip()
    return head if done.returncode == 0 and head and len(head) <= 200 else None


def check_agent(agent: object) -> None:
    """Refuses what cannot be an agent now, rather than failing every run it is given:
    an ``async def`` function (or a partial of one, or an object whose ``__call__`` is
    one) that takes the run as its one required positional argument."""
    wanted = "must be an async function taking the run, as in `async def agent(run: RunContext) -> None`"
    if not callable(agent):
        raise InvalidInput("agent", f"{wanted}; got {type(agent).__name__}")
    target: Any = agent
    while isinstance(target, functools.partial):
        target = target.func
    call = target if inspect.isfunction(target) or inspect.ismethod(target) else type(target).__call__
    if not inspect.iscoroutinefunction(call):
        raise InvalidInput("agent", f"{wanted}; {agent!r} is not async (write it with `async def`)")
    try:
        inspect.signature(agent).bind(None)
    except TypeError:
        raise InvalidInput("agent", f"{wanted}; {agent!r} cannot be called with one argument") from None
    except ValueError:  # no signature to read (a builtin): let it through
        pass


def check_agents(agent: object, agents: object) -> dict[str | None, Any]:
    """The agents a dispatcher serves, by key (None: the default agent, ``agent``), each
    checked as :func:`check_agent` does; at least one. Keys are identifiers (as ids are)."""
    served: dict[str | None, Any] = {}
    if agent is not None:
        check_agent(agent)
        served[None] = agent
    if agents is not None:
        if not isinstance(agents, Mapping):
            raise InvalidInput(
                "agents", f"must be a mapping of agent key to agent, got {type(agents).__name__}"
            )
        for key, each in agents.items():
            _json.check_id(key, "agents", max_len=200)
            check_agent(each)
            served[key] = each
    if not served:
        raise InvalidInput("agent", "give an agent, or agents={key: agent, ...}, or both")
    return served
