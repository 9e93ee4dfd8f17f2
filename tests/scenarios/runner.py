"""Plays a scenario: browser requests, as the AI SDK sends them, against the real ChatService (and so
the real chat machine) in process, its upstream ADK replayed from recordings (tests/scenarios/replay.py).
No sockets, no subprocesses.

`Scenario.post` takes what `tests/chatflow.py post` takes (chat id, UI messages, extra body keys) and
answers what it answers, a `tests.procs.Reply`: the chunks the browser read framed as the SSE
transport frames them, or the refusal as the edge answers it (status and JSON error body). So a row
moved from tests/integration keeps its assertions word for word, `assistant_from` and `types`
included. Every response read is handed to the module's `SdkCheck`, which runs them all through the
AI SDK's own parser (ai 6 and ai 7) in one Node call when the module ends (tests/scenarios/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Literal

import orjson

from gateway.approvals.audit_trail import AuditTrail
from gateway.chat.attachment import Attachment
from gateway.cluster.memory import MemoryState
from gateway.config.schema import parse_config
from gateway.core.approvals import Verdict
from gateway.core.chat_request import parse_chat_body
from gateway.core.refusals import Refusal
from gateway.ops.metrics import GatewayMetrics
from tests.support.clock import Clock
from tests.support.service import chat_service
from tests.jsdriver import check_streams
from tests.procs import Reply
from tests.scenarios.recordings import Recordings
from tests.scenarios.replay import ReplayAdk

# The default agent of a config with the single-agent keys (named after upstream.app_name).
AGENT = "demo_agent"
READ_TIMEOUT = 5.0
Stop = Literal["leave", "abort"]


@dataclass
class SdkCheck:
    """Every response a module's scenarios read, checked at the module's end by the AI SDK's own
    schema and message assembler (tests/js/check-stream.mjs), ai 6 and ai 7, in one Node call."""

    cases: list[dict[str, Any]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    # Per case: what to assert on the message the SDK assembled (None: nothing more).
    thens: list[Callable[[dict[str, Any]], None] | None] = field(default_factory=list)

    def add(
        self, label: str, chunks: list[dict[str, Any]], message: dict[str, Any] | None, *, declared: int | None,
        then: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`then(message)`: asserted on the message as the declared version's SDK (a stock app: ai 6's)
        assembled it, when the module ends."""
        # A stock app does not say its version, and then gets ai 6's framing, which ai 7 reads too;
        # one that declared 7 may get chunks only ai 7 knows.
        for version in (7,) if declared == 7 else (6, 7):
            self.cases.append({"version": version, "chunks": chunks, **({"message": message} if message else {})})
            self.labels.append(f"{label} (ai {version})")
            self.thens.append(then if version == (declared or 6) else None)

    def verify(self) -> None:
        if not self.cases:
            return
        failures = []
        for label, case, then, result in zip(self.labels, self.cases, self.thens, check_streams(self.cases)):
            errors = [c["errorText"] for c in case["chunks"] if c["type"] == "error"]
            # An `error` chunk is the one way a response may fail, and the SDK must report its text.
            if result["schemaErrors"] or result["streamError"] != (errors[0] if errors else None):
                failures.append(f"{label}: schema {result['schemaErrors']}, stream error {result['streamError']!r}")
            elif then is not None:
                try:
                    then(result["message"])
                except AssertionError as exc:
                    failures.append(f"{label}: the assembled message: {exc}")
        assert not failures, "responses the AI SDK refuses:\n" + "\n".join(failures)


