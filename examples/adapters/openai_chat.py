"""A runrow agent on the openai client's Chat Completions API, with one tool.

Any OpenAI-compatible server works: the client reads OPENAI_BASE_URL and OPENAI_API_KEY,
and OPENAI_MODEL names the model. Run it with ``runrow worker openai_chat:agent``.
"""

import os

from openai import AsyncOpenAI

import runrow
from runrow.adapters.openai import call_tool, stream_chat_completion

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")


def get_weather(city: str) -> dict:
    """Today's weather in a city."""
    return {"city": city, "temperature_c": 18, "sky": "sunny"}


TOOLS = {"get_weather": get_weather}
TOOL_SPECS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Today's weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


async def agent(run: runrow.RunContext) -> None:
    messages = [{"role": m.role, "content": m.content} for m in await run.transcript()]
    async with AsyncOpenAI() as client:
        for _ in range(8):  # model turns, at most
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, tools=TOOL_SPECS, stream=True
            )
            turn = await stream_chat_completion(run, stream)  # streams text into the journal
            messages.append(turn.message)
            if not turn.tool_calls:
                await run.write_message(turn.text)
                return
            for call in turn.tool_calls:  # journaled: tool_call_started, then tool_call_finished
                messages.append(await call_tool(run, call, TOOLS[call.name]))
    raise RuntimeError("the model kept calling tools")
