"""When a chat's ADK session is created: before its first run, or by the ADK server with the run
(`upstream.auto_create_session`, ADK's `--auto_create_session`), with ADK faked in-process."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.chat.registry import Registry
from gateway.chat.service import Attachment, ChatService
from gateway.config.schema import parse_config
from gateway.core.chat_request import parse_chat_body
from gateway.ops.metrics import GatewayMetrics
from gateway.upstream.client import UpstreamError
from tests.support.adk import SessionStoreAdk
from tests.support.recordings import check_stream_rules, types
from tests.support.chat import read as read_chunks
from tests.support.service import chat_service

AGENT = "demo_agent"


def config(auto: bool | None, mode: str = "sse") -> str:
    setting = "" if auto is None else f"\n  auto_create_session: {'true' if auto else 'false'}"
    return f"internal:\n  secret: s3cret\nupstream:\n  mode: {mode}{setting}\n"


def service_on(adk: SessionStoreAdk, auto: bool | None) -> tuple[ChatService, GatewayMetrics]:
    service = chat_service(config(auto), adk=adk)
    return service, service.metrics


def request(chat_id: str, text: str = "hello there") -> Any:
    user = {"id": f"{chat_id}-u", "role": "user", "parts": [{"type": "text", "text": text}]}
    return parse_chat_body({"id": chat_id, "messages": [user], "trigger": "submit-message"}, version_header=None, default_version=6)


async def turn(service: ChatService, chat_id: str, user: str = "u") -> list[dict[str, Any]]:
    attachment = await service.submit(AGENT, user, request(chat_id))
    return await read(attachment)


async def read(attachment: Attachment) -> list[dict[str, Any]]:
    chunks = await read_chunks(attachment)
    check_stream_rules(chunks)
    return chunks


def missing(metrics: GatewayMetrics) -> float:
    return metrics.registry.get_sample_value("adk_gateway_upstream_errors_total", {"agent": AGENT, "kind": "session_missing"}) or 0.0


def test_the_setting_defaults_to_creating_first() -> None:
    agent = parse_config(config(None), env={}).agents[AGENT]
    assert agent.upstream.auto_create_session is False


async def test_without_the_setting_a_new_chat_creates_its_session_before_the_run() -> None:
    adk = SessionStoreAdk(auto=False, server_creates=True)
    service, _ = service_on(adk, False)
    assert "text-delta" in types(await turn(service, "chat-1"))
    await turn(service, "chat-1")
    assert adk.calls == ["create", "run", "run"]


async def test_a_server_that_creates_sessions_gets_the_run_alone() -> None:
    adk = SessionStoreAdk(auto=True, server_creates=True)
    service, metrics = service_on(adk, True)
    assert "text-delta" in types(await turn(service, "chat-1"))
    await turn(service, "chat-2")
    await turn(service, "chat-1")
    assert adk.calls == ["run", "run", "run"]
    assert ("u", "chat-1") in adk.sessions and ("u", "chat-2") in adk.sessions  # the chat's ids, unchanged
    assert missing(metrics) == 0 and adk.auto_creates_sessions


async def test_a_server_that_does_not_create_them_costs_one_404_once_then_sessions_are_created_first() -> None:
    adk = SessionStoreAdk(auto=True, server_creates=False)
    service, metrics = service_on(adk, True)
    assert "text-delta" in types(await turn(service, "chat-1"))
    assert adk.calls == ["run", "create", "run"]
    assert not adk.auto_creates_sessions and missing(metrics) == 1
    assert "text-delta" in types(await turn(service, "chat-2"))
    await turn(service, "chat-1")
    assert adk.calls == ["run", "create", "run", "create", "run", "run"]
    assert missing(metrics) == 1


async def test_a_restart_that_lost_the_session_still_recovers() -> None:
    # A server without the flag that lost its sessions: the chat's session is created again.
    adk = SessionStoreAdk(auto=True, server_creates=True)
    service, metrics = service_on(adk, True)
    await turn(service, "chat-1")
    adk.sessions.clear()
    adk.server_creates = False
    assert "text-delta" in types(await turn(service, "chat-1"))
    assert adk.calls == ["run", "run", "create", "run"]
    assert missing(metrics) == 1 and ("u", "chat-1") in adk.sessions
    # An established chat's 404 says the server lost it, not that it never creates: the setting holds.
    assert adk.auto_creates_sessions


async def test_with_the_setting_an_unreachable_upstream_is_the_runs_error_chunk_and_the_chat_recovers() -> None:
    adk = SessionStoreAdk(auto=True, server_creates=True)
    service, _ = service_on(adk, True)
    adk.down = True
    chunks = await turn(service, "chat-1")
    assert [c for c in chunks if c["type"] == "error"] and chunks[-1]["type"] == "finish"
    adk.down = False
    assert "text-delta" in types(await turn(service, "chat-1"))


async def test_without_the_setting_an_unreachable_upstream_is_the_requests_502() -> None:
    adk = SessionStoreAdk(auto=False, server_creates=True)
    service, _ = service_on(adk, False)
    adk.down = True
    with pytest.raises(UpstreamError) as refused:
        await service.submit(AGENT, "u", request("chat-1"))
    assert refused.value.http().status == 502
    chat = service._registry.find(AGENT, "u", "chat-1")
    # The run it claimed never started: the claim is given back, so the chat is neither busy nor kept for ever.
    assert chat is not None and chat.machine.settled and chat.run is None
    adk.down = False
    assert "text-delta" in types(await turn(service, "chat-1"))
    assert await service.forget_idle(float("inf")) == [chat]


async def test_a_live_session_is_created_first_whatever_the_setting() -> None:
    adk = SessionStoreAdk(auto=True, server_creates=True)
    registry = Registry()
    service = chat_service(config(True, mode="live"), adk=adk, registry=registry)
    chat = registry.get(AGENT, "u", "chat-1", now=0.0)
    await service.runs.before_turn(chat)
    assert adk.calls == ["create"] and chat.session_ready
