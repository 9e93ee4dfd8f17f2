"""Reload fails closed: what start would refuse, an empty or truncated file, or a loosening is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.config import parse_config
from gateway.reload import plan_reload, reload_config
from gateway.state import GATEWAY

# What an operator runs in production: every interface, API keys, a payment needing approval.
PRODUCTION = """\
listen:
  host: 0.0.0.0
  port: 8080
auth:
  mode: api_key
  api_keys:
    - id: web
      key: k-123
internal:
  secret: s-456
limits:
  max_messages: 50
tools:
  process_payment:
    approval: true
  get_location:
    runs_in: browser
"""


def running(text: str = PRODUCTION):
    return parse_config(text, source="gateway.yaml", env={})


def plan(text: str, *, now: str = PRODUCTION):
    return plan_reload(text, source="gateway.yaml", running=running(now), env={})


@pytest.mark.parametrize("text", ["", "\n\n", "# all commented out\n", "---\n"])
def test_an_empty_file_is_refused(text: str) -> None:
    result = plan(text)
    assert result.config is None
    assert result.problems == ["gateway.yaml: the file is empty; a reload never falls back to defaults"]


def test_a_truncated_file_cannot_turn_auth_off_on_a_public_listener() -> None:
    # Cut after the listen section: auth and tools fall back to their defaults.
    truncated = PRODUCTION[: PRODUCTION.index("auth:")]
    result = plan(truncated)
    assert result.config is None
    assert any("auth.mode none is only allowed on a loopback listener, not 0.0.0.0" in p for p in result.problems)


def test_auth_none_is_judged_against_the_running_listener_not_the_file() -> None:
    # The file says loopback (so the file alone passes start's check), but what runs listens on 0.0.0.0.
    text = PRODUCTION.replace("0.0.0.0", "127.0.0.1").replace("  mode: api_key", "  mode: none")
    assert parse_config(text, env={}).auth.mode == "none"
    result = plan(text)
    assert result.config is None
    assert any("loopback listener, not 0.0.0.0" in p for p in result.problems)
    assert "listen" in result.restart_required


def test_a_reload_never_turns_auth_off_even_on_loopback() -> None:
    loopback = PRODUCTION.replace("0.0.0.0", "127.0.0.1")
    result = plan(loopback.replace("  mode: api_key", "  mode: none"), now=loopback)
    assert result.config is None
    assert result.problems == [
        "gateway.yaml: auth.mode: a reload cannot turn authentication off (running: api_key); "
        "restart the gateway to change that"
    ]


@pytest.mark.parametrize(("edit", "why"), [
    (lambda t: t[: t.index("tools:")], "tools.process_payment: a reload cannot stop requiring approval"),
    (lambda t: t.replace("    approval: true\n", "    approval: false\n"), "tools.process_payment: a reload cannot stop requiring approval"),
    (lambda t: t.replace("    runs_in: browser\n", "    runs_in: server\n"), "tools.get_location: a reload cannot stop gating this tool"),
])
def test_a_reload_never_ungates_a_tool(edit, why: str) -> None:  # type: ignore[no-untyped-def]
    result = plan(edit(PRODUCTION))
    assert result.config is None
    assert any(why in p for p in result.problems), result.problems


def test_the_default_policy_cannot_be_loosened_either() -> None:
    now = PRODUCTION + "  default:\n    approval: true\n"
    result = plan(PRODUCTION, now=now)
    assert result.config is None
    assert any("tools.default (every tool not listed): a reload cannot stop requiring approval" in p for p in result.problems)


def test_tightening_and_ordinary_changes_apply() -> None:
    text = PRODUCTION.replace("max_messages: 50", "max_messages: 5") + "  get_weather:\n    approval: true\n"
    result = plan(text)
    assert result.problems == []
    assert result.config is not None
    assert result.config.limits.max_messages == 5
    assert result.config.agents[result.config.default].tool_policy("get_weather").approval
    assert result.restart_required == []


def test_a_bad_file_is_refused_with_starts_problems() -> None:
    result = plan(PRODUCTION + "bogus: 1\n")
    assert result.config is None
    assert result.problems == ["gateway.yaml: bogus: unknown key"]


async def test_an_empty_file_keeps_the_running_gateway_closed(tmp_path: Path) -> None:
    """The repro of issue 13: truncate the file, reload: requests without a key are still refused."""
    config = running()
    app = create_app(config)
    gateway = app[GATEWAY]
    path = tmp_path / "gateway.yaml"
    path.write_text("")
    result = reload_config(gateway, path)
    assert not result.ok and result.as_json()["result"] == "failure"
    assert gateway.config is config
    assert gateway.config.auth.mode == "api_key"
    assert gateway.config.agents[gateway.config.default].tool_policy("process_payment").approval
    assert gateway.metrics.config_reloads.labels("failure")._value.get() == 1
    assert gateway.metrics.config_reloads.labels("success")._value.get() == 0


async def test_a_good_file_applies(tmp_path: Path) -> None:
    app = create_app(running())
    gateway = app[GATEWAY]
    path = tmp_path / "gateway.yaml"
    path.write_text(PRODUCTION.replace("max_messages: 50", "max_messages: 7"))
    result = reload_config(gateway, path)
    assert result.ok, result.problems
    assert gateway.config.limits.max_messages == 7
    assert gateway.admission.config.max_messages == 7


async def test_an_unreadable_file_is_a_failed_reload(tmp_path: Path) -> None:
    app = create_app(running())
    gateway = app[GATEWAY]
    result = reload_config(gateway, tmp_path / "missing.yaml")
    assert not result.ok and "cannot read" in result.problems[0]
