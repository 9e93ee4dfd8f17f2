"""Bad WebSocket input on /api/chat/ws: random text and JSON, near-valid send/resume/abort/audio
frames, binary frames, frames over the size limit, odd handshake query strings.

Every case: every frame answered gets a well-formed frame, chunk sequences have no gaps, the socket
stays open (only a frame over `websocket.max_frame_bytes` may close it, with 1009) and still
answers a sentinel `resume`; no crash in the gateway's log, no victim touched.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.fuzz.harness import Fuzz, budget, gating, known_bug, ws_exchange
from tests.fuzz.strategies import ws_frames

pytestmark = pytest.mark.integration

QUERIES = st.sampled_from(["", "?aiSdkVersion=7", "?aiSdkVersion=6", "?aiSdkVersion=x", "?aiSdkVersion=" + "7" * 3000, "?a=%zz"])


@budget(40, 1200)
@given(frames=st.lists(ws_frames(), min_size=1, max_size=5), query=QUERIES)
def test_ws_frames(fuzz: Fuzz, frames: list[str | bytes], query: str) -> None:
    assume(not any(gating(f) or known_bug("ws_frame", f) for f in frames))
    rid = fuzz.next_request_id((query, frames))
    started = time.monotonic()
    asyncio.run(ws_exchange(fuzz.base, frames, query=query, headers={"X-Request-Id": rid}))
    fuzz.timed(time.monotonic() - started, (query, frames))
    fuzz.after_case((query, frames), rid)
    fuzz.case("ws_frames")
