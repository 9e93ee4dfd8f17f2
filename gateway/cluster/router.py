"""Which replica does the work for a request, and how the answer gets back (docs/scaling.md).

Every chat runs on one replica, its owner: the replica that holds the ADK connection of its run,
its converter, its run log and its gated calls. The shared chat directory says which replica
that is. A browser request (a message, an approval, a resume, an abort) or a plugin request may
land on any replica behind the load balancer:

- on the owner, or for a chat nobody owns yet: it is handled here, as with a single replica;
- elsewhere: it is forwarded to the owner's inbox; the owner does the work and relays the
  response's chunks through the shared state, and this replica streams them to the browser
  (`RelayFeed`). A plugin request waits here for the verdict the owner sends back (and finds it
  in the call's record should that message be lost).

When the owner is dead (no heartbeat for `sessions.owner_timeout`), the next request for the chat
moves it here. The dead replica's run is lost with its ADK connection: a resume of it is answered
410 `run_lost`, an answer to one of its approvals 410 `approval_gone` saying so, and a new message
works as usual (ADK keeps the session). A plugin request waiting on the dead owner is released
fail-closed: the tool does not run.

With the memory backend there is one replica and every chat is local: nothing is forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import orjson
import structlog

from ..approvals import GatedCall, Verdict
from ..chats import Attachment, ChatService, Gone
from ..config import SessionsConfig
from ..errors import HttpError, refusal
from ..limits import Limited
from ..messages import ChatRequest, parse_chat_body
from ..metrics import GatewayMetrics
from ..protocol import ClientVersion, encode_chunk
from ..registry import Chat
from ..runs import FollowerLagged
from ..stopping import cancel_and_wait
from .shared import Claim, RelayEntry, SharedState, SharedStateDown

__all__ = ["Cluster", "OwnerLost", "RelayFeed"]

log = structlog.get_logger("adk_gateway.cluster")

_RUN_LOST = (
    "The gateway replica that was running this chat's response stopped before it finished; "
    "send your message again."
)
_APPROVAL_LOST = (
    "The gateway replica that held this approval stopped; the tool was not run. "
    "Send a new message to try again."
)
_CONTACT_LOST = "The gateway lost contact with the replica running this response; reload the chat to resume it."
_OWNER_STOPPED = "The gateway replica running this response stopped; send your message again."
# How long close() waits for its cancelled tasks: they stop at once unless a cancellation was lost.
_STOP_GRACE = 1.0


class OwnerLost(HttpError):
    """The replica that ran the chat died, and what the request needs died with it."""


class Cluster:
    def __init__(self, state: SharedState, chats: ChatService, metrics: GatewayMetrics) -> None:
        self.state = state
        self.chats = chats
        self.metrics = metrics
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._verdicts: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # The relay pumps among them (see relays_active).
        self._pumps: set[asyncio.Task[Any]] = set()
        # Run marks waiting to be written to the directory: only the latest per chat matters.
        self._marks: dict[tuple[str, str], str] = {}
        self._marks_due = asyncio.Event()
        self._closed = False
        # Set by the drain: new work forwarded here is refused, as the transports refuse their own.
        self.draining = False
        chats.on_run = self._on_run

    @property
    def replica_id(self) -> str:
        return self.state.replica_id

    @property
    def available(self) -> bool:
        return self.state.available

    @property
    def restoring(self) -> bool:
        return self.state.restoring

    @property
    def _settings(self) -> SessionsConfig:
        return self.chats.config.sessions

    async def start(self) -> None:
        await self.state.start(self._deliver, self._local_chats)
        self._spawn(self._write_marks())

    async def close(self) -> None:
        """Stop this replica's tasks, then leave the shared state; bounded, whatever the tasks do."""
        self._closed = True
        self._marks_due.set()  # the mark writer wakes and sees _closed
        # Bounded: a task that lost its cancellation inside a store call (wait_for, in redis-py on
        # Python 3.11) would otherwise hold shutdown, and the heartbeat with it, forever.
        await cancel_and_wait(self._tasks, _STOP_GRACE, what="cluster tasks")
        await self.state.close()

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        # Named, so close() can say which task did not stop.
        task = asyncio.create_task(work, name=f"cluster:{work.__qualname__}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- browser requests ------------------------------------------------------------------

    async def submit(self, user_id: str, request: ChatRequest) -> Attachment:
        """`ChatService.submit`, wherever the chat runs."""
        claim = await self._claim(user_id, request.chat_id)
        if claim.local:
            try:
                return await self.chats.submit(user_id, request)
            except Gone:
                if claim.orphaned_run is None:
                    raise
                self.metrics.owner_lost.labels("approval").inc()
                raise Gone(_APPROVAL_LOST) from None
        reply = await self._ask(claim.owner, {"op": "submit", "user": user_id, "body": request.as_body()})
        attachment = self._attachment(claim.owner, reply)
        if attachment is None:
            raise HttpError(502, "replica_failed", "the gateway replica running this chat answered without a response")
        return attachment

    async def resume(self, user_id: str, chat_id: str) -> Attachment | None:
        """`ChatService.resume`, wherever the chat runs."""
        claim = await self._claim(user_id, chat_id, create=False)
        if claim.local:
            if claim.orphaned_run is not None:
                raise OwnerLost(410, "run_lost", _RUN_LOST)
            return self.chats.resume(user_id, chat_id)
        reply = await self._ask(claim.owner, {"op": "resume", "user": user_id, "chat": chat_id})
        return self._attachment(claim.owner, reply)

    async def send_audio(self, user_id: str, chat_id: str, mime_type: str, data: str, version: ClientVersion) -> Attachment | None:
        claim = await self._claim(user_id, chat_id)
        if claim.local:
            return await self.chats.send_audio(user_id, chat_id, mime_type, data, version)
        reply = await self._ask(claim.owner, {
            "op": "audio", "user": user_id, "chat": chat_id, "mime": mime_type, "data": data, "version": version,
        })
        return self._attachment(claim.owner, reply)

    async def abort(self, user_id: str, chat_id: str) -> bool:
        """Stop the chat's run, wherever it runs. True if one was running (here) or asked to stop."""
        if self.chats.abort(user_id, chat_id):
            return True
        return await self._tell_owner(user_id, chat_id, {"op": "abort", "user": user_id, "chat": chat_id})

    async def socket_closed(self, user_id: str, chat_id: str) -> None:
        await self.chats.socket_closed(user_id, chat_id)
        await self._tell_owner(user_id, chat_id, {"op": "socket_closed", "user": user_id, "chat": chat_id})

    async def forget_idle(self, idle_before: float) -> int:
        gone = await self.chats.forget_idle(idle_before)
        for chat in gone:
            with contextlib.suppress(SharedStateDown):
                await self.state.release(chat.user_id, chat.chat_id)
        return len(gone)

    async def _claim(self, user_id: str, chat_id: str, *, create: bool = True) -> Claim:
        claim = await self.state.claim(user_id, chat_id, ttl=self.chats.config.chat.idle_chat_ttl, create=create)
        if claim.orphaned_run is not None:
            self.metrics.owner_lost.labels("run").inc()
            log.warning("chat_taken_over", chat_id=chat_id, lost_message_id=claim.orphaned_run)
        elif not claim.local:
            self.metrics.forwarded.labels("out").inc()
        return claim

    async def _tell_owner(self, user_id: str, chat_id: str, message: dict[str, Any]) -> bool:
        try:
            owner = await self.state.owner(user_id, chat_id)
            if owner is None or owner == self.replica_id:
                return False
            await self.state.send(owner, {**message, "from": self.replica_id})
        except SharedStateDown:
            return False
        return True

    def _attachment(self, owner: str, reply: dict[str, Any]) -> Attachment | None:
        key = reply.get("relay")
        if not key:
            return None
        return Attachment(None, RelayFeed(self, owner, key))

    # ---- plugin requests -------------------------------------------------------------------

    async def gate(self, *, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any]) -> tuple[Verdict, str]:
        """The verdict for a gated call the plugin asks about, and its label for the metrics."""
        if not self.chats.runs_here(user_id, session_id):
            try:
                owner = await self.state.owner(user_id, session_id)
            except SharedStateDown:
                return Verdict.refuse("The gateway's shared session store is unreachable; the call was not run."), "sessions_unavailable"
            if owner is not None and owner != self.replica_id:
                return await self._gate_remote(owner, user_id, session_id, tool_call_id, tool, args)
        return await self._gate_here(user_id, session_id, tool_call_id, tool, args)

    async def _gate_here(
        self, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any],
        on_waiting: Callable[[GatedCall], Awaitable[None]] | None = None,
    ) -> tuple[Verdict, str]:
        """Open, record and announce the call here, and wait for its verdict; `on_waiting` is
        called once the call waits for a person (not when the answer is immediate)."""
        gate = self.chats.open_gate(
            user_id=user_id, session_id=session_id, tool_call_id=tool_call_id, tool=tool, args=args, announce=False
        )
        if isinstance(gate, Verdict):
            return gate, "not_gated" if gate.run else (gate.reason or "respond")
        call = gate
        ttl = max(call.deadline - self.chats.now(), 0) + 60
        try:
            # Recorded before the browser can see it, so any replica can tell what became of it.
            await self.state.put_call(call.id, {
                "user": call.user_id, "chat": call.chat_id, "owner": self.replica_id, "tool": call.tool,
            }, ttl=ttl)
        except SharedStateDown:
            self.chats.cancel_call(call, "the gateway's shared session store is unreachable")
        if on_waiting is not None and not call.released:
            await on_waiting(call)
        self.chats.announce(call)
        verdict = await self.chats.wait(call)
        if on_waiting is not None:
            # Another replica holds the plugin's request and reads the verdict from the record
            # if the message below is lost: keep trying through a Redis outage.
            self._spawn(self._record_verdict(call.id, verdict))
        return verdict, "run" if verdict.run else "respond"

    async def _record_verdict(self, call_id: str, verdict: Verdict) -> None:
        for _ in range(120):
            if self._closed:
                break
            try:
                await self.state.put_call(call_id, {"verdict": _verdict_json(verdict)}, ttl=120)
                return
            except SharedStateDown:
                await asyncio.sleep(self._settings.heartbeat_interval)
        log.warning("verdict_not_recorded", approval_id=call_id)

    async def _gate_remote(
        self, owner: str, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any]
    ) -> tuple[Verdict, str]:
        self.metrics.forwarded.labels("out").inc()
        try:
            reply = await self._ask(owner, {
                "op": "gate", "user": user_id, "session": session_id, "tool_call_id": tool_call_id,
                "tool": tool, "args": args,
            })
        except OwnerLost:
            self.metrics.owner_lost.labels("gated_call").inc()
            log.warning("gated_call_owner_lost", owner=owner, tool_call_id=tool_call_id)
            return Verdict.refuse(
                "The gateway replica running this chat stopped before anyone answered; the call was not run."
            ), "owner_lost"
        except HttpError as exc:
            return Verdict.refuse(f"The gateway could not reach the replica running this chat ({exc.message}); the call was not run."), exc.code
        if "verdict" in reply:
            return _verdict_from(reply["verdict"]), reply.get("result", "respond")
        call_id = reply["call"]
        loop = asyncio.get_running_loop()
        future = self._verdicts.setdefault(call_id, loop.create_future())
        interval = self._settings.heartbeat_interval
        # The owner releases the call by its deadline; past that (and a margin), the verdict was
        # lost with Redis's data: refuse rather than hold the agent forever.
        give_up = loop.time() + self.chats.config.tool_policy(tool).timeout + 2 * self._settings.forward_timeout
        try:
            while True:
                _resume_lost_cancellation()
                if loop.time() > give_up:
                    log.warning("gated_call_verdict_lost", approval_id=call_id, owner=owner)
                    return Verdict.refuse("The gateway lost this call's answer; the call was not run."), "verdict_lost"
                if await _settled(future, interval):
                    message = future.result()
                    return _verdict_from(message["verdict"]), message.get("result", "respond")
                try:
                    record = await self.state.get_call(call_id)
                    if record is not None and record.get("verdict"):
                        verdict = _verdict_from(record["verdict"])
                        return verdict, "run" if verdict.run else "respond"
                    if await self._dead(owner):
                        self.metrics.owner_lost.labels("gated_call").inc()
                        log.warning("gated_call_owner_lost", approval_id=call_id, owner=owner)
                        return Verdict.refuse(
                            "The gateway replica holding this call stopped before anyone answered; the call was not run."
                        ), "owner_lost"
                except SharedStateDown:
                    continue  # keep waiting: the owner may still answer through the inbox
        finally:
            self._verdicts.pop(call_id, None)

    # ---- between replicas ------------------------------------------------------------------

    async def _ask(self, owner: str, message: dict[str, Any]) -> dict[str, Any]:
        """Send a request to `owner` and wait for its reply; refusals come back as HttpError."""
        request_id = secrets.token_hex(8)
        future = self._pending[request_id] = asyncio.get_running_loop().create_future()
        interval = self._settings.heartbeat_interval
        waited = 0.0
        try:
            await self.state.send(owner, {**message, "id": request_id, "from": self.replica_id})
            while not await _settled(future, interval):
                waited += interval
                if await self._dead(owner):
                    raise OwnerLost(503, "replica_unavailable", "the gateway replica running this chat stopped; retry", {"Retry-After": "1"})
                if waited >= self._settings.forward_timeout:
                    raise HttpError(503, "replica_unavailable", "the gateway replica running this chat did not answer; retry", {"Retry-After": "1"})
        finally:
            self._pending.pop(request_id, None)
        reply = future.result()
        error = reply.get("error")
        if error is not None:
            raise HttpError(error["status"], error["code"], error["message"], error.get("headers") or None)
        return reply

    async def _dead(self, replica_id: str) -> bool:
        """Dead for sure: no heartbeat now, nor one heartbeat interval later."""
        if await self.state.alive(replica_id):
            return False
        await asyncio.sleep(self._settings.heartbeat_interval)
        return not await self.state.alive(replica_id)

    def _deliver(self, message: dict[str, Any]) -> None:
        reply_to = message.get("reply")
        if reply_to is not None:
            future = self._pending.get(reply_to)
            if future is not None and not future.done():
                future.set_result(message)
            return
        if message.get("op") == "verdict":
            call_id = str(message.get("call"))
            future = self._verdicts.get(call_id)
            if future is None:
                # It overtook the asker, which has not started waiting yet: keep it a while.
                future = self._verdicts[call_id] = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_later(60, self._verdicts.pop, call_id, None)
            if not future.done():
                future.set_result(message)
            return
        self._spawn(self._serve(message))

    async def _serve(self, message: dict[str, Any]) -> None:
        """Do what another replica forwarded here, and reply to it."""
        op, sender, request_id = message.get("op"), str(message.get("from")), message.get("id")
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(forwarded_from=sender, op=op, user_id=message.get("user"))
        self.metrics.forwarded.labels("in").inc()
        try:
            result = await self._handle(op, sender, message)
        except Exception as exc:
            answer = refusal(exc)
            if answer is None:
                log.exception("forwarded_request_failed")
                answer = HttpError(500, "internal_error", "the gateway failed to handle this request")
            elif isinstance(exc, Limited):
                self.metrics.limited.labels(exc.code).inc()
            result = {"error": {"status": answer.status, "code": answer.code, "message": answer.message, "headers": answer.headers}}
        if request_id is not None and result is not None:
            with contextlib.suppress(SharedStateDown):
                await self.state.send(sender, {**result, "reply": request_id})

    async def _handle(self, op: Any, sender: str, message: dict[str, Any]) -> dict[str, Any] | None:
        user_id = str(message["user"])
        if self.draining and op in ("submit", "audio"):
            raise HttpError(503, "draining", "the gateway replica running this chat is shutting down; retry in a moment", {"Retry-After": "5"})
        if op == "submit":
            request = parse_chat_body(message["body"], version_header=None, default_version=self.chats.config.chat.default_protocol)
            structlog.contextvars.bind_contextvars(chat_id=request.chat_id)
            return self._relay(await self.chats.submit(user_id, request))
        if op == "resume":
            return self._relay(self.chats.resume(user_id, str(message["chat"])))
        if op == "audio":
            attachment = await self.chats.send_audio(
                user_id, str(message["chat"]), str(message["mime"]), str(message["data"]), message["version"]
            )
            return self._relay(attachment)
        if op == "abort":
            self.chats.abort(user_id, str(message["chat"]))
            return None
        if op == "socket_closed":
            await self.chats.socket_closed(user_id, str(message["chat"]))
            return None
        if op == "gate":
            return await self._serve_gate(sender, message)
        raise HttpError(400, "invalid_request", f"unknown forwarded operation {op!r}")

    async def _serve_gate(self, sender: str, message: dict[str, Any]) -> dict[str, Any] | None:
        request_id = message["id"]

        waited: list[str] = []

        async def waiting(call: GatedCall) -> None:
            # The asker holds the plugin's request: it now waits for the verdict message below.
            waited.append(call.id)
            await self.state.send(sender, {"reply": request_id, "call": call.id})

        verdict, result = await self._gate_here(
            str(message["user"]), str(message["session"]), str(message["tool_call_id"]), str(message["tool"]),
            dict(message.get("args") or {}), on_waiting=waiting,
        )
        payload = {"verdict": _verdict_json(verdict), "result": result}
        if not waited:
            return payload  # answered at once: the reply carries the verdict
        with contextlib.suppress(SharedStateDown):
            await self.state.send(sender, {"op": "verdict", "call": waited[0], **payload})
        return None

    # ---- relays ----------------------------------------------------------------------------

    def _relay(self, attachment: Attachment | None) -> dict[str, Any]:
        if attachment is None:
            return {"relay": None}
        key = secrets.token_urlsafe(12)
        pump = self._spawn(self._pump_relay(key, attachment))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return {"relay": key}

    @property
    def relays_active(self) -> int:
        """Responses run here that another replica streams to its browser: the drain waits for them
        as for its own streams."""
        return len(self._pumps)

    async def end_relays(self, timeout: float = 2.0) -> None:
        """Let the relays of responses that just ended write their ends (the drain, once runs are
        cancelled), so a relayed browser gets its terminal chunks and the relay's end, not a cut."""
        if self._pumps:
            await asyncio.wait(set(self._pumps), timeout=timeout)

    async def _pump_relay(self, key: str, attachment: Attachment) -> None:
        seq = 0
        try:
            try:
                async for batch in attachment.response.follow(0):
                    await self.state.relay_append(key, RelayEntry(seq, batch))
                    seq += len(batch)
                end = "done"
            except FollowerLagged:
                end = "lagged"
            await self.state.relay_append(key, RelayEntry(seq, end=end))
        except SharedStateDown:
            log.warning("relay_cut", reason="the shared session store is unreachable")

    # ---- the directory ---------------------------------------------------------------------

    def _on_run(self, chat: Chat, message_id: str) -> None:
        self._marks[(chat.user_id, chat.chat_id)] = message_id
        self._marks_due.set()

    async def _write_marks(self) -> None:
        # Ends on _closed as well as on cancellation: a cancellation lost inside mark_run would
        # otherwise leave this loop waiting on _marks_due for ever.
        while not self._closed:
            await self._marks_due.wait()
            self._marks_due.clear()
            marks, self._marks = self._marks, {}
            for (user_id, chat_id), message_id in marks.items():
                if self._closed:
                    return
                try:
                    await self.state.mark_run(user_id, chat_id, message_id)
                except SharedStateDown:
                    pass  # written back with every local chat once the store is back (_local_chats)

    def _local_chats(self) -> list[tuple[str, str, str]]:
        out = []
        for chat in self.chats.local_chats():
            running = chat.run.message_id if chat.driver is not None and chat.driver.alive and chat.run is not None else ""
            out.append((chat.user_id, chat.chat_id, running))
        return out


