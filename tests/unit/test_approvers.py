"""Approvers: who answers an asked call (groups by user id or JWT claims, four-eyes, quorum), how an
approver is identified (approver key, chat key, JWT, none), and the config that says so."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from gateway.access.approvers import ApproverAuth, ApproverIdentity
from gateway.access.auth import Authenticator
from gateway.config.approvers import AskSpec, Principal
from gateway.config.schema import ConfigError, GatewayConfig, parse_config
from gateway.approvals.notice import Approver
from gateway.core.refusals import HttpError
from gateway.edge.errors import error_middleware

SECRET = "s" * 32

APPROVERS = """
approvers:
  api_keys:
    - {id: supervisor, key: k-supervisor}
    - {id: nobody, key: ""}
    - {id: hashed, sha256: %s}
  groups:
    supervisors: {users: ["approver_key:supervisor", "approver_key:hashed", alice]}
    staff: {jwt_claims: {groups: [staff]}}
  auditors: {users: ["approver_key:hashed"]}
""" % hashlib.sha256(b"k-hashed").hexdigest()

AUTH = {
    "none": "",
    "api_key": "auth:\n  mode: api_key\n  api_keys:\n    - {id: alice, key: k-alice}\n    - {id: bob, key: k-bob}\n",
    "jwt": f"auth:\n  mode: jwt\n  jwt: {{secret: {SECRET}}}\n",
}


def config(mode: str, approvers: str = APPROVERS) -> GatewayConfig:
    text = AUTH[mode] + approvers
    if mode != "jwt":
        text = text.replace("    staff: {jwt_claims: {groups: [staff]}}\n", "")
    return parse_config(text, env={})


def desk(mode: str, approvers: str = APPROVERS) -> ApproverAuth:
    loaded = config(mode, approvers)
    return ApproverAuth(Authenticator(loaded.auth), loaded.approvers, auth_mode=loaded.auth.mode)


def req(headers: dict[str, str] | None = None) -> web.Request:
    return make_mocked_request("GET", "/api/approvals", headers=headers or {})


def token(sub: str, **claims: Any) -> str:
    return jwt.encode({"sub": sub, "exp": time.time() + 60, **claims}, SECRET, algorithm="HS256")


# ---- identify ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "api_key", "jwt"])
async def test_an_approver_key_names_its_id_in_every_auth_mode(mode: str) -> None:
    auth = desk(mode)
    assert await auth.identify_approver(req({"Authorization": "Bearer k-supervisor"})) == ApproverIdentity(
        "supervisor", auth="approver_key", source="approver_key")
    assert (await auth.identify_approver(req({"x-api-key": "k-hashed"}))).user_id == "hashed"
    assert (await auth.identify_approver(req({"Authorization": "bearer k-supervisor"}))).approver == Approver("supervisor", "approver_key")


async def test_without_an_approver_key_the_chat_identity_answers_with_how_it_authenticated() -> None:
    assert await desk("none").identify_approver(req()) == ApproverIdentity("anonymous", auth="none", source="none")
    assert await desk("api_key").identify_approver(req({"Authorization": "Bearer k-alice"})) == ApproverIdentity(
        "alice", auth="api_key", source="api_key")
    who = await desk("jwt").identify_approver(req({"Authorization": f"Bearer {token('carol', groups=['staff'])}"}))
    assert (who.user_id, who.auth, who.claims["groups"]) == ("carol", "jwt", ["staff"])


async def test_a_chat_credential_from_the_cookie_says_cookie() -> None:
    text = AUTH["api_key"].replace("  mode: api_key\n", "  mode: api_key\n  cookie_name: session\n") + APPROVERS
    loaded = parse_config(text.replace("    staff: {jwt_claims: {groups: [staff]}}\n", ""), env={})
    auth = ApproverAuth(Authenticator(loaded.auth), loaded.approvers, auth_mode="api_key")
    request = make_mocked_request("GET", "/api/approvals", headers={"Cookie": "session=k-bob"})
    assert await auth.identify_approver(request) == ApproverIdentity("bob", via_cookie=True, auth="cookie", source="api_key")


@pytest.mark.parametrize("mode", ["none", "api_key", "jwt"])
@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer "}, {"Authorization": "Bearer"}, {"x-api-key": ""}, {"x-api-key": "  "},
])
async def test_an_empty_key_never_matches_the_empty_approver_key(mode: str, headers: dict[str, str]) -> None:
    """`nobody` has an empty key (an unset ${VAR:-}): no bearer, empty or not, is ever `nobody`."""
    auth = desk(mode)
    try:
        who = await auth.identify_approver(req(headers))
    except HttpError as refused:
        assert refused.status == 401
    else:
        assert mode == "none" and who == ApproverIdentity("anonymous", auth="none", source="none")


@pytest.mark.parametrize("mode", ["none", "api_key", "jwt"])
async def test_an_unknown_key_is_refused_even_where_chats_need_none(mode: str) -> None:
    """In mode none the chat routes ignore credentials; a mistyped approver key must not quietly
    act as the anonymous chatting user."""
    with pytest.raises(HttpError) as info:
        await desk(mode).identify_approver(req({"Authorization": "Bearer k-supervisorX"}))
    assert (info.value.status, info.value.code) == (401, "unauthorized")
    assert info.value.headers == {"WWW-Authenticate": 'Bearer realm="adk-gateway"'}


async def test_a_refused_approver_gets_the_chat_routes_json_401(aiohttp_client: Any) -> None:
    auth = desk("api_key")

    async def whoami(request: web.Request) -> web.Response:
        who = await auth.identify_approver(request)
        return web.json_response({"user": who.user_id, "auth": who.auth})

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/api/approvals", whoami)
    client: TestClient[Any, Any] = await aiohttp_client(TestServer(app))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer "}):
        answer = await client.get("/api/approvals", headers=headers)
        assert answer.status == 401 and answer.headers["WWW-Authenticate"] == 'Bearer realm="adk-gateway"'
        body = await answer.json()
        assert body["error"]["code"] == "unauthorized" and set(body["error"]) == {"code", "message"}
        assert "wrong" not in body["error"]["message"]
    answer = await client.get("/api/approvals", headers={"Authorization": "Bearer k-supervisor"})
    assert await answer.json() == {"user": "supervisor", "auth": "approver_key"}


# ---- may_decide / may_audit ----------------------------------------------------------------------


def test_without_approvers_only_the_chatting_user_answers() -> None:
    auth = desk("api_key")
    assert auth.may_decide(ApproverIdentity("alice", auth="api_key", source="api_key"), None, "alice") is None
    assert auth.may_decide(ApproverIdentity("bob", auth="api_key", source="api_key"), None, "alice") == "not_an_approver"
    # An approver key cannot chat: it is never the requester, whatever its id.
    assert auth.may_decide(ApproverIdentity("supervisor", auth="approver_key", source="approver_key"), None, "supervisor") == "not_an_approver"


def test_a_group_matches_by_user_id_whatever_the_credential() -> None:
    auth = desk("api_key")
    spec = AskSpec("supervisors")
    assert auth.may_decide(ApproverIdentity("supervisor", auth="approver_key", source="approver_key"), spec, "bob") is None
    assert auth.may_decide(ApproverIdentity("alice", auth="api_key", source="api_key"), spec, "bob") is None
    assert auth.may_decide(ApproverIdentity("bob", auth="api_key", source="api_key"), spec, "bob") == "not_an_approver"
    assert auth.may_decide(ApproverIdentity("nobody", auth="api_key", source="api_key"), spec, "bob") == "not_an_approver"


def test_a_group_matches_by_jwt_claims() -> None:
    auth = desk("jwt")
    spec = AskSpec("staff")
    assert auth.may_decide(ApproverIdentity("dan", {"groups": ["staff", "x"]}, auth="jwt", source="jwt"), spec, "erin") is None
    assert auth.may_decide(ApproverIdentity("dan", {"groups": "staff"}, auth="jwt", source="jwt"), spec, "erin") is None
    for claims in ({"groups": ["ops"]}, {}, {"groups": None}, {"group": ["staff"]}):
        assert auth.may_decide(ApproverIdentity("dan", claims, auth="jwt", source="jwt"), spec, "erin") == "not_an_approver"


def test_four_eyes_refuses_the_requester_even_in_the_group() -> None:
    auth = desk("api_key")
    alice = ApproverIdentity("alice", auth="api_key", source="api_key")
    assert auth.may_decide(alice, AskSpec("supervisors", self_approval=True), "alice") is None
    assert auth.may_decide(alice, AskSpec("supervisors", self_approval=False), "alice") == "self_approval"
    assert auth.may_decide(alice, AskSpec("supervisors", self_approval=False), "bob") is None
    # Outside the group, the reason is that, not four-eyes.
    bob = ApproverIdentity("bob", auth="api_key", source="api_key")
    assert auth.may_decide(bob, AskSpec("supervisors", self_approval=False), "bob") == "not_an_approver"


def test_a_group_no_longer_configured_answers_nobody() -> None:
    assert desk("api_key").may_decide(ApproverIdentity("alice", auth="api_key", source="api_key"), AskSpec("gone"), "bob") == "not_an_approver"


def test_auditors_by_user_or_claims_and_nobody_by_default() -> None:
    assert desk("api_key").may_audit(ApproverIdentity("hashed", auth="approver_key", source="approver_key"))
    assert not desk("api_key").may_audit(ApproverIdentity("alice", auth="api_key", source="api_key"))
    plain = desk("api_key", APPROVERS.replace('  auditors: {users: ["approver_key:hashed"]}\n', ""))
    assert not plain.may_audit(ApproverIdentity("hashed", auth="approver_key", source="approver_key"))
    claims = desk("jwt", APPROVERS.replace('{users: ["approver_key:hashed"]}', "{jwt_claims: {roles: auditor}}"))
    assert claims.may_audit(ApproverIdentity("x", {"roles": ["auditor"]}, auth="jwt", source="jwt"))
    assert not claims.may_audit(ApproverIdentity("x", {"roles": ["staff"]}, auth="jwt", source="jwt"))


# ---- config --------------------------------------------------------------------------------------

TOOL = """
internal: {secret: s}
agents:
  pay:
    tools:
      refund:
        approval: true
        approvers: supervisors
        self_approval: false
        rules:
          - {name: large, when: args.amount > 100, decide: ask, approvers: staff_two, quorum: 2}
          - {name: small, when: args.amount < 5, decide: approve}
          - {name: mine, when: args.amount == 50, decide: ask}
