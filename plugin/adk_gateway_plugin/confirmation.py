"""The plugin's `confirm` path (every gated call of an agent on `/run_sse`): ADK's own confirmation of a call.

Kept apart from the blocking path in __init__.py: nothing here talks to the gateway. The plugin
asks ADK for a confirmation exactly as ADK's `FunctionTool(require_confirmation=True)` does, so ADK
ends the run with the request in its session, the gateway shows it as a native confirmation, and
ADK's re-run after the answer comes back here with the answer on the tool context.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["BROWSER_PAYLOAD", "CannotConfirm", "confirm", "is_live"]

# ADK's own texts for a call that waits for, or was refused, a confirmation
# (google/adk/tools/function_tool.py, the same in 1.22 and 2.x): the gateway and the model read
# the plugin's confirmations exactly as they read a native `require_confirmation`.
_PLACEHOLDER = "This tool call requires confirmation, please approve or reject."
_REJECTED = "This tool call is rejected."
# The namespace of the gateway's keys in a confirmation's payload (both directions).
_NAMESPACE = "adk_gateway"
# Asked with a browser tool's confirmation: the gateway reads it in ADK's session.
BROWSER_PAYLOAD = {_NAMESPACE: {"runs_in": "browser"}}
_DEFAULT_HINT = (
    "Please approve or reject the tool call {tool}() by responding with a FunctionResponse with an expected "
    "ToolConfirmation payload."
)


class CannotConfirm(Exception):
    """This ADK's tool context cannot request a confirmation."""


def is_live(context: Any) -> bool:
    """Whether the call runs in a live (`/run_live`) invocation, which has no tool confirmation.

    Every supported ADK (1.22 to 2.x) gives a live invocation a `live_request_queue`, and only a
    live one. A context that does not let us look counts as live: the blocking path gates there
    too, so not knowing costs durability, never a gate.
    """
    try:
        invocation = context._invocation_context  # noqa: SLF001 - the one place each version keeps it
    except AttributeError:
        return True
    return getattr(invocation, "live_request_queue", True) is not None


def _gateway_payload(payload: Any) -> dict[str, Any] | None:
    """The gateway's keys in a confirmation's payload; None when it has none."""
    ours = payload.get(_NAMESPACE) if isinstance(payload, dict) else None
    return ours if isinstance(ours, dict) else None


def confirm(tool: str, hint: Any, context: Any, payload: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """On `/run_sse`: ask ADK's own confirmation of the call instead of blocking.

    What ADK's `FunctionTool(require_confirmation=True)` does, in 1.22 and 2.x alike: no answer yet
    -> request one (ADK ends the run with an `adk_request_confirmation` call in its session) and
    answer the call with ADK's placeholder; ADK re-runs the call once with the answer: confirmed
    -> None (the tool runs), rejected -> ADK's rejection result. Raises when the context cannot
    ask: CannotConfirm when it has no `request_confirmation`, anything else from ADK (the caller
    refuses the call either way). `payload` goes with the request (a browser tool's mark); the
    gateway's payload in the answer, an output or an error, is the call's result instead of the tool.
    """
    answer = getattr(context, "tool_confirmation", None)
    if answer is not None:
        ours = _gateway_payload(getattr(answer, "payload", None))
        if ours is not None and "error" in ours:
            return {"error": str(ours["error"])}
        if ours is not None and "output" in ours and getattr(answer, "confirmed", False) is True:
            out = ours["output"]
            return out if isinstance(out, dict) else {"result": out}
        if getattr(answer, "confirmed", False) is True:
            return None
        return {"error": _REJECTED}
    request = getattr(context, "request_confirmation", None)
    if not callable(request):
        raise CannotConfirm(tool)
    with warnings.catch_warnings():
        # ADK 1.x: "[EXPERIMENTAL] ToolConfirmation ..." each time one is built, here by ADK itself.
        warnings.filterwarnings("ignore", message=r".*EXPERIMENTAL.*", category=UserWarning)
        text = hint if isinstance(hint, str) and hint else _DEFAULT_HINT.format(tool=tool)
        if payload is None:
            request(hint=text)
        else:
            request(hint=text, payload=payload)
    # As ADK's own: the model is not asked to comment on a call that waits for a person.
    context.actions.skip_summarization = True
    return {"error": _PLACEHOLDER}