class RelayFeed:
    """A response running on another replica, read from its relay: what a transport follows."""

    def __init__(self, cluster: Cluster, owner: str, key: str) -> None:
        self._cluster = cluster
        self._owner = owner
        self._key = key

    async def follow(self, start: int = 0, *, idle: float | None = None) -> AsyncIterator[list[bytes]]:
        """Batches of frames from position `start` to the end of the response (as Response.follow)."""
        state = self._cluster.state
        step = self._cluster._settings.heartbeat_interval
        if idle is not None:
            step = min(step, idle)
        position, after, quiet = 0, "", 0.0
        # Whether the last frame handed out ended the response (finish, error, abort): a relay that
        # breaks after that has nothing left to say, and a second terminal chunk would reach the
        # browser after its finish.
        ended = False
        while True:
            try:
                after, entries = await state.relay_read(self._key, after, timeout=step)
                if not entries:
                    quiet += step
                    if idle is not None and quiet >= idle:
                        quiet = 0.0
                        yield []
                    if await self._cluster._dead(self._owner):
                        if not ended:
                            self._cluster.metrics.owner_lost.labels("stream").inc()
                            yield [_error_frame(_OWNER_STOPPED)]
                        return
                    continue
            except SharedStateDown:
                if not ended:
                    yield [_error_frame(_CONTACT_LOST)]
                return
            quiet = 0.0
            batch: list[bytes] = []
            for entry in entries:
                if entry.seq != position:
                    # The relay lost entries (Redis restarted under it): do not hand out a stream with a hole.
                    yield batch + [_error_frame(_CONTACT_LOST)]
                    return
                for frame in entry.frames:
                    if position >= start:
                        batch.append(frame)
                    position += 1
                if entry.end == "lagged":
                    if batch:
                        yield batch
                    raise FollowerLagged("the relay fell behind the response")
                if entry.end is not None:
                    if batch:
                        yield batch
                    return
            if batch:
                ended = batch[-1].startswith(_TERMINAL)
                yield batch


# How a chunk that ends a response starts, as encode_chunk writes it ("type" is always a chunk's first key).
_TERMINAL = (b'{"type":"finish"', b'{"type":"error"', b'{"type":"abort"')


def _resume_lost_cancellation() -> None:
    """Raise the cancellation of this task if a call below lost it, for a loop that would otherwise
    go on: on Python 3.11, wait_for (redis-py sends every command with it) returns a result that
    arrived with the cancellation and drops the cancellation. The task still counts it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _settled(future: asyncio.Future[Any], timeout: float) -> bool:
    """Whether `future` is done within `timeout`, leaving it alone either way.

    Not wait_for: on Python 3.11 it can swallow a cancellation that arrives as the wait ends,
    and a task that cannot be cancelled hangs shutdown.
    """
    await asyncio.wait((future,), timeout=timeout)
    return future.done()


def _error_frame(text: str) -> bytes:
    return encode_chunk({"type": "error", "errorText": text})


def _verdict_json(verdict: Verdict) -> str:
    return orjson.dumps(verdict.as_json()).decode()


def _verdict_from(raw: str) -> Verdict:
    return Verdict.from_json(orjson.loads(raw))
