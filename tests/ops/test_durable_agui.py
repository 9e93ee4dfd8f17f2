"""Issue 40's fault rows: an AG-UI interrupt outlives the replica that asked it, a rolling restart, an
ADK restart and all of them at once; a browser tool outlives two replicas; an approvers' call waits
across replicas and outlives them. On the rig of test_durable_approvals.py.

Replicas A and B on a real redis-server, the stock ADK API server with the plugin behind a balancer,
ADK on a SQLite session file (the suite's `on_sqlite`), the agent in confirm mode, and the browsers'
balancer in front of both replicas. An AG-UI client is what `@ag-ui/client`'s `HttpAgent` does on
the wire: it POSTs a `RunAgentInput` with the whole thread to `/ag-ui` and reads the SSE events;
`Client` here does the same with raw HTTP and keeps the messages as the client assembles them
(`thread_after`). Every run's events go through `@ag-ui/core`'s schemas and `@ag-ui/client`'s
pipeline in one Node call at the end of a row, and what the client assembles from each run must be
the thread this one posted next.

- An interrupt (a payment the person approves): asked through the balancer, then the fault (the
  replica that runs the chat killed -9, a rolling restart, the ADK server killed -9 and started
  again on its SQLite file), then the resume through the balancer (another replica, when the
  first is gone): the run ends success with the payment's result; ADK's tool ledger shows the
  payment ran exactly once (none when denied); the same resume again is refused (approval_gone).
- A browser tool (get_location, approved first): asked on one replica, which is killed; approved
  on the other, which hands it to the browser (pendingToolCallIds) and is killed at once; the
  browser's tool message reaches the first one started again, and ADK has the output once.
- An approvers' call (a payment above 1,000, the supervisors', quorum 2): the run shows the
  activity and stays open (through an ADK restart, or the other replica's death); both
  supervisors decide through `/api/approvals` on the other replica; the open run receives the
  continuation and ends success; the payment ran once. If instead the replica holding the run
  dies, the decision still runs the payment once and the thread goes on.
"""

from __future__ import annotations

import collections
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.jsdriver import check_agui_streams
from tests.ops.checks import Browser, Stream, new_chat
from tests.ops.stack import Replicas, Upstream, adk_events, payment_responses, replicas, wait_until
from tests.ops.test_durable_approvals import Rig, confirm_stack, everything_at_once, kill, restart_adk, rolling_restart
from tests.ops.test_durable_approver_calls import APPROVERS, approvers_api, listed, tools_with_supervisors

pytestmark = [pytest.mark.integration, pytest.mark.js, pytest.mark.timeout(240)]

Events = list[dict[str, Any]]
LOCATION_TOOL = {"name": "get_location", "description": "Where the person is.", "parameters": {"type": "object", "properties": {}}}
HERE = {"latitude": 35.68, "longitude": 139.76}


