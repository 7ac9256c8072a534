"""A runrow agent on the OpenAI Agents SDK, with one tool.

The model is reached through Chat Completions, so any OpenAI-compatible server works: the
client reads OPENAI_BASE_URL and OPENAI_API_KEY, and OPENAI_MODEL names the model. Run it
with ``runrow worker openai_agents_sdk:agent``.
"""

import os

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import runrow
from runrow.adapters.openai_agents import stream_agents_run

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")
set_tracing_disabled(True)  # runrow's journal is the record here


@function_tool
def get_weather(city: str) -> dict:
    """Today's weather in a city."""
    return {"city": city, "temperature_c": 18, "sky": "sunny"}


async def agent(run: runrow.RunContext) -> None:
    async with AsyncOpenAI() as client:
        assistant = Agent(
            name="assistant",
            instructions="Answer briefly. Use the tools for facts.",
            model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
            tools=[get_weather],
        )
        result = Runner.run_streamed(assistant, str(run.content))
        output = await stream_agents_run(run, result)  # text, tool calls, into the journal
    await run.write_message(str(output))