approvers:
  groups:
    supervisors: {users: [supervisor]}
    staff_two: {users: [a, b]}
"""


def test_asks_names_who_answers_by_the_rule_that_asked() -> None:
    policy = parse_config(TOOL, env={}).agents["pay"].tool_policy("refund")
    assert policy.asks("large") == AskSpec("staff_two", self_approval=True, quorum=2)
    # No rule matched: the tool's own keys; an ask rule without approvers: the chatting user.
    assert policy.asks(None) == AskSpec("supervisors", self_approval=False, quorum=1)
    assert policy.asks("mine") is None
    # Any other name (a rule a reload removed): as the tool would.
    assert policy.asks("small") == policy.asks(None) == policy.asks("unknown")
    assert parse_config("", env={}).agents["demo_agent"].tool_policy("x").asks(None) is None


@pytest.mark.parametrize(("edit", "problem"), [
    (("approvers: staff_two", "approvers: nope"), "rules[large]: approvers 'nope' is not a group of approvers.groups"),
    (("quorum: 2", "quorum: 3"), "quorum 3 needs more approvers than the group staff_two lists (2)"),
    (("quorum: 2", "quorum: 11"), "less than or equal to 10"),
    (("quorum: 2", "quorum: 0"), "greater than or equal to 1"),
    (("decide: approve}", "decide: approve, approvers: staff_two}"), "approvers only apply where calls are asked"),
    (("decide: ask}", "decide: ask, self_approval: false}"), "self_approval needs `approvers`"),
    (("        approvers: supervisors\n", ""), "self_approval needs `approvers`"),
    (("        approval: true\n", "        approval: true\n        runs_in: browser\n"), "browser tool"),
    (("{users: [supervisor]}", "{users: []}"), "a group names at least one user or one JWT claim"),
    (("{users: [supervisor]}", "{users: [supervisor], jwt_claims: {groups: staff}}"),
     "approvers.groups.supervisors.jwt_claims needs auth.mode jwt (it is none)"),
    (("  groups:\n", "  auditors: {jwt_claims: {groups: audit}}\n  groups:\n"),
     "approvers.auditors.jwt_claims needs auth.mode jwt (it is none)"),
    (("    staff_two:", "    'bad name':"), "groups.bad name: a group name"),
])
def test_approver_keys_are_checked_at_load(edit: tuple[str, str], problem: str) -> None:
    assert edit[0] in TOOL
    with pytest.raises(ConfigError) as info:
        parse_config(TOOL.replace(*edit), env={})
    assert problem in "\n".join(info.value.problems)


def test_a_tool_names_approvers_only_for_what_it_asks_itself() -> None:
    # A rule that cannot be evaluated is decided by its own keys (config/rules.py), never handed to the
    # tool's approvers: on a tool without approval they would answer nothing, so the file is refused.
    text = TOOL.replace("        approval: true\n", "")
    with pytest.raises(ConfigError, match=r"refund: approvers, self_approval only apply where calls are asked \(approval: true\)"):
        parse_config(text, env={})
    bare = "internal: {secret: s}\ntools:\n  refund: {approvers: supervisors}\napprovers:\n  groups:\n    supervisors: {users: [s]}\n"
    with pytest.raises(ConfigError, match="only apply where calls are asked"):
        parse_config(bare, env={})


KEYS = """
auth:
  mode: api_key
  api_keys:
    - {id: alice, key: k-alice}
