"""Another user's answers, resumes and messages: a gateway with `auth.mode: api_key` and two users.

Alice leaves approvals pending; Bob (and callers with missing, wrong or mangled credentials) name
them from his chats and from chat ids equal to hers, resume her chat ids, over SSE and WebSocket.
Nothing of Alice's may change or leak; at the end Alice answers and every call completes.
Skipped while gateway.config has no auth mode other than `none`.
"""

from __future__ import annotations

import asyncio
import os
import time
import typing
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.schema import AuthConfig
from tests.chatflow import assistant_from, new_chat, user
from tests.faults.stack import demo_stack
from tests.fuzz.harness import FUZZ_TOOLS, Fuzz, budget, final_check, fuzz_config, send, setup_victims, ws_exchange
from tests.fuzz.strategies import encode

AUTH_MODES = typing.get_args(AuthConfig.model_fields["mode"].annotation)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif("api_key" not in AUTH_MODES, reason="gateway.config has no auth mode other than none yet"),
]

KEYS = {"alice": "alice-key-" + os.urandom(8).hex(), "bob": "bob-key-" + os.urandom(8).hex()}


def auth_config() -> str:
    entries = "".join(f"    - id: {user_id}\n      key: {key}\n" for user_id, key in KEYS.items())
    # The `query` channel below is `?access_token=`, read only with the switch on.
    return f"auth:\n  mode: api_key\n  allow_token_in_url: true\n  api_keys:\n{entries}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def alice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    with demo_stack(
        tmp_path_factory.mktemp("users"), tools=FUZZ_TOOLS, extra=fuzz_config() + auth_config(),
    ) as stack:
        yield setup_victims(stack.gateway, bearer(KEYS["alice"]), ["pay 50 to Hanako", "where am I", "play track 2"])


CREDENTIALS = st.sampled_from(["bob", "bob", "bob", "none", "garbage", "alice+x", "ALICE", "empty"])
CHANNELS = st.sampled_from(["bearer", "x-api-key", "query"])
ACTIONS = st.sampled_from([
    "answer_in_her_chat_id", "answer_in_own_chat", "typed_in_her_chat_id", "resume_her_chat_id",
    "ws_resume_her_chat_id", "ws_answer_in_her_chat_id",
])


def credential(name: str) -> str | None:
    return {
        "bob": KEYS["bob"], "none": None, "garbage": "x" * 40, "alice+x": KEYS["alice"] + "x",
        "ALICE": KEYS["alice"].upper(), "empty": "",
    }[name]


@budget(20, 500)
@given(cred=CREDENTIALS, channel=CHANNELS, action=ACTIONS, pick=st.integers(min_value=0, max_value=100), approved=st.booleans())
def test_another_user_cannot_answer_resume_or_disturb(alice: Fuzz, cred: str, channel: str, action: str, pick: int, approved: bool) -> None:
    victim = alice.victims[pick % len(alice.victims)]
    key = credential(cred)
    headers: dict[str, str] = {}
    query = ""
    if key is not None:
        if channel == "bearer":
            headers = bearer(key)
        elif channel == "x-api-key":
            headers = {"x-api-key": key}
        else:
            query = f"?access_token={key}"
    valid = cred == "bob"
    what = (cred, channel, action, victim.chat_id)

    answer = assistant_from(victim.first, [approved] * max(1, len(victim.approval_ids)))
    if not victim.approval_ids:  # a browser tool: Bob "delivers" its output
        answer["parts"][1].update(state="output-available", output={"playing": 666})

    if action.startswith("ws_"):
        frame: dict[str, Any]
        if action == "ws_resume_her_chat_id":
            frame = {"type": "resume", "requestId": "x", "id": victim.chat_id}
        else:
            frame = {"type": "send", "requestId": "x", "id": victim.chat_id, "trigger": "submit-message",
                     "messages": [*victim.history, answer], "messageId": answer["id"], "headers": {}, "body": {}}
        rid = alice.next_request_id(what)
        started = time.monotonic()
        try:
            frames = asyncio.run(ws_exchange(alice.base, [encode(frame).decode()], query=query,
                                             headers={"X-Request-Id": rid, **headers}, wait_for={"x"}))
        except aiohttp.WSServerHandshakeError as exc:
            assert not valid and exc.status == 401, (what, exc.status)
        else:
            assert valid, f"the socket opened with credential {cred!r}"
            ours = [f for f in frames if f.get("requestId") == "x"]
            assert ours[0]["type"] in ("error", "no-active"), (what, ours[:3])
        alice.timed(time.monotonic() - started, what)
        alice.after_case(what, rid)
        alice.case("cross_user_ws")
        return

    if action == "resume_her_chat_id":
        reply = send(alice, "cross_user", "GET", f"/api/chat/{victim.chat_id}/stream{query}", None, headers, what=what)
        assert reply is not None and reply.status in ((204, 404) if valid else (401,)), (what, reply.status, reply.body[:300])
        return
    if action == "answer_in_own_chat":
        body = {"id": new_chat(), "messages": [user("hello there"), answer], "messageId": answer["id"]}
    elif action == "typed_in_her_chat_id":
        body = {"id": victim.chat_id, "messages": [user("hello there")]}
    else:
        body = {"id": victim.chat_id, "messages": [*victim.history, answer], "messageId": answer["id"]}
    reply = send(alice, "cross_user", "POST", f"/api/chat{query}", encode(body), headers, what=what)
    assert reply is not None
    if not valid:
        assert reply.status == 401, (what, reply.status, reply.body[:300])
    elif action == "typed_in_her_chat_id":
        # Bob's own chat of that name, or refused as another user's: either way nothing of hers.
        assert reply.status in (200, 404), (what, reply.status, reply.body[:300])
    else:
        assert reply.status in (400, 403, 404, 410), (what, reply.status, reply.body[:300])


def test_zz_alice_answers_and_everything_completes(alice: Fuzz) -> None:
    final_check(alice)
