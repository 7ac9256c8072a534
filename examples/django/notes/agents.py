"""The agent the worker runs: ``python manage.py runrow_worker notes.agents:agent``."""

import anyio

import runrow


async def agent(run: runrow.RunContext) -> None:
    if isinstance(run.content, str) and run.content.startswith("wait-for "):
        # The drain test's run: in flight until the test creates the file it names.
        await run.text("waiting ")
        gate = anyio.Path(run.content.removeprefix("wait-for "))
        while not await gate.exists():  # noqa: ASYNC110 - a file another process creates
            await anyio.sleep(0.05)
    answer = f"You said {run.content!r}."
    await run.text(answer)
    await run.write_message(answer)
