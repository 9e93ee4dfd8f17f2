"""The demo agents' script: what the offline model answers, in text and live mode alike.

This module owns the rows of the script (DESIGN.md section 4): reading a user text
into a `Reply` (`reply_to`: function calls to make, an error, a crash, or text that
quotes the user), writing the text that reports tool results (`summarize_results`),
finding those results in a request's contents (`latest_results`), and splitting
text into streamed deltas (`chunk_text`). It knows nothing of how the answer is
delivered: `gateway.demo.model` (``ScriptedLlm``, text mode) and `gateway.demo.live`
(``ScriptedLiveConnection``, ``/run_live``) both play it.

One script serves every demo agent (demo_agent's payments, weather and browser
tools; support_agent's ``lookup_order`` and ``issue_refund``): `reply_to` takes the
names of the tools the agent declared (`declared_tools` reads them from a request)
and never plans a call to a tool the agent lacks. It answers such a row in text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from google.genai import types

if TYPE_CHECKING:
    from google.adk.models.llm_request import LlmRequest

DEMO_ERROR_CODE = "DEMO_ERROR"
DEMO_ERROR_MESSAGE = "The demo model was asked to fail (trigger error)."
CRASH_MESSAGE = "The demo model crashed on purpose (crash)."
DEFAULT_CURRENCY = "USD"

_TRIGGER_ERROR_RE = re.compile(r"\btrigger(?:\s+an?)?\s+error\b", re.IGNORECASE)
_CRASH_RE = re.compile(r"\bcrash\b", re.IGNORECASE)
_PAY_RE = re.compile(r"\b(?:pay|send|transfer)\b", re.IGNORECASE)
# One "<amount> [currency] to <recipient>" clause; "pay 10 to Alice and 20 to Bob"
# holds two. The currency must be exactly three letters, so "to" is never one.
_PAYMENT_CLAUSE_RE = re.compile(
    r"[$€£¥]?\s*(?P<amount>\d+(?:[.,]\d+)?)\s*(?:(?P<currency>[a-z]{3})\s+)?to\s+"
    r"(?P<recipient>[^\W\d_][\w'-]*)",
    re.IGNORECASE,
)
_WEATHER_RE = re.compile(
    r"\bweather\b.*?\b(?:in|for|at)\s+(?P<city>[^\W\d_][\w .'-]*?)\s*[?.!]*\s*$",
    re.IGNORECASE,
)
_LOCATION_RE = re.compile(r"\bwhere\s+am\s+i\b", re.IGNORECASE)
_TRACK_RE = re.compile(r"\bplay\s+(?:track|song|bgm)\s*#?\s*(?P<track>\d+)\b", re.IGNORECASE)
# "refund 20 on order 1234", "refund $20 USD for order #1234". As for payments, the currency is
# exactly three letters, and never the word that introduces the order.
_REFUND_RE = re.compile(
    r"\brefund\s+[$€£¥]?\s*(?P<amount>\d+(?:[.,]\d+)?)\s*"
    r"(?:(?!(?:for|on|of)\b)(?P<currency>[a-z]{3})\s+)?(?:for|on|of)\s+order\s*#?\s*(?P<order_id>\w[\w-]*)",
    re.IGNORECASE,
)
_ORDER_STATUS_RE = re.compile(
    r"\b(?:where\s+is|where's|status\s+of|check)\s+(?:my\s+)?order\s*#?\s*(?P<order_id>\w[\w-]*)",
    re.IGNORECASE,
)

# What to suggest, per tool the agent has, in the order the suggestions are listed.
_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("pay 50 to Hanako", "process_payment"),
    ("pay 10 to Alice and 20 to Bob", "process_payment"),
    ("weather in Tokyo", "get_weather"),
    ("where am I", "get_location"),
    ("play track 2", "change_bgm"),
    ("refund 20 on order 1234", "issue_refund"),
    ("where is order 1234", "lookup_order"),
)
# The heading of a summary whose results all come from one of these tools.
_HEADINGS = {"process_payment": "Payments:", "issue_refund": "Refunds:"}
# Whom the script suggests to when it does not know the agent's tools: the original demo agent.
_DEMO_AGENT_TOOLS = frozenset({"process_payment", "get_weather", "get_location", "change_bgm"})

# Short enough that a text turn always splits into several deltas.
_WORDS_PER_CHUNK = 4
_MIN_CHUNKS = 3


class DemoCrash(RuntimeError):
    """Raised by the model for the ``crash`` row, to exercise ADK's run-error path."""


@dataclass(frozen=True)
class PlannedCall:
    """One function call the script makes."""

    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """One tool response, with the arguments of the call it answers (if found)."""

    name: str
    args: dict[str, Any]
    response: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """What the script answers to one user text, in text and live mode alike."""

    kind: Literal["error", "crash", "calls", "text"]
    calls: tuple[PlannedCall, ...] = ()
    text: str = ""


