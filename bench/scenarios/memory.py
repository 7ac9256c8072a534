"""memory: peak RSS of one worker process running 200 concurrent streaming runs."""

from __future__ import annotations

from lib import Bench, Row, ratio, summary

from scenarios.journal import streaming


async def memory(b: Bench) -> list[Row]:
    p = b.profile
    peaks: list[float] = []
    idles: list[float] = []
    for _ in range(max(1, p.reps - 1)):
        res = await streaming(b, True)
        peaks.append(res["peak_rss_mb"])
        idles.append(res["idle_rss_mb"])
    med, lo, hi = summary(peaks)
    idle = summary(idles)[0]
    return [
        Row(
            "memory",
            f"peak RSS, 1 worker, {p.stream_runs} streaming runs ({p.stream_seconds:g}s)",
            med,
            "MB",
            lo,
            hi,
            idle,
            "same worker idle (dispatcher up, no runs)",
            ratio(med, idle),
            samples=peaks,
        )
    ]
