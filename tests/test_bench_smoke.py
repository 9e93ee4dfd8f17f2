"""The benchmark suite's machinery, at tiny sizes: every phase runs and reports, timings unchecked.

`make bench` measures; this only keeps bench/ working as the gateway changes (its config keys,
routes, the plugin's internal API). No timing is asserted: numbers at these sizes mean nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


def test_every_bench_phase_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--quiet", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(out.read_text())
    results = document["results"]
    assert set(results) == {
        "converter", "sse", "ws", "growth", "idle", "approval", "turns", "tools", "ttft", "shapes", "tracing", "limits",
    }
    # Issue 28: the shared limits' cost, one round trip per admitted request.
    assert set(results["limits"]["cheap_request"]) == {"local", "shared"}
    assert results["limits"]["cheap_request"]["shared"]["redis_evalsha_per_request"] > 0
    assert results["limits"]["new_chat_turns"]["shared"]["limit_round_trips_per_turn"] > 0

    for mix in ("recorded_run_sse", "recorded_run_live", "stream_mix"):
        assert {"floor_us_per_event", "converter_us_per_event", "ratio_to_floor"} <= set(results["converter"][mix])
    assert "ratio_16x_to_1x" in results["converter"]["growth"]
    assert {"parse_us", "convert_us", "publish_us"} <= set(results["converter"]["breakdown"])

    for transport in ("sse", "ws"):
        for kind in ("throughput", "latency"):
            for level in results[transport][kind].values():
                assert {"direct", "passthrough", "gateway"} <= set(level)
                for row in level.values():
                    assert row["failed"] == 0 and row["errors"] == 0, row
        for level in results[transport]["throughput"].values():
            assert all(row["streams"] >= 1 and "cpu_us_per_event_proxy" in row for row in level.values())
        for level in results[transport]["latency"].values():
            assert all(row["events"] >= 1 for row in level.values())

    assert all("rss_growth_kib_per_stream" in row for row in results["growth"].values())
    assert set(results["idle"]["sse"]) >= {"passthrough", "gateway"}
    assert set(results["idle"]["ws"]) >= {"passthrough", "gateway", "gateway_sse_upstream"}
    for rows in results["idle"].values():
        assert all(row["ready"] == row["connections"] for row in rows.values())
    assert results["approval"]["iterations"] >= 1 and results["approval"]["failures"] == 0

    # The agentic shape (issue 18): short turns, approval pairs, the tool-heavy stream, time to first text.
    turns = results["turns"]
    for level in turns["short"].values():
        assert set(level) == {"warm", "new"}
        for routes in level.values():
            assert set(routes) == {"passthrough", "gateway"}
            for row in routes.values():
                assert row["turns"] >= 1 and row["failed"] == 0 and row["errors"] == 0, row
                assert "cpu_us_per_turn_proxy" in row and "cpu_us_per_turn_upstream" in row
    for level in turns["approval_pair"].values():
        assert set(level) == {"passthrough", "gateway"}
        assert all(row["pairs"] >= 1 and row["failed"] == 0 and "cpu_us_per_pair_proxy" in row for row in level.values())
    tools = results["tools"]
    for part in ("stream", "turns"):
        for level in tools[part].values():
            assert {"passthrough", "gateway"} <= set(level)
            for row in level.values():
                assert row["failed"] == 0 and row["errors"] == 0 and "cpu_us_per_event_proxy" in row, row
    assert {"floor_us_per_event", "converter_us_per_event", "ratio_to_floor"} <= set(tools["converter"])
    assert {"parse_us", "convert_us", "publish_us"} <= set(tools["breakdown"])
    for kind in ("new", "warm"):
        assert {"direct", "passthrough", "gateway", "gateway_creates"} <= set(results["ttft"][kind])
        assert all(row["requests"] >= 1 and "added_us_p50" in row for row in results["ttft"][kind].values())
    assert results["ttft"]["upstream_session_rtt"]["requests"] >= 1

    # The cost of traces (issue 27): every gateway ran the turns; those that trace exported to the sink.
    tracing = results["tracing"]
    assert set(tracing["gateways"]) == {"off_a", "off_b", "on_default", "on_full"}
    assert all(row["turns"] >= 1 and row["failed"] == 0 and row["errors"] == 0 for row in tracing["gateways"].values())
    assert {"on_default", "on_full", "off_vs_off"} <= set(tracing["paired"])

    targets = {row["target"]: row["status"] for row in document["targets"]}
    assert len(targets) >= 10 and set(targets.values()) <= {"PASS", "MISS", "n/a"}
    agentic = [t for t in targets if t.startswith(("short turns", "approval pair", "tool-heavy", "time to first text"))]
    assert len(agentic) >= 8 and all(targets[t] != "n/a" for t in agentic), {t: targets[t] for t in agentic}
    assert [targets[t] != "n/a" for t in targets if t.startswith("tracing")] == [True, True, True]


@pytest.mark.parametrize("stock", [False, True], ids=["creates-sessions", "stock-sessions"])
async def test_the_fake_upstream_runs_on_a_missing_session_unless_stock(aiohttp_client: Any, stock: bool) -> None:
    from bench.fake_upstream import create_app

    client = await aiohttp_client(create_app(stock_sessions=stock))
    run = {"appName": "demo_agent", "userId": "u", "sessionId": "s1", "streaming": True,
           "newMessage": {"role": "user", "parts": [{"text": "hello"}]}}
    first = await client.post("/run_sse", json=run)
    assert first.status == (404 if stock else 200)
    if stock:
        assert "Session not found" in (await first.json())["detail"]
        assert (await client.post("/apps/demo_agent/users/u/sessions", json={"sessionId": "s1"})).status == 200
        assert (await client.post("/run_sse", json=run)).status == 200
