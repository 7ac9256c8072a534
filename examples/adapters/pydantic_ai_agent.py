"""A runrow agent on PydanticAI, with one tool.

Any OpenAI-compatible server works: the client reads OPENAI_BASE_URL and OPENAI_API_KEY,
and OPENAI_MODEL names the model. Run it with ``runrow worker pydantic_ai_agent:agent``.
"""

import os

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import runrow
from runrow.adapters.pydantic_ai import stream_pydantic_ai

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")

assistant = Agent(instructions="Answer briefly. Use the tools for facts.")


@assistant.tool_plain
def get_weather(city: str) -> dict:
    """Today's weather in a city."""
    return {"city": city, "temperature_c": 18, "sky": "sunny"}


async def agent(run: runrow.RunContext) -> None:
    async with AsyncOpenAI() as client:
        model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
        output = await stream_pydantic_ai(run, assistant, str(run.content), model=model)
    await run.write_message(output)
