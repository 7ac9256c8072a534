"""Enqueue one turn and follow its events until it ends: `python ask.py "hello"`.

A worker (`runrow worker myapp.agents:agent`) runs it; in a web app, the enqueue is your
request handler and the tail is your streaming endpoint.
"""

import asyncio
import os
import sys

import runrow

DATABASE_URL = os.environ["DATABASE_URL"]


async def main(content: str) -> None:
    run = await runrow.enqueue(DATABASE_URL, conversation_id="quickstart", user_id="ann", content=content)
    print("enqueued", run.id, run.status)
    async for event in runrow.tail(DATABASE_URL, run.id):
        print(event.seq, event.type, event.payload)
    messages = await runrow.transcript(DATABASE_URL, "quickstart")
    print("transcript:", [(m.role, m.content) for m in messages[-2:]])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "hello"))
