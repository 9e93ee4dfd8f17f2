"""The internal listener: where the gateway's ADK plugin asks what to do with a gated tool call.

It is a separate aiohttp Application on its own host and port (loopback by default), so nothing
here is reachable through the browser-facing routes. Every request carries the shared secret as a
bearer token, compared in constant time: `internal.secret`, or during a rotation
`internal.previous_secret` (each use of which is logged, so the operator sees which agents still
have to move to the new one before it is dropped).

- `GET /internal/v1/policy?app_name=APP`: the tool policy of the agent whose ADK app is APP, so
  the plugin only calls back for gated tools (404 for an app no agent has). A tool of an agent on
  `/run_sse` is marked `confirm` (`confirm_browser` for a browser tool): it waits as ADK's own
  confirmation, which the plugin asks ADK for, not this listener. A tool with rules
  (config/rules.py) or approvers, or a server tool with `approval` (a standing grant may decide its
  calls: approvals/grants.py), is marked `rules` too: the plugin asks about each call first (below,
  with `confirm`), and asks ADK's confirmation only when neither a rule nor a grant decided. Without `app_name` (a
  plugin from before several agents): every agent's policies merged, each tool as gated as any agent
  has it. A plugin that does not say `features=rules` is older than 0.2: it would confirm without
  asking and skip the rules, so it is served no `confirm` at all; it then asks about every gated
  call, and each ask of an agent on `/run_sse` is refused (`plugin_too_old`, below).
- `POST /internal/v1/tool-calls`: announce a call and wait (long request) for its verdict:
  `{"verdict": "run"}` or `{"verdict": "respond", "response": {...}}` (live mode's held engine);
  with `"confirm": true`, a rule's verdict at once or `{"verdict": "confirm"}` (ask ADK's
  confirmation); with `"approvers": true` too (plugin 0.3: it can mark ADK's confirmation), a call its
  approvers decide is `{"verdict": "confirm", "payload": {...}}`, the payload to ask ADK's
  confirmation with; or, from a replica that drains while the call's chat runs on another, 503
  `retry_elsewhere` (the plugin asks again, and the chat's replica takes the repeated ask as the same
  call). An ask without `"confirm": true` about an agent on `/run_sse` comes from a plugin older than
  0.2 (or from a `/run_live` call to that agent's ADK that did not come through the gateway): it is
  refused at once, the call not run, never held.
- `POST /internal/v1/reload`: reload the config file (as SIGHUP does); 422 with the problems
  when the new file is bad (the old config stays).
- `GET /metrics` (`metrics.path`), with `metrics.listener: internal`: the Prometheus metrics,
  without the secret, which a scraper holding it could also use to call the routes above.
"""

from __future__ import annotations

import hmac
import math
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from ..config.agent import ToolPolicy
from .app import metrics as metrics_page
from ..config.schema import GatewayConfig
from .errors import error_middleware, json_error
from ..core.approvals import Verdict
from ..core.refusals import HttpError, Refusal
from .reload import reload_config
from .state import GATEWAY

__all__ = ["PLUGIN_TOO_OLD", "TOO_OLD", "create_internal_app"]

log = structlog.get_logger("adk_gateway.edge.internal")


class ToolCallRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    app_name: str = Field(min_length=1, max_length=256)
    user_id: str = Field(min_length=1, max_length=256)
    session_id: str = Field(min_length=1, max_length=256)
    function_call_id: str = Field(min_length=1, max_length=256)
    tool: str = Field(min_length=1, max_length=256)
    args: dict = Field(default_factory=dict)
    invocation_id: str | None = None
    # Confirm mode: decide by the tool's rules only; a person's decision is ADK's confirmation.
    confirm: bool = False
    # With `confirm`: the plugin asks ADK's confirmation with the verdict's payload (plugin 0.3.0),
    # so a call its approvers decide waits in ADK's session too.
    approvers: bool = False

    @field_validator("args")
    @classmethod
    def _finite(cls, args: dict[str, Any]) -> dict[str, Any]:
        # The parser takes `NaN`, `Infinity` and numbers past a double's range (1e400) as floats
        # that are not finite: not JSON, and every comparison a rule makes with NaN is false.
        where = _not_finite(args)
        if where is not None:
            raise ValueError(f"{where} is not a finite number (NaN and Infinity are not JSON)")
        return args


