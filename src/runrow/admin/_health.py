"""Queue health: per-tenant queue, workers, and a server-rendered SVG chart of runs
finished (and reaped) per bucket over the last hours. No script, no external fetch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from .._gateway import admin as gw
from .._gateway import usage as gw_usage
from .._gateway._exec import run
from ._html import Html, e, join, table, ts

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ._app import AdminState

__all__ = ["HealthPage", "chart", "depth_chart"]

WINDOW = 6 * 3600.0
BUCKET = 600.0


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def chart(buckets: list[gw.Bucket], *, now: datetime, window: float, bucket: float) -> Html:
    """Finished runs per bucket as an SVG bar chart, with reaped runs marked; a table
    of the same figures follows for screen readers (the chart is aria-hidden)."""
    n = int(window // bucket)
    start = now - timedelta(seconds=window)
    by_slot: dict[int, gw.Bucket] = {}
    for b in buckets:
        slot = int((b.bucket - start).total_seconds() // bucket)
        if 0 <= slot < n:
            by_slot[slot] = b
        elif slot == n:  # the current, partial bucket
            by_slot[n - 1] = b
    peak = max([b.completed + b.ended_otherwise for b in by_slot.values()] + [1])
    width, height, pad = 720, 160, 24
    bar = (width - 2 * pad) / n
    bars = []
    for slot, b in sorted(by_slot.items()):
        x = pad + slot * bar
        total = b.completed + b.ended_otherwise
        for value, cls, y0 in ((total, "bar-total", 0), (b.reaped, "bar-reaped", 0)):
            h = (height - 2 * pad) * value / peak
            bars.append(
                f'<rect class="{cls}" x="{x + 1:.1f}" y="{height - pad - h - y0:.1f}" '
                f'width="{max(bar - 2, 1):.1f}" height="{h:.1f}"></rect>'
            )
    axis = (
        f'<line class="axis" x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}"></line>'
        f'<text class="label" x="{pad}" y="{height - 6}">{e(start.strftime("%H:%M"))}Z</text>'
        f'<text class="label" x="{width - pad}" y="{height - 6}" text-anchor="end">now</text>'
        f'<text class="label" x="{pad}" y="{pad - 8}">peak {peak} per {int(bucket // 60)} min</text>'
    )
    svg = (
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-hidden="true" focusable="false">{axis}{"".join(bars)}</svg>'
    )
    rows = [(ts(b.bucket), b.completed, b.ended_otherwise, b.reaped) for b in buckets]
    data = table(
        "Runs finished per bucket",
        ("Bucket (UTC)", "Completed", "Failed or cancelled", "Reaped"),
        rows,
        empty="No run finished in this window.",
    )
    legend = (
        '<ul class="legend"><li><span class="key key-total"></span> finished</li>'
        '<li><span class="key key-reaped"></span> reaped (worker lost, deadline)</li></ul>'
    )
    return Html(
        f"<figure>{svg}{legend}<figcaption>Throughput: runs finished per {int(bucket // 60)} minutes, last {int(window // 3600)} hours</figcaption></figure><details><summary>The figures</summary>{data}</details>"
    )


def depth_chart(depths: list[int], *, now: datetime, window: float, bucket: float) -> Html:
    """Queue depth at each bucket's end as an SVG line, with the figures in a table."""
    n = max(len(depths), 1)
    start = now - timedelta(seconds=window)
    top = max(depths, default=0)
    peak = max(top, 1)  # the scale (an empty queue draws a flat line at the bottom)
    width, height, pad = 720, 120, 24
    step = (width - 2 * pad) / max(n - 1, 1)
    points = " ".join(
        f"{pad + i * step:.1f},{height - pad - (height - 2 * pad) * d / peak:.1f}"
        for i, d in enumerate(depths)
    )
    svg = (
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-hidden="true" focusable="false">'
        f'<line class="axis" x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}"></line>'
        f'<polyline class="depth" fill="none" points="{points}"></polyline>'
        f'<text class="label" x="{pad}" y="{pad - 8}">peak {top} queued</text>'
        f'<text class="label" x="{pad}" y="{height - 6}">{e(start.strftime("%H:%M"))}Z</text>'
        f'<text class="label" x="{width - pad}" y="{height - 6}" text-anchor="end">now</text></svg>'
    )
    rows = [(ts(start + timedelta(seconds=bucket * (i + 1))), d) for i, d in enumerate(depths)]
    data = table("Queued runs at each bucket's end", ("Time (UTC)", "Queued"), rows, empty="No data.")
    return Html(
        f"<figure>{svg}<figcaption>Queue depth, every {int(bucket // 60)} minutes, last "
        f"{int(window // 3600)} hours</figcaption></figure><details><summary>The figures</summary>{data}</details>"
    )


