"""The ADK plugin's decisions, against a fake gateway (the real pairing runs in tests/integration)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

from gateway.core import approvals
from gateway.agent_plugin import REFUSAL_KEY, GatewayPlugin
from tests.support.fake_gateway import FakeGateway, context


def pay(amount: int) -> dict:
    """Pays."""
    return {"paid": amount}


def weather(city: str) -> dict:
    """Weather."""
    return {"city": city}


@pytest.fixture
async def gateway(aiohttp_server: Any) -> AsyncIterator[tuple[FakeGateway, str]]:
    fake = FakeGateway()
    server = await aiohttp_server(fake.app())
    yield fake, str(server.make_url("")).rstrip("/")


@pytest.fixture
async def plugged(gateway: tuple[FakeGateway, str]) -> AsyncIterator[tuple[FakeGateway, GatewayPlugin]]:
    """The fake gateway, and a plugin with its secret pointed at it (closed after the test)."""
    fake, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    yield fake, plugin
    await plugin.close()


async def test_ungated_tools_run_without_asking(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    assert await plugin.before_tool_callback(tool=FunctionTool(weather), tool_args={"city": "x"}, tool_context=context()) is None
    assert fake.asked == []


async def test_run_verdict_confirms_the_call(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    ctx = context()
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=ctx) is None
    assert ctx.tool_confirmation.confirmed is True
    assert fake.asked == [{
        "app_name": "app", "user_id": "u1", "session_id": "chat-1", "invocation_id": "inv",
        "function_call_id": "call-1", "tool": "pay", "args": {"amount": 5},
    }]


@pytest.mark.parametrize(
    ("verdict", "status", "needle", "code"),
    [
        ({"verdict": "respond", "response": {"error": "rejected", REFUSAL_KEY: "denied"}}, 200, "rejected", "denied"),
        ({"verdict": "maybe"}, 200, "unexpected", "unexpected_answer"),
        ([1, 2], 200, "unexpected", "unexpected_answer"),
        ({}, 500, "refused to decide", "gateway_refused"),
    ],
)
async def test_everything_but_run_keeps_the_tool_from_running(
    gateway: tuple[FakeGateway, str], verdict: Any, status: int, needle: str, code: str
) -> None:
    fake, url = gateway
    fake.verdict, fake.status = verdict, status
    plugin = GatewayPlugin(url=url, secret="s3cret")
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    assert needle in response["error"]
    # Marked, so the gateway never takes the refusal for a tool result (adk_gateway_policy_bypassed_total).
    assert response[REFUSAL_KEY] == code
    await plugin.close()


async def test_the_decision_request_carries_the_tool_span_as_traceparent(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    fake, plugin = plugged
    # ADK's execute_tool span, current while the plugin's callback runs (only the API is needed).
    tool_span = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=TraceState([("vendor", "x")]),
    )
    with trace.use_span(NonRecordingSpan(tool_span)):
        assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context()) is None
    [sent] = fake.headers
    assert sent["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert sent["tracestate"] == "vendor=x"
    assert sent["Authorization"] == "Bearer s3cret"


async def test_without_a_span_the_decision_request_carries_no_trace_context(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context()) is None
    [sent] = fake.headers
    assert "traceparent" not in sent and "tracestate" not in sent


async def test_an_environment_without_opentelemetry_sends_no_trace_context(monkeypatch: pytest.MonkeyPatch) -> None:
    import adk_gateway_plugin.tracecontext as tracecontext

    monkeypatch.setattr(tracecontext, "_propagator", None)
    assert tracecontext.trace_headers() == {}

    class Broken:
        def inject(self, carrier: dict[str, str]) -> None:
            raise RuntimeError("a propagator fault")

    monkeypatch.setattr(tracecontext, "_propagator", Broken())
    assert tracecontext.trace_headers() == {}  # never the call's failure


def test_the_plugin_and_the_gateway_agree_on_the_refusal_marker() -> None:
    # The plugin is installed in the agent's process without the gateway's modules: it has its own copy.
    assert REFUSAL_KEY == approvals.REFUSAL_KEY


async def test_a_wait_past_max_wait_is_refused_and_says_so(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    fake.behaviour = "hang"
    plugin = GatewayPlugin(url=url, secret="s3cret", max_wait=0.5)
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    assert response[REFUSAL_KEY] == "max_wait"
    assert "ADK_GATEWAY_MAX_WAIT" in response["error"] and "not run" in response["error"]
    await plugin.close()


async def test_a_gateway_that_drops_the_wait_is_refused(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    fake.behaviour = "drop"
    # Asked again for up to a second (a cut is retried: tests/unit/test_plugin_retries.py), then refused.
    plugin = GatewayPlugin(url=url, secret="s3cret", retry_for=1)
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    assert response[REFUSAL_KEY] == "gateway_unreachable" and "not run" in response["error"]
    await plugin.close()


async def test_fails_closed_without_a_reachable_gateway() -> None:
    plugin = GatewayPlugin(url="http://127.0.0.1:9", secret="s3cret", connect_timeout=1)
    response = await plugin.before_tool_callback(tool=FunctionTool(weather), tool_args={}, tool_context=context())
    assert "policy is unavailable" in response["error"]
    assert response[REFUSAL_KEY] == "policy_unavailable"
    await plugin.close()


async def test_wrong_secret_means_no_policy_and_refusal(gateway: tuple[FakeGateway, str]) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="wrong")
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=context())
    assert "policy is unavailable" in response["error"]
    await plugin.close()


async def test_non_blocking_policy_marks_the_tool_for_live_mode(gateway: tuple[FakeGateway, str]) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    paying, asking = FunctionTool(pay), FunctionTool(weather)
    await plugin.before_agent_callback(agent=SimpleNamespace(tools=[paying, asking]), callback_context=None)
    assert paying.behavior is types.Behavior.NON_BLOCKING and asking.behavior is None
    await plugin.close()


async def test_a_bug_in_the_plugin_is_a_marked_refusal(gateway: tuple[FakeGateway, str]) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")

    async def broken(*_: Any) -> dict:
        raise RuntimeError("bug")

    plugin._ask = broken  # type: ignore[method-assign]
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=context())
    assert response[REFUSAL_KEY] == "plugin_failed" and "not run" in response["error"]
    await plugin.close()


# ---- ADK version differences (the plugin's docstring; tests/integration/test_adk_versions.py runs
# the plugin inside real ADKs of both sides) -------------------------------------------------------


def operator_callback(**_: Any) -> None:
    return None


@pytest.mark.parametrize("existing", [None, operator_callback, [operator_callback]])
async def test_the_backstop_goes_first_among_the_agents_callbacks_once(gateway: tuple[FakeGateway, str], existing: Any) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    agent = SimpleNamespace(name="a", tools=[], before_tool_callback=existing)
    for _ in range(3):  # every invocation runs before_agent_callback again
        await plugin.before_agent_callback(agent=agent, callback_context=None)
    kept = [] if existing is None else [operator_callback]
    assert agent.before_tool_callback == [plugin._backstop, *kept]
    await plugin.close()


async def test_the_backstop_is_per_plugin_and_skips_agents_without_tool_callbacks(gateway: tuple[FakeGateway, str]) -> None:
    _, url = gateway
    first, second = GatewayPlugin(url=url, secret="s3cret"), GatewayPlugin(url=url, secret="s3cret")
    agent, workflow = SimpleNamespace(name="a", tools=[], before_tool_callback=None), SimpleNamespace(name="w")
    for plugin in (first, second):
        await plugin.before_agent_callback(agent=agent, callback_context=None)
        await plugin.before_agent_callback(agent=workflow, callback_context=None)
    assert agent.before_tool_callback == [second._backstop, first._backstop]
    assert not hasattr(workflow, "before_tool_callback")
    await first.close()
    await second.close()


@pytest.mark.parametrize("verdict", [{"verdict": "run"}, {"verdict": "respond", "response": {"error": "no", REFUSAL_KEY: "denied"}}])
async def test_a_call_seen_by_the_plugin_hook_is_not_asked_again_by_the_backstop(
    plugged: tuple[FakeGateway, GatewayPlugin], verdict: dict
) -> None:
    # ADK 1.22's SSE path and every 2.x path: the plugin hook, then (when it returned None) the
    # agent's callbacks, the backstop first among them.
    fake, plugin = plugged
    fake.verdict = verdict
    ctx = context()
    first = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=ctx)
    assert await plugin._backstop(tool=FunctionTool(pay), args={"amount": 5}, tool_context=ctx) is None
    assert len(fake.asked) == 1
    assert first == verdict.get("response")


@pytest.mark.parametrize(("verdict", "expected"), [
    ({"verdict": "run"}, None),
    ({"verdict": "respond", "response": {"error": "no", REFUSAL_KEY: "denied"}}, {"error": "no", REFUSAL_KEY: "denied"}),
])
async def test_the_backstop_gates_a_call_the_plugin_hook_never_saw(
    plugged: tuple[FakeGateway, GatewayPlugin], verdict: dict, expected: Any
) -> None:
    # ADK 1.22's live path: only the agent's callbacks run, with `args=` rather than `tool_args=`.
    fake, plugin = plugged
    fake.verdict = verdict
    ctx = context()
    assert await plugin._backstop(tool=FunctionTool(pay), args={"amount": 5}, tool_context=ctx) == expected
    assert [a["args"] for a in fake.asked] == [{"amount": 5}]
    if expected is None:
        assert ctx.tool_confirmation.confirmed is True
    # Ungated tools pass without asking, through the backstop too.
    assert await plugin._backstop(tool=FunctionTool(weather), args={"city": "x"}, tool_context=context()) is None
    assert len(fake.asked) == 1


async def test_only_the_backstop_defers_to_the_mark(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    # The plugin hook asks whenever ADK calls it, as it always did (a re-run of a tool on the same
    # context must not slip through on the mark); the backstop asks only about unmarked calls.
    fake, plugin = plugged
    ctx = context()
    for _ in range(2):
        await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=ctx)
    assert len(fake.asked) == 2
    unmarked = context()
    for _ in range(2):
        await plugin._backstop(tool=FunctionTool(pay), args={"amount": 5}, tool_context=unmarked)
    assert len(fake.asked) == 4


class ToolWithoutBehavior(FunctionTool):
    """A tool as ADK 1.x builds it: no `behavior` attribute (it came with ADK 2.0)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "behavior":
            raise AttributeError(name)
        return super().__getattribute__(name)