approvers:
  api_keys:
    - {id: supervisor, key: k-supervisor}
"""


@pytest.mark.parametrize(("edit", "problem"), [
    (("id: supervisor", "id: alice"), "an id is either a chat key's (auth.api_keys) or an approver key's, not both (alice)"),
    (("key: k-supervisor", "key: k-alice"), "approvers.api_keys[supervisor]: the same key as one of auth.api_keys"),
    (("{id: supervisor, key: k-supervisor}", "{id: supervisor, key: k-supervisor}\n    - {id: s2, key: k-supervisor}"),
     "the same key under two ids"),
    (("{id: supervisor, key: k-supervisor}", f"{{id: supervisor, key: k, sha256: {'a' * 64}}}"), "give key or sha256, not both"),
])
def test_approver_keys_are_one_person_each(edit: tuple[str, str], problem: str) -> None:
    parse_config(KEYS, env={})
    with pytest.raises(ConfigError) as info:
        parse_config(KEYS.replace(*edit), env={})
    assert problem in "\n".join(info.value.problems)


def test_an_id_may_hold_two_keys_within_one_list_while_a_key_is_rotated() -> None:
    rotating = KEYS.replace("    - {id: supervisor, key: k-supervisor}\n",
                            "    - {id: supervisor, key: k-supervisor}\n    - {id: supervisor, key: k-supervisor-2}\n")
    rotating = rotating.replace("    - {id: alice, key: k-alice}\n", "    - {id: alice, key: k-alice}\n    - {id: alice, key: k-alice-2}\n")
    assert [key.id for key in parse_config(rotating, env={}).approvers.api_keys] == ["supervisor", "supervisor"]


def test_an_approver_cannot_take_the_anonymous_users_id() -> None:
    with pytest.raises(ConfigError, match="auth.anonymous_user"):
        parse_config("approvers:\n  api_keys:\n    - {id: anonymous, key: k}\n", env={})


def test_approver_keys_never_show_in_a_repr_or_a_dump() -> None:
    loaded = parse_config(KEYS, env={})
    assert "k-supervisor" not in repr(loaded) and "k-supervisor" not in str(loaded.model_dump())
    assert "k-supervisor" not in loaded.model_dump_json()


def test_a_config_rebuilt_from_its_dump_keeps_its_approvers() -> None:
    from gateway.config.schema import revalidate

    loaded = parse_config(TOOL, env={})
    again = revalidate(loaded, source="reload")
    assert again.agents["pay"].tool_policy("refund").asks("large") == AskSpec("staff_two", True, 2)
    assert again.approvers == loaded.approvers


def test_the_demo_asks_a_supervisor_for_large_refunds_never_the_requester() -> None:
    from pathlib import Path

    from gateway.config.schema import load_config

    loaded = load_config(Path(__file__).parents[2] / "config" / "gateway.yaml", env={"ADK_GATEWAY_SECRET": "s"})
    refund = loaded.agents["support_agent"].tool_policy("issue_refund")
    assert refund.asks("large_refund") == AskSpec("supervisors", self_approval=False, quorum=1)
    assert refund.asks(None) is None and refund.timeout == 300
    assert [rule.when for rule in refund.rules] == ["args.amount > 100"]
    assert loaded.approvers.groups["supervisors"].users == ["approver_key:supervisor"]


def test_approver_keys_are_among_the_secrets_masked_in_logs() -> None:
    from gateway.ops.logs import secret_values

    assert "k-supervisor" in secret_values(parse_config(KEYS, env={}))


# ---- one namespace per source of identity --------------------------------------------------------

JWT_KEYS = f"""
auth:
  mode: jwt
  jwt: {{secret: {SECRET}}}
