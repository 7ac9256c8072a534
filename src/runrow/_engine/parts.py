"""A running dispatcher's parts, wired together: the services and their shared state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _aio
from .._db import HeldConnection
from .._observe import Observers
from .claimer import Claimer
from .ending import EndingWriter
from .executor import Executor
from .journal_writer import Appender
from .lease import LeaseKeeper
from .reaper import Reaper
from .roster import Roster
from .schema_watch import SchemaWatch
from .service import Services

if TYPE_CHECKING:
    from .._gateway.claims import ClaimedRun
    from .dispatcher import Dispatcher


# The pool size from which the heartbeat and the reaper keep a connection each (below
# it, they take a pooled connection per statement, as the runs do).
UPKEEP_MIN_POOL = 7


class Host:
    """The narrow handle a RunContext gets on the engine (see ``context.RunHost``)."""

    __slots__ = ("db_trouble", "lost", "park", "pool", "settings")

    def __init__(self, dispatcher: Dispatcher, roster: Roster) -> None:
        self.settings = dispatcher.settings
        self.pool = dispatcher._pool_now
        self.lost = roster.lost
        self.park = roster.park
        self.db_trouble = dispatcher._db_trouble


class Parts:
    """One running dispatcher's services and their shared state, wired together."""

    def __init__(self, d: Dispatcher) -> None:
        s = d.settings
        pool, trouble = d._pool_now, d._db_trouble
        observe = Observers(d._observer_list, s.worker_id)
        self.services = Services()
        self.tasks = _aio.TaskSet()  # per-run work: the runs, their helpers, retries, checks
        self.roster = Roster(s.concurrency)
        self.appender = Appender(s, pool, trouble)
        self.claimer = Claimer(s, self.roster, pool, d._stats, observe, self._start, trouble)
        # The ending writer claims for the slots that endings free, with them (see ending.py).
        self.endings = EndingWriter(s, self.roster, pool, d._stats, self.tasks, trouble, self.claimer)
        # The heartbeat and the reaper each keep a connection: keeping claims alive and
        # ending abandoned runs never wait behind the runs' own statements for a pooled
        # connection (a pool that busy would cost leases), nor behind each other.
        self.beat_conn = HeldConnection(pool, min_pool=UPKEEP_MIN_POOL)
        self.reap_conn = HeldConnection(pool, min_pool=UPKEEP_MIN_POOL)
        self.lease = LeaseKeeper(s, self.roster, pool, self.beat_conn, observe, self.tasks, trouble)
        self.reaper = Reaper(s, self.roster, self.reap_conn, d._stats, observe)
        self.schema_watch = SchemaWatch(s, pool, self.claimer, self.roster, self.services)
        self.executor = Executor(
            s,
            self.roster,
            d._agent,
            observe,
            self.endings,
            self.appender,
            self.tasks,
            Host(d, self.roster),
            d._stats,
        )

    def _start(self, row: ClaimedRun) -> None:
        self.lease.adopt(self.roster.runs[row.id])
        self.executor.start(row)