async def test_non_blocking_on_an_adk_without_tool_behavior_leaves_the_tool_alone_and_says_so_once(
    gateway: tuple[FakeGateway, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    tool = ToolWithoutBehavior(pay)
    agent = SimpleNamespace(name="a", tools=[tool], before_tool_callback=None)
    with caplog.at_level("WARNING", logger="adk_gateway.plugin"):
        await plugin.before_agent_callback(agent=agent, callback_context=None)
        await plugin.before_agent_callback(agent=agent, callback_context=None)
    assert not hasattr(tool, "behavior")
    warned = [r for r in caplog.records if "non_blocking" in r.getMessage()]
    assert len(warned) == 1 and "stays blocking" in warned[0].getMessage()
    await plugin.close()


def test_the_plugin_builds_confirmations_without_adk_1x_experimental_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import adk_gateway_plugin

    class Warning1x:  # ADK 1.x's ToolConfirmation warns on every instance
        def __init__(self, **kwargs: Any) -> None:
            warnings.warn("[EXPERIMENTAL] ToolConfirmation: This feature is experimental", UserWarning, stacklevel=2)
            self.confirmed = kwargs["confirmed"]

    monkeypatch.setattr(adk_gateway_plugin, "ToolConfirmation", Warning1x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert adk_gateway_plugin._confirmed().confirmed is True
    assert seen == []


def test_the_old_import_path_is_the_plugin_itself() -> None:
    import adk_gateway_plugin

    from gateway import agent_plugin

    assert agent_plugin.GatewayPlugin is adk_gateway_plugin.GatewayPlugin
    assert agent_plugin.REFUSAL_KEY == adk_gateway_plugin.REFUSAL_KEY


# ---- the secret from a file, rotated without restarting the agent (issue 24) --------------------------


async def test_a_secret_file_is_read_again_so_a_rotation_needs_no_agent_restart(
    gateway: tuple[FakeGateway, str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = gateway
    secret_file = tmp_path / "adk-gateway-secret"
    secret_file.write_text("s3cret\n")  # as `kubectl create secret` or an editor leaves it
    monkeypatch.setenv("ADK_GATEWAY_SECRET", "ignored-when-a-file-is-given")
    monkeypatch.setenv("ADK_GATEWAY_SECRET_FILE", str(secret_file))
    plugin = GatewayPlugin(url=url)
    try:
        assert await plugin._tool_policy("pay", "app") is not None
        # Steps 1-2 of the rotation: the gateway takes both, the file gets the new secret; the
        # plugin sends it from its next policy fetch on.
        fake.secrets = {"s3cret", "n3w"}
        secret_file.write_text("n3w\n")
        plugin._policy_expires["app"] = 0.0
        asked = fake.asked.copy()
        assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 1}, tool_context=context()) is None
        assert len(fake.asked) == len(asked) + 1
        fake.secrets = {"n3w"}  # step 4: the old secret dropped
        assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 2}, tool_context=context()) is None
        assert fake.refused == 0
    finally:
        await plugin.close()


async def test_a_refused_request_reads_the_secret_file_again_and_retries_once(
    gateway: tuple[FakeGateway, str], tmp_path: Any,
) -> None:
    # The order of a rotation got wrong (the gateway moved first, no overlap): the plugin catches up
    # at the first refusal instead of refusing gated calls until the agent restarts.
    fake, url = gateway
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret")
    plugin = GatewayPlugin(url=url, secret_file=str(secret_file))
    try:
        assert await plugin._tool_policy("pay", "app") is not None
        fake.secrets = {"n3w"}
        secret_file.write_text("n3w")
        assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 1}, tool_context=context()) is None
        assert fake.refused == 1 and fake.asked[-1]["args"] == {"amount": 1}
        # A file that still holds a refused secret is not retried in a loop: refused, marked.
        fake.secrets = {"n3wer"}
        response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 2}, tool_context=context())
        assert response[REFUSAL_KEY] == "gateway_refused" and fake.refused == 2
    finally:
        await plugin.close()


