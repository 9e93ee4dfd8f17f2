"""The in-process fake of ADK's API server, as the chat service's agent client (`AdkClient`) sees
it: the one fake ADK of the unit tests. `ScriptedAdk` streams what the test feeds it; `NativeAdk`
answers on its own with ADK's native confirmation; `SessionStoreAdk` holds sessions as ADK's store
does (created or not, scoped by user, a recorded one); `LiveAdk` opens `/run_live` sockets the test
feeds. Real ADK servers: tests/procs.py."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

from gateway.core.rebuild import MESSAGE_ID_STATE_KEY
from gateway.upstream.client import AskedCall, SessionConfirmations, UpstreamError
from gateway.upstream.session_history import session_confirmations
from tests.support.chat import text_events

# ADK's session once it sealed a run the gateway cut (ADK 2.11+: upstream/cut_runs.py).
SEALED = {"events": [{"author": "a", "errorCode": "INVOCATION_ABORTED"}], "lastUpdateTime": 2.0}


class ScriptedAdk:
    """`/run_sse` as the test feeds it: each batch put in `reads` is one upstream read; None ends the
    run. The session read answers `history` as its events when the test gives one (a list it may
    append to), else `sessions` in turn (then SEALED); confirmations are read from that session as
    AdkClient reads them. `calls`: the runs and session reads, in order; `messages`: the message each
    run was started with. It is also the app's agent client (`open`, `ping`, `close`: always up)."""

    # AdkClient's: sessions are created before runs (upstream.auto_create_session off).
    auto_creates_sessions = False

    def __init__(self, *, history: list[dict[str, Any]] | None = None) -> None:
        self.reads: asyncio.Queue[list[dict[str, Any]] | None] = asyncio.Queue()
        self.history = history
        self.sessions: list[Any] = []
        self.calls: list[str] = []
        self.messages: list[dict[str, Any]] = []

    def open(self) -> None:
        pass

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        pass

    async def ensure_session(self, user_id: str, session_id: str) -> None:
        return None

    async def session(self, user_id: str, session_id: str) -> Any:
        self.calls.append("session")
        if self.history is not None:
            return {"events": list(self.history), "lastUpdateTime": 1.0}
        return self.sessions.pop(0) if self.sessions else SEALED

    async def confirmations(self, user_id: str, session_id: str) -> SessionConfirmations:
        return session_confirmations(await self.session(user_id, session_id))

    async def run_sse_batches(self, **kwargs: Any) -> AsyncIterator[list[dict[str, Any]]]:
        self.calls.append("run")
        if kwargs.get("new_message"):
            self.messages.append(kwargs["new_message"])
        while (batch := await self.reads.get()) is not None:
            yield batch

    def says(self, *pieces: str) -> None:
        """ADK streams `pieces` as one answer (partials, then the aggregated final event)."""
        for event in text_events(*pieces):
            self.reads.put_nowait([event])

    def ends(self) -> None:
        """ADK's run ends (its stream closes)."""
        self.reads.put_nowait(None)

    def answers(self) -> list[dict[str, Any]]:
        """What the gateway answered ADK's confirmations with, in order."""
        return [p["functionResponse"]["response"] for m in self.messages for p in m.get("parts", ())
                if "functionResponse" in p and p["functionResponse"]["name"] == "adk_request_confirmation"]


CONFIRM_ID = "adk-confirm-1"


