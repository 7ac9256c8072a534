"""Adapters that stream a model client's output into a run's journal.

Each adapter is a module of its own, imported on demand, and needs its client library
(an optional extra); importing this package imports none of them:

* :mod:`runrow.adapters.openai` — the ``openai`` client's Chat Completions and Responses
  streams, and tool calls journaled around your tool functions (``runrow[openai]``);
* :mod:`runrow.adapters.openai_agents` — a streamed run of the OpenAI Agents SDK
  (``runrow[openai-agents]``);
* :mod:`runrow.adapters.pydantic_ai` — a PydanticAI agent's run (``runrow[pydantic-ai]``).

Each writes runrow's vocabulary: text as ``content_delta`` events (reasoning on the
``reasoning`` stream), and ``tool_call_started`` / ``tool_call_finished`` around each
tool call. See docs/howto/adapters.md.
"""

__all__: list[str] = []
