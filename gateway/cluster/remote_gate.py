"""Gating a plugin call whose chat runs on another replica (docs/scaling.md).

A gated call is opened, shown to the browser and decided on its chat's owner, which records every
call it opens in the shared state (chat, owner, tool; the verdict once released) before the browser
can see it, so any replica can tell what became of it.

A plugin request that lands elsewhere is held there: that replica forwards a `Gate` to the owner,
which answers at once (`Decided`) or says the call waits for a person (`Waiting`) and sends the
verdict when a person or the deadline decides (`Released`), recording it too. The waiting replica
takes whichever it sees first, the message or the record, and refuses the call (the tool does not
run) when the owner dies first, or when nothing comes by the call's deadline and a margin.

A replica that stops does not take the requests it holds for other replicas' chats down with it:
from the start of its drain it answers each of them, and every new one, `HandedOver` (503
`retry_elsewhere`), and the plugin asks again through the balancer. The owner takes a repeated
ask for a call it already holds as the same call (`here`): it re-attaches to the call's verdict,
never opens, records or shows it twice, and answers a call already released with its verdict.

The owner reaches its chats through the approvals room's port `approvals/ports.py` `GatedCalls`
(the chat's gates implement it). Before a new ask is decided it reserves a use of a standing grant
that could decide it (grant_uses.py), and reads the user's count of approvals
listed for the approvals API from the store, when the ask could be listed: the chat's machine
refuses it past the user's cap (approvals/decision.py), and the store's capped put of a held call
stays the guard against asks that passed together.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import orjson
import structlog

from ..approvals.decision import OVER_USER_CAP
from ..approvals.ports import GatedCalls
from ..core.approvals import CallState, GatedCall, Verdict
from ..core.refusals import HttpError, Refusal
from ..ops.metrics import GatewayMetrics
from ..ops.stopping import cancel_and_wait
from .approval_desk import ApprovalDesk
from .grant_uses import GrantUses
from .liveness import Liveness, OwnerDied, OwnerLost, OwnerSilent
from .messages import Answer, Decided, Forwarded, Gate, Released, Reply, Waiting, Work
from .shared import SharedState, SharedStateBusy, SharedStateDown
from .tasks import Tasks

__all__ = ["Ask", "HandedOver", "RemoteGate", "store_refused"]

log = structlog.get_logger("adk_gateway.cluster.remote_gate")

# Forward work to a replica and wait for its answer (Asker.ask): refusals raise HttpError.
Ask = Callable[[str, Work], Awaitable[Answer]]
# How many heartbeat intervals the owner keeps trying to record a verdict through an outage.
_RECORD_TRIES = 120
# A verdict that overtook its asker is kept this long for it (the asker starts waiting within
# forward_timeout; a minute is ample and bounds what an asker that never comes leaves behind).
_EARLY_VERDICT_KEEP = 60.0
# How long a call's recorded verdict stays readable after it was written (the asker reads it
# within a heartbeat or two; the margin covers a Redis outage in between).
_VERDICT_RECORD_TTL = 120
# How long a handed-over ask waits for the cancelled forward to end (it ends at once unless a
# cancellation is lost inside a Redis call): the plugin is answered either way.
_HANDOVER_GRACE = 1.0


class HandedOver(Refusal):
    """This replica stops, and the chat runs on another: the plugin asks again through the balancer,
    which sends it to a replica that stays (the owner re-attaches the repeated ask to the call)."""

    status = 503
    code = "retry_elsewhere"
    retry_after = 1

    def __init__(self) -> None:
        super().__init__(
            "this gateway replica is shutting down and the chat runs on another one: ask again (the call is kept there)"
        )


class RemoteGate:
    """Both ends of a forwarded gated call: the replica holding the plugin's request, and the owner."""

    def __init__(
        self, state: SharedState, calls: GatedCalls, metrics: GatewayMetrics, tasks: Tasks, liveness: Liveness,
        ask: Ask, *, forward_timeout: float, desk: ApprovalDesk | None = None,
    ) -> None:
        self._state = state
        # This replica's chats, as the plugin's asks reach them (the chat's gates).
        self._calls = calls
        self.metrics = metrics
        self._tasks = tasks
        self._liveness = liveness
        self._ask = ask
        self._forward_timeout = forward_timeout
        # Verdicts of calls waiting on another replica, by approval id.
        self._verdicts: dict[str, asyncio.Future[Decided]] = {}
        # Lists the calls that wait for a decision for the approvals API (the cluster's; none in some tests).
        self.desk = desk
        # Set when this replica starts to stop: what it holds for other replicas is handed back.
        self._handing_over = asyncio.Event()
        # Standing grants: a use reserved before the machine decides, given back unless spent.
        self._grant_uses = GrantUses(state.grants, calls)

    # ---- holding the plugin's request -----------------------------------------------------

    def hand_over(self, on: bool = True) -> None:
        """From now on (the drain), answer every plugin request held or asked here for a chat
        another replica owns with `HandedOver`, so that it is asked again of a replica that stays."""
        if on:
            self._handing_over.set()
        else:
            self._handing_over.clear()

    async def ask_owner(self, owner: str, gate: Gate) -> tuple[Verdict, str]:
        """The verdict `owner`, which runs the chat, gives the call; and its label for the metrics.

        Raises HandedOver when this replica starts to stop before the verdict came: the call stays
        open on its owner, and the plugin's repeated ask finds it there.
        """
        if self._handing_over.is_set():
            raise HandedOver()
        asking = asyncio.ensure_future(self._ask_owner(owner, gate))
        handing_over = asyncio.ensure_future(self._handing_over.wait())
        try:
            await asyncio.wait((asking, handing_over), return_when=asyncio.FIRST_COMPLETED)
        finally:
            handing_over.cancel()
            if not asking.done():
                # Handed over, or the plugin went away: nothing here waits for the verdict any more.
                await cancel_and_wait((asking,), _HANDOVER_GRACE, what="handed-over ask")
        if asking.done() and not asking.cancelled():
            return asking.result()  # a verdict that came with the drain is still given
        log.info("gated_call_handed_over", owner=owner, tool_call_id=gate.tool_call_id)
        raise HandedOver()

    async def _ask_owner(self, owner: str, gate: Gate) -> tuple[Verdict, str]:
        self.metrics.forwarded.labels("out").inc()
        try:
            answer = await self._ask_through_outages(owner, gate)
        except SharedStateDown:
            return Verdict.refuse(
                "The gateway's shared session store stayed unreachable; the call was not run."
            ), "sessions_unavailable"
        except OwnerLost:
            self.metrics.owner_lost.labels("gated_call").inc()
            log.warning("gated_call_owner_lost", owner=owner, tool_call_id=gate.tool_call_id)
            return Verdict.refuse(
                "The gateway replica running this chat stopped before anyone answered; the call was not run."
            ), "owner_lost"
        except HttpError as exc:
            return Verdict.refuse(f"The gateway could not reach the replica running this chat ({exc.message}); the call was not run."), exc.code
        if isinstance(answer, Waiting):
            return await self.await_verdict(answer.call, owner, gate.app, gate.tool)
        if not isinstance(answer, Decided):
            raise HttpError(502, "replica_failed", "the gateway replica running this chat answered without a verdict")
        return answer.verdict, answer.result

    async def _ask_through_outages(self, owner: str, gate: Gate) -> Answer:
        """Ask the owner, again after a store outage, until the call's deadline and its margin.

        An outage while the request is forwarded leaves it unknown whether the owner got it; asking
        again is safe (the owner answers the same call for the same tool call id, it never opens
        a second one), and refusing at once would lose an approval a person may still give.
        """
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._calls.timeout(gate.app, gate.tool) + 2 * self._forward_timeout
        while True:
            try:
                return await self._ask(owner, gate)
            except SharedStateDown:
                if loop.time() >= give_up:
                    raise
                log.info("gate_forward_retry", owner=owner, tool_call_id=gate.tool_call_id, reason="shared store unreachable")
                await asyncio.sleep(self._liveness.interval)

    async def await_verdict(self, call_id: str, owner: str, app: str, tool: str) -> tuple[Verdict, str]:
        """The verdict of the call `call_id`, which waits for a person on `owner`: from the owner's
        message or, should that be lost, from the call's record; refused if the owner dies first."""
        future = self._verdicts.setdefault(call_id, asyncio.get_running_loop().create_future())
        # The owner releases the call by its deadline; past that (and a margin), the verdict was
        # lost with Redis's data: refuse rather than hold the agent forever.
        timeout = self._calls.timeout(app, tool) + 2 * self._forward_timeout
        try:
            decided = await self._liveness.wait(
                future, owner, timeout=timeout, check=lambda: self._recorded(call_id), through_outages=True
            )
        except OwnerDied:
            self.metrics.owner_lost.labels("gated_call").inc()
            log.warning("gated_call_owner_lost", approval_id=call_id, owner=owner)
            return Verdict.refuse(
                "The gateway replica holding this call stopped before anyone answered; the call was not run."
            ), "owner_lost"
        except OwnerSilent:
            log.warning("gated_call_verdict_lost", approval_id=call_id, owner=owner)
            return Verdict.refuse("The gateway lost this call's answer; the call was not run."), "verdict_lost"
        finally:
            self._verdicts.pop(call_id, None)
        return decided.verdict, decided.result

    def released(self, message: Released) -> None:
        """A verdict from the owner (the inbox hands it here)."""
        future = self._verdicts.get(message.call)
        if future is None:
            # It overtook the asker, which has not started waiting yet: keep it a while.
            loop = asyncio.get_running_loop()
            future = self._verdicts[message.call] = loop.create_future()
            loop.call_later(_EARLY_VERDICT_KEEP, self._verdicts.pop, message.call, None)
        if not future.done():
            future.set_result(message.decided)

    async def _recorded(self, call_id: str) -> Decided | None:
        record = await self._state.get_call(call_id)
        if record is None or not record.get("verdict"):
            return None
        verdict = Verdict.from_json(orjson.loads(record["verdict"]))
        return Decided(verdict, "run" if verdict.run else "respond")

    # ---- the owner ------------------------------------------------------------------------

    async def here(self, gate: Gate, on_waiting: Callable[[GatedCall], Awaitable[None]] | None = None) -> tuple[Verdict, str]:
        """Open, record and announce the call here, and wait for its verdict; `on_waiting` is
        called once the call waits for a person (not when the answer is immediate).

        A call already open here (the plugin asks again) is re-attached to: its verdict once
        released, at once if it was; it is not recorded, shown or counted again.
        """
        calls = self._calls
        # Read before the call is looked up, so that nothing awaits between the look-up and the open.
        user_waiting = await self._user_waiting(gate)
        grant = await self._grant_uses.reserve(gate)
        call = calls.find(app_name=gate.app, user_id=gate.user, session_id=gate.session, tool_call_id=gate.tool_call_id)
        reattached = call is not None
        if reattached:
            await self._grant_uses.settle(grant, gate, opened=False)
        listed = False  # in the approvals API's directory: dropped once released
        over_cap = False  # refused by the store for its user's cap on listed approvals
        if call is not None:
            log.info("gate_reattached", approval_id=call.id, tool_call_id=call.tool_call_id, released=call.released)
        else:
            try:
                opened = calls.open(
                    app_name=gate.app, user_id=gate.user, session_id=gate.session, tool_call_id=gate.tool_call_id,
                    tool=gate.tool, args=gate.args, announce=False, confirm=gate.confirm,
                    approvers=gate.approvers, user_waiting=user_waiting, grants=(grant,) if grant is not None else (),
                )
            finally:
                # Kept if the grant decided the call (its ledger says so), else given back.
                await self._grant_uses.settle(grant, gate, opened=True)
            if isinstance(opened, Verdict):
                return opened, opened.reason or ("not_gated" if opened.run else "respond")
            call = opened
            await self._record_open(call)
            listed = self.desk is not None and call.state is CallState.AWAITING_APPROVAL
            if listed and not await self._list(call):
                listed, over_cap = False, True
        if on_waiting is not None and not call.released:
            await on_waiting(call)
        if not reattached:
            # Shown by the ask that opened it, once recorded: a repeated ask shows nothing.
            calls.announce(call)
        verdict = await calls.wait(call)
        if listed:
            # Only what was listed: a browser tool's wait for its output costs no store round trip.
            assert self.desk is not None
            self._tasks.spawn(self.desk.closed(call.id))
        if on_waiting is not None:
            # Another replica holds the plugin's request and reads the verdict from the record
            # if the message is lost: keep trying through a Redis outage.
            self._tasks.spawn(self._record_verdict(call.id, verdict))
        if over_cap:
            return verdict, "too_many_pending_user"
        return verdict, "run" if verdict.run else "respond"

    async def _user_waiting(self, gate: Gate) -> int | None:
        """How many approvals the asking user has listed, for the chat's machine to hold the ask to
        their cap; None when no listing is kept here, the ask could not be listed (no store round
        trip), or the store cannot say: then nothing is refused for it."""
        if self.desk is None or not self._calls.may_be_listed(gate.app, gate.tool, confirm=gate.confirm):
            return None
        try:
            return await self._state.pending_approvals(gate.user)
        except SharedStateDown:
            return None

    async def _list(self, call: GatedCall) -> bool:
        """List the call for the approvals API; past its user's cap, refuse it (released as
        cancelled: the model reads why, the browser sees it refused) and say so: False.

        The machine already held the ask to the cap by the count read before it (`_user_waiting`),
        but a parallel ask of the same user may have been listed since: the store's atomic capped
        put is what no two asks pass together."""
        assert self.desk is not None
        if await self.desk.opened(call):
            return True
        agent = self._calls.agent_of(call.user_id, call.session_id)
        self.metrics.approvals_over_user_cap.labels(agent).inc()
        log.warning("approval_over_user_cap", approval_id=call.id, tool=call.tool)
        self._calls.cancel(call, OVER_USER_CAP)
        return False

    async def _record_open(self, call: GatedCall) -> None:
        """Record a call just opened, before the browser can see it, so any replica can tell what became of it."""
        ttl = max(call.deadline - self._calls.now(), 0) + 60
        try:
            await self._state.put_call(call.id, {
                "user": call.user_id, "chat": call.chat_id, "owner": self._state.replica_id, "tool": call.tool,
            }, ttl=ttl)
        except SharedStateDown:
            self._calls.cancel(call, "the gateway's shared session store is unreachable")

    async def serve(self, gate: Gate, asked: Forwarded) -> Answer | None:
        """A Gate forwarded here: the verdict if immediate; else Waiting now, and Released later."""
        waited: list[str] = []

        async def waiting(call: GatedCall) -> None:
            # The asker holds the plugin's request: it now waits for the verdict message below.
            waited.append(call.id)
            await self._state.send(asked.sender, Reply(asked.request_id, Waiting(call.id)).to_json())

        verdict, result = await self.here(gate, on_waiting=waiting)
        decided = Decided(verdict, result)
        if not waited:
            return decided  # answered at once: the reply carries the verdict
        with contextlib.suppress(SharedStateDown):
            await self._state.send(asked.sender, Released(waited[0], decided).to_json())
        return None

    async def _record_verdict(self, call_id: str, verdict: Verdict) -> None:
        for _ in range(_RECORD_TRIES):
            if self._tasks.closed:
                break
            try:
                await self._state.put_call(call_id, {"verdict": orjson.dumps(verdict.as_json()).decode()}, ttl=_VERDICT_RECORD_TTL)
                return
            except SharedStateDown:
                await asyncio.sleep(self._liveness.interval)
        log.warning("verdict_not_recorded", approval_id=call_id)


def store_refused(exc: SharedStateDown) -> tuple[Verdict, str]:
    """The verdict (and its label) of a gated call whose owner could not be looked up: refused,
    saying whether Redis was down or this replica overloaded."""
    if isinstance(exc, SharedStateBusy):
        return Verdict.refuse("The gateway was overloaded; the call was not run."), "gateway_overloaded"
    return Verdict.refuse("The gateway's shared session store is unreachable; the call was not run."), "sessions_unavailable"
