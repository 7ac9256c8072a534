"""The whole round trip in one process, no `runrow worker` needed: `python one_process.py`.

In production these live in different processes: the web app enqueues and streams,
workers run the dispatcher.
"""

import asyncio
import os

from myapp.agents import agent

import runrow

DATABASE_URL = os.environ["DATABASE_URL"]


async def main() -> None:
    await runrow.migrate(DATABASE_URL)  # what `runrow migrate` does; safe to repeat
    async with runrow.Dispatcher(DATABASE_URL, agent, concurrency=4):
        run = await runrow.enqueue(
            DATABASE_URL, conversation_id="one-process", user_id="ann", content="hello"
        )
        async for event in runrow.tail(DATABASE_URL, run.id):
            print(event.seq, event.type, event.payload)
    messages = await runrow.transcript(DATABASE_URL, "one-process")
    assert [m.role for m in messages[-2:]] == ["user", "assistant"]
    print("the agent answered:", messages[-1].content)


if __name__ == "__main__":
    asyncio.run(main())