approvers:
  api_keys:
    - {{id: supervisor, key: k-supervisor}}
  groups:
    supervisors: {{users: [SUPERVISOR]}}
  auditors: {{users: [SUPERVISOR]}}
"""


def test_a_bare_id_that_could_be_an_approver_key_or_an_idp_user_is_refused_at_load() -> None:
    """Under auth.mode jwt any identity provider user may carry the id `supervisor`: listed bare,
    a group would let them answer as the key's holder."""
    with pytest.raises(ConfigError) as info:
        parse_config(JWT_KEYS.replace("SUPERVISOR", "supervisor"), env={})
    problems = "\n".join(info.value.problems)
    assert ("approvers.groups.supervisors.users: supervisor is an approver key's id (approvers.api_keys) and could be an "
            "identity provider's user too: write approver_key:supervisor for the key's holder, or jwt:supervisor") in problems
    assert "approvers.auditors.users: supervisor is an approver key's id" in problems
    for written in ("approver_key:supervisor", "jwt:supervisor"):
        parse_config(JWT_KEYS.replace("SUPERVISOR", written), env={})


async def test_an_idp_user_named_like_an_approver_key_is_not_that_approver() -> None:
    loaded = parse_config(JWT_KEYS.replace("SUPERVISOR", "approver_key:supervisor"), env={})
    auth = ApproverAuth(Authenticator(loaded.auth), loaded.approvers, auth_mode="jwt")
    impostor = await auth.identify_approver(req({"Authorization": f"Bearer {token('supervisor')}"}))
    holder = await auth.identify_approver(req({"Authorization": "Bearer k-supervisor"}))
    assert (impostor.user_id, impostor.principal, holder.principal) == (
        "supervisor", Principal("jwt", "supervisor"), Principal("approver_key", "supervisor"))
    spec = AskSpec("supervisors", self_approval=False)
    assert auth.may_decide(impostor, spec, "erin") == "not_an_approver"
    assert not auth.may_audit(impostor)
    assert auth.may_decide(holder, spec, "erin") is None and auth.may_audit(holder)
    # Four-eyes compares people: the key's holder is not the IdP user `supervisor` who asked.
    assert auth.may_decide(holder, spec, "supervisor") is None
    # Nor does the key's holder answer that user's own calls.
    assert auth.may_decide(holder, None, "supervisor") == "not_an_approver"
    assert auth.may_decide(impostor, None, "supervisor") is None