async def test_an_unreadable_secret_file_fails_closed(gateway: tuple[FakeGateway, str], tmp_path: Any) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret_file=str(tmp_path / "missing"))
    try:
        response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=context())
        assert response[REFUSAL_KEY] == "policy_unavailable"
    finally:
        await plugin.close()


# ---- upstream.approvals: confirm (ADK's own confirmation instead of a held request) ----------------

CONFIRM = {"approval": True, "runs_in": "server", "gated": True, "confirm": True, "hint": "Money leaves."}


class Confirmations:
    """ADK's side of a confirmation on a tool context: what was requested (1.22 and 2.x alike)."""

    def __init__(self) -> None:
        self.requested: list[dict[str, Any]] = []

    def __call__(self, *, hint: str | None = None, payload: Any = None) -> None:
        self.requested.append({"hint": hint, "payload": payload})


def sse_context(*, live: bool = False, answer: Any = None, can_confirm: bool = True) -> Any:
    ctx = context()
    ctx.tool_confirmation = answer
    # Every supported ADK gives a live invocation, and only a live one, a live_request_queue.
    ctx._invocation_context = SimpleNamespace(live_request_queue=object() if live else None)
    ctx.actions = SimpleNamespace(skip_summarization=False)
    if can_confirm:
        ctx.request_confirmation = Confirmations()
    return ctx


