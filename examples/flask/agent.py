"""The example's agent (run it with `runrow worker agent:agent` from this folder)."""

import runrow


async def agent(run: runrow.RunContext) -> None:
    answer = f"You said {run.content!r}."
    for word in answer.split():
        await run.text(word + " ")  # journaled, streamed to the Flask app's SSE clients
    await run.write_message(answer)