def reply_to(user_text: str, tools: Collection[str] | None = None) -> Reply:
    """The script's answer to one user text (DESIGN.md section 4).

    `tools` names the tools the agent declared; a row that would call another tool
    is answered in text instead, as a model does not call a function it was not
    given. None (a request that declares no tools, as hand-built in tests) leaves
    every row in play.
    """
    if _TRIGGER_ERROR_RE.search(user_text):
        return Reply("error")
    if _CRASH_RE.search(user_text):
        return Reply("crash")
    calls = plan_calls(user_text)
    missing = sorted({c.name for c in calls} - set(tools)) if tools is not None else []
    if missing:
        return Reply("text", text=missing_tool_text(user_text, missing, tools))
    if calls:
        return Reply("calls", calls=tuple(calls))
    return Reply("text", text=echo_text(user_text, tools))


def declared_tools(llm_request: LlmRequest) -> frozenset[str] | None:
    """The names of the functions a request offers the model, or None if it offers none.

    ADK fills ``tools_dict`` (and the function declarations of ``config.tools``) from
    the agent's tools before it calls the model, in text mode and before it opens a
    live connection alike; both are read, so a declaration added by a callback counts.
    """
    names = set(llm_request.tools_dict)
    for tool in (llm_request.config.tools if llm_request.config else None) or ():
        if isinstance(tool, types.Tool):
            names.update(d.name for d in tool.function_declarations or () if d.name)
    return frozenset(names) or None


def plan_calls(text: str) -> list[PlannedCall]:
    """Returns the function calls the script makes for one user text (empty: no tool row)."""
    if _PAY_RE.search(text):
        calls = [
            PlannedCall(
                "process_payment",
                {
                    "amount": _number(match["amount"]),
                    "recipient": match["recipient"],
                    "currency": (match["currency"] or DEFAULT_CURRENCY).upper(),
                },
            )
            for match in _PAYMENT_CLAUSE_RE.finditer(text)
        ]
        if calls:
            return calls
    if weather := _WEATHER_RE.search(text):
        city = " ".join(word[:1].upper() + word[1:] for word in weather["city"].split())
        return [PlannedCall("get_weather", {"city": city})]
    if _LOCATION_RE.search(text):
        return [PlannedCall("get_location", {})]
    if track := _TRACK_RE.search(text):
        return [PlannedCall("change_bgm", {"track": int(track["track"])})]
    if refund := _REFUND_RE.search(text):
        return [
            PlannedCall(
                "issue_refund",
                {
                    "order_id": refund["order_id"],
                    "amount": _number(refund["amount"]),
                    "currency": (refund["currency"] or DEFAULT_CURRENCY).upper(),
                },
            )
        ]
    if order := _ORDER_STATUS_RE.search(text):
        return [PlannedCall("lookup_order", {"order_id": order["order_id"]})]
    return []


def echo_text(user_text: str, tools: Collection[str] | None = None) -> str:
    """The reply to anything the script does not recognise: it quotes the user."""
    return f'You said: "{_quote(user_text)}". I am the offline demo agent. {_suggestions(tools)}'


def missing_tool_text(user_text: str, missing: Sequence[str], tools: Collection[str] | None) -> str:
    """The reply to a row whose tool this agent does not have."""
    names = " or ".join(missing)
    return (
        f'You said: "{_quote(user_text)}". I have no {names} tool, so I did nothing. '
        f"{_suggestions(tools)}"
    )


def _quote(user_text: str) -> str:
    return " ".join(user_text.split()) or "(nothing)"


def _suggestions(tools: Collection[str] | None) -> str:
    available = _DEMO_AGENT_TOOLS if tools is None else tools
    examples = [f'"{text}"' for text, tool in _EXAMPLES if tool in available]
    if not examples:
        return "I have no tools to offer."
    if len(examples) == 1:
        return f"Try {examples[0]}."
    return f"Try {', '.join(examples[:-1])} or {examples[-1]}."


def summarize_results(results: Sequence[ToolResult]) -> str:
    """The text the model writes once every tool of its last call round has answered."""
    if not results:
        return "There is nothing to report."
    lines = [_describe(r) for r in results]
    if len(results) == 1:
        return lines[0]
    names = {r.name for r in results}
    heading = _HEADINGS.get(names.pop(), "Results:") if len(names) == 1 else "Results:"
    return heading + "\n" + "\n".join(f"- {line}" for line in lines)