async def test_confirm_asks_adk_not_the_gateway_and_answers_with_adks_placeholder(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    fake.tools = {"pay": CONFIRM}
    plugin = GatewayPlugin(url=url, secret="s3cret")
    ctx = sse_context()
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=ctx)
    # What ADK's require_confirmation answers, so the gateway and the model read it as ADK's own.
    assert response == {"error": "This tool call requires confirmation, please approve or reject."}
    assert ctx.request_confirmation.requested == [{"hint": "Money leaves.", "payload": None}]
    assert ctx.actions.skip_summarization is True
    assert fake.asked == []  # nothing held open on the gateway
    await plugin.close()


async def test_confirm_without_a_hint_uses_adks_own(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    fake.tools = {"pay": {**CONFIRM, "hint": None}}
    plugin = GatewayPlugin(url=url, secret="s3cret")
    ctx = sse_context()
    await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=ctx)
    # The gateway shows no hint for ADK's generated one (it instructs the model, not the person).
    assert ctx.request_confirmation.requested[0]["hint"].startswith("Please approve or reject the tool call pay()")
    await plugin.close()


async def test_the_rerun_after_an_approval_runs_the_tool_and_after_a_rejection_does_not(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    from google.adk.tools.tool_confirmation import ToolConfirmation

    fake, plugin = plugged
    fake.tools = {"pay": CONFIRM}
    approved = sse_context(answer=ToolConfirmation(confirmed=True))
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=approved) is None
    rejected = sse_context(answer=ToolConfirmation(confirmed=False))
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=rejected)
    assert response == {"error": "This tool call is rejected."}  # ADK's own rejection
    assert approved.request_confirmation.requested == rejected.request_confirmation.requested == []
    assert fake.asked == []


