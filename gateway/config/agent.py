"""One agent's configuration: its ADK upstream, its tool policy, who may use it and its own caps.

`GatewayConfig.agents` (config/schema.py) maps each agent's name to an `AgentConfig`; the rules across
agents (names, unique app names, access lists that fit the auth mode) are GatewayConfig's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AnyHttpUrl, Field, model_validator

from .approvers import GROUP_NAME_PATTERN, MAX_QUORUM, AskSpec
from .rules import ToolRule, asker_problem
from .values import ClaimValues, Duration, Section

__all__ = ["AGENT_NAME_PATTERN", "HOLD_ON_SSE", "AgentAccess", "AgentConfig", "AgentLimits", "ToolPolicy", "UpstreamConfig"]


# The one held engine is live's: on /run_sse a held plugin request dies with the replica or ADK
# that holds it, where ADK's confirmation survives both.
HOLD_ON_SSE = (
    "approvals: hold is not available with mode: sse: every call that waits for a person on /run_sse is ADK's "
    "confirmation in the session; remove the key, or use mode: live where the held engine is the only one"
)


class UpstreamConfig(Section):
    url: AnyHttpUrl = AnyHttpUrl("http://127.0.0.1:8000")
    app_name: str = Field("demo_agent", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # sse: one `/run_sse` request per turn. live: one `/run_live` session per chat, kept across turns
    # (Gemini Live models; audio). Approvals and browser tools work in both through the plugin.
    mode: Literal["sse", "live"] = "sse"
    # Response modalities asked of a live session.
    live_modalities: list[Literal["TEXT", "AUDIO"]] = Field(default_factory=lambda: ["TEXT"], min_length=1)
    connect_timeout: Duration = Field(5.0, gt=0)
    # Longest silence tolerated on a running stream. There is deliberately no total timeout:
    # a run may legitimately stream for a long time.
    idle_timeout: Duration = Field(300.0, gt=0)
    # Pooled connections to the upstream; every streaming run holds one for its whole length.
    max_connections: int = Field(1000, ge=1)
    # How often /readyz may probe the upstream; between probes the last answer is reused.
    health_interval: Duration = Field(5.0, gt=0)
    # How a call that waits for a person waits (docs/approvals.md); each mode has one way, and this
    # key only names it. sse: confirm, ADK's confirmation in its session (the run ends; the answer,
    # the person's, the approvers' or a deadline's, re-runs the call; a browser tool's output is the
    # answer's payload). live: hold, the plugin blocks inside the tool call on a long request to the
    # gateway until the decision (ADK's live flow has no confirmation). Any other pairing is refused.
    # Resolved by the validator: every reader sees "hold" or "confirm".
    approvals: Literal["hold", "confirm"] | None = None
    # The ADK server runs with `--auto_create_session`: a new chat's first `/run_sse` goes out
    # without creating the session first (one round trip fewer). A server that answers 404 all the
    # same gets the session created and the run retried, and its client creates first from then
    # on. Live sessions are always created first.
    auto_create_session: bool = False

    @model_validator(mode="after")
    def _one_engine_per_mode(self) -> UpstreamConfig:
        if self.approvals is None:
            # Not in the fields set, so a mode set later (`with_mode`) derives it again.
            object.__setattr__(self, "approvals", "confirm" if self.mode == "sse" else "hold")
        elif self.approvals == "confirm" and self.mode == "live":
            # ADK's live flow has no tool confirmation: the plugin must block there.
            raise ValueError("approvals: confirm needs mode: sse (ADK's live flow has no tool confirmations); use hold")
        elif self.approvals == "hold" and self.mode == "sse":
            raise ValueError(HOLD_ON_SSE)
        return self

    def with_mode(self, mode: Literal["sse", "live"]) -> UpstreamConfig:
        """This upstream in `mode` (`--upstream-mode`), validated again: approvals the file left
        unset follow the new mode; an explicit confirm on live or hold on sse is refused as in the file."""
        data = self.model_dump()
        if not self.approvals_explicit:
            del data["approvals"]
        return UpstreamConfig.model_validate({**data, "mode": mode})

    @property
    def approvals_explicit(self) -> bool:
        """Whether the file set `approvals` (rather than taking the mode's default). A config
        rebuilt from a dump (`revalidate`) has it set: the mode it was resolved for is final there."""
        return "approvals" in self.model_fields_set


class ToolPolicy(Section):
    """What the gateway does with calls to one tool (enforced by the ADK plugin in the agent)."""

    # A person must approve each call before it runs.
    approval: bool = False
    # `browser`: the call is answered by the browser (the AI SDK's onToolCall + addToolOutput).
    runs_in: Literal["server", "browser"] = "server"
    # How long to wait for the person (approval) or the browser (output).
    timeout: Duration = Field(300.0, gt=0)
    # What a timeout means for the call: `deny` (the tool does not run, the model is told it was
    # rejected; the browser sees tool-output-denied) or `error` (tool-output-error).
    on_timeout: Literal["deny", "error"] = "deny"
    # Shown to the person next to the approval request.
    hint: str | None = None
    # Live mode only: declare the tool NON_BLOCKING to the model (ADK `types.Behavior`), so the
    # conversation goes on while the call waits for a person; the result reaches the model later.
    # Default (blocking): the model's output stalls until the decision, though input keeps flowing.
    non_blocking: bool = False
    # Conditions on the call's arguments (config/rules.py), first match wins; none matching: `approval`
    # decides (ask when true, approve when false); a condition that cannot be evaluated fails closed
    # (config/rules.py `decide`). Any rule gates the tool, so a deny rule applies to a tool without
    # `approval` too.
    rules: list[ToolRule] = Field(default_factory=list)
    # Who answers the calls the tool itself asks (`approval: true`, no rule matched), as a rule's
    # keys say for the calls it asks (config/rules.py): a group of `approvers.groups`, whether the
    # requester may answer their own, how many distinct approvers must approve. Unset: the chatting user.
    approvers: str | None = Field(None, pattern=GROUP_NAME_PATTERN)
    self_approval: bool = True
    quorum: int = Field(1, ge=1, le=MAX_QUORUM)

    @model_validator(mode="after")
    def _rules_fit(self) -> ToolPolicy:
        if self.rules and self.runs_in == "browser":
            raise ValueError("rules on a browser tool are not supported yet (runs_in: browser)")
        if self.runs_in == "browser" and asker_problem(self, ask=False):
            raise ValueError("approvers on a browser tool are not supported (the chatting user's browser runs it)")
        # The tool's own approvers answer only what the tool itself asks: a rule that cannot be
        # evaluated is decided by its own keys (config/rules.py), never handed to the tool's.
        if problem := asker_problem(self, ask=self.approval):
            raise ValueError(problem.replace("(decide: ask)", "(approval: true)"))
        names = [rule.name for rule in self.rules]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"rule names must be unique within a tool: {', '.join(twice)} is used more than once")
        return self

    def asks(self, rule: str | None) -> AskSpec | None:
        """Who answers a call asked by the rule named `rule` (None: the tool's own `approval` asked);
        None: the chatting user. An ask rule answers with its own keys; any other name (a rule a
        reload removed) with the tool's. A call's decision (config/rules.py `decide`) may combine
        several: this is what one of them says alone."""
        found = next((r for r in self.rules if r.name == rule and r.decide == "ask"), None) if rule else None
        if found is not None:
            return found.ask_spec
        if self.approvers is None:
            return None
        return AskSpec(self.approvers, self.self_approval, self.quorum)

    def groups(self) -> set[str]:
        """The approver groups this tool and its rules name."""
        named = {rule.approvers for rule in self.rules if rule.approvers is not None}
        return named | ({self.approvers} if self.approvers is not None else set())

    @property
    def gated(self) -> bool:
        """The plugin must ask the gateway before the call may proceed."""
        return self.approval or self.runs_in == "browser" or bool(self.rules)


AGENT_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class AgentLimits(Section):
    """An agent's own caps; a key left out takes the gateway-wide `limits:` value."""

    max_messages: int | None = Field(None, ge=1)
    max_pending_approvals_per_chat: int | None = Field(None, ge=1)
    max_pending_approvals_per_user: int | None = Field(None, ge=1)


class AgentAccess(Section):
    """Who may use an agent. Empty: every caller the gateway authenticates."""

    # `auth.mode: api_key`: the ids (in `auth.api_keys`) whose keys may use this agent.
    api_keys: list[str] | None = None
    # `auth.mode: jwt`: claims the token must carry, each with the values allowed: a string claim
    # must equal one, a list claim (`groups`, `aud`) must hold one. Every claim listed must match.
    jwt_claims: ClaimValues | None = None


class AgentConfig(Section):
    """One agent the gateway serves: its ADK upstream, its tool policy, who may use it, its caps."""

    upstream: UpstreamConfig = UpstreamConfig()
    # Per-tool policy; the key `default` applies to every tool not listed.
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)
    access: AgentAccess = AgentAccess()
    limits: AgentLimits = AgentLimits()

    def tool_policy(self, name: str) -> ToolPolicy:
        return self.tools.get(name) or self.tools.get("default") or _NO_POLICY

    @property
    def upstream_base(self) -> str:
        return str(self.upstream.url).rstrip("/")

    def confirms(self, name: str) -> bool:
        """Whether the plugin asks ADK's confirmation of this tool's calls instead of blocking: every
        gated tool (approval, browser or both) of an agent with `approvals: confirm`."""
        return self.upstream.approvals == "confirm" and self.tool_policy(name).gated

    @property
    def gated_tools(self) -> list[str]:
        return sorted(name for name, policy in self.tools.items() if policy.gated)

    @property
    def browser_tools(self) -> list[str]:
        """The tools, by name, whose calls the browser answers: what a page runs in the AI SDK's
        onToolCall, which the SDK calls for every call. A `default` policy that runs in the
        browser is left out: a page can only run the tools it knows by name."""
        return sorted(name for name, policy in self.tools.items() if policy.runs_in == "browser" and name != "default")


_NO_POLICY = ToolPolicy()