@pytest.mark.parametrize(("mode", "users", "members"), [
    ("none", "[supervisor, anonymous]", {Principal("approver_key", "supervisor"), Principal("none", "anonymous")}),
    ("api_key", "[supervisor, alice, 'api_key:bob']",
     {Principal("approver_key", "supervisor"), Principal("api_key", "alice"), Principal("api_key", "bob")}),
    ("jwt", "['approver_key:supervisor', alice, 'jwt:bob']",
     {Principal("approver_key", "supervisor"), Principal("jwt", "alice"), Principal("jwt", "bob")}),
])
def test_bare_ids_name_the_one_source_that_can_hold_them(mode: str, users: str, members: set[Principal]) -> None:
    text = AUTH[mode] + "approvers:\n  api_keys:\n    - {id: supervisor, key: k}\n  groups:\n    g: {users: %s}\n" % users
    assert config_members(parse_config(text, env={})) == members


def config_members(loaded: GatewayConfig) -> set[Principal]:
    return set(loaded.approvers.group_members("g"))


@pytest.mark.parametrize(("mode", "users", "problem"), [
    ("api_key", "['jwt:alice']", "jwt:alice names an identity provider's user, which needs auth.mode jwt (it is api_key)"),
    ("jwt", "['api_key:alice']", "api_key:alice names an auth.api_keys key's holder, which needs auth.mode api_key (it is jwt)"),
    ("api_key", "['api_key:carol']", "api_key:carol: auth.api_keys has no id carol"),
    ("none", "['approver_key:ghost']", "approver_key:ghost: approvers.api_keys has no id ghost"),
    ("none", "['jwt:']", "jwt:: an id follows jwt:"),
])
def test_a_member_written_with_its_source_must_be_one_that_source_holds(mode: str, users: str, problem: str) -> None:
    text = AUTH[mode] + "approvers:\n  api_keys:\n    - {id: supervisor, key: k}\n  groups:\n    g: {users: %s}\n" % users
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert f"approvers.groups.g.users: {problem}" in "\n".join(info.value.problems)