async def test_a_timeout_answered_with_the_gateways_error_refuses_the_call_with_it(gateway: tuple[FakeGateway, str]) -> None:
    # `on_timeout: error` in confirm mode: the gateway rejects with its error as the payload
    # (docs/approvals.md); the tool does not run and the call ends with that error.
    from google.adk.tools.tool_confirmation import ToolConfirmation

    fake, url = gateway
    fake.tools = {"pay": CONFIRM}
    plugin = GatewayPlugin(url=url, secret="s3cret")
    text = "Timed out waiting for approval; the call was not run."
    timed_out = sse_context(answer=ToolConfirmation(confirmed=False, payload={"adk_gateway": {"error": text}}))
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=timed_out) == {"error": text}
    # Someone else's payload is not the gateway's: a plain rejection, or a plain approval.
    foreign = sse_context(answer=ToolConfirmation(confirmed=False, payload={"error": "x"}))
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=foreign) == {
        "error": "This tool call is rejected."
    }
    approved = sse_context(answer=ToolConfirmation(confirmed=True, payload={"adk_gateway": "nonsense"}))
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=approved) is None
    assert fake.asked == []
    await plugin.close()


async def test_a_live_run_keeps_the_blocking_path(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    # ADK's live flow has no confirmation: asked there, nobody would ever answer.
    fake, plugin = plugged
    fake.tools = {"pay": CONFIRM}
    ctx = sse_context(live=True)
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=ctx) is None
    assert [a["tool"] for a in fake.asked] == ["pay"] and ctx.request_confirmation.requested == []


async def test_a_context_that_does_not_say_whether_it_is_live_keeps_the_blocking_path(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    fake.tools = {"pay": CONFIRM}
    ctx = sse_context()
    del ctx._invocation_context
    fake.verdict = {"verdict": "respond", "response": {"error": "no", REFUSAL_KEY: "denied"}}
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=ctx)
    assert response[REFUSAL_KEY] == "denied" and len(fake.asked) == 1 and ctx.request_confirmation.requested == []


async def test_an_adk_that_cannot_ask_for_a_confirmation_refuses_the_call(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    fake.tools = {"pay": CONFIRM}
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=sse_context(can_confirm=False))
    assert response[REFUSAL_KEY] == "confirm_unsupported" and "not run" in response["error"]
    assert fake.asked == []


async def test_a_confirmation_request_that_raises_refuses_the_call(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    fake.tools = {"pay": CONFIRM}
    ctx = sse_context()

    def broken(**_: Any) -> None:
        raise ValueError("request_confirmation requires function_call_id")

    ctx.request_confirmation = broken
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=ctx)
    assert response[REFUSAL_KEY] == "plugin_failed" and "not run" in response["error"]


async def test_confirm_without_a_policy_refuses_even_an_approved_rerun() -> None:
    from google.adk.tools.tool_confirmation import ToolConfirmation

    plugin = GatewayPlugin(url="http://127.0.0.1:9", secret="s3cret", connect_timeout=1)
    ctx = sse_context(answer=ToolConfirmation(confirmed=True))
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=ctx)
    assert response[REFUSAL_KEY] == "policy_unavailable"
    await plugin.close()


