"""The recipe "Your own agent without a model API key" (docs/operations.md), followed as written: the
agents folder examples/offline_agent (an app `shop` on the copyable scripted model), served by the
stock `adk api_server` command with the gateway's plugin, and a gateway on the recipe's own
gateway.yaml. Its gated tool asks the chatting user, its other tool runs at once, other text is
answered in text: the model reaches the gateway's policy as a real one would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chatflow import assistant_from, new_chat, types, user
from tests.procs import ROOT, AdkServer, GatewayProcess, free_port, request, stop_process, wait_http

pytestmark = pytest.mark.integration

RECIPE = ROOT / "examples" / "offline_agent"
DOC = ROOT / "docs" / "operations.md"


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("recipe")
    internal, port, secret = free_port(), free_port(), "recipe-" + os.urandom(6).hex()
    plugin_env = {"ADK_GATEWAY_URL": f"http://127.0.0.1:{internal}", "ADK_GATEWAY_SECRET": secret}
    adk = AdkServer(
        tmp, agents_dir=RECIPE, adk=Path(sys.executable).parent / "adk",
        extra_plugins=("adk_gateway_plugin.GatewayPlugin",), env=plugin_env,
    )
    adk.start()
    env = {**os.environ, "PORT": str(port), "ADK_URL": adk.base, "GATEWAY_INTERNAL_PORT": str(internal), "ADK_GATEWAY_SECRET": secret}
    env.pop("GOOGLE_API_KEY", None)
    log = tmp / "gateway.log"
    config = RECIPE / "gateway.yaml"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/readyz", timeout=60, proc=proc, log=log)
        yield GatewayProcess(base, port, log, proc, config)
    finally:
        stop_process(proc)
        adk.stop()


def _post(gw: GatewayProcess, chat: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reply = request(gw.base, "POST", "/api/chat", {"id": chat, "messages": messages, "trigger": "submit-message"})
    assert reply.status == 200, reply.body
    return reply.chunks


def test_the_recipes_gated_tool_waits_for_the_person_and_runs_once_approved(recipe: GatewayProcess) -> None:
    chat = new_chat()
    asked = user('call issue_refund {"order_id": "1234", "amount": 250}')
    first = request(recipe.base, "POST", "/api/chat", {"id": chat, "messages": [asked], "trigger": "submit-message"})
    assert "tool-approval-request" in types(first), first.chunks
    [call] = [c for c in first.chunks if c["type"] == "tool-input-available"]
    assert call["toolName"] == "issue_refund" and call["input"] == {"order_id": "1234", "amount": 250}
    answered = _post(recipe, chat, [asked, assistant_from(first, [True])])
    [output] = [c for c in answered if c["type"] == "tool-output-available"]
    assert output["output"] == {"order_id": "1234", "refunded": 250}
    text = "".join(c["delta"] for c in answered if c["type"] == "text-delta")
    assert "issue_refund returned" in text and '"refunded": 250' in text


def test_the_recipes_ungated_tool_and_plain_text(recipe: GatewayProcess) -> None:
    looked_up = _post(recipe, new_chat(), [user('call lookup_order {"order_id": "7"}')])
    assert "tool-approval-request" not in [c["type"] for c in looked_up]
    [output] = [c for c in looked_up if c["type"] == "tool-output-available"]
    assert output["output"] == {"order_id": "7", "status": "delivered"}
    echoed = _post(recipe, new_chat(), [user("hello there")])
    assert "".join(c["delta"] for c in echoed if c["type"] == "text-delta") == "You said: hello there"


def test_the_doc_shows_the_recipes_files_as_they_are() -> None:
    doc = DOC.read_text()
    for name in ("shop/agent.py", "gateway.yaml"):
        assert (RECIPE / name).read_text().strip() in doc, f"docs/operations.md must show examples/offline_agent/{name} as it is"
    assert "examples/offline_agent/shop/scripted_model.py" in doc
