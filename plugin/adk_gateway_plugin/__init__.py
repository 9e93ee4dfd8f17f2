"""The ADK plugin that lets adk-gateway gate tool calls, installed in the agent's process.

Add it to a stock ADK API server without touching agent code:

    pip install ./plugin        # from a checkout of adk-gateway, in the agent's environment
    ADK_GATEWAY_URL=http://127.0.0.1:8081 ADK_GATEWAY_SECRET=... \\
        adk api_server --extra_plugins adk_gateway_plugin.GatewayPlugin AGENTS_DIR

Before each tool call, `before_tool_callback` checks the gateway's tool policy for the call's ADK
app (fetched per app and refreshed, so ungated tools cost no round trip; one gateway serves several
agents, each named by app). A gated call waits for a person or the browser one way per upstream mode:

- `/run_sse` (the policy marks the tool `confirm`, or `confirm_browser`): nothing is held. The
  plugin asks ADK's own tool confirmation (`tool_context.request_confirmation`, as
  `require_confirmation` does); ADK ends the run with the request in its session, and its re-run
  after the answer runs the tool or answers ADK's rejection. A tool with rules or approvers (`rules`)
  is asked about first (`"confirm": true`): a rule may decide at once, and a call its approvers
  decide is confirmed with the gateway's payload naming them (`"approvers": true`). A browser tool's
  output comes back as the answer's payload, returned as its result (its server function never runs).
- `/run_live` (no confirmations): it asks the gateway and waits for the verdict: run the tool, or
  answer the call with a response instead (a denial, a timeout, the browser's output).

The gateway requires 0.2 or newer: it refuses an older plugin's asks about an agent on `/run_sse`
(`plugin_too_old`), approvers there need 0.3; upgrade the plugin first (gateway docs/operations.md).

It fails closed: if the gateway cannot be reached or answers nonsense, the call is answered with an
error saying why and the tool does not run. It never raises, because a plugin exception aborts the
whole run. Each such refusal carries `REFUSAL_KEY` next to its `error`, naming why, so that the
gateway never counts it as a gated tool that ran without asking.

Supported: google-adk 1.22 to the newest 2.x. Where those versions differ, the plugin adapts (each
difference is a test in tests/unit/test_agent_plugin.py, run on both sides):

- Older ADK 1.x runs no plugin `before_tool_callback` on the live path: `/run_live` calls only the
  agent's own callbacks (1.22.1 and at least up to 1.26, google/adk-python#4704; 1.39.1 and 2.x
  run the plugins there too). A gated tool would run unasked. So the plugin also puts a backstop
  first in each agent's `before_tool_callback` list, from its `before_agent_callback` (which every
  version runs, live or not). The backstop gates only a call the plugin hook did not see (the hook
  marks the call's tool context), so no call is asked about twice.
- `non_blocking` in the policy sets the tool's `behavior` to NON_BLOCKING, an ADK 2.x attribute
  read by its live flow. ADK 1.x tools have no such attribute: there the tool stays blocking, and
  the plugin says so once per tool.
- ADK 1.x warns that `ToolConfirmation` is experimental each time one is built; the plugin builds
  one per approved call, so it silences that warning there.

Environment: ADK_GATEWAY_URL (default http://127.0.0.1:8081), ADK_GATEWAY_SECRET (required) or
ADK_GATEWAY_SECRET_FILE (a file holding it, such as a mounted secret: read again before each
policy fetch and after a refusal, so the secret can be rotated without restarting the agent),
ADK_GATEWAY_CONNECT_TIMEOUT (seconds, default 5), ADK_GATEWAY_MAX_WAIT (seconds a call may wait,
default 3600; the gateway's own deadlines normally end the wait much sooner), ADK_GATEWAY_RETRY_FOR
(seconds, default 30; 0: never): how long a call is asked again when no replica decided it (one
handed the request back as it stopped, a connection was cut, a balancer found no replica; asking.py).

Tracing (0.3.0): each request to the gateway carries the W3C `traceparent` of the current
OpenTelemetry span, ADK's tool span for a decision request, so the gateway's span of the approval's
wait sits under it in one trace (tracecontext.py; nothing is sent when ADK traces nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

import httpx
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from .asking import NoVerdict, ask
from .confirmation import BROWSER_PAYLOAD, CannotConfirm, confirm, is_live
from .tracecontext import trace_headers

if TYPE_CHECKING:
    # Only for annotations: ADK 2.x made ToolContext an alias of its Context class.
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.tools.tool_context import ToolContext

__all__ = ["REFUSAL_KEY", "GatewayPlugin", "__version__"]

__version__ = "0.3.0"

# gateway.approvals.REFUSAL_KEY: the gateway recognises this plugin's refusals by it.
REFUSAL_KEY = "adk_gateway_refusal"

logger = logging.getLogger("adk_gateway.plugin")

_DEFAULT_URL = "http://127.0.0.1:8081"
# Set on a call's tool context by the plugin hook; the agent-level backstop leaves such a call alone.
_SEEN = "_adk_gateway_seen"



def _app_name(context: Any) -> str:
    """The ADK app a callback runs for ("" when the context does not say)."""
    try:
        name = context.session.app_name
    except Exception:  # noqa: BLE001 - a context without a session: ask for the every-agent policy
        return ""
    return name if isinstance(name, str) else ""


def _refuse(text: str, code: str) -> dict[str, Any]:
    # ADK's convention for a call that did not run, marked so that the gateway can tell this
    # refusal from a gated tool that ran without asking (docs/approvals.md, "Refusals").
    return {"error": text, REFUSAL_KEY: code}


def _confirmed() -> ToolConfirmation:
    with warnings.catch_warnings():
        # ADK 1.x: "[EXPERIMENTAL] ToolConfirmation ..." on every instance built.
        warnings.filterwarnings("ignore", message=r".*EXPERIMENTAL.*", category=UserWarning)
        return ToolConfirmation(confirmed=True)


class GatewayPlugin(BasePlugin):
    def __init__(
        self,
        name: str = "adk_gateway",
        *,
        url: str | None = None,
        secret: str | None = None,
        secret_file: str | None = None,
        connect_timeout: float | None = None,
        max_wait: float | None = None,
        retry_for: float | None = None,
    ) -> None:
        super().__init__(name=name)
        self._url = (url or os.environ.get("ADK_GATEWAY_URL") or _DEFAULT_URL).rstrip("/")
        # A file, when given, wins over ADK_GATEWAY_SECRET: it is what can change under a running agent.
        self._secret_file = None if secret is not None else (secret_file or os.environ.get("ADK_GATEWAY_SECRET_FILE") or None)
        self._secret = secret if secret is not None else os.environ.get("ADK_GATEWAY_SECRET", "")
        if self._secret_file is not None:
            self._secret = ""
            self._reread_secret()
        self._connect_timeout = connect_timeout or float(os.environ.get("ADK_GATEWAY_CONNECT_TIMEOUT", "5"))
        self._max_wait = max_wait or float(os.environ.get("ADK_GATEWAY_MAX_WAIT", "3600"))
        self._retry_for = retry_for if retry_for is not None else float(os.environ.get("ADK_GATEWAY_RETRY_FOR", "30"))
        # Per ADK app name ("" when the app is unknown: the gateway answers with every agent's
        # gated tools together). One API server may serve several apps, with one plugin.
        self._policies: dict[str, dict[str, dict[str, Any]]] = {}
        self._policy_expires: dict[str, float] = {}
        self._policy_lock: asyncio.Lock | None = None
        self._http: httpx.AsyncClient | None = None
        self._no_behavior_warned: set[str] = set()
        if not self._secret:
            logger.error(
                "ADK_GATEWAY_SECRET is not set (nor readable from ADK_GATEWAY_SECRET_FILE): the policy cannot be "
                "read, so every tool call will be refused"
            )

    # ---- ADK hooks -------------------------------------------------------------------------

    async def before_agent_callback(self, *, agent: Any, callback_context: CallbackContext) -> None:
        """Make sure every tool call of `agent` is gated, and apply `non_blocking` from the policy."""
        try:
            self._install_backstop(agent)
        except Exception:  # never abort a run over this: where plugin hooks run, they still gate
            logger.exception("could not add the gateway's backstop to agent %s", getattr(agent, "name", "?"))
        try:
            app = _app_name(callback_context)
            for tool in getattr(agent, "tools", None) or []:
                if not isinstance(tool, BaseTool):
                    continue
                entry = await self._tool_policy(tool.name, app)
                if entry and entry.get("non_blocking"):
                    self._declare_non_blocking(tool)
        except Exception:  # never abort a run over a declaration detail
            logger.exception("could not apply the gateway's non_blocking policy")

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        # Always asked here (as before there was a backstop): only the backstop looks at the mark.
        # Unmarkable, the call would be asked about twice, never let through.
        with contextlib.suppress(Exception):
            setattr(tool_context, _SEEN, True)
        return await self._gate(tool, tool_args, tool_context)

    async def _backstop(self, *, tool: BaseTool, args: dict[str, Any], tool_context: ToolContext) -> dict[str, Any] | None:
        """The agent-level callback: gates a call that the plugin hook above never saw.

        ADK 1.22's live path runs only the agent's callbacks (with these keyword names), never a
        plugin's `before_tool_callback`; everywhere else the plugin hook ran first and this passes.
        """
        if getattr(tool_context, _SEEN, False):
            return None
        return await self._gate(tool, args, tool_context)

    # ---- the decision ----------------------------------------------------------------------

    async def _gate(self, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext) -> dict[str, Any] | None:
        try:
            policy = await self._tool_policy(tool.name, _app_name(tool_context))
            if policy is None:
                return _refuse(
                    "The approval gateway's tool policy is unavailable (gateway unreachable or refusing this plugin), "
                    "so this call cannot be checked; it was not run.",
                    "policy_unavailable",
                )
            if not policy.get("gated"):
                return None
            browser = policy.get("runs_in") == "browser"
            if policy.get("confirm_browser" if browser else "confirm") and not is_live(tool_context):
                # A tool with rules is asked about first, unless this is ADK's re-run with the
                # person's answer: a rule may decide it at once; if none does, ADK asks.
                if not policy.get("rules") or getattr(tool_context, "tool_confirmation", None) is not None:
                    return self._confirm(tool.name, policy.get("hint"), tool_context, browser=browser)
                verdict = await self._ask(tool.name, tool_args, tool_context, confirm=True)
                if verdict.get("verdict") == "confirm":
                    marked = verdict.get("payload")  # who answers (approvers), kept in ADK's session
                    return self._confirm(
                        tool.name, policy.get("hint"), tool_context, browser=browser,
                        payload=marked if isinstance(marked, dict) and not browser else None,
                    )
            else:
                verdict = await self._ask(tool.name, tool_args, tool_context)
        except Exception:  # an exception here would abort the user's whole run
            logger.exception("gateway plugin failed; refusing the call")
            return _refuse("The approval gateway failed while checking this call; it was not run.", "plugin_failed")
        if verdict.get("verdict") == "run":
            # A tool that also declares require_confirmation must not pause a second time.
            tool_context.tool_confirmation = _confirmed()
            return None
        response = verdict.get("response")
        if verdict.get("verdict") == "respond" and isinstance(response, dict):
            return response
        return _refuse("The approval gateway answered something unexpected; the call was not run.", "unexpected_answer")

    @staticmethod
    def _confirm(
        tool: str, hint: Any, tool_context: ToolContext, *, browser: bool = False, payload: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        try:
            if not browser:
                return confirm(tool, hint, tool_context, payload)
            result = confirm(tool, hint, tool_context, BROWSER_PAYLOAD)
            if result is None:
                # Confirmed without the browser's output (a bare `confirmed: true`, whoever sent it):
                # the tool's server function is a stand-in for the browser and must never run.
                return _refuse(
                    "This browser tool call was confirmed without the browser's output; it was not run.", "no_output",
                )
            return result
        except CannotConfirm:
            logger.error("this ADK cannot request a tool confirmation from a plugin; refusing %s", tool)
            return _refuse(
                "This agent's ADK cannot ask for a confirmation (the gateway's approvals: confirm), so this call "
                "cannot be approved; it was not run.",
                "confirm_unsupported",
            )

    # ---- version differences ---------------------------------------------------------------

    def _install_backstop(self, agent: Any) -> None:
        """Puts `_backstop` first among `agent`'s own before-tool callbacks, once."""
        if not hasattr(agent, "before_tool_callback"):
            return  # not an LlmAgent: it calls no tools itself
        current = agent.before_tool_callback
        callbacks = list(current) if isinstance(current, list) else ([] if current is None else [current])
        if any(getattr(cb, "__self__", None) is self and getattr(cb, "__func__", None) is GatewayPlugin._backstop
               for cb in callbacks):
            return
        # First, as plugins come before the agent's callbacks: an operator's callback that has
        # side effects must not run for a call the gateway then refuses.
        agent.before_tool_callback = [self._backstop, *callbacks]

    def _declare_non_blocking(self, tool: BaseTool) -> None:
        if not hasattr(tool, "behavior"):
            # ADK 1.x: tools have no `behavior`; its live flow runs every tool blocking.
            if tool.name not in self._no_behavior_warned:
                self._no_behavior_warned.add(tool.name)
                logger.warning(
                    "the gateway's policy declares %s non_blocking, which this ADK does not support "
                    "(tools have no `behavior` before ADK 2.0): it stays blocking in live mode", tool.name,
                )
            return
        if tool.behavior is not types.Behavior.NON_BLOCKING:
            tool.behavior = types.Behavior.NON_BLOCKING
            logger.info("tool %s declared NON_BLOCKING by the gateway's policy", tool.name)

    # ---- gateway calls ---------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        if self._http is None or self._http.is_closed:
            self._http = httpx.AsyncClient(
                # Each gated call waits on its own connection (a long request): no pool cap, or
                # the 101st waiting call would queue behind the others. The overall bounds are
                # asyncio's (below); httpx bounds only the connect.
                timeout=httpx.Timeout(None, connect=self._connect_timeout),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
                # The gateway is reached directly, never through the HTTP(S)_PROXY an agent's
                # environment may set for its model's API.
                trust_env=False,
            )
        return self._http

    def _reread_secret(self) -> bool:
        """Take the secret from ADK_GATEWAY_SECRET_FILE again; whether it changed. An unreadable
        or empty file keeps the secret held (the gateway refuses it if it is wrong: fail closed)."""
        if self._secret_file is None:
            return False
        try:
            with open(self._secret_file, encoding="utf-8") as file:
                value = file.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            logger.warning("cannot read ADK_GATEWAY_SECRET_FILE %s: %s", self._secret_file, exc)
            return False
        if not value or value == self._secret:
            return False
        if self._secret:
            logger.info("the gateway secret changed in %s; using the new one", self._secret_file)
        self._secret = value
        return True

    async def _send(
        self, method: str, url: str, *, client: httpx.AsyncClient | None = None, traced: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request to the internal listener (through `client`, else the shared one), with the
        trace context `traced` (tracecontext.py). Refused (401) while the secret file holds a newer
        secret: sent again once with it, as the gateway may have dropped the old one already."""
        http = client or self._client()
        resp = await http.request(method, url, headers={**(traced or {}), "Authorization": f"Bearer {self._secret}"}, **kwargs)
        if resp.status_code == 401 and self._reread_secret():
            resp = await http.request(method, url, headers={**(traced or {}), "Authorization": f"Bearer {self._secret}"}, **kwargs)
        return resp

    async def _tool_policy(self, tool: str, app: str = "") -> dict[str, Any] | None:
        """This tool's policy entry for ADK app `app` ({} when ungated), or None when that app's
        policy was never fetched (the gateway unreachable, or serving no agent of this app)."""
        if app not in self._policies or time.monotonic() >= self._policy_expires.get(app, 0.0):
            if self._policy_lock is None:
                self._policy_lock = asyncio.Lock()
            async with self._policy_lock:
                if app not in self._policies or time.monotonic() >= self._policy_expires.get(app, 0.0):
                    await self._refresh_policy(app)
        policy = self._policies.get(app)
        if policy is None:
            return None
        return policy.get(tool) or policy.get("default") or {}

    async def _refresh_policy(self, app: str) -> None:
        # Each policy fetch (every `internal.policy_refresh`) takes a rotated secret.
        self._reread_secret()
        try:
            # `features`: what this plugin knows, so the gateway never counts on more (a tool with
            # rules is asked about before ADK's confirmation only by a plugin that says `rules`).
            params = {"app_name": app, "features": "rules"} if app else {"features": "rules"}
            resp = await asyncio.wait_for(
                self._send("GET", f"{self._url}/internal/v1/policy", params=params, traced=trace_headers()),
                timeout=self._connect_timeout + 5,
            )
            if resp.status_code != 200:
                raise ValueError(f"HTTP {resp.status_code}")
            body = resp.json()
            tools = body["tools"]
            if not isinstance(tools, dict):
                raise ValueError("tools is not an object")
            self._policies[app] = tools
            self._policy_expires[app] = time.monotonic() + float(body.get("refresh", 30))
        except Exception as exc:  # noqa: BLE001
            # A stale policy is still the best routing information; retry soon.
            logger.warning("could not fetch the gateway's tool policy for app %r: %s", app, exc or type(exc).__name__)
            self._policy_expires[app] = time.monotonic() + 2.0

    async def _ask(self, tool: str, args: dict[str, Any], tool_context: ToolContext, *, confirm: bool = False) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "app_name": tool_context.session.app_name,
            "user_id": tool_context.user_id,
            "session_id": tool_context.session.id,
            "invocation_id": tool_context.invocation_id,
            "function_call_id": tool_context.function_call_id,
            "tool": tool,
            "args": args,
        }
        if confirm:
            # `approvers`: this plugin confirms with the verdict's payload (a call its approvers decide).
            payload["confirm"] = payload["approvers"] = True
        url = f"{self._url}/internal/v1/tool-calls"
        # Read here, in ADK's tool span (the gateway puts the approval's wait under it); every
        # retry of the same ask carries the same context.
        traced = trace_headers()
        answer = await ask(
            lambda client: self._send("POST", url, client=client, json=payload, traced=traced), tool=tool,
            call_id=str(payload["function_call_id"]), max_wait=self._max_wait, retry_for=self._retry_for,
            connect_timeout=self._connect_timeout,
        )
        if isinstance(answer, NoVerdict):
            return {"verdict": "respond", "response": _refuse(answer.text, answer.code)}
        return answer

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
