"""Reload fails closed: what start would refuse, an empty or truncated file, or a loosening is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.edge.app import create_app
from gateway.config.schema import parse_config
from gateway.config.loosening import RULES, UNJUDGED, Rule
from gateway.edge.reload import plan_reload, reload_config
from gateway.edge.state import GATEWAY

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


# ---- agents judged by name, by ADK app and by the default route (issue 24, defect 1) ----------------

TWO_AGENTS = """\
auth:
  mode: api_key
  api_keys:
    - {id: staff, key: k-staff}
    - {id: web, key: k-web}
internal:
  secret: s-456
agents:
  demo_agent:
    upstream: {app_name: demo_agent}
  support_agent:
    upstream: {app_name: support_agent}
    tools:
      issue_refund: {approval: true}
    access:
      api_keys: [staff]
"""
# The repro: renamed, the app kept, its tools and its access deleted.
RENAMED = TWO_AGENTS.replace("  support_agent:\n", "  support_agnet:\n").replace(
    "    tools:\n      issue_refund: {approval: true}\n    access:\n      api_keys: [staff]\n", ""
)


def test_a_rename_that_keeps_the_app_keeps_its_gate_and_its_access() -> None:
    result = plan(RENAMED, now=TWO_AGENTS)
    assert result.config is None
    assert result.problems == [
        "gateway.yaml: agents.support_agnet.access.api_keys: a reload cannot let more keys use this agent "
        "(ADK app support_agent, served by the agent support_agent until now); restart the gateway to change that",
        "gateway.yaml: agents.support_agnet.tools.issue_refund: a reload cannot stop requiring approval "
        "(ADK app support_agent, served by the agent support_agent until now); restart the gateway to change that",
    ]


def test_a_rename_that_keeps_the_gate_and_the_access_applies() -> None:
    renamed = TWO_AGENTS.replace("  support_agent:\n", "  support_agnet:\n")
    result = plan(renamed, now=TWO_AGENTS)
    assert result.problems == [] and result.config is not None
    assert result.config.agent_for_app("support_agent") == "support_agnet"


def test_an_app_another_agent_takes_over_keeps_its_gates() -> None:
    # support_agent is removed, and demo_agent now serves its ADK app, ungated and open to every key.
    taken = TWO_AGENTS.split("  support_agent:\n")[0].replace("{app_name: demo_agent}", "{app_name: support_agent}")
    result = plan(taken, now=TWO_AGENTS)
    assert result.config is None
    assert any(p.startswith("gateway.yaml: agents.demo_agent.tools.issue_refund: a reload cannot stop requiring approval "
                            "(ADK app support_agent, served by the agent support_agent until now)") for p in result.problems)


def test_removing_an_agent_and_its_app_is_allowed() -> None:
    result = plan(TWO_AGENTS.split("  support_agent:\n")[0], now=TWO_AGENTS)
    assert result.problems == [] and result.config is not None and list(result.config.agents) == ["demo_agent"]


def test_two_agents_cannot_share_an_app_after_a_reload_either() -> None:
    shared = TWO_AGENTS.replace("{app_name: demo_agent}", "{app_name: support_agent}")
    result = plan(shared, now=TWO_AGENTS)
    assert result.config is None
    assert any("'support_agent' is also agents.demo_agent's" in p for p in result.problems), result.problems


def test_the_default_route_is_not_moved_to_a_new_agent_that_gates_less() -> None:
    # A single-agent file cut before its `upstream:` and `tools:`: the one agent is now `demo_agent`
    # with the default upstream, a new name and a new app, and `/api/chat` would serve it ungated.
    shop = PRODUCTION.replace("tools:\n", "upstream:\n  app_name: shop\ntools:\n")
    cut = PRODUCTION[: PRODUCTION.index("tools:")]
    result = plan(cut, now=shop)
    assert result.config is None
    assert "gateway.yaml: tools.process_payment: a reload cannot stop requiring approval (/api/chat, served by the agent shop until now); " \
           "restart the gateway to change that" in result.problems
    # The same agent under another name and app, gated as before, may take the route.
    assert plan(PRODUCTION, now=shop).config is not None


def test_the_default_route_may_move_to_an_agent_that_was_there() -> None:
    moved = TWO_AGENTS.replace("agents:\n", "default_agent: support_agent\nagents:\n")
    assert plan(moved, now=TWO_AGENTS).config is not None
    assert plan(TWO_AGENTS, now=moved).config is not None  # callers of /api/chat reach demo_agent, as they could


def test_a_tool_listed_now_cannot_escape_the_default_policy_that_gated_it() -> None:
    now = PRODUCTION + "  default:\n    approval: true\n"
    result = plan(now + "  get_weather:\n    hint: no approval\n", now=now)
    assert result.config is None
    assert any(p.startswith("gateway.yaml: tools.get_weather: a reload cannot stop requiring approval") for p in result.problems)


# ---- a single-agent file's refusals name its own keys (issue 24, docs) ------------------------------


def test_a_single_agent_files_refusal_names_the_keys_it_has() -> None:
    result = plan(PRODUCTION.replace("    approval: true\n", "    approval: false\n"))
    assert result.problems == [
        "gateway.yaml: tools.process_payment: a reload cannot stop requiring approval; restart the gateway to change that"
    ]
    # As start's problems are: the bad duration of the same key.
    bad = plan(PRODUCTION.replace("    approval: true\n", "    approval: true\n    timeout: soon\n"))
    assert bad.problems[0].startswith("gateway.yaml: tools.process_payment.timeout: invalid duration")


async def test_the_internal_reload_endpoint_refuses_the_rename_and_the_policy_keeps_the_gate(tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from gateway.edge.internal import create_internal_app

    app = create_app(running(TWO_AGENTS))
    gateway = app[GATEWAY]
    gateway.config_path = tmp_path / "gateway.yaml"
    gateway.config_path.write_text(RENAMED)
    client = TestClient(TestServer(create_internal_app(app)))
    await client.start_server()
    try:
        secret = {"Authorization": "Bearer s-456"}
        refused = await client.post("/internal/v1/reload", headers=secret)
        assert refused.status == 422
        body = await refused.json()
        assert body["result"] == "failure" and any("agents.support_agnet.tools.issue_refund" in p for p in body["problems"])
        policy = await (await client.get("/internal/v1/policy", params={"app_name": "support_agent"}, headers=secret)).json()
        assert policy["tools"]["issue_refund"]["gated"] and policy["tools"]["issue_refund"]["approval"]
        assert gateway.config.agents["support_agent"].access.api_keys == ["staff"]
    finally:
        await client.close()


# ---- one table of who gets in, each setting with its direction (issue 24, defect 2) ----------------

KEYS = """\
listen: {host: 0.0.0.0}
internal: {secret: s-456}
auth:
  mode: api_key
  api_keys:
    - {id: staff, key: k-staff}
    - {id: web, key: k-web}
  allowed_origins: [https://a.example, https://b.example]
  cookie_name: session
  ws_ticket_ttl: 30s
agents:
  pay:
    upstream: {app_name: pay}
    tools:
      process_payment: {approval: true}
      get_location: {runs_in: browser}
    access: {api_keys: [staff]}
"""
JWT = """\
listen: {host: 0.0.0.0}
internal: {secret: s-456}
auth:
  mode: jwt
  jwt:
    secret: hs-secret
    audience: my-app
    issuer: https://idp.example
    required_claims: {scope: [chat, admin]}
    leeway: 30s
agents:
  pay:
    upstream: {app_name: pay}
    tools:
      process_payment: {approval: true}
    access: {jwt_claims: {groups: [staff, ops]}}
"""
PEM_JWT = JWT.replace("    secret: hs-secret\n", "    algorithms: [RS256, ES256]\n    public_key_file: {pem}\n")
JWKS_JWT = JWT.replace("    secret: hs-secret\n", "    algorithms: [RS256]\n    jwks_url: https://idp.example/keys\n")
DISCOVERY_JWT = JWT.replace("    secret: hs-secret\n", "    algorithms: [RS256]\n    discovery: true\n")


def _swap(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


# Rules on a payment's arguments (issue 26): small ones approved, middling ones asked, large ones refused.
_SMALL = "          - {name: small, when: 'args.amount < 5', decide: approve}\n"
_MID = "          - {name: mid, when: 'args.amount < 100', decide: ask}\n"
_LARGE = "          - {name: large, when: 'args.amount >= 10000', decide: deny, reason: Too much.}\n"
RULED = _swap(KEYS, "      process_payment: {approval: true}\n",
              "      process_payment:\n        approval: true\n        rules:\n" + _SMALL + _MID + _LARGE)


# Approvers (issue 26, item 2): refunds answered by two supervisors, never the requester.
_REFUND = ("      issue_refund:\n        approval: true\n        approvers: supervisors\n        self_approval: false\n"
           "        quorum: 2\n        rules:\n"
           "          - {name: large, when: 'args.amount > 100', decide: ask, approvers: supervisors, self_approval: false, quorum: 2}\n"
           "          - {name: small, when: 'args.amount < 10', decide: ask}\n")
APPROVING = _swap(KEYS, "      get_location: {runs_in: browser}\n", "      get_location: {runs_in: browser}\n" + _REFUND) + (
    "approvers:\n  api_keys:\n    - {id: boss, key: k-boss}\n  groups:\n    supervisors: {users: [boss, staff, lead]}\n"
    "    others: {users: [web, lead]}\n  auditors: {users: [boss]}\n")
APPROVING_JWT = _swap(JWT, "      process_payment: {approval: true}\n", "      process_payment: {approval: true}\n" + _REFUND) + (
    "approvers:\n  groups:\n    supervisors: {users: [boss, staff], jwt_claims: {groups: [supervisors]}}\n"
    "  auditors: {jwt_claims: {roles: [audit, compliance]}}\n")


# Per entry of the table: (running, a looser file) and (running, a tighter file, or the same setting
# written again for a setting that must stay equal), and the key a refusal names.
CASES: dict[str, tuple[tuple[str, str], tuple[str, str], str]] = {
    "auth.mode": (
        (KEYS.replace("0.0.0.0", "127.0.0.1"), _swap(KEYS.replace("0.0.0.0", "127.0.0.1"), "mode: api_key", "mode: none")
         .replace("    access: {api_keys: [staff]}\n", "")),
        (PRODUCTION.replace("0.0.0.0", "127.0.0.1").replace("  mode: api_key", "  mode: none"), PRODUCTION.replace("0.0.0.0", "127.0.0.1")),
        "auth.mode",
    ),
    "auth.api_keys": (
        (KEYS, _swap(KEYS, "    - {id: web, key: k-web}\n", "    - {id: web, key: k-web}\n    - {id: ops, key: k-ops}\n")),
        (KEYS, _swap(KEYS, "    - {id: web, key: k-web}\n", "")),
        "auth.api_keys[ops]",
    ),
    "auth.jwt.algorithms": (
        (PEM_JWT, _swap(PEM_JWT, "[RS256, ES256]", "[RS256, ES256, PS256]")),
        (PEM_JWT, _swap(PEM_JWT, "[RS256, ES256]", "[RS256]")),
        "auth.jwt.algorithms",
    ),
    "auth.jwt.secret": ((JWT, _swap(JWT, "hs-secret", "another-secret")), (JWT, JWT), "auth.jwt.secret"),
    "auth.jwt.public_key_file": (
        (PEM_JWT, _swap(PEM_JWT, "{pem}", "{other_pem}")),
        (PEM_JWT, _swap(PEM_JWT, "{pem}", "{pem_copy}")),  # the same key from another file
        "auth.jwt.public_key_file",
    ),
    "auth.jwt.jwks_url": (
        (JWKS_JWT, _swap(JWKS_JWT, "https://idp.example/keys", "https://elsewhere.example/keys")),
        (JWKS_JWT, JWKS_JWT),
        "auth.jwt.jwks_url",
    ),
    "auth.jwt.discovery": (
        (DISCOVERY_JWT, _swap(DISCOVERY_JWT, "discovery: true", "jwks_url: https://idp.example/keys")),
        (DISCOVERY_JWT, DISCOVERY_JWT),
        "auth.jwt.discovery",
    ),
    "auth.jwt.jwks_hosts": (
        (_swap(DISCOVERY_JWT, "discovery: true", "discovery: true\n    jwks_hosts: [keys.example]"),
         _swap(DISCOVERY_JWT, "discovery: true", "discovery: true\n    jwks_hosts: [keys.example, evil.example]")),
        (_swap(DISCOVERY_JWT, "discovery: true", "discovery: true\n    jwks_hosts: [keys.example, more.example]"),
         _swap(DISCOVERY_JWT, "discovery: true", "discovery: true\n    jwks_hosts: [keys.example]")),
        "auth.jwt.jwks_hosts",
    ),
    "auth.jwt.jwks_allow_http": (
        (DISCOVERY_JWT, _swap(DISCOVERY_JWT, "discovery: true", "discovery: true\n    jwks_allow_http: true")),
        (_swap(DISCOVERY_JWT, "discovery: true", "discovery: true\n    jwks_allow_http: true"), DISCOVERY_JWT),
        "auth.jwt.jwks_allow_http",
    ),
    "auth.jwt.audience": (
        (JWT, _swap(JWT, "    audience: my-app\n", "")),
        (_swap(JWT, "    audience: my-app\n", ""), JWT),
        "auth.jwt.audience",
    ),
    "auth.jwt.issuer": (
        (JWT, _swap(JWT, "    issuer: https://idp.example\n", "    issuer: https://other.example\n")),
        (_swap(JWT, "    issuer: https://idp.example\n", ""), JWT),
        "auth.jwt.issuer",
    ),
    "auth.jwt.user_claim": ((JWT, _swap(JWT, "    leeway: 30s\n", "    leeway: 30s\n    user_claim: email\n")), (JWT, JWT), "auth.jwt.user_claim"),
    "auth.jwt.required_claims": (
        (JWT, _swap(JWT, "[chat, admin]", "[chat, admin, guest]")),
        (JWT, _swap(JWT, "{scope: [chat, admin]}", "{scope: [chat], tenant: acme}")),
        "auth.jwt.required_claims.scope",
    ),
    "auth.jwt.leeway": ((JWT, _swap(JWT, "leeway: 30s", "leeway: 2m")), (JWT, _swap(JWT, "leeway: 30s", "leeway: 5s")), "auth.jwt.leeway"),
    "auth.allowed_origins": (
        (KEYS, _swap(KEYS, "https://b.example]", "https://b.example, https://c.example]")),
        (KEYS, _swap(KEYS, ", https://b.example]", "]")),
        "auth.allowed_origins",
    ),
    "auth.cookie_name": (
        (_swap(KEYS, "  cookie_name: session\n", ""), KEYS),
        (KEYS, _swap(KEYS, "  cookie_name: session\n", "")),
        "auth.cookie_name",
    ),
    "auth.ws_ticket_ttl": ((KEYS, _swap(KEYS, "ws_ticket_ttl: 30s", "ws_ticket_ttl: 5m")), (KEYS, _swap(KEYS, "ws_ticket_ttl: 30s", "ws_ticket_ttl: 10s")), "auth.ws_ticket_ttl"),
    "auth.allow_token_in_url": (
        (KEYS, _swap(KEYS, "  ws_ticket_ttl: 30s\n", "  ws_ticket_ttl: 30s\n  allow_token_in_url: true\n")),
        (_swap(KEYS, "  ws_ticket_ttl: 30s\n", "  ws_ticket_ttl: 30s\n  allow_token_in_url: true\n"), KEYS),
        "auth.allow_token_in_url",
    ),
    "agents.<name>.access.api_keys": (
        (KEYS, _swap(KEYS, "[staff]}", "[staff, web]}")),
        (_swap(KEYS, "[staff]}", "[staff, web]}"), KEYS),
        "agents.pay.access.api_keys",
    ),
    "agents.<name>.access.jwt_claims": (
        (JWT, _swap(JWT, "[staff, ops]", "[staff, ops, guest]")),
        (JWT, _swap(JWT, "{groups: [staff, ops]}", "{groups: [staff], tenant: acme}")),
        "agents.pay.access.jwt_claims.groups",
    ),
    "agents.<name>.tools.<tool>.approval": (
        (KEYS, _swap(KEYS, "{approval: true}", "{approval: false}")),
        (KEYS, _swap(KEYS, "{runs_in: browser}", "{runs_in: browser, approval: true}")),
        "agents.pay.tools.process_payment",
    ),
    "agents.<name>.tools.<tool>.runs_in": (
        (KEYS, _swap(KEYS, "{runs_in: browser}", "{runs_in: server}")),
        (KEYS, _swap(KEYS, "{approval: true}", "{approval: true, runs_in: browser}")),
        "agents.pay.tools.get_location",
    ),
    "agents.<name>.tools.<tool>.rules": (
        (RULED, _swap(RULED, _LARGE, "")),
        (RULED, _swap(_swap(RULED, _SMALL, ""), _LARGE, _LARGE + "          - {name: blocked, when: 'args.to == \"XX\"', decide: deny, reason: No.}\n")),
        "agents.pay.tools.process_payment.rules",
    ),
    "agents.<name>.tools.<tool>.approvers": (
        (APPROVING, _swap(APPROVING, "        self_approval: false\n", "")),
        (APPROVING, _swap(APPROVING, "        quorum: 2\n", "        quorum: 3\n")),
        "agents.pay.tools.issue_refund",
    ),
    "approvers.api_keys": (
        (APPROVING, _swap(APPROVING, "    - {id: boss, key: k-boss}\n", "    - {id: boss, key: k-boss}\n    - {id: lead, key: k-lead}\n")),
        # A key removed with its holder's places in the lists (bare, `boss` would name a chat key's holder).
        (APPROVING, _swap(_swap(_swap(APPROVING, "  api_keys:\n    - {id: boss, key: k-boss}\n", ""), "[boss, staff, lead]",
                                "[staff, lead]"), "  auditors: {users: [boss]}\n", "")),
        "approvers.api_keys[lead]",
    ),
    "approvers.groups": (
        (APPROVING, _swap(APPROVING, "[boss, staff, lead]", "[boss, staff, lead, web]")),
        (APPROVING, _swap(APPROVING, "[boss, staff, lead]", "[boss, staff]")),
        "approvers.groups.supervisors",
    ),
    "approvers.auditors": (
        (APPROVING_JWT, _swap(APPROVING_JWT, "[audit, compliance]", "[audit, compliance, staff]")),
        (APPROVING_JWT, _swap(APPROVING_JWT, "{roles: [audit, compliance]}", "{roles: [audit], tenant: acme}")),
        "approvers.auditors",
    ),
}


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    folder = tmp_path_factory.mktemp("keys")

    def public_pem() -> bytes:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    one = public_pem()
    files = {"pem": one, "pem_copy": one, "other_pem": public_pem()}
    for name, data in files.items():
        (folder / f"{name}.pem").write_bytes(data)
    return {name: str(folder / f"{name}.pem") for name in files}


def _fill(text: str, pems: dict[str, str]) -> str:
    for name, path in pems.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.path)
def test_loosening_any_setting_of_the_table_is_refused(rule: Rule, pems: dict[str, str]) -> None:
    assert rule.path in CASES, f"{rule.path}: add a case (a looser and a tighter file) to CASES"
    (now, looser), _, key = CASES[rule.path]
    result = plan(_fill(looser, pems), now=_fill(now, pems))
    assert result.config is None
    assert any(p.startswith(f"gateway.yaml: {key}: a reload cannot ") and p.endswith("; restart the gateway to change that")
               for p in result.problems), result.problems


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.path)
def test_tightening_any_setting_of_the_table_applies(rule: Rule, pems: dict[str, str]) -> None:
    _, (now, tighter), _ = CASES[rule.path]
    result = plan(_fill(tighter, pems), now=_fill(now, pems))
    assert result.problems == [] and result.config is not None


def test_the_cases_are_the_tables() -> None:
    assert set(CASES) == {rule.path for rule in RULES}


def test_every_setting_of_who_gets_in_is_in_the_table_or_said_not_to_be() -> None:
    """A new field of the auth config or of an agent's access or gates fails here until it is
    classified: in RULES with its direction, or in UNJUDGED with why it does not decide who gets in."""
    from gateway.config.agent import AgentAccess, AgentConfig, ToolPolicy
    from gateway.config.approvers import ApproverGroup, ApproversConfig, Auditors
    from gateway.config.auth import ApiKey, AuthConfig, JwtConfig

    models = {
        "auth": AuthConfig, "auth.jwt": JwtConfig, "auth.api_keys[]": ApiKey,
        "agents.<name>": AgentConfig, "agents.<name>.access": AgentAccess, "agents.<name>.tools.<tool>": ToolPolicy,
        "approvers": ApproversConfig, "approvers.api_keys[]": ApiKey, "approvers.groups.<group>": ApproverGroup,
        "approvers.auditors": Auditors,
    }
    sections = set(models) | {"agents.<name>.tools"}
    fields = {f"{prefix}.{name}" for prefix, model in models.items() for name in model.model_fields} - sections
    classified = {rule.path for rule in RULES} | {path for rule in RULES for path in rule.covers} | set(UNJUDGED)
    assert fields - classified == set(), "classify these in gateway/config/loosening.py (RULES or UNJUDGED)"
    # A rule may judge a whole section (`approvers.auditors`) and cover its fields.
    assert classified - fields - sections == set(), "the table names settings that do not exist"
    assert all(rule.why and rule.direction for rule in RULES) and all(UNJUDGED.values())


def test_a_key_given_to_another_id_is_refused() -> None:
    swapped = KEYS.replace("{id: staff, key: k-staff}", "{id: staff, key: k-web}").replace("{id: web, key: k-web}", "{id: web, key: k-staff}")
    result = plan(swapped, now=KEYS)
    assert result.config is None and any(p.startswith("gateway.yaml: auth.api_keys[staff]: ") for p in result.problems)
    # The same key as its digest is the same key.
    digest = hashlib.sha256(b"k-web").hexdigest()
    assert plan(KEYS.replace("{id: web, key: k-web}", f"{{id: web, sha256: {digest.upper()}}}"), now=KEYS).config is not None


def test_a_dropped_access_list_and_a_dropped_claim_are_refused() -> None:
    assert plan(KEYS.replace("    access: {api_keys: [staff]}\n", ""), now=KEYS).config is None
    assert plan(JWT.replace("    required_claims: {scope: [chat, admin]}\n", ""), now=JWT).config is None
    assert plan(JWT.replace("    access: {jwt_claims: {groups: [staff, ops]}}\n", ""), now=JWT).config is None


def test_any_origin_opens_every_origin() -> None:
    # A cookie never goes with "*" (start refuses it): these files carry their key in a header.
    listed = KEYS.replace("  cookie_name: session\n", "")
    star = listed.replace("[https://a.example, https://b.example]", '["*"]')
    assert plan(star, now=listed).config is None
    assert plan(listed, now=star).config is not None


def test_from_no_auth_every_mode_narrows() -> None:
    jwt = JWT.replace("0.0.0.0", "127.0.0.1")
    open_ = jwt.replace("mode: jwt", "mode: none").replace("    access: {jwt_claims: {groups: [staff, ops]}}\n", "")
    assert plan(jwt, now=open_).problems == []
    keys = plan(JWT.replace("0.0.0.0", "127.0.0.1").replace("mode: jwt", "mode: api_key\n  api_keys: [{id: a, key: k}]")
                .replace("    access: {jwt_claims: {groups: [staff, ops]}}\n", ""), now=JWT.replace("0.0.0.0", "127.0.0.1"))
    assert keys.config is None and any(p.startswith("gateway.yaml: auth.mode: a reload cannot") for p in keys.problems)


def test_the_reloading_docs_list_every_setting_of_the_table() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    section = doc[doc.index("## Reloading"):doc.index("## Command line")]
    assert [rule.path for rule in RULES if f"`{rule.path}`" not in section] == []
    assert [path for path in UNJUDGED if f"`{path.rsplit('.', 1)[-1]}`" not in section] == []


def test_a_single_agent_file_moved_to_the_agents_form_is_judged_by_its_app() -> None:
    # PRODUCTION's one agent is `demo_agent` (named after its app); here the app moves under another name.
    head = PRODUCTION[: PRODUCTION.index("tools:")]
    ungated = head + "agents:\n  payments:\n    upstream: {app_name: demo_agent}\n"
    result = plan(ungated)
    assert result.config is None
    assert any(p.startswith("gateway.yaml: agents.payments.tools.process_payment: a reload cannot stop requiring approval "
                            "(ADK app demo_agent, served by the agent demo_agent until now)") for p in result.problems)
    gated = ungated + "    tools:\n      process_payment: {approval: true}\n      get_location: {runs_in: browser}\n"
    assert plan(gated).problems == []


# ---- rules on a call's arguments: which edits a reload may make (issue 26) --------------------------

_NEW_DENY = "          - {name: blocked, when: 'args.to == \"XX\"', decide: deny, reason: No.}\n"


def _rules_text(*rules: str, approval: bool = True) -> str:
    head = RULED[: RULED.index("        approval: true\n")]
    tail = RULED[RULED.index("      get_location:"):]
    return head + f"        approval: {str(approval).lower()}\n        rules:\n" + "".join(rules) + tail


def _rules_plan(*rules: str, approval: bool = True, now: str = RULED):  # type: ignore[no-untyped-def]
    return plan(_rules_text(*rules, approval=approval), now=now)


@pytest.mark.parametrize("rules", [
    (_SMALL, _MID, _LARGE),                                   # the same
    (_SMALL, _MID, _LARGE.replace("Too much.", "Over the limit.")),  # a reason is text
    (_MID, _LARGE),                                           # an approve rule removed
    (_SMALL, _MID, _LARGE, _NEW_DENY),                        # a deny rule added after the last deny
    # A rule that cannot be evaluated is decided by its own outcome at least (config/rules.py): a
    # deny rule added anywhere refuses a call it cannot read, never asks where `large` refused.
    (_SMALL, _MID, _NEW_DENY, _LARGE),
    (_SMALL.replace("decide: approve", "decide: deny, reason: No."), _MID, _LARGE),
], ids=["same", "reason", "approve-removed", "deny-appended", "deny-before-deny", "approve-made-deny-before-deny"])
def test_a_reload_may_keep_rules_add_deny_rules_and_remove_approve_rules(rules: tuple[str, ...]) -> None:
    result = _rules_plan(*rules)
    assert result.problems == [] and result.config is not None


@pytest.mark.parametrize(("rules", "what"), [
    ((_SMALL, _MID), "remove the deny rule large"),
    ((_SMALL, _LARGE), "remove the ask rule mid"),
    ((_SMALL, _MID, _LARGE, "          - {name: more, when: 'args.amount < 10', decide: approve}\n"),
     "add the approve rule more"),
    ((_SMALL, "          - {name: odd, when: 'args.amount == 7', decide: ask}\n", _MID, _LARGE), "add the ask rule odd"),
    ((_SMALL.replace("< 5", "< 50"), _MID, _LARGE), "change the rule small"),
    ((_SMALL, _MID.replace("decide: ask", "decide: approve"), _LARGE), "change the rule mid"),
    ((_SMALL, _LARGE.replace(">= 10000", ">= 20000"), ), "change the rule large"),
    ((_MID, _SMALL, _LARGE), "reorder the rules"),
])
def test_any_other_change_to_the_rules_is_refused(rules: tuple[str, ...], what: str) -> None:
    result = _rules_plan(*rules)
    assert result.config is None
    assert any(p.startswith("gateway.yaml: agents.pay.tools.process_payment.rules: a reload cannot loosen a tool's rules (")
               and what in p for p in result.problems), result.problems


def test_an_approve_rule_made_a_deny_rule_applies_with_no_deny_rule_after_it() -> None:
    denied = _SMALL.replace("decide: approve", "decide: deny, reason: No.")
    assert _rules_plan(denied, _MID, now=_rules_text(_SMALL, _MID)).problems == []


def test_an_approve_rule_may_go_wherever_it_stands_since_one_that_cannot_be_evaluated_never_approves() -> None:
    later = "          - {name: later, when: 'args.to == \"DE\"', decide: approve}\n"
    assert _rules_plan(later, _LARGE, now=_rules_text(_SMALL, later, _LARGE)).problems == []
    # Without approval, what no rule decides was approved already, whether `small` could read the call or not.
    assert _rules_plan(_LARGE, approval=False, now=_rules_text(_SMALL, _LARGE, approval=False)).problems == []


def test_rules_under_the_default_policy_are_judged_for_every_tool_not_listed() -> None:
    default = "      default:\n        approval: true\n        rules:\n" + _LARGE.replace("args.amount", "args.n")
    now = _swap(KEYS, "      get_location: {runs_in: browser}\n", "      get_location: {runs_in: browser}\n" + default)
    result = plan(_swap(now, default, "      default: {approval: true}\n"), now=now)
    assert result.config is None and any(
        "agents.pay.tools.default.rules (every tool not listed): a reload cannot loosen a tool's rules (remove the deny rule large)"
        in p for p in result.problems)


def test_a_tool_that_gains_rules_without_approval_is_gated() -> None:
    text = _swap(KEYS, "      get_location: {runs_in: browser}\n", "      get_location: {runs_in: browser}\n"
                 "      get_weather:\n        rules: [{name: nowhere, when: 'args.city == \"X\"', decide: deny, reason: No.}]\n")
    result = plan(text, now=KEYS)
    assert result.problems == [] and result.config is not None
    assert "get_weather" in result.config.agents["pay"].gated_tools


def test_a_browser_tool_moved_to_the_server_with_rules_but_without_approval_is_refused() -> None:
    """Rules gate a tool, but a call no rule decides runs unasked: not the browser's every call."""
    moved = _swap(KEYS, "      get_location: {runs_in: browser}\n",
                  "      get_location:\n        rules: [{name: far, when: 'args.km > 100', decide: deny, reason: Too far.}]\n")
    result = plan(moved, now=KEYS)
    assert result.config is None
    assert any(p.startswith("gateway.yaml: agents.pay.tools.get_location: a reload cannot stop gating this tool") for p in result.problems)
    asked = _swap(moved, "      get_location:\n", "      get_location:\n        approval: true\n")
    assert plan(asked, now=KEYS).problems == []


# ---- who may approve is access: a reload never widens it (issue 26, item 2) ------------------------

_LARGE_ASK = "          - {name: large, when: 'args.amount > 100', decide: ask, approvers: supervisors, self_approval: false, quorum: 2}\n"


@pytest.mark.parametrize(("edit", "key", "what"), [
    ((_LARGE_ASK, "          - {name: large, when: 'args.amount > 100', decide: ask}\n"),
     "agents.pay.tools.issue_refund.rules[large]", "let the chatting user answer what the group supervisors answers"),
    ((_LARGE_ASK, _LARGE_ASK.replace("self_approval: false", "self_approval: true")),
     "agents.pay.tools.issue_refund.rules[large]", "let the requester approve their own calls (self_approval)"),
    ((_LARGE_ASK, _LARGE_ASK.replace("quorum: 2", "quorum: 1")),
     "agents.pay.tools.issue_refund.rules[large]", "need fewer approvers (quorum 1, running: 2)"),
    ((_LARGE_ASK, _LARGE_ASK.replace("approvers: supervisors", "approvers: others")),
     "agents.pay.tools.issue_refund.rules[large]", "hand the calls to another group (others, running: supervisors)"),
    (("        approvers: supervisors\n        self_approval: false\n        quorum: 2\n", ""),
     "agents.pay.tools.issue_refund", "let the chatting user answer what the group supervisors answers"),
    (("        quorum: 2\n        rules:", "        quorum: 1\n        rules:"),
     "agents.pay.tools.issue_refund", "need fewer approvers"),
    (("[boss, staff, lead]", "[boss, staff, lead, anonymous]"), "approvers.groups.supervisors", "users added: api_key:anonymous"),
    # The chatting user answered the small ones: the group's members would decide calls they decide none of now.
    (("          - {name: small, when: 'args.amount < 10', decide: ask}\n",
      "          - {name: small, when: 'args.amount < 10', decide: ask, approvers: others}\n"),
     "agents.pay.tools.issue_refund.rules[small]", "hand the chatting user's calls to the group others"),
])
def test_a_reload_never_lets_more_people_approve(edit: tuple[str, str], key: str, what: str) -> None:
    result = plan(_swap(APPROVING, *edit), now=APPROVING)
    assert result.config is None
    assert any(p.startswith(f"gateway.yaml: {key}: a reload cannot ") and what in p for p in result.problems), result.problems


@pytest.mark.parametrize(("edit", "what"), [
    (("[boss, staff], jwt_claims: {groups: [supervisors]}", "[boss, staff], jwt_claims: {groups: [supervisors, staff]}"),
     "the claim groups dropped or widened"),
    (("[boss, staff], jwt_claims: {groups: [supervisors]}", "[boss, staff], jwt_claims: {teams: [supervisors]}"),
     "the claim groups dropped or widened"),
])
def test_a_group_claim_widened_is_refused(edit: tuple[str, str], what: str) -> None:
    result = plan(_swap(APPROVING_JWT, *edit), now=APPROVING_JWT)
    assert result.config is None
    assert any(p.startswith("gateway.yaml: approvers.groups.supervisors: a reload cannot ") and what in p
               for p in result.problems), result.problems


def test_claims_where_a_group_had_none_are_refused() -> None:
    now = _swap(APPROVING_JWT, "{users: [boss, staff], jwt_claims: {groups: [supervisors]}}", "{users: [boss, staff]}")
    result = plan(APPROVING_JWT, now=now)
    assert result.config is None and any("claims that match where none were" in p for p in result.problems)


@pytest.mark.parametrize("edit", [
    ("[boss, staff, lead]", "[boss, staff]"),
    # The same people, written with the source their ids come from.
    ("[boss, staff, lead]", "[approver_key:boss, api_key:staff, lead]"),
    ("{users: [web, lead]}", "{users: [lead]}"),
    ("  auditors: {users: [boss]}\n", ""),
    ("    - {id: boss, key: k-boss}\n", "    - {id: boss, sha256: " + hashlib.sha256(b"k-boss").hexdigest() + "}\n"),
])
def test_a_reload_may_narrow_who_approves(edit: tuple[str, str]) -> None:
    result = plan(_swap(APPROVING, *edit), now=APPROVING)
    assert result.problems == [] and result.config is not None


def test_narrowing_the_rules_approvers_applies() -> None:
    looser = _swap(APPROVING, _LARGE_ASK, _LARGE_ASK.replace("self_approval: false", "self_approval: true").replace("quorum: 2", "quorum: 1"))
    result = plan(APPROVING, now=looser)
    assert result.problems == [] and result.config is not None


def test_approver_keys_are_judged_in_auth_mode_none_too() -> None:
    local = "internal: {secret: s-456}\napprovers:\n  api_keys:\n    - {id: boss, key: k-boss}\n"
    result = plan(local.replace("k-boss", "k-other"), now=local)
    assert result.config is None and any("approvers.api_keys[boss]" in p for p in result.problems), result.problems
    # An unset ${SUPERVISOR_API_KEY:-} is no key: setting it later is a key added.
    empty = local.replace("k-boss", '""')
    assert plan(empty, now=local).problems == []
    assert plan(local, now=empty).config is None


def test_a_reload_that_turns_traces_on_waits_for_a_restart() -> None:
    result = plan(PRODUCTION + "telemetry:\n  enabled: true\n")
    assert result.config is not None and result.config.telemetry.enabled is None
    assert "telemetry" in result.restart_required
