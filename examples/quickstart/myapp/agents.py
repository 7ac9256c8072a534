"""The agent: one async function that takes a RunContext (run it with `runrow worker myapp.agents:agent`)."""

import runrow


async def agent(run: runrow.RunContext) -> None:
    history = await run.transcript()  # the conversation so far, oldest first
    await run.emit({"type": "thinking", "turns_so_far": len(history)})
    answer = f"You said {run.content!r}."
    for word in answer.split():
        await run.text(word + " ")  # journaled and streamed, merged within 0.25 s
    await run.write_message(answer)  # the durable transcript entry