async def test_a_hold_policy_ignores_an_earlier_confirmation_and_asks_the_gateway(gateway: tuple[FakeGateway, str]) -> None:
    # An agent switched back to hold while a confirmation was pending: the answer re-runs the call,
    # which the gateway then gates again (asked twice, never run unasked).
    from google.adk.tools.tool_confirmation import ToolConfirmation

    fake, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    fake.verdict = {"verdict": "respond", "response": {"error": "no", REFUSAL_KEY: "denied"}}
    ctx = sse_context(answer=ToolConfirmation(confirmed=True))
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=ctx)
    assert response[REFUSAL_KEY] == "denied" and len(fake.asked) == 1
    await plugin.close()


# ---- browser tools in confirm mode: the browser's output is the confirmation's payload ---------

BROWSER_CONFIRM = {"approval": False, "runs_in": "browser", "gated": True, "confirm": False, "confirm_browser": True, "hint": None}


def where() -> dict[str, Any]:
    raise AssertionError("a browser tool's server function ran")


def answered(confirmed: bool, payload: Any = None) -> Any:
    from google.adk.tools.tool_confirmation import ToolConfirmation

    return ToolConfirmation(confirmed=confirmed, payload=payload)


@pytest.mark.parametrize("approval", [False, True])
async def test_a_browser_tool_asks_adk_with_the_browser_mark_and_holds_nothing(
    plugged: tuple[FakeGateway, GatewayPlugin], approval: bool,
) -> None:
    fake, plugin = plugged
    fake.tools = {"where": {**BROWSER_CONFIRM, "approval": approval, "hint": "Shares where you are."}}
    ctx = sse_context()
    response = await plugin.before_tool_callback(tool=FunctionTool(where), tool_args={}, tool_context=ctx)
    assert response == {"error": "This tool call requires confirmation, please approve or reject."}
    assert ctx.request_confirmation.requested == [{"hint": "Shares where you are.", "payload": {"adk_gateway": {"runs_in": "browser"}}}]
    assert fake.asked == []


@pytest.mark.parametrize(("output", "result"), [
    ({"latitude": 35.6812}, {"latitude": 35.6812}),
    (2, {"result": 2}),  # wrapped as ADK wraps a tool's non-dict result
    ("track 2", {"result": "track 2"}),
    (None, {"result": None}),
])
async def test_the_rerun_returns_the_browsers_output_without_running_the_tool(
    plugged: tuple[FakeGateway, GatewayPlugin], output: Any, result: Any,
) -> None:
    fake, plugin = plugged
    fake.tools = {"where": BROWSER_CONFIRM}
    ctx = sse_context(answer=answered(True, {"adk_gateway": {"output": output}}))
    assert await plugin.before_tool_callback(tool=FunctionTool(where), tool_args={}, tool_context=ctx) == result
    assert ctx.request_confirmation.requested == [] and fake.asked == []


@pytest.mark.parametrize("confirmed", [True, False])
async def test_the_browsers_error_is_the_calls_result(plugged: tuple[FakeGateway, GatewayPlugin], confirmed: bool) -> None:
    fake, plugin = plugged
    fake.tools = {"where": BROWSER_CONFIRM}
    ctx = sse_context(answer=answered(confirmed, {"adk_gateway": {"error": "Permission denied"}}))
    assert await plugin.before_tool_callback(tool=FunctionTool(where), tool_args={}, tool_context=ctx) == {"error": "Permission denied"}


@pytest.mark.parametrize("payload", [None, {}, {"adk_gateway": {}}, {"adk_gateway": "x"}, {"output": 1}])
async def test_a_browser_tool_confirmed_without_the_gateways_output_is_refused_not_run(
    plugged: tuple[FakeGateway, GatewayPlugin], payload: Any,
) -> None:
    # Its server function is a stand-in for the browser: a bare approval must not run it.
    fake, plugin = plugged
    fake.tools = {"where": BROWSER_CONFIRM}
    ctx = sse_context(answer=answered(True, payload))
    response = await plugin.before_tool_callback(tool=FunctionTool(where), tool_args={}, tool_context=ctx)
    assert response[REFUSAL_KEY] == "no_output" and "not run" in response["error"]