def test_a_quorum_counts_distinct_people_not_entries() -> None:
    """`supervisor` and `approver_key:supervisor` are one person, listed twice: not two of a quorum."""
    text = TOOL.replace("{users: [a, b]}", "{users: [a, a]}")
    with pytest.raises(ConfigError, match="quorum 2 needs more approvers than the group staff_two lists [(]1[)]"):
        parse_config(text, env={})
    keyed = (TOOL.replace("approvers:\n  groups:", "approvers:\n  api_keys:\n    - {id: a, key: k-a}\n  groups:")
             .replace("{users: [a, b]}", "{users: [a, 'approver_key:a']}"))
    with pytest.raises(ConfigError, match="lists [(]1[)]"):
        parse_config(keyed, env={})


def test_the_shipped_config_names_the_supervisor_key() -> None:
    from pathlib import Path

    from gateway.config.schema import load_config

    loaded = load_config(Path(__file__).parents[2] / "config" / "gateway.yaml", env={"ADK_GATEWAY_SECRET": "s"})
    assert loaded.approvers.group_members("supervisors") == {Principal("approver_key", "supervisor")}


# ---- votes count while their voter may still decide ----------------------------------------------


def test_a_vote_counts_while_its_voter_is_still_a_member() -> None:
    auth = desk("jwt")
    spec = AskSpec("supervisors", self_approval=False)
    assert auth.counts("approver_key:supervisor", spec, "erin")
    assert auth.counts("jwt:alice", spec, "erin")
    # Not listed (an approver taken out, another source), the requester under four-eyes, or no principal at all.
    assert not auth.counts("jwt:supervisor", spec, "erin")
    assert not auth.counts("jwt:alice", spec, "alice")
    assert not auth.counts("supervisor", spec, "erin")
    assert not auth.counts("approver_key:supervisor", AskSpec("gone"), "erin")
    # Let in by the group's claims: the vote did not keep the token, and a reload can only narrow them.
    assert auth.counts("jwt:dan", AskSpec("staff"), "erin") and not auth.counts("approver_key:dan", AskSpec("staff"), "erin")
    # The chatting user's own calls: only theirs.
    assert auth.counts("jwt:erin", None, "erin") and not auth.counts("approver_key:erin", None, "erin")


# ---- through the approvals API -------------------------------------------------------------------

ROUTE_KEYS = f"""
auth:
  mode: jwt
  jwt: {{secret: {SECRET}}}
approvers:
  api_keys:
    - {{id: supervisor, key: k-supervisor}}
    - {{id: lead, key: k-lead}}
    - {{id: chief, key: k-chief}}
  groups:
    supervisors: {{users: ["approver_key:supervisor", "approver_key:lead", "approver_key:chief"]}}
"""