def thread_after(messages: list[dict[str, Any]], events: Events) -> list[dict[str, Any]]:
    """The messages an AG-UI client holds after a run's `events` (`@ag-ui/client`'s
    defaultApplyEvents, for what these runs send); `HttpAgent` posts them on the next run, but for
    the activity messages."""
    out = json.loads(json.dumps(messages))
    by_id = {m["id"]: m for m in out}

    def holder(call_id: str) -> dict[str, Any]:
        return next(m for m in out if any(c["id"] == call_id for c in m.get("toolCalls", [])))

    for event in events:
        kind = event["type"]
        if kind == "TEXT_MESSAGE_START" and event["messageId"] not in by_id:
            by_id[event["messageId"]] = {"id": event["messageId"], "role": event.get("role", "assistant"), "content": ""}
            out.append(by_id[event["messageId"]])
        elif kind == "TEXT_MESSAGE_CONTENT":
            by_id[event["messageId"]]["content"] += event["delta"]
        elif kind == "TOOL_CALL_START":
            if any(c["id"] == event["toolCallId"] for m in out for c in m.get("toolCalls", [])):
                continue  # a call of an earlier run, announced again when it is handed over
            parent = by_id.get(event.get("parentMessageId") or "")
            if parent is None or parent["role"] != "assistant":
                parent = {"id": event.get("parentMessageId") or event["toolCallId"], "role": "assistant"}
                by_id[parent["id"]] = parent
                out.append(parent)
            call = {"id": event["toolCallId"], "type": "function",
                    "function": {"name": event["toolCallName"], "arguments": ""}}
            parent.setdefault("toolCalls", []).append(call)
        elif kind == "TOOL_CALL_ARGS":
            call = next(c for c in holder(event["toolCallId"])["toolCalls"] if c["id"] == event["toolCallId"])
            call["function"]["arguments"] += event["delta"]
        elif kind == "TOOL_CALL_RESULT":
            result = {"id": event["messageId"], "role": "tool", "toolCallId": event["toolCallId"], "content": event["content"]}
            at = out.index(holder(event["toolCallId"])) + 1
            while at < len(out) and out[at]["role"] == "tool":
                at += 1
            out.insert(at, result)
        elif kind == "ACTIVITY_SNAPSHOT":
            activity = {"id": event["messageId"], "role": "activity", "activityType": event["activityType"],
                        "content": event["content"]}
            if event["messageId"] in by_id:
                out[out.index(by_id[event["messageId"]])] = activity
            else:
                out.append(activity)
            by_id[event["messageId"]] = activity
    return out


def finished(events: Events) -> dict[str, Any]:
    """The run's one end, RUN_FINISHED (nothing after it, no RUN_ERROR): its outcome."""
    ends = [e for e in events if e["type"] in ("RUN_FINISHED", "RUN_ERROR")]
    assert [e["type"] for e in ends] == ["RUN_FINISHED"] and events[-1] is ends[0], [e["type"] for e in events]
    return events[-1]["outcome"]


class Settling(Exception):
    """The gateway answered 503 (the shared store settling, or out of reach): retry in a moment."""


