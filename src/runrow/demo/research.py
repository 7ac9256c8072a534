"""The demo's research turn (#41): a message that starts with "research" ("research
tides") fans out to three sub-agents, one per angle, and answers once they have all
ended.

The turn spawns three child runs of the agent key :data:`RESEARCHER` in one transaction
(``run.spawn_many``: a replay gets the same three back) and parks on them
(``run.wait_for_children``): while they stream, it holds no worker slot and no lease.
Each researcher streams its notes word by word and writes them as its answer; the page
follows the whole tree in one stream (``/v1/runs/{id}/events?tree=true``), each
sub-agent in a panel of its own, and a reload resumes it from the tree position it saw
last. Kill the worker while they stream: the reaper ends the lost researchers
(``worker_lost``), which wakes the parked turn, and it answers with what the others
found and says which were lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from runrow import ChildCancelled, ChildFailed

if TYPE_CHECKING:
    from runrow import RunContext

__all__ = ["ANGLES", "RESEARCHER", "notes_for", "research", "research_topic", "researcher"]

RESEARCHER = "researcher"
"""The agent key of the research turn's sub-agents."""
ANGLES = ("its history", "how it works", "open questions")
"""One sub-agent per angle, in this order."""


def research_topic(content: object) -> str | None:
    """The topic of a research message ("research tides" -> "tides"), else None."""
    if not isinstance(content, str):
        return None
    head, _, rest = content.strip().partition(" ")
    if head.lower() != "research":
        return None
    return " ".join(rest.split())[:60] or "everything"


def notes_for(topic: str, angle: str) -> str:
    """What the fake researcher finds (deterministic)."""
    return f"On {angle} of {topic}: three sources agree, one does not, and the rest is detail."


async def research(run: RunContext, topic: str, delay: float) -> None:
    """The research turn: three researchers, then an answer from their notes."""
    await run.text(f"Researching {topic} from {len(ANGLES)} angles. ")
    children = await run.spawn_many(
        [(RESEARCHER, {"topic": topic, "angle": a}) for a in ANGLES], key="research"
    )
    results = await run.wait_for_children(children)
    found: list[str] = []
    for angle, result in zip(ANGLES, results, strict=True):
        try:
            found.append(str(result.get()))
        except ChildFailed as exc:
            cause = (exc.error or {}).get("type", "failed")
            found.append(f"(the researcher on {angle} was lost: {cause})")
        except ChildCancelled:
            found.append(f"(the researcher on {angle} was stopped)")
    answer = f"Here is what {len(ANGLES)} researchers found about {topic}. " + " ".join(found)
    for word in answer.split(" "):
        await run.text(word + " ")
        await anyio.sleep(delay / 4)
    await run.write_message(answer)


async def researcher(run: RunContext, delay: float) -> None:
    """One sub-agent: streams its notes on its angle (four times slower than the demo's
    words: research takes a while, long enough to reload the page or kill the worker
    while it goes), then writes them as its answer."""
    content: Any = run.content
    notes = notes_for(str(content["topic"]), str(content["angle"]))
    for word in notes.split(" "):
        await run.text(word + " ")
        await anyio.sleep(4 * delay)
    await run.write_message(notes)
