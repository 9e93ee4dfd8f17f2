"""Stop, then the next message, as a person does it with a stock AI SDK Chat (issue 24, defect 10).

`chat.stop()` mid-reply (SSE: the fetch is aborted and the run goes on, `chat.on_disconnect:
continue`; WebSocket: an `abort` frame), then the next message in the same chat at once: the
gateway takes it and streams it whole, where it answered 409 `chat_busy` until the abandoned run
ended and the Chat showed an error.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.jsdriver import assert_clean, run_chats
from tests.procs import PluginStack, plugin_stack

pytestmark = [pytest.mark.integration, pytest.mark.js]


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginStack]:
    # Chunks 0.1 s apart: the reply is still streaming when the driver stops it.
    with plugin_stack(tmp_path_factory.mktemp("stop"), adk_env={"DEMO_CHUNK_DELAY": "0.1"}) as stack:
        yield stack


def test_stop_then_a_new_message_streams_whole_over_sse_and_websocket(slow_stack: PluginStack) -> None:
    base = slow_stack.gateway.base
    ws_url = base.replace("http", "ws") + "/api/chat/ws"
    steps = [
        {"send": "hello there, this is a much longer message to echo back slowly", "abortAfterChunks": 4},
        {"send": "hello again"},
    ]
    runs = [
        {"version": 6, "api": base + "/api/chat", "steps": steps},
        {"version": 7, "api": base + "/api/chat", "steps": steps},
        {"version": 7, "api": ws_url, "transport": "ws", "steps": steps},
    ]
    for result in run_chats(runs, timeout=40):
        where = (result["version"], result["transport"])
        assert_clean(result)
        assert result["status"] == "ready", where
        assert [m["role"] for m in result["messages"]] == ["user", "assistant", "user", "assistant"], where
        last = "".join(p.get("text", "") for p in result["messages"][-1]["parts"])
        assert "hello again" in last, (where, last)
        first = "".join(p.get("text", "") for p in result["messages"][1]["parts"])
        assert "slowly" not in first, (where, first)  # it was stopped mid-reply
        if result["transport"] == "sse":
            assert [r["status"] for r in result["requests"]] == [200, 200], (where, result["requests"])