@dataclass
class Client:
    """One AG-UI thread, as an `HttpAgent` on a page behind the browsers' balancer runs it."""

    url: str
    thread: str = field(default_factory=new_chat)
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Each run: the thread the client held before it, and its events.
    runs: list[tuple[list[dict[str, Any]], Events]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    # The frontend tools the page declares (HttpAgent's `tools`).
    tools: list[dict[str, Any]] = field(default_factory=list)
    _before: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def open(self, *, text: str | None = None, resume: list[dict[str, Any]] | None = None, total: float = 30) -> Stream:
        """POST the next run (the thread so far, plus `text` as the user's message), not yet read."""
        if text is not None:
            self.messages.append({"id": "u-" + secrets.token_hex(4), "role": "user", "content": text})
        body: dict[str, Any] = {
            "threadId": self.thread, "runId": "run-" + secrets.token_hex(4),
            "messages": [m for m in self.messages if m["role"] != "activity"],
            "tools": self.tools, "context": [], "state": {}, "forwardedProps": {},
        }
        if resume is not None:
            body["resume"] = resume
        self._before = json.loads(json.dumps(self.messages))
        stream = Browser(total=total).open(self.url, "POST", "/ag-ui", body, headers={"Accept": "text/event-stream"})
        if stream.status == 503 and text is not None:
            self.messages.pop()  # not taken: a retry sends it again
        if stream.status == 503:
            raise Settling(stream.body)
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream", (stream.status, stream.body)
        return stream

    def done(self, stream: Stream) -> Events:
        """Read the run to its end; the thread and the pending interrupts as the client keeps them."""
        events = stream.rest().chunks
        self.runs.append((self._before, events))
        self.messages = thread_after(self.messages, events)
        if events[-1]["type"] == "RUN_FINISHED":  # as HttpAgent: a failed run leaves them pending
            self.pending = events[-1]["outcome"].get("interrupts", [])
        return events

    def run(self, **kwargs: Any) -> Events:
        return self.done(self.open(**kwargs))

    def answer(self, approved: bool) -> list[dict[str, Any]]:
        """Every pending interrupt resolved (HttpAgent refuses a run that leaves one out)."""
        return [{"interruptId": i["id"], "status": "resolved", "payload": {"approved": approved}} for i in self.pending]


def assert_ag_ui_clean(client: Client) -> None:
    """Each run's events pass `@ag-ui/core`'s schemas and `@ag-ui/client`'s pipeline (one Node
    call), and after each run the client holds the thread this one posted next (`thread_after`)."""
    results = check_agui_streams([events for _, events in client.runs], [before for before, _ in client.runs])
    for i, ((before, events), result) in enumerate(zip(client.runs, results)):
        where = (client.thread, i, [e["type"] for e in events])
        assert result["schemaErrors"] == [] and result["verifyError"] is None and result["runError"] is None, (where, result)
        assert result["messages"] == thread_after(before, events), (where, result["messages"])


def ask_payment(rig: Rig, amount: int) -> tuple[Client, str]:
    """A thread whose first run, through the browsers' balancer, ends interrupted for a payment;
    and the replica that ran it."""
    client = Client(rig.front_url)
    before = dict(rig.front.connections)
    events = client.run(text=f"pay {amount} to Hanako")
    owner = next(name for name in ("a", "b") if rig.front.connections[name] > before.get(name, 0))
    outcome = finished(events)
    assert outcome["type"] == "interrupt" and len(outcome["interrupts"]) == 1, outcome
    interrupt = outcome["interrupts"][0]
    # ADK's own confirmation: the pending approval is a record in ADK's session, nothing held open.
    assert interrupt["metadata"]["approvalId"].startswith("adk-") and interrupt["metadata"]["tool"] == "process_payment"
    assert json.loads(client.messages[-1]["toolCalls"][0]["function"]["arguments"])["amount"] == amount
    assert rig.r.ledger.of(client.thread) == []
    return client, owner


def assert_paid_once(r: Replicas, client: Client, times: int) -> None:
    """ADK's tool ledger: the payment ran `times` times, and exactly as ADK recorded it."""
    assert len(r.ledger.of(client.thread)) == times, r.ledger.lines()
    r.ledger.assert_matches(client.thread, payment_responses(r.adk, client.thread, r.user))


def assert_replay_refused(client: Client, resume: list[dict[str, Any]]) -> None:
    """The same resume again (a retry, a second tab): RUN_STARTED then RUN_ERROR approval_gone."""
    events = client.run(resume=resume)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"], events
    assert events[-1]["code"] == "approval_gone", events


# ---- an interrupt across the fault -------------------------------------------------------------


def sent(client: Client, **run: Any) -> Events:
    """The run, sent again as a person would while it is refused 503 "retry in a moment": for
    `owner_timeout` after every replica was down, a chat whose owner has no heartbeat is not taken
    over (docs/scaling.md, "settling"; test_durable_approvals.race)."""
    for _ in range(20):
        try:
            return client.run(**run)
        except Settling:
            time.sleep(0.25)
    return client.run(**run)


def _owner_killed(rig: Rig, owner: str) -> None:
    kill(rig.r.replica(owner))


FAULTS: dict[str, Callable[[Rig, str], None]] = {
    "kill_9": _owner_killed,
    "rolling_restart": lambda rig, _owner: rolling_restart(rig.r),
    "adk_restart": lambda rig, _owner: restart_adk(rig.r),
    "everything_at_once": lambda rig, _owner: everything_at_once(rig.r),
}


@pytest.mark.parametrize(("fault", "approved"), [
    ("kill_9", True),
    ("kill_9", False),
    pytest.param("rolling_restart", True, marks=pytest.mark.chaos),
    pytest.param("adk_restart", True, marks=pytest.mark.chaos),
    pytest.param("everything_at_once", True, marks=pytest.mark.chaos),
])
def test_an_interrupt_survives_the_fault(tmp_path: Path, on_sqlite: Upstream, fault: str, approved: bool) -> None:
    """Interrupted through the balancer, the fault, resumed through the balancer: the payment's
    result (or its denial) ends the run, ADK ran it once (or never), and a replayed resume runs nothing."""
    with confirm_stack(tmp_path, on_sqlite) as rig:
        r = rig.r
        client, owner = ask_payment(rig, 50)
        FAULTS[fault](rig, owner)
        resume, call_id = client.answer(approved), client.pending[0]["toolCallId"]
        before = dict(rig.front.connections)
        events = sent(client, resume=resume)
        if fault == "kill_9":  # the balancer's health check in miniature sent it to the survivor
            assert rig.front.connections - collections.Counter(before) == {"ab".replace(owner, ""): 1}
        outcome = finished(events)
        assert outcome == {"type": "success"}, outcome
        results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
        assert [e["toolCallId"] for e in results] == [call_id], events
        if approved:
            assert json.loads(results[0]["content"])["success"] is True, results
            assert "sent 50 USD to Hanako" in json.dumps(client.messages), client.messages
        else:
            assert json.loads(results[0]["content"]) == {"denied": True}, results
        assert_paid_once(r, client, 1 if approved else 0)
        assert_replay_refused(client, resume)
        assert_paid_once(r, client, 1 if approved else 0)
        assert_ag_ui_clean(client)


# ---- a browser tool across two deaths -----------------------------------------------------------


def test_a_browser_tool_is_asked_handed_over_and_answered_on_three_processes(tmp_path: Path, on_sqlite: Upstream) -> None:
    """get_location: approved (an interrupt) after the replica that asked was killed, handed to the
    browser by the survivor (pendingToolCallIds), which is killed in turn as soon as it answered;
    the browser's output reaches, through the balancer, the first replica started again (sent
    again while the replicas settle), which knows the approval only from the chat's kept state:
    the run ends with the model's words on the browser's output, which ADK recorded once."""
    with confirm_stack(tmp_path, on_sqlite) as rig:
        r = rig.r
        client = Client(rig.front_url, tools=[LOCATION_TOOL])
        before = dict(rig.front.connections)
        outcome = finished(client.run(text="where am I"))
        asked = next(name for name in ("a", "b") if rig.front.connections[name] > before.get(name, 0))
        assert outcome["type"] == "interrupt" and outcome["interrupts"][0]["metadata"]["tool"] == "get_location", outcome
        call_id = outcome["interrupts"][0]["toolCallId"]
        kill(r.replica(asked))
        outcome = finished(client.run(resume=client.answer(True)))
        assert outcome == {"type": "success", "pendingToolCallIds": [call_id]}, outcome
        kill(r.replica("ab".replace(asked, "")))
        r.start_again(asked)
        client.messages.append({"id": "t-" + secrets.token_hex(4), "role": "tool", "toolCallId": call_id,
                                "content": json.dumps(HERE)})
        events = sent(client)
        assert finished(events) == {"type": "success"}, events
        assert "You are at latitude 35.68, longitude 139.76." in [m.get("content") for m in client.messages], client.messages
        # ADK's own record of the call: the plugin's placeholder while it waited, then the output, once.
        recorded = [p["functionResponse"]["response"] for e in adk_events(r.adk, client.thread, r.user)
                    for p in (e.get("content") or {}).get("parts") or []
                    if p.get("functionResponse", {}).get("name") == "get_location"]
        assert [response for response in recorded if "error" not in response] == [HERE], recorded
        assert_ag_ui_clean(client)


# ---- an approvers' call across replicas --------------------------------------------------------


@pytest.mark.parametrize("fault", ["none", *(pytest.param(f, marks=pytest.mark.chaos) for f in ("adk_restart", "b_killed"))])
def test_an_approvers_call_continues_the_open_run_across_replicas(tmp_path: Path, on_sqlite: Upstream, fault: str) -> None:
    """A payment the supervisors decide (quorum 2): the run on A shows the waiting activity and stays
    open (through an ADK restart on SQLite, `adk_restart`, or B killed -9 and started again,
    `b_killed`); both vote on B; A's open run streams the continuation and ends success; paid once."""
    with replicas(tmp_path, on=on_sqlite, approvals="confirm", tools=tools_with_supervisors(), extra=APPROVERS) as r:
        client = Client(r.a.base)
        stream = client.open(text="pay 2500 to Hanako", total=60)
        waiting = stream.until(lambda e: e["type"] == "ACTIVITY_SNAPSHOT")
        assert waiting["activityType"] == "adk_gateway.approval" and waiting["content"]["state"] == "waiting", waiting
        approval = wait_until(lambda: listed(r.b.base, 1).get(client.thread), "the approval listed on B")
        assert not stream.ended and r.ledger.of(client.thread) == []
        if fault == "adk_restart":
            restart_adk(r)
        elif fault == "b_killed":
            kill(r.b)
            r.start_again("b")
        for who in ("sup1", "sup2"):
            vote = approvers_api(r.b.base, "POST", f"/api/approvals/{approval['id']}", who, {"approved": True})
            assert vote.status == 200, vote.body
        assert vote.json()["outcome"] == "approved", vote.body
        events = client.done(stream)
        assert finished(events) == {"type": "success"}, events
        kinds = [e["type"] for e in events]
        assert "TOOL_CALL_RESULT" in kinds and kinds.index("ACTIVITY_SNAPSHOT") < kinds.index("TOOL_CALL_RESULT"), kinds
        decided = [e for e in events if e["type"] == "ACTIVITY_SNAPSHOT"][-1]
        assert decided["content"]["state"] == "decided", decided
        result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
        assert json.loads(result["content"])["success"] is True, result
        assert_paid_once(r, client, 1)
        assert_ag_ui_clean(client)
        r.ledger.assert_no_double_execution()


@pytest.mark.chaos
def test_an_approvers_call_outlives_the_replica_holding_its_open_run(tmp_path: Path, on_sqlite: Upstream) -> None:
    """A is killed (-9) while its AG-UI run waits for the supervisors: the client's connection drops
    (AG-UI has no reconnect, docs/ag-ui.md). Their votes on B still decide the call, which runs once;
    the thread goes on with the person's next message, on B, and nothing runs again."""
    with replicas(tmp_path, on=on_sqlite, approvals="confirm", tools=tools_with_supervisors(), extra=APPROVERS) as r:
        client = Client(r.a.base)
        stream = client.open(text="pay 2500 to Hanako", total=60)
        stream.until(lambda e: e["type"] == "ACTIVITY_SNAPSHOT")
        approval = wait_until(lambda: listed(r.b.base, 1).get(client.thread), "the approval listed on B")
        kill(r.a)
        dropped = stream.rest().chunks
        assert not {"RUN_FINISHED", "RUN_ERROR"} & {e["type"] for e in dropped}, dropped
        client.messages = thread_after(client.messages, dropped)
        for who in ("sup1", "sup2"):
            vote = approvers_api(r.b.base, "POST", f"/api/approvals/{approval['id']}", who, {"approved": True})
            assert vote.status == 200, vote.body
        assert vote.json()["outcome"] == "approved", vote.body
        wait_until(lambda: r.ledger.of(client.thread), "the payment, run by B", 20)
        client.url = r.b.base
        events = client.run(text="what is the weather in Tokyo")
        assert finished(events) == {"type": "success"} and "in Tokyo" in json.dumps(events), events
        assert_paid_once(r, client, 1)
        assert_ag_ui_clean(client)
        r.ledger.assert_no_double_execution()