def _not_finite(args: dict[str, Any]) -> str | None:
    """Where in `args` (`args.a[2].b`) a float that is not finite is, or None."""
    stack: list[tuple[str, Any]] = [("args", args)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where
        if isinstance(value, dict):
            stack.extend((f"{where}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


_METRICS_ROUTE = "metrics"

# The refusal of an ask from a plugin older than 0.2 (docs/approvals.md, "Refusals"): read by the
# model and shown to the person as the call's error.
PLUGIN_TOO_OLD = "plugin_too_old"
TOO_OLD = (
    "This agent's adk-gateway-plugin is too old for this gateway: it must be 0.2 or newer (upgrade the plugin "
    "in the agent's image first, then the gateway; the gateway's docs/operations.md); the call was not run."
)
# The apps whose too-old plugin this process has logged already, kept on the internal Application.
_WARNED_TOO_OLD = web.AppKey("warned_too_old", set[str])


def _matches(given: bytes, secret: SecretStr | None) -> bool:
    expected = secret.get_secret_value().encode() if secret is not None else b""
    # Compared first, whatever is configured; an empty secret authenticates nobody (an unset
    # ${VAR:-} must not open the listener).
    return hmac.compare_digest(given, expected) and bool(expected)


@web.middleware
async def require_secret(request: web.Request, handler):  # type: ignore[no-untyped-def]
    if request.match_info.route.name == _METRICS_ROUTE:
        return await handler(request)
    gateway = request.app[GATEWAY]
    settings = gateway.config.internal
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip().encode()
    # Both compared every time: which one matched must not show in the timing either.
    current, previous = _matches(given, settings.secret), _matches(given, settings.previous_secret)
    if not (current or previous):
        gateway.metrics.plugin_requests.labels("", "unauthorized").inc()
        log.warning("internal_unauthorized", path=request.path)
        raise HttpError(401, "unauthorized", "missing or wrong internal secret")
    if previous and not current:
        log.warning(
            "internal_previous_secret_used", path=request.path,
            detail="an agent still authenticates with internal.previous_secret: restart it with the new "
            "ADK_GATEWAY_SECRET before dropping previous_secret",
        )
    return await handler(request)


def _entry(p: ToolPolicy, confirm: bool) -> dict[str, object]:
    browser = p.runs_in == "browser"
    return {
        # The gateway decides first (a rule, who answers: approvers, or a standing grant of whoever
        # would be asked: docs/approvals.md) before any ADK confirmation.
        "rules": bool(p.rules) or p.approvers is not None or (p.approval and not browser),
        "approval": p.approval, "runs_in": p.runs_in, "timeout": p.timeout, "gated": p.gated, "non_blocking": p.non_blocking,
        # An agent on /run_sse: ask ADK's confirmation (with this hint) instead of blocking.
        "confirm": confirm and not browser, "hint": p.hint,
        # The same for a browser tool, whose output comes back as the answer's payload: its own key,
        # so that a plugin from before it (which would run the tool's server function on a bare
        # confirmation) asks instead, and is refused.
        "confirm_browser": confirm and browser,
    }


def merged_policy(config: GatewayConfig) -> dict[str, dict[str, object]]:
    """Every agent's tool policy as one, for a plugin that does not say its app: a tool is as gated
    as the agent that gates it most (fail closed: no agent's gated tool runs unasked)."""
    agents = list(config.agents.values())
    names = {name for agent in agents for name in agent.tools} | {"default"}
    merged = {}
    for name in sorted(names):
        policies = [agent.tool_policy(name) for agent in agents]
        merged[name] = {
            "approval": any(p.approval for p in policies),
            "runs_in": "browser" if any(p.runs_in == "browser" for p in policies) else "server",
            "timeout": max((p.timeout for p in policies if p.gated), default=policies[0].timeout),
            "gated": any(p.gated for p in policies),
            "rules": any(bool(p.rules) or p.approvers is not None for p in policies),
            "non_blocking": all(p.non_blocking for p in policies),
            # Without the app, the plugin asks about every gated call (its asks name the app: refused
            # for an agent on /run_sse, held for one on /run_live).
            "confirm": False,
            "confirm_browser": False,
            "hint": None,
        }
    return merged


async def policy(request: web.Request) -> web.Response:
    config = request.app[GATEWAY].config
    app = request.query.get("app_name")
    # Plugin 0.2 and newer say they ask about a tool with rules before ADK's confirmation. An older
    # one would confirm such a call without asking (the rules and approvers skipped): it is served no
    # `confirm`, so that every gated call it sees is asked about, and refused (`tool_call`).
    current = "rules" in request.query.get("features", "").split(",")
    if app is None:
        tools = merged_policy(config)
    else:
        agent = config.agent_for_app(app)
        if agent is None:
            log.warning("policy_for_unknown_app", app_name=app)
            raise HttpError(404, "agent_not_found", f"no agent of this gateway has the ADK app name {app!r}")
        settings = config.agents[agent]
        if not current and settings.upstream.mode == "sse":
            _too_old(request, app, agent)
        tools = {name: _entry(p, current and settings.confirms(name)) for name, p in settings.tools.items()}
    return web.json_response({"tools": tools, "refresh": config.internal.policy_refresh})


def _too_old(request: web.Request, app: str, agent: str) -> None:
    """Log, once per app and process, that the agent's plugin is too old for its calls to be asked."""
    warned = request.app[_WARNED_TOO_OLD]
    if app in warned:
        return
    warned.add(app)
    log.warning(
        "plugin_too_old", app_name=app, agent=agent,
        detail="the agent's adk-gateway-plugin is older than 0.2 (it asks without ADK's confirmation): every gated "
        "call of this agent is refused until it is upgraded; upgrade the plugin in the agent's image first, then the "
        "gateway (docs/operations.md)",
    )


async def tool_call(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    try:
        body = ToolCallRequest.model_validate_json(await request.read())
    except ValidationError as exc:
        gateway.metrics.plugin_requests.labels("", "invalid").inc()
        first = exc.errors()[0]
        raise HttpError(400, "invalid_request", f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    structlog.contextvars.bind_contextvars(
        session_id=body.session_id, tool_call_id=body.function_call_id, tool=body.tool
    )
    # The agent label is bounded by the config: an app no agent has counts under "".
    agent = gateway.config.agent_for_app(body.app_name) or ""
    if agent and not body.confirm and gateway.config.agents[agent].upstream.mode == "sse":
        # On /run_sse every call that waits for a person is ADK's confirmation: a held ask would die
        # with this replica or ADK. Refused before anything is recorded; the tool does not run.
        _too_old(request, body.app_name, agent)
        gateway.metrics.plugin_requests.labels(agent, PLUGIN_TOO_OLD).inc()
        return web.json_response(Verdict.refuse(TOO_OLD, PLUGIN_TOO_OLD).as_json())
    # The plugin's `traceparent` (ADK's tool span), if it sends one, parents the approval's wait.
    continued = gateway.tracing.continue_from(request.headers) if gateway.tracing.enabled else None
    try:
        verdict, result = await gateway.cluster.gate(
            app_name=body.app_name, user_id=body.user_id, session_id=body.session_id,
            tool_call_id=body.function_call_id, tool=body.tool, args=body.args, confirm=body.confirm,
            approvers=body.confirm and body.approvers,
        )
    except Refusal as exc:
        # `retry_elsewhere` (this replica drains, the chat runs on another): the plugin asks again;
        # nothing was decided and the tool has not run.
        answer = exc.http()
        gateway.metrics.plugin_requests.labels(agent, answer.code).inc()
        response = json_error(answer.status, answer.code, answer.message, answer.headers)
        # A balancer keeps a connection on the replica it chose: closed, the next ask on it goes
        # to a replica that stays.
        response.force_close()
        return response
    finally:
        gateway.tracing.leave(continued)
    gateway.metrics.plugin_requests.labels(agent, result).inc()
    return web.json_response(verdict.as_json())


async def reload(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    if gateway.config_path is None:
        raise HttpError(409, "no_config_file", "this gateway was not started from a config file")
    result = reload_config(gateway, gateway.config_path)
    return web.json_response(result.as_json(), status=200 if result.ok else 422)


def create_internal_app(public: web.Application) -> web.Application:
    """The internal Application, sharing the public one's state."""
    app = web.Application(middlewares=[error_middleware, require_secret], client_max_size=1024 * 1024)
    app[GATEWAY] = public[GATEWAY]
    app[_WARNED_TOO_OLD] = set()
    app.add_routes([
        web.get("/internal/v1/policy", policy),
        web.post("/internal/v1/tool-calls", tool_call),
        web.post("/internal/v1/reload", reload),
    ])
    metrics = app[GATEWAY].config.metrics
    if metrics.enabled and metrics.listener == "internal":
        app.add_routes([web.get(metrics.path, metrics_page, name=_METRICS_ROUTE)])
    return app