def _describe(result: ToolResult) -> str:
    response, args = result.response, result.args
    error = _error_of(response)
    if result.name == "process_payment":
        amount = _format_amount(response.get("amount", args.get("amount")))
        currency = response.get("currency", args.get("currency", DEFAULT_CURRENCY))
        recipient = response.get("recipient", args.get("recipient", "the recipient"))
        if error is None:
            txn = response.get("transaction_id", "unknown")
            return f"Done: sent {amount} {currency} to {recipient} (transaction {txn})."
        return f"The payment of {amount} {currency} to {recipient} was not made: {error}"
    if result.name == "get_weather":
        city = response.get("city", args.get("city", "that city"))
        if error is None:
            return (
                f"The weather in {city} is {response.get('condition', 'unknown')}, "
                f"{response.get('temperature_c', '?')}°C."
            )
        return f"I could not get the weather in {city}: {error}"
    if result.name == "get_location":
        if error is None:
            return (
                f"You are at latitude {response.get('latitude', '?')}, "
                f"longitude {response.get('longitude', '?')}."
            )
        return f"I could not get your location: {error}"
    if result.name == "change_bgm":
        track = response.get("track", args.get("track", "?"))
        if error is None:
            return f"Now playing track {track}."
        return f"I could not change the music to track {track}: {error}"
    if result.name == "issue_refund":
        amount = _format_amount(response.get("amount", args.get("amount")))
        currency = response.get("currency", args.get("currency", DEFAULT_CURRENCY))
        order_id = response.get("order_id", args.get("order_id", "?"))
        if error is None:
            return (
                f"Refunded {amount} {currency} on order {order_id} "
                f"(refund id {response.get('refund_id', 'unknown')})."
            )
        return f"The refund of {amount} {currency} on order {order_id} was not made: {error}"
    if result.name == "lookup_order":
        order_id = response.get("order_id", args.get("order_id", "?"))
        if error is None:
            details = ""
            if "items" in response and "total" in response:
                total = _format_amount(response["total"])
                details = f" ({response['items']} items, {total} {response.get('currency', DEFAULT_CURRENCY)})"
            return f"Order {order_id}{details} is {response.get('status', 'in an unknown state')}."
        return f"I could not look up order {order_id}: {error}"
    return f"{result.name} returned {json.dumps(response, sort_keys=True, default=str)}."


def _error_of(response: dict[str, Any]) -> str | None:
    """The failure a tool response reports, or None when it succeeded."""
    if "error" in response:
        return str(response["error"])
    if response.get("success") is False:
        return str(response.get("reason") or response.get("message") or "it was refused.")
    return None


def _number(raw: str) -> int | float:
    value = float(raw.replace(",", "."))
    # Keep "50" an integer in the call args, as a model would write it.
    return int(value) if value.is_integer() else value


def _format_amount(amount: Any) -> str:
    if isinstance(amount, float) and amount.is_integer():
        return str(int(amount))
    return str(amount)


def chunk_text(text: str) -> list[str]:
    """Splits text into deltas that concatenate back to exactly ``text``."""
    pieces = re.findall(r"\S+\s*|\s+", text)
    per_chunk = max(1, min(_WORDS_PER_CHUNK, len(pieces) // _MIN_CHUNKS))
    chunks = ["".join(pieces[i : i + per_chunk]) for i in range(0, len(pieces), per_chunk)]
    return chunks or [text]


def content_text(content: types.Content) -> str:
    """The visible (non-thought) text of a content."""
    return "".join(p.text for p in content.parts or () if p.text and not p.thought)


def _function_responses(content: types.Content) -> list[types.FunctionResponse]:
    return [p.function_response for p in content.parts or () if p.function_response]


def _function_calls(content: types.Content) -> list[types.FunctionCall]:
    return [p.function_call for p in content.parts or () if p.function_call]


def latest_results(contents: Sequence[types.Content]) -> list[ToolResult] | None:
    """The tool results of the trailing function-response turn, or None if the turn is text.

    ADK strips its own ``adk-`` ids before the request reaches a model, so the
    responses are matched to the model's last calls by name, in order.
    """
    responses: list[types.FunctionResponse] = []
    index = len(contents) - 1
    while index >= 0 and contents[index].role != "model" and _function_responses(contents[index]):
        responses[:0] = _function_responses(contents[index])
        index -= 1
    if not responses:
        return None
    calls = _function_calls(contents[index]) if index >= 0 else []
    unmatched = list(calls)
    results = []
    for response in responses:
        call = next(
            (c for c in unmatched if (response.id and c.id == response.id) or c.name == response.name),
            None,
        )
        if call is not None:
            unmatched.remove(call)
        results.append(
            ToolResult(
                name=response.name or "tool",
                args=dict(call.args or {}) if call else {},
                response=dict(response.response or {}),
            )
        )
    return results