async def test_a_rejected_browser_tool_gets_adks_rejection(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    fake.tools = {"where": {**BROWSER_CONFIRM, "approval": True}}
    ctx = sse_context(answer=answered(False))
    response = await plugin.before_tool_callback(tool=FunctionTool(where), tool_args={}, tool_context=ctx)
    assert response == {"error": "This tool call is rejected."}


async def test_a_browser_tool_marked_only_confirm_keeps_the_blocking_path(gateway: tuple[FakeGateway, str]) -> None:
    # Only `confirm_browser` sends a browser tool through ADK's confirmation: the gateway says so
    # only once it carries the output as the answer's payload.
    fake, url = gateway
    fake.tools = {"where": {**BROWSER_CONFIRM, "confirm": True, "confirm_browser": False}}
    fake.verdict = {"verdict": "respond", "response": {"latitude": 1}}
    plugin = GatewayPlugin(url=url, secret="s3cret")
    ctx = sse_context()
    assert await plugin.before_tool_callback(tool=FunctionTool(where), tool_args={}, tool_context=ctx) == {"latitude": 1}
    assert [a["tool"] for a in fake.asked] == ["where"] and ctx.request_confirmation.requested == []
    await plugin.close()


async def test_a_browser_tool_on_a_live_run_keeps_the_blocking_path(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    fake, plugin = plugged
    fake.tools = {"where": BROWSER_CONFIRM}
    fake.verdict = {"verdict": "respond", "response": {"latitude": 1}}
    ctx = sse_context(live=True)
    assert await plugin.before_tool_callback(tool=FunctionTool(where), tool_args={}, tool_context=ctx) == {"latitude": 1}
    assert [a["tool"] for a in fake.asked] == ["where"] and ctx.request_confirmation.requested == []


async def test_a_server_tool_takes_the_gateways_output_or_error_payload_too(plugged: tuple[FakeGateway, GatewayPlugin]) -> None:
    # The one protocol for every gated tool (a deadline's `on_timeout: error` answers this way).
    fake, plugin = plugged
    fake.tools = {"pay": CONFIRM}
    ctx = sse_context(answer=answered(False, {"adk_gateway": {"error": "Timed out"}}))
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=ctx) == {"error": "Timed out"}


def test_confirm_mode_builds_no_experimental_warning_on_adk_1x() -> None:
    import warnings

    from adk_gateway_plugin.confirmation import confirm

    def warns(**_: Any) -> None:
        warnings.warn("[EXPERIMENTAL] ToolConfirmation: This feature is experimental", UserWarning, stacklevel=2)

    ctx = sse_context()
    ctx.request_confirmation = warns
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        confirm("pay", "h", ctx)
    assert seen == []


async def test_a_call_for_approvers_is_confirmed_by_adk_with_the_gateways_payload(gateway: tuple[FakeGateway, str]) -> None:
    """The gateway's mark of who answers goes with ADK's confirmation (kept in ADK's session); the
    plugin says it can carry it, and ADK's re-run with the gateway's answer runs the tool."""
    fake, url = gateway
    fake.tools = {"pay": {**CONFIRM, "rules": True}}
    mark = {"adk_gateway": {"approvers": {"approvers": "supervisors", "self_approval": False, "quorum": 2, "rule": "big"}}}
    fake.verdict = {"verdict": "confirm", "payload": mark}
    plugin = GatewayPlugin(url=url, secret="s3cret")
    ctx = sse_context()
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5000}, tool_context=ctx)
    assert response == {"error": "This tool call requires confirmation, please approve or reject."}
    assert ctx.request_confirmation.requested == [{"hint": "Money leaves.", "payload": mark}]
    [asked] = fake.asked
    assert asked["confirm"] is True and asked["approvers"] is True
    rerun = sse_context(answer=SimpleNamespace(confirmed=True, payload=None))
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5000}, tool_context=rerun) is None
    assert len(fake.asked) == 1  # the re-run with the answer is not asked about again
    await plugin.close()
