"""What the internal listener accepts as a gated call's arguments: JSON, and so only finite numbers.

The plugin sends the arguments the model wrote. The JSON parser behind the request model takes
`NaN`, `Infinity` and a number beyond a double's range (`1e400`) as floats that are not finite,
none of which is JSON; with NaN every comparison a rule makes is false. Such a call is refused 400
with a JSON body before anything is gated. The real internal Application over HTTP; the gate
records what reaches it.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.schema import parse_config
from gateway.core.approvals import RUN, Verdict
from gateway.edge.app import create_app
from gateway.edge.internal import create_internal_app
from gateway.edge.state import GATEWAY

CONFIG = """\
upstream:
  url: http://adk:8000
  app_name: shop
tools:
  buy:
    approval: true
internal:
  secret: s3cret-internal
"""
# A current plugin's rules-first ask (`confirm`): the agent runs on /run_sse.
HEAD = b'{"app_name": "shop", "user_id": "u", "session_id": "s", "function_call_id": "f", "tool": "buy", "confirm": true, "args": '


async def ask(args: bytes) -> tuple[int, Any, list[dict[str, Any]]]:
    """POST a call with `args` (raw JSON text): the status, the body, and the args that reached the gate."""
    app = create_app(parse_config(CONFIG, env={}))
    gated: list[dict[str, Any]] = []

    async def gate(**call: Any) -> tuple[Verdict, str]:
        gated.append(call["args"])
        return RUN, "run"

    app[GATEWAY].cluster.gate = gate  # type: ignore[method-assign]
    client = TestClient(TestServer(create_internal_app(app)))
    await client.start_server()
    try:
        resp = await client.post(
            "/internal/v1/tool-calls", data=HEAD + args + b"}",
            headers={"Authorization": "Bearer s3cret-internal", "Content-Type": "application/json"},
        )
        return resp.status, await resp.json(), gated
    finally:
        await client.close()


@pytest.mark.parametrize("args", [
    b'{"amount": NaN}', b'{"amount": Infinity}', b'{"amount": -Infinity}', b'{"amount": 1e400}',
    b'{"items": [{"price": 1}, {"price": NaN}]}',
])
async def test_a_number_that_is_not_finite_is_refused_400_before_the_gate(args: bytes) -> None:
    status, body, gated = await ask(args)
    assert status == 400
    assert body["error"]["code"] == "invalid_request"
    assert "not a finite number" in body["error"]["message"]
    assert gated == []


async def test_finite_numbers_and_integers_beyond_64_bits_reach_the_gate_as_written() -> None:
    status, body, gated = await ask(b'{"amount": 1e300, "n": 123456789012345678901234567890, "x": [-0.5]}')
    assert (status, body) == (200, {"verdict": "run"})
    assert gated == [{"amount": 1e300, "n": 123456789012345678901234567890, "x": [-0.5]}]