async def api_client(text: str) -> TestClient[Any, Any]:
    from gateway.edge.app import create_app

    client: TestClient[Any, Any] = TestClient(TestServer(create_app(parse_config(text, env={}))))
    await client.start_server()
    return client


async def put_pending(client: TestClient[Any, Any], approval_id: str, *, quorum: int = 1) -> None:
    from gateway.edge.state import GATEWAY

    gateway = client.app[GATEWAY]  # type: ignore[index]
    now = time.time()
    await gateway.cluster.state.put_approval({
        "id": approval_id, "state": "pending", "agent": "demo_agent", "app_name": "demo_agent", "tool": "issue_refund",
        "tool_call_id": f"adk-{approval_id}", "chat_id": "chat-1", "session": "s-1", "requester": "erin",
        "args": {"amount": 250}, "rule": "large_refund", "approvers": "supervisors", "self_approval": False,
        "quorum": quorum, "votes": [], "created": now, "deadline": now + 300, "owner": gateway.cluster.state.replica_id,
    }, ttl=300)


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def test_through_the_api_an_idp_user_named_like_the_key_neither_lists_nor_decides() -> None:
    client = await api_client(ROUTE_KEYS)
    try:
        await put_pending(client, "gw-1")
        impostor = bearer(token("supervisor"))
        listed = await client.get("/api/approvals", headers=impostor)
        assert listed.status == 200 and (await listed.json())["approvals"] == []
        assert (await client.get("/api/approvals/gw-1", headers=impostor)).status == 404
        voted = await client.post("/api/approvals/gw-1", json={"approved": True}, headers=impostor)
        assert voted.status == 404 and (await voted.json())["error"]["code"] == "approval_not_found"
        mine = await client.get("/api/approvals", headers=bearer("k-supervisor"))
        assert [a["id"] for a in (await mine.json())["approvals"]] == ["gw-1"]
    finally:
        await client.close()


async def test_through_the_api_votes_of_an_approver_a_reload_removed_stop_counting(tmp_path: Any) -> None:
    from gateway.edge.reload import reload_config
    from gateway.edge.state import GATEWAY

    # The demo's setup: auth.mode none, approver keys listed by their bare ids.
    local = (ROUTE_KEYS.replace(f"  mode: jwt\n  jwt: {{secret: {SECRET}}}\n", "  mode: none\n")
             .replace('"approver_key:supervisor", "approver_key:lead", "approver_key:chief"', "supervisor, lead, chief"))
    client = await api_client(local)
    gateway = client.app[GATEWAY]  # type: ignore[index]
    decided: list[list[dict[str, str]]] = []

    async def decide(record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]]) -> str:
        decided.append(deciders)
        return "decided"

    gateway.cluster.approvals.decide = decide
    try:
        await put_pending(client, "gw-1", quorum=2)
        first = await client.post("/api/approvals/gw-1", json={"approved": True}, headers=bearer("k-supervisor"))
        assert first.status == 200 and len((await first.json())["votes"]) == 1
        path = tmp_path / "gateway.yaml"
        path.write_text(local.replace("supervisor, lead", "lead"))
        assert reload_config(gateway, path).ok
        # The supervisor's approval no longer counts: the lead's is the first of two.
        second = await client.post("/api/approvals/gw-1", json={"approved": True}, headers=bearer("k-lead"))
        assert second.status == 200 and (await second.json())["state"] == "pending" and decided == []
        third = await client.post("/api/approvals/gw-1", json={"approved": True}, headers=bearer("k-chief"))
        assert third.status == 200 and (await third.json())["outcome"] == "approved"
        assert decided == [[{"user": "chief", "auth": "approver_key"}, {"user": "lead", "auth": "approver_key"}]]
    finally:
        await client.close()


def test_a_member_written_with_a_space_after_its_source_says_how_to_write_it() -> None:
    text = AUTH["none"] + "approvers:\n  api_keys:\n    - {id: supervisor, key: k}\n  groups:\n    g:\n      users:\n        - approver_key: supervisor\n"
    with pytest.raises(ConfigError, match="write approver_key:supervisor without a space after the colon"):
        parse_config(text, env={})