class NativeAdk:
    """ADK with a native confirmation of `process_payment` (call-1): a message asks (CONFIRM_ID first),
    an answer runs the tool; its session holds what was asked and answered, and `restart()` loses it
    (in-memory sessions). `sent`: every message it was sent.

    Options for confirm mode's deadlines: `asked_at` (ADK's event timestamp) makes the session tell
    when each call was asked, and in which message (the state delta of the run that asked);
    `rejects` answers a rejection as ADK does (the plugin's error, or ADK's own) instead of running
    the tool; `slow` (set by default) holds each confirmations read until the test sets it."""

    auto_creates_sessions = False

    def __init__(self, answered_in_session: tuple[str, ...] = (), *, asked_at: float | None = None, rejects: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.asked: set[str] = set()
        self.answered_in_session = set(answered_in_session)
        self.session_reads = 0
        self.asks = 0
        self.asked_at = asked_at
        self.rejects = rejects
        self.slow = asyncio.Event()
        self.slow.set()
        self.asked_in: str | None = None

    def restart(self) -> None:
        self.asked.clear()
        self.answered_in_session.clear()

    async def ensure_session(self, user_id: str, session_id: str) -> None:
        return None

    async def confirmations(self, user_id: str, session_id: str) -> SessionConfirmations:
        await self.slow.wait()
        self.session_reads += 1
        held = SessionConfirmations(asked=frozenset(self.asked), answered=frozenset(self.answered_in_session))
        if self.asked_at is None:
            return held
        ids = held.asked | held.answered
        calls = {i: AskedCall("call-1", "process_payment", self.asked_at, message_id=self.asked_in) for i in ids}
        return SessionConfirmations(held.asked, held.answered, calls)

    async def run_sse_batches(self, *, new_message: dict[str, Any], **kw: Any) -> Any:
        if self.asked_in is None and kw.get("state_delta"):
            self.asked_in = kw["state_delta"].get(MESSAGE_ID_STATE_KEY)
        self.sent.append(new_message)
        responses = [p["functionResponse"] for p in new_message.get("parts", ()) if "functionResponse" in p]
        if responses and self.rejects and not responses[0]["response"]["confirmed"]:
            yield self._rejected(responses[0]["response"])
            return
        if responses:
            answers = {r["id"] for r in responses}
            self.asked -= answers
            self.answered_in_session |= answers
            yield [{"author": "a", "content": {"role": "model", "parts": [{"text": "Paid."}]}, "finishReason": "STOP"}]
            return
        confirm_id = CONFIRM_ID if not self.asks else f"{CONFIRM_ID}-{self.asks}"
        self.asks += 1
        self.asked.add(confirm_id)
        yield [
            {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {
                "id": confirm_id, "name": "adk_request_confirmation",
                "args": {"originalFunctionCall": {"id": "call-1", "name": "process_payment", "args": {"amount": 50}},
                         "toolConfirmation": {"hint": "ok?", "confirmed": False}},
            }}]}, "longRunningToolIds": [confirm_id]},
        ]

    def _rejected(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """ADK's answer to a rejection: the call's refusal (the plugin's error, or ADK's own)."""
        self.asked.clear()
        self.answered_in_session.add(CONFIRM_ID)
        error = (response.get("payload") or {}).get("adk_gateway", {}).get("error", "This tool call is rejected.")
        return [
            {"author": "a", "content": {"role": "user", "parts": [
                {"functionResponse": {"id": "call-1", "name": "process_payment", "response": {"error": error}}},
            ]}},
            {"author": "a", "content": {"role": "model", "parts": [{"text": "Not paid."}]}, "finishReason": "STOP"},
        ]


class SessionStoreAdk:
    """ADK's session store as `AdkClient` sees it. A run on a session the server does not hold
    (`sessions`) is a 404 (`session_missing`) unless the server creates it with the run
    (`server_creates`); `auto` is AdkClient's `auto_creates_sessions` (upstream.auto_create_session).
    The session read answers `recorded` (a recorded session's JSON) for `owner` only, as ADK scopes
    sessions by user. A run answering a confirmation is kept in `recorded` (with its state delta)
    and runs the payment (`paid`, a rejection runs nothing); any other run says "hello". `down`: the
    server is unreachable. Records the creations and runs (`calls`), the session reads (`asked_for`),
    and each run's message (`sent`) and state delta (`deltas`)."""

    def __init__(
        self, recorded: dict[str, Any] | None = None, owner: str = "alice", *, auto: bool = False, server_creates: bool = True,
    ) -> None:
        self.recorded = copy.deepcopy(recorded)
        self.owner = owner
        self.auto_creates_sessions = auto
        self.server_creates = server_creates
        self.sessions: set[tuple[str, str]] = set()
        self.calls: list[str] = []
        self.asked_for: list[tuple[str, str]] = []
        self.sent: list[dict[str, Any]] = []
        self.deltas: list[Any] = []
        self.paid = 0
        self.down = False

    def _reachable(self) -> None:
        if self.down:
            raise UpstreamError("connect", "the agent service is unreachable")

    async def ensure_session(self, user_id: str, session_id: str) -> None:
        self.calls.append("create")
        self._reachable()
        self.sessions.add((user_id, session_id))

    async def session(self, user_id: str, session_id: str) -> Any:
        self.asked_for.append((user_id, session_id))
        self._reachable()
        return self.recorded if user_id == self.owner else None

    async def confirmations(self, user_id: str, session_id: str) -> SessionConfirmations:
        # What was asked and answered, not when: these sessions carry no ask times.
        held = session_confirmations(await self.session(user_id, session_id))
        return SessionConfirmations(asked=held.asked, answered=held.answered)

    async def run_sse_batches(
        self, *, user_id: str, session_id: str, new_message: dict[str, Any], state_delta: Any = None, **_: Any,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        self.calls.append("run")
        self._reachable()
        if (user_id, session_id) not in self.sessions:
            if not self.server_creates:
                raise UpstreamError("session_missing", "the agent service does not know this session", 404)
            self.sessions.add((user_id, session_id))
        self.sent.append(new_message)
        self.deltas.append(state_delta)
        if not any("functionResponse" in p for p in new_message.get("parts", ())):
            yield [{"author": "a", "content": {"role": "model", "parts": [{"text": "hello"}]}, "finishReason": "STOP"}]
            return
        [part] = new_message["parts"]  # an answer comes alone
        yield self._paid(new_message, state_delta, part["functionResponse"]["response"]["confirmed"])

    def _paid(self, message: dict[str, Any], state_delta: Any, confirmed: bool) -> list[dict[str, Any]]:
        """ADK's answer to a confirmation's answer: the payment's result (or its refusal), then a text."""
        assert self.recorded is not None, "an answer to a session that asked nothing"
        # As ADK keeps the run's state delta: on the event of its new message.
        self.recorded["events"].append({"author": "user", "content": message, "actions": {"stateDelta": state_delta or {}}})
        if confirmed:
            self.paid += 1
        result = {"success": True} if confirmed else {"error": "This tool call is rejected."}
        return [
            {"author": "demo_agent", "content": {"role": "user", "parts": [
                {"functionResponse": {"id": self.tool_call_id(), "name": "process_payment", "response": result}}]}},
            {"author": "demo_agent", "content": {"role": "model", "parts": [{"text": "Done."}]}, "finishReason": "STOP"},
        ]

    def tool_call_id(self) -> str:
        """The id of the call the recorded session's confirmation asks about."""
        assert self.recorded is not None
        for event in self.recorded["events"]:
            for part in event["content"]["parts"]:
                call = part.get("functionCall")
                if call and call["name"] == "adk_request_confirmation":
                    return str(call["args"]["originalFunctionCall"]["id"])
        raise AssertionError("no confirmation")


# What ADK sends on `/run_live`: the model's words, a tool's call and its result, a turn's end.
def live_text(text: str) -> dict[str, Any]:
    return {"content": {"role": "model", "parts": [{"text": text}]}}


LIVE_CALL = {"content": {"role": "model", "parts": [{"functionCall": {"id": "c", "name": "t"}}]}}
LIVE_RESULT = {"content": {"role": "user", "parts": [{"functionResponse": {"id": "c", "name": "t", "response": {}}}]}}
TURN_COMPLETE = {"turnComplete": True}


class LiveConnection:
    """One `/run_live` socket to ADK: the events the test puts in `inbox` (None closes it), the
    requests the gateway sent (`sent`)."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.close_reason = "closed"

    async def send(self, request: dict[str, Any]) -> None:
        self.sent.append(request)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        while (event := await self.inbox.get()) is not None:
            yield event

    async def messages(self) -> AsyncIterator[str]:
        async for event in self.events():
            yield json.dumps(event)

    async def close(self) -> None:
        self.inbox.put_nowait(None)


class LiveAdk:
    """ADK with `/run_live`: every session the gateway opens is a LiveConnection the test feeds
    (`opened`, in order)."""

    # AdkClient's: sessions are created before runs (upstream.auto_create_session off).
    auto_creates_sessions = False

    def __init__(self) -> None:
        self.opened: list[LiveConnection] = []

    async def ensure_session(self, user_id: str, session_id: str) -> None:
        return None

    async def open_live(self, **_: Any) -> LiveConnection:
        self.opened.append(LiveConnection())
        return self.opened[-1]
