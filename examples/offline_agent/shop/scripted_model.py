"""A scripted ADK model: no API key, no network. Copy this file next to your agent's agent.py.

The person's message decides what the model does:

- ``call <tool> <JSON object>``: the model calls that tool of the agent with those arguments,
  e.g. ``call issue_refund {"order_id": "1234", "amount": 250}``; the gateway's tool policy
  applies to the call as it would to a real model's;
- anything else: the model answers with the text it was sent.

When the tools have answered, the model writes what they returned. It needs google-adk only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types


class ScriptedModel(BaseLlm):
    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        # One complete response whether or not ADK streams: a model may always answer so.
        contents = llm_request.contents or []
        last = contents[-1] if contents else None
        results = [p.function_response for p in (last.parts or []) if p.function_response] if last else []
        if results:
            text = "; ".join(f"{r.name} returned {json.dumps(r.response, default=str)}" for r in results)
            yield _answer(types.Part.from_text(text=text))
            return
        said = next((p.text for c in reversed(contents) if c.role == "user" for p in c.parts or [] if p.text), "")
        yield _answer(_plan(said.strip(), set(llm_request.tools_dict)))


def _plan(said: str, tools: set[str]) -> types.Part:
    words = said.split(maxsplit=2)
    if len(words) < 2 or words[0].lower() != "call":
        return types.Part.from_text(text=f"You said: {said}")
    name = words[1]
    if name not in tools:
        return types.Part.from_text(text=f"There is no tool {name}; this agent has: {', '.join(sorted(tools))}.")
    try:
        args = json.loads(words[2]) if len(words) > 2 else {}
    except json.JSONDecodeError as exc:
        return types.Part.from_text(text=f"The arguments are not JSON: {exc}")
    if not isinstance(args, dict):
        return types.Part.from_text(text="The arguments must be a JSON object.")
    # No id: ADK gives the call its own (adk-...), as it does a real model's.
    return types.Part(function_call=types.FunctionCall(name=name, args=args))


def _answer(part: types.Part) -> LlmResponse:
    return LlmResponse(content=types.ModelContent(parts=[part]), finish_reason=types.FinishReason.STOP)