class HealthPage:
    """``GET /health``: the queue per tenant, workers, throughput and reaped runs."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    async def get(self, request: Request) -> Response:
        access = await self.state.access(request)
        tenant = access.tenant_id
        async with self.state.pool.connection() as conn:
            tenants = await run(conn, gw.tenant_health(self.state.schema, tenant_id=tenant))
            workers = await run(conn, gw.workers(self.state.schema, tenant_id=tenant))
            series = await run(
                conn,
                gw.finished_series(
                    self.state.schema, tenant_id=tenant, window_seconds=WINDOW, bucket_seconds=BUCKET
                ),
            )
            depths = await run(
                conn,
                gw.depth_series(
                    self.state.schema, tenant_id=tenant, window_seconds=WINDOW, bucket_seconds=BUCKET
                ),
            )
            since = datetime.now(UTC) - timedelta(seconds=WINDOW)
            usage = await run(
                conn, gw_usage.usage_totals(self.state.schema, tenant_key=tenant, since=since, until=None)
            )
            budgets = await run(conn, gw_usage.usage_budgets(self.state.schema, tenant_key=tenant))
        now = datetime.now(UTC)
        queued = sum(t.queued for t in tenants)
        running = sum(t.running for t in tenants)
        reaped = sum(b.reaped for b in series)
        parts: list[object] = [
            Html(
                '<dl class="summary">'
                f"<dt>Queued</dt><dd id='depth-queued'>{queued}</dd>"
                f"<dt>Running</dt><dd id='depth-running'>{running}</dd>"
                f"<dt>Reaped, last {int(WINDOW // 3600)} h</dt><dd id='reaped'>{reaped}</dd></dl>"
            ),
            Html('<section aria-labelledby="tenants-h"><h2 id="tenants-h">Tenants</h2>'),
            table(
                "Queue per tenant (most queued first)",
                ("Tenant", "Queued", "Running", "Oldest wait", "Weight", "Max running"),
                [
                    (
                        t.tenant or "(none)",
                        t.queued,
                        t.running,
                        _age(t.oldest_wait_seconds),
                        t.weight if t.weight is not None else "1 (default)",
                        t.max_running if t.max_running is not None else "no cap",
                    )
                    for t in tenants
                ],
                empty="Nothing queued or running.",
            ),
            Html('</section><section aria-labelledby="usage-h"><h2 id="usage-h">Usage</h2>'),
            table(
                f"Usage per tenant and agent, last {int(WINDOW // 3600)} h (whole hours)",
                ("Tenant", "Agent", "Input tokens", "Output tokens", "Cost", "Records"),
                [
                    (
                        u.tenant_id or "(none)",
                        u.agent_key or "(default)",
                        u.input_tokens,
                        u.output_tokens,
                        f"{u.cost:g}",
                        u.records,
                    )
                    for u in usage
                ],
                empty="No usage recorded.",
            ),
            table(
                "Usage budgets (this period)",
                ("Tenant", "Per", "Tokens", "Cost", "Period ends", "State"),
                [
                    (
                        b.tenant_id or "(none)",
                        f"{b.period_seconds // 3600} h",
                        "-" if b.tokens is None else f"{b.spent_tokens} of {b.tokens}",
                        "-" if b.cost is None else f"{b.spent_cost:g} of {b.cost:g}",
                        ts(b.period_ends_at),
                        "spent: enqueue refused" if b.spent else "ok",
                    )
                    for b in budgets
                ],
                empty="No usage budget set.",
            ),
            Html('</section><section aria-labelledby="workers-h"><h2 id="workers-h">Workers</h2>'),
            table(
                "Workers holding running runs",
                ("Worker", "Runs in flight", "Last heartbeat", "Next lease expiry"),
                [
                    (w.worker_id or "?", w.runs, ts(w.last_heartbeat_at), ts(w.next_lease_expiry))
                    for w in workers
                ],
                empty="No worker holds a run.",
            ),
            Html('</section><section aria-labelledby="tp-h"><h2 id="tp-h">Throughput and reaped runs</h2>'),
            chart(series, now=now, window=WINDOW, bucket=BUCKET),
            Html('</section><section aria-labelledby="depth-h"><h2 id="depth-h">Queue depth</h2>'),
            depth_chart(depths, now=now, window=WINDOW, bucket=BUCKET),
            Html("</section>"),
        ]
        return self.state.page(request, access, "Queue health", join(parts))
