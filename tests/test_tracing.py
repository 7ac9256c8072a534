"""OpenTelemetry: the enqueuing request's trace continues into the worker's run span,
and the agent's own spans are children of it (SDK in-memory exporter, real database)."""

from __future__ import annotations

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import runrow
from runrow.tracing import TRACE_KEY, TracingObserver, traced_enqueue

from .helpers import status_of, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_enqueue_and_run_spans_share_the_request_trace(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, tracing: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = tracing
    tracer = provider.get_tracer("host-app")
    seen_request: list[object] = []

    async def agent(run: runrow.RunContext) -> None:
        seen_request.append(run.request)
        with tracer.start_as_current_span("agent.llm_call"):
            await run.text("hello")
        if run.content == "bad":
            raise RuntimeError("boom")

    observer = TracingObserver(provider)
    async with runrow.Dispatcher(dsn, agent, schema=schema, observers=[observer], poll=0.5) as d:
        with tracer.start_as_current_span("POST /messages", kind=SpanKind.SERVER) as request_span:
            run = await traced_enqueue(
                d.pool,
                schema=schema,
                conversation_id="c",
                user_id="u",
                content="hi",
                request={"model": "m"},
                tracer_provider=provider,
            )
        bad = await traced_enqueue(
            d.pool, schema=schema, conversation_id="c2", user_id="u", content="bad", tracer_provider=provider
        )
        for r, st in ((run, "completed"), (bad, "failed")):
            await wait_for(lambda r=r, st=st: _is(conn, schema, r.id, st), what="runs to end")
        await wait_for(
            lambda: len([s for s in exporter.get_finished_spans() if s.name == "runrow.run"]) == 2,
            what="both run spans to end",
        )

    spans = exporter.get_finished_spans()
    by_run = {s.attributes["runrow.run_id"]: s for s in spans if s.name == "runrow.run" and s.attributes}
    trace_id = request_span.get_span_context().trace_id
    (enq,) = [
        s
        for s in spans
        if s.name == "runrow.enqueue" and s.attributes and s.attributes.get("runrow.run_id") == str(run.id)
    ]
    run_span = by_run[str(run.id)]
    # One trace from the HTTP request to the worker: request -> enqueue -> run -> agent.
    assert enq.context.trace_id == trace_id
    assert enq.parent is not None and enq.parent.span_id == request_span.get_span_context().span_id
    assert run_span.context.trace_id == trace_id
    assert run_span.parent is not None and run_span.parent.span_id == enq.context.span_id
    assert run_span.kind == SpanKind.CONSUMER
    assert run_span.attributes is not None and run_span.attributes["runrow.status"] == "completed"
    (llm,) = [s for s in spans if s.name == "agent.llm_call" and s.context.trace_id == trace_id]
    assert llm.parent is not None and llm.parent.span_id == run_span.context.span_id
    (fin,) = [s for s in spans if s.name == "runrow.finalize" and s.context.trace_id == trace_id]
    assert fin.parent is not None and fin.parent.span_id == run_span.context.span_id
    assert run_span.end_time is not None and fin.end_time is not None and fin.end_time <= run_span.end_time
    assert any(s.name == "runrow.claim" for s in spans)

    # The failing run is its own trace (no request span around it), marked as an error.
    bad_span = by_run[str(bad.id)]
    assert bad_span.context.trace_id != trace_id
    assert bad_span.status.status_code == StatusCode.ERROR

    # The snapshot keeps the host's keys; the reserved key carries a W3C traceparent.
    first = next(r for r in seen_request if isinstance(r, dict) and "model" in r)
    assert first["model"] == "m"
    assert first[TRACE_KEY]["traceparent"].split("-")[1] == format(trace_id, "032x")


async def test_without_an_sdk_spans_are_noops(dsn: str, schema: str) -> None:
    # The API alone (no provider configured here): enqueue still works and carries a key.
    run = await traced_enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    info = await runrow.get_run(dsn, run.id, schema=schema)
    assert isinstance(info.request, dict) and TRACE_KEY in info.request
    with pytest.raises(TypeError):
        await traced_enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x", request=[1])


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: object, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status
