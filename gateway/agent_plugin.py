"""The ADK plugin that lets the gateway gate tool calls, installed in the agent's process.

Add it to a stock ADK API server without touching agent code:

    ADK_GATEWAY_URL=http://127.0.0.1:8081 ADK_GATEWAY_SECRET=... \\
        adk api_server --extra_plugins gateway.agent_plugin.GatewayPlugin AGENTS_DIR

Before each tool call, `before_tool_callback` checks the gateway's tool policy (fetched once and
refreshed, so ungated tools cost no round trip). For a gated call it asks the gateway's internal
listener and waits for the verdict: run the tool, or answer the call with a response instead (a
denial, a timeout, or the output the browser produced). This works for `/run_sse` and `/run_live`
alike, which ADK's own confirmation does not (DESIGN.md section 1).

It fails closed: if the gateway cannot be reached or answers nonsense, the call is answered with an
error saying why and the tool does not run. It never raises, because a plugin exception aborts the
whole run. Each such refusal carries `REFUSAL_KEY` next to its `error`, naming why, so that the
gateway never counts it as a gated tool that ran without asking.

Environment: ADK_GATEWAY_URL (default http://127.0.0.1:8081), ADK_GATEWAY_SECRET (required),
ADK_GATEWAY_CONNECT_TIMEOUT (seconds, default 5), ADK_GATEWAY_MAX_WAIT (seconds a call may wait,
default 3600; the gateway's own deadlines normally end the wait much sooner).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import aiohttp
from google.adk.agents.callback_context import CallbackContext
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.adk.tools.tool_context import ToolContext
from google.genai import types

__all__ = ["REFUSAL_KEY", "GatewayPlugin"]

# gateway.approvals.REFUSAL_KEY: the gateway recognises this plugin's refusals by it.
REFUSAL_KEY = "adk_gateway_refusal"

logger = logging.getLogger("adk_gateway.plugin")

_DEFAULT_URL = "http://127.0.0.1:8081"


def _refuse(text: str, code: str) -> dict[str, Any]:
    # ADK's convention for a call that did not run, marked so that the gateway can tell this
    # refusal from a gated tool that ran without asking (docs/approvals.md, "Refusals").
    return {"error": text, REFUSAL_KEY: code}


class GatewayPlugin(BasePlugin):
    def __init__(
        self,
        name: str = "adk_gateway",
        *,
        url: str | None = None,
        secret: str | None = None,
        connect_timeout: float | None = None,
        max_wait: float | None = None,
    ) -> None:
        super().__init__(name=name)
        self._url = (url or os.environ.get("ADK_GATEWAY_URL") or _DEFAULT_URL).rstrip("/")
        self._secret = secret if secret is not None else os.environ.get("ADK_GATEWAY_SECRET", "")
        self._connect_timeout = connect_timeout or float(os.environ.get("ADK_GATEWAY_CONNECT_TIMEOUT", "5"))
        self._max_wait = max_wait or float(os.environ.get("ADK_GATEWAY_MAX_WAIT", "3600"))
        self._policy: dict[str, dict[str, Any]] | None = None
        self._policy_expires = 0.0
        self._policy_lock: asyncio.Lock | None = None
        self._http: aiohttp.ClientSession | None = None
        if not self._secret:
            logger.error("ADK_GATEWAY_SECRET is not set: the policy cannot be read, so every tool call will be refused")

    # ---- ADK hooks -------------------------------------------------------------------------

    async def before_agent_callback(self, *, agent: Any, callback_context: CallbackContext) -> None:
        """Apply `non_blocking` from the policy to the agent's tools (read by ADK's live flow)."""
        try:
            for tool in getattr(agent, "tools", None) or []:
                if not isinstance(tool, BaseTool):
                    continue
                entry = await self._tool_policy(tool.name)
                if entry and entry.get("non_blocking") and tool.behavior is not types.Behavior.NON_BLOCKING:
                    tool.behavior = types.Behavior.NON_BLOCKING
                    logger.info("tool %s declared NON_BLOCKING by the gateway's policy", tool.name)
        except Exception:  # noqa: BLE001 - never abort a run over a declaration detail
            logger.exception("could not apply the gateway's non_blocking policy")
        return None


    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        try:
            policy = await self._tool_policy(tool.name)
            if policy is None:
                return _refuse(
                    "The approval gateway's tool policy is unavailable (gateway unreachable or refusing this plugin), "
                    "so this call cannot be checked; it was not run.",
                    "policy_unavailable",
                )
            if not policy.get("gated"):
                return None
            verdict = await self._ask(tool.name, tool_args, tool_context)
        except Exception:  # noqa: BLE001 - an exception here would abort the user's whole run
            logger.exception("gateway plugin failed; refusing the call")
            return _refuse("The approval gateway failed while checking this call; it was not run.", "plugin_failed")
        if verdict.get("verdict") == "run":
            # A tool that also declares require_confirmation must not pause a second time.
            tool_context.tool_confirmation = ToolConfirmation(confirmed=True)
            return None
        response = verdict.get("response")
        if verdict.get("verdict") == "respond" and isinstance(response, dict):
            return response
        return _refuse("The approval gateway answered something unexpected; the call was not run.", "unexpected_answer")

    # ---- gateway calls ---------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self._secret}"})
        return self._http

    async def _tool_policy(self, tool: str) -> dict[str, Any] | None:
        """This tool's policy entry ({} when ungated), or None when no policy was ever fetched."""
        if self._policy is None or time.monotonic() >= self._policy_expires:
            if self._policy_lock is None:
                self._policy_lock = asyncio.Lock()
            async with self._policy_lock:
                if self._policy is None or time.monotonic() >= self._policy_expires:
                    await self._refresh_policy()
        if self._policy is None:
            return None
        return self._policy.get(tool) or self._policy.get("default") or {}

    async def _refresh_policy(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._connect_timeout + 5, sock_connect=self._connect_timeout)
        try:
            async with self._session().get(f"{self._url}/internal/v1/policy", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                body = await resp.json()
            tools = body["tools"]
            if not isinstance(tools, dict):
                raise ValueError("tools is not an object")
            self._policy = tools
            self._policy_expires = time.monotonic() + float(body.get("refresh", 30))
        except Exception as exc:  # noqa: BLE001
            # A stale policy is still the best routing information; retry soon.
            logger.warning("could not fetch the gateway's tool policy: %s", exc)
            self._policy_expires = time.monotonic() + 2.0

    async def _ask(self, tool: str, args: dict[str, Any], tool_context: ToolContext) -> dict[str, Any]:
        payload = {
            "app_name": tool_context.session.app_name,
            "user_id": tool_context.user_id,
            "session_id": tool_context.session.id,
            "invocation_id": tool_context.invocation_id,
            "function_call_id": tool_context.function_call_id,
            "tool": tool,
            "args": args,
        }
        timeout = aiohttp.ClientTimeout(total=self._max_wait, sock_connect=self._connect_timeout)
        try:
            async with self._session().post(f"{self._url}/internal/v1/tool-calls", json=payload, timeout=timeout) as resp:
                if resp.status != 200:
                    logger.warning("gateway refused the decision request: HTTP %s", resp.status)
                    return {"verdict": "respond", "response": _refuse(
                        f"The approval gateway refused to decide (HTTP {resp.status}); the call was not run.",
                        "gateway_refused",
                    )}
                verdict = await resp.json()
                return verdict if isinstance(verdict, dict) else {}
        except aiohttp.ClientError as exc:
            # Also a connect timeout (aiohttp's ServerTimeoutError is a ClientError too).
            logger.warning("gateway unreachable while deciding %s: %s", tool, exc)
            return {"verdict": "respond", "response": _refuse(
                "The approval gateway went away before anyone decided; the call was not run.", "gateway_unreachable",
            )}
        except asyncio.TimeoutError:
            logger.warning("no decision on %s within ADK_GATEWAY_MAX_WAIT (%s s)", tool, self._max_wait)
            return {"verdict": "respond", "response": _refuse(
                f"Nobody decided within the plugin's longest wait (ADK_GATEWAY_MAX_WAIT, {self._max_wait:g} s); "
                "the call was not run.",
                "max_wait",
            )}

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
