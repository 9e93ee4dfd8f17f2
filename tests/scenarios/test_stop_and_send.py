"""Stop, then the next message, as a person does it with a stock AI SDK Chat (issue 24, defect 10).

`chat.stop()` mid-reply (SSE: the fetch is aborted and the run goes on, `chat.on_disconnect:
continue`; WebSocket: an `abort` frame), then the next message in the same chat at once: the
gateway takes it and streams it whole, where it answered 409 `chat_busy` until the abandoned run
ended and the Chat showed an error. On the recordings of every supported ADK: 2.11 and later seal
the cut run in the session, older ones write nothing after the cut (upstream/cut_runs.py waits for
either). ADK's database store and live sessions, whose side of this only the real server shows,
stay in tests/integration/test_stop_and_send.py.
"""

from __future__ import annotations

import pytest

from gateway.demo.script import echo_text
from tests.chatflow import new_chat, types, user
from tests.scenarios.recordings import Recordings
from tests.scenarios.runner import Scenario, said

pytestmark = pytest.mark.js

LONG = "hello there, this is a much longer message to echo back slowly"


# The three browsers of the integration row: ai 6 and ai 7 over SSE (stop leaves), ai 7 over the
# WebSocket (stop sends `abort`).
@pytest.mark.parametrize("stop", ["leave", "abort"])
async def test_stop_then_a_new_message_streams_whole(sc: Scenario, recordings: Recordings, stop: str) -> None:
    """The next reply is the new message's own, whole, and ends with `finish`."""
    chat, first_message = new_chat(), user(LONG)
    sc.play("long_echo", until=3)  # ADK is still streaming the reply when the browser stops
    first = await sc.post(chat, [first_message], stop_after=4, stop=stop)
    assert first.status == 200
    assistant = {"id": first.chunks[0]["messageId"], "role": "assistant", "parts": [{"type": "text", "text": said(first.chunks)}]}

    again = user("hello again")
    second = await sc.post(chat, [first_message, assistant, again], play="hello_again")
    assert [first.status, second.status] == [200, 200], second.body
    last = said(second.chunks)
    assert "hello again" in last, last
    assert "slowly" not in last, last  # not the rest of the stopped reply
    # Stopped mid-reply: a part of the whole reply only.
    whole = echo_text(LONG)
    stopped = said(first.chunks)
    assert whole.startswith(stopped) and len(stopped) < len(whole), stopped
    assert types(second)[-1] == "finish", types(second)
    # Its own assistant message: the Chat shows user, assistant, user, assistant.
    assert second.chunks[0]["messageId"] != first.chunks[0]["messageId"]
    # The new message reached ADK as the recorder sent it, after the stopped run.
    assert sc.adk.messages == [recordings.request("long_echo")["newMessage"], recordings.request("hello_again")["newMessage"]]
