"""OpenTelemetry spans for runrow: ``pip install "runrow[tracing]"`` (the API only).

runrow depends on ``opentelemetry-api`` alone; without an SDK configured by the host
every span is a no-op. Spans:

* ``runrow.enqueue`` (producer), from :func:`traced_enqueue`, around the enqueue; it
  injects the current trace context (W3C ``traceparent``/``tracestate``, through the
  globally configured propagator) into the run's request snapshot under the reserved
  key :data:`TRACE_KEY` (``"_runrow_trace"``).
* ``runrow.claim``, from :class:`TracingObserver`, one per claim statement that took
  runs (``runrow.runs``: how many).
* ``runrow.run`` (consumer), around the agent call, as the current span: the agent's
  own spans are its children. Its parent is the enqueuing request's context, extracted
  from the request snapshot, so the request and the run share one trace.
* ``runrow.finalize``, a child of ``runrow.run``, from the agent's return to the
  ending's commit.

Attributes: ``runrow.run_id``, ``runrow.conversation_id``, ``runrow.worker_id``,
``runrow.queue_wait_seconds``, ``runrow.status`` and ``runrow.recorded``. No message
content or request data is ever put on a span.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import __version__
from ._enqueue import enqueue
from ._observe import Observer
from ._status import FAILED

if TYPE_CHECKING:
    import uuid
    from collections.abc import Iterator

    from ._db import Database
    from ._engine.view import RunView
    from ._models import Run

__all__ = ["TRACE_KEY", "TracingObserver", "traced_enqueue"]

log = logging.getLogger("runrow.tracing")

TRACE_KEY = "_runrow_trace"
"""The request-snapshot key :func:`traced_enqueue` writes the trace context under."""


def _tracer(provider: trace.TracerProvider | None) -> trace.Tracer:
    return trace.get_tracer("runrow", __version__, tracer_provider=provider)


async def traced_enqueue(
    db: Database,
    *,
    request: Mapping[str, Any] | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    **kwargs: Any,
) -> Run:
    """:func:`runrow.enqueue` inside a ``runrow.enqueue`` span, carrying the trace along.

    Takes the same keyword arguments as :func:`runrow.enqueue`. ``request`` must be a
    mapping (or None); a copy of it gets the current trace context under
    :data:`TRACE_KEY`, so the worker's ``runrow.run`` span joins the caller's trace.
    The key is reserved: a value the caller put there is replaced.
    """
    if request is not None and not isinstance(request, Mapping):
        raise TypeError("traced_enqueue needs request to be a mapping (or None) to carry the trace context")
    tracer = _tracer(tracer_provider)
    with tracer.start_as_current_span("runrow.enqueue", kind=SpanKind.PRODUCER) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        snapshot = {**(request or {}), TRACE_KEY: carrier}
        if "conversation_id" in kwargs:
            span.set_attribute("runrow.conversation_id", str(kwargs["conversation_id"]))
        run = await enqueue(db, request=snapshot, **kwargs)
        span.set_attribute("runrow.run_id", str(run.id))
        span.set_attribute("runrow.created", run.created)
        return run


def trace_context(request: Any) -> dict[str, str] | None:
    """The trace carrier in a request snapshot, if it holds a well-formed one."""
    if not isinstance(request, Mapping):
        return None
    carrier = request.get(TRACE_KEY)
    if not isinstance(carrier, Mapping):
        return None
    return {str(k): str(v) for k, v in carrier.items() if isinstance(v, str)}


class _RunSpans:
    __slots__ = ("finalize", "run")

    def __init__(self, run: trace.Span) -> None:
        self.run = run
        self.finalize: trace.Span | None = None


class TracingObserver(Observer):
    """A dispatcher observer that records claim, run and finalisation spans.

    ``tracer_provider`` defaults to the globally configured one.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = _tracer(tracer_provider)
        self._waits: dict[uuid.UUID, float] = {}
        self._spans: dict[uuid.UUID, _RunSpans] = {}

    def claimed(self, *, count: int, seconds: float) -> None:
        end = time.time_ns()
        span = self._tracer.start_span(
            "runrow.claim",
            start_time=end - int(seconds * 1e9),
            attributes={"runrow.runs": count},
        )
        span.end(end_time=end)

    def run_started(self, run: RunView, *, queue_wait: float) -> None:
        self._waits[run.run_id] = queue_wait

    @contextlib.contextmanager
    def run_scope(self, run: RunView) -> Iterator[None]:
        carrier = trace_context(run.request)
        parent = propagate.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            "runrow.run",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "runrow.run_id": str(run.run_id),
                "runrow.conversation_id": run.conversation_id,
                "runrow.worker_id": run.worker_id,
                "runrow.queue_wait_seconds": self._waits.pop(run.run_id, 0.0),
            },
        )
        spans = _RunSpans(span)
        self._spans[run.run_id] = spans
        # The run span stays open past the agent call: it ends with the ending's commit.
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            try:
                yield
            finally:
                spans.finalize = self._tracer.start_span(
                    "runrow.finalize",
                    context=trace.set_span_in_context(span),
                    attributes={"runrow.run_id": str(run.run_id)},
                )

    def first_event(self, run: RunView, *, seconds: float) -> None:
        spans = self._spans.get(run.run_id)
        if spans is not None:
            spans.run.add_event("runrow.first_event", {"runrow.seconds": seconds})

    def run_finished(self, run: RunView, *, status: str, seconds: float, recorded: bool) -> None:
        spans = self._spans.pop(run.run_id, None)
        if spans is None:
            return
        for s in (spans.finalize, spans.run):
            if s is None:
                continue
            s.set_attribute("runrow.status", status)
            s.set_attribute("runrow.recorded", recorded)
            if status == FAILED or not recorded:
                s.set_status(Status(StatusCode.ERROR, status if recorded else f"{status} (not recorded)"))
            s.end()

    def claim_lost(self, run: RunView) -> None:
        spans = self._spans.pop(run.run_id, None)
        if spans is None:
            return
        for s in (spans.finalize, spans.run):
            if s is not None:
                s.set_attribute("runrow.claim_lost", True)
                s.set_status(Status(StatusCode.ERROR, "claim lost: stood down"))
                s.end()