class Scenario:
    """One gateway (a ChatService of `config`) in front of ADK replayed from `recordings`, and the
    browsers that talk to it."""

    def __init__(
        self, sdk: SdkCheck, label: str, recordings: Recordings | None = None, config: str = "",
        env: dict[str, str] | None = None, clock: Clock | None = None,
    ) -> None:
        self.adk = ReplayAdk(recordings or Recordings())
        # The gateway's monotonic time: a test's Clock, which stands still until moved (None: real time).
        self.clock = clock
        self.adk.asker = self._plugin_asks
        self.metrics = GatewayMetrics()
        parsed = parse_config(config, env=env or {})
        self.metrics.know_agents(parsed)  # as the app does at start (edge/app.py)
        self.service = chat_service(parsed, adk=self.adk, metrics=self.metrics, clock=self.clock)
        # As the app wires it (edge/app.py): every approval decided becomes an audit record, logged
        # at once (its store's appends are not started: nothing here reads them back).
        self.audit = AuditTrail(MemoryState("scenario"), self.metrics, lambda: parsed.audit, logging=parsed.logging)
        self.service.notices.add_sink(self.audit.record)
        self._sdk = sdk
        self._label = label

    def _plugin_asks(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The plugin's ask, as the internal listener hands it to the gateway (edge/internal.py
        `tool_call`); the verdict it answers at once (None: the call waits, held)."""
        decided = self.service.gates.open(
            app_name=body["app_name"], user_id=body["user_id"], session_id=body["session_id"],
            tool_call_id=body["function_call_id"], tool=body["tool"], args=body["args"],
            confirm=body.get("confirm", False), approvers=body.get("confirm", False) and body.get("approvers", False),
        )
        return decided.as_json() if isinstance(decided, Verdict) else None

    def play(self, run: str, *, until: int | None = None) -> None:
        """ADK's next run answers with the recording `run` (`until`: its first events only, still streaming)."""
        self.adk.play(run, until=until)

    async def post(
        self, chat_id: str, messages: list[dict[str, Any]], *, user: str = "u", version: int | None = None,
        stop_after: int | None = None, stop: Stop = "leave", then: Callable[[dict[str, Any]], None] | None = None,
        play: str | tuple[str, ...] = (), **extra: Any,
    ) -> Reply:
        """POST /api/chat. `play`: the recordings ADK answers the runs this request starts with, in
        order (`Scenario.play` each first). `version`: the `x-ai-sdk-version` the app declares (None: a stock app).
        `stop_after`: the browser stops after reading that many chunks, by leaving (SSE: the AI
        SDK's stop() aborts the fetch) or by an `abort` frame (WebSocket). `then(message)`: asserted on
        the assistant message the AI SDK assembles from the response, when the module ends (SdkCheck)."""
        for run in (play,) if isinstance(play, str) else play:
            self.play(run)
        body = {"id": chat_id, "messages": messages, "trigger": "submit-message", **extra}
        try:
            request = parse_chat_body(body, version_header=None if version is None else str(version), default_version=6)
            attachment = await self.service.submit(AGENT, user, request)
        except Refusal as exc:
            answer = exc.http()
            error = {"error": {"code": answer.code, "message": answer.message}}
            return Reply(answer.status, {"content-type": "application/json"}, json.dumps(error).encode())
        chunks = await self._read(attachment, chat_id, user, stop_after, stop)
        assert not self.adk.mismatches, self.adk.mismatches
        continued = next((m for m in messages if m.get("id") == extra.get("messageId") and m.get("role") == "assistant"), None)
        self._sdk.add(f"{self._label}: POST {len(self._sdk.labels)}", chunks, continued, declared=version, then=then)
        return sse_reply(chunks, done=stop_after is None)

    async def _read(self, attachment: Attachment, chat_id: str, user: str, stop_after: int | None, stop: Stop) -> list[dict[str, Any]]:
        frames: list[bytes] = []

        async def follow() -> None:
            async for batch in attachment.response.follow():
                frames.extend(batch)
                if stop_after is not None and len(frames) >= stop_after:
                    return

        try:
            await asyncio.wait_for(follow(), READ_TIMEOUT)
        finally:
            if stop_after is not None and stop == "abort":
                self.service.abort(AGENT, user, chat_id)
            attachment.response.close()  # what a transport does when it stops reading
        return [orjson.loads(frame) for frame in frames[:stop_after]]

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of the samples of `name` whose labels include `labels`, as tests.procs.metric_value
        reads /metrics (a series split by a label not named, the agent, adds up)."""
        want = labels or {}
        return sum(
            sample.value
            for family in self.metrics.registry.collect()
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in want.items())
        )

    async def close(self) -> None:
        await self.service.close()


def said(chunks: list[dict[str, Any]]) -> str:
    """The text a response streamed."""
    return "".join(c.get("delta", "") for c in chunks if c["type"] == "text-delta")


def sse_reply(chunks: list[dict[str, Any]], *, done: bool = True) -> Reply:
    """`chunks` as the SSE transport frames them (docs/protocol.md), `[DONE]` after a whole response."""
    payloads = [orjson.dumps(chunk) for chunk in chunks] + ([b"[DONE]"] if done else [])
    return Reply(200, {"content-type": "text/event-stream"}, b"".join(b"data: " + p + b"\n\n" for p in payloads))
