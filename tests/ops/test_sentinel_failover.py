"""Redis that fails over (issue 28, item 2): a real Sentinel failover under two replicas.

A primary redis-server and a replica of it (`--replicaof`), three redis-sentinel processes (quorum 2,
failure detection scaled down to half a second), replicas A and B configured with the sentinels
(`sessions.redis_sentinels`, no redis_url host), the stock ADK API server with the plugin behind a
round-robin balancer and its ledger of real payments. Payments wait for a person on both replicas
(ADK's confirmations, each chat's record of them in Redis) while a response streams from A to a
browser reading through B (relayed through Redis). Then kill -9 of the primary, mid-traffic:

- the sentinels promote the replica, and both gateways follow without a restart (their next
  connection asks the sentinels): ready again, new chats on each, no `shared_state_reset` (the
  promoted replica holds the epoch, so nothing is "restored" over live data);
- the relayed stream ends once, cleanly (finished, or one error);
- every approval pending before the kill is answered: it runs once (approved), never (denied), or
  is refused with a clear error (fails closed) if what it needed was lost in the window;
- zero double executions (the ledger), and a replay of each answer runs nothing;
- what asynchronous replication lost in the window is measured (a writer counting on the primary
  until it dies, against what the promoted replica has; the gateway's keys before and after) and
  reported, with the time the failover and the gateways' recovery took.

Select it alone with `PYTEST_ARGS='-k sentinel'`.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.ops.checks import Browser, Stream, answer, assert_one_terminal, assert_sdk_clean, new_chat, text_of, types_of, user
from tests.ops.stack import Replicas, payment_responses, replicas, wait_until
from tests.ops.test_failure_modes import log_events, long_stream, owned_by, start_payment
from tests.procs import RedisSentinel, RedisServer, request, resp_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SERVICE = "gw-primary"
PREFIX = "gw-test"


@dataclass
class Store:
    primary: RedisServer
    replica: RedisServer
    sentinels: list[RedisSentinel]

    def reach(self) -> str:
        """The replicas' `sessions` keys for this store: the sentinels, and no redis_url host."""
        listed = ", ".join(f"'{s.address}'" for s in self.sentinels)
        return f"  redis_sentinels: [{listed}]\n  redis_sentinel_service: {SERVICE}\n"

    def promoted(self) -> bool:
        """A majority of the sentinels name the replica as the primary, and it says it is one."""
        def names_replica(s: RedisSentinel) -> bool:
            try:
                return s.primary() == ("127.0.0.1", self.replica.port)
            except OSError:
                return False

        if sum(names_replica(s) for s in self.sentinels) < 2:
            return False
        return "role:master" in resp_command(self.replica.port, "INFO", "replication")


@contextmanager
def sentinel_store(tmp: Path) -> Iterator[Store]:
    """The primary, its replica in sync, three sentinels that all see both and each other."""
    with ExitStack() as stack:
        primary = RedisServer(tmp)
        primary.start()
        stack.callback(primary.stop)
        replica = RedisServer(tmp, replica_of=primary.port)
        replica.start()
        stack.callback(replica.stop)
        sentinels = [RedisSentinel(tmp, primary.port, SERVICE) for _ in range(3)]
        for sentinel in sentinels:
            sentinel.start()
            stack.callback(sentinel.stop)
        wait_until(lambda: "master_link_status:up" in resp_command(replica.port, "INFO", "replication"),
                   "the replica's first sync", 20, every=0.1)
        # Sentinels learn the replica from the primary's INFO, and each other from its hello channel
        # (every 2 s): a failover needs both.
        for sentinel in sentinels:
            wait_until(lambda s=sentinel: int(s.state()["num-slaves"]) >= 1 and int(s.state()["num-other-sentinels"]) == 2,
                       f"sentinel {sentinel.port} to see the replica and the other sentinels", 30, every=0.2)
        yield Store(primary, replica, sentinels)


class WriteProbe(threading.Thread):
    """INCRs one key on the primary as fast as one connection can until it dies: `acked` is the last
    value the primary acknowledged, to compare with what the promoted replica holds."""

    def __init__(self, port: int) -> None:
        super().__init__(name="write-probe", daemon=True)
        self.port = port
        self.acked = 0

    def run(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                reader = sock.makefile("rb")
                command = b"*2\r\n$4\r\nINCR\r\n$11\r\nprobe:count\r\n"
                while True:
                    sock.sendall(command)
                    line = reader.readline()
                    if not line.startswith(b":"):
                        return
                    self.acked = int(line[1:-2])
        except OSError:
            return


def gateway_keys(port: int) -> dict[str, str]:
    """The gateway's keys and their values (DUMP), but the heartbeats: they live for owner_timeout
    and are written again every heartbeat, not data to keep."""
    keys = [k for k in resp_command(port, "KEYS", f"{PREFIX}:*") if not k.startswith((f"{PREFIX}:replica:", f"{PREFIX}:beats"))]
    return {k: _content(port, k) for k in keys}


def _content(port: int, key: str) -> str:
    """A key's value, as data (DUMP would also tell encodings apart, which replication may change)."""
    kind = resp_command(port, "TYPE", key)
    read = {
        "string": ("GET",), "hash": ("HGETALL",), "set": ("SMEMBERS",), "list": ("LRANGE", "0", "-1"),
        "zset": ("ZRANGE", "0", "-1", "WITHSCORES"), "stream": ("XRANGE", "-", "+"),
    }.get(kind)
    if read is None:
        return kind  # gone meanwhile ("none")
    value = resp_command(port, read[0], key, *read[1:])
    if kind == "hash":
        value = sorted(zip(value[::2], value[1::2]))
    elif kind == "set":
        value = sorted(value)
    return f"{kind} {value!r}"


def window_loss(before: dict[str, str], after: dict[str, str]) -> tuple[int, str]:
    """What the promoted replica holds older than the primary did at the kill, by kind of key: how
    many keys differ, and a summary."""
    def kind(key: str) -> str:
        return key.split(":")[1]

    lost = sorted(kind(k) for k in before.keys() - after.keys())
    back = sorted(kind(k) for k in after.keys() - before.keys())
    older = sorted(kind(k) for k in before.keys() & after.keys() if before[k] != after[k])
    return len(lost) + len(older) + len(back), (
        f"{len(before)} keys at the kill: {len(lost)} missing {lost}, {len(older)} older {older}, {len(back)} back {back}"
    )


class ReadyWatch(threading.Thread):
    """Polls both replicas' /readyz from the kill on: `back[name]`, seconds from the kill to ready
    again after having been seen unready; `seen`, each replica's statuses in order."""

    def __init__(self, r: Replicas, since: float) -> None:
        super().__init__(name="ready-watch", daemon=True)
        self.r = r
        self.since = since
        self.back: dict[str, float] = {}
        self.seen: dict[str, list[str]] = {"a": [], "b": []}

    def run(self) -> None:
        deadline = self.since + 60
        while len(self.back) < 2 and time.monotonic() < deadline:
            for name in ("a", "b"):
                if name in self.back:
                    continue
                status = request(self.r.replica(name).base, "GET", "/readyz").json()["status"]
                if not self.seen[name] or self.seen[name][-1] != status:
                    self.seen[name].append(status)
                if status == "ready" and len(self.seen[name]) > 1:
                    self.back[name] = time.monotonic() - self.since
            time.sleep(0.02)


def _sentinel_events(sentinel: RedisSentinel) -> str:
    """The failover's steps in one sentinel's log, with their times (ms)."""
    steps = ("+sdown master", "+odown", "+elected-leader", "+selected-slave", "+promoted-slave", "+switch-master")
    lines = [line for line in sentinel.log.read_text().splitlines() if any(step in line for step in steps)]
    return "; ".join(f"{line.split()[4][-6:]} {line.split()[6]}" for line in lines if len(line.split()) > 6)


@dataclass
class Pending:
    chat: str
    message: dict[str, Any]
    first: list[dict[str, Any]]
    approved: bool
    owner: str
    outcome: str = ""
    replays: list[int] = field(default_factory=list)


def send_answer(r: Replicas, base: str, p: Pending) -> Stream:
    reply = answer(p.first, p.approved)
    return Browser(r.headers).post(base, p.chat, [p.message, reply], messageId=reply["id"])


def ask_four(r: Replicas) -> list[Pending]:
    """Payments waiting for a person: two chats owned by each replica, one to approve, one to deny."""
    pendings = []
    for name, amount, approved in (("a", 11, True), ("a", 12, False), ("b", 13, True), ("b", 14, False)):
        chat, message, first = start_payment(r, r.replica(name), f"pay {amount} to Hanako")
        pendings.append(Pending(chat, message, first, approved, name))
    return pendings


def other_than(r: Replicas, p: Pending) -> str:
    return (r.b if p.owner == "a" else r.a).base


def answer_through_the_other(r: Replicas, p: Pending) -> None:
    """The person answers through the replica that does not own the chat: the answer runs (or
    refuses) the payment, or is refused clearly (failing closed), never run without the answer."""
    stream = send_answer(r, other_than(r, p), p)
    if stream.status == 200:
        chunks = assert_one_terminal(stream, error=False)
        want = "tool-output-available" if p.approved else "tool-output-denied"
        assert chunks[1]["type"] == want, chunks[:3]
        assert_sdk_clean(p.first, chunks)
        p.outcome = "answered"
    else:
        body = stream.json()
        assert stream.status in (409, 410, 503) and body["error"]["code"], stream.body
        p.outcome = f"{stream.status} {body['error']['code']}"


def assert_nothing_twice(r: Replicas, pendings: list[Pending]) -> None:
    """Each answer replayed on both replicas runs nothing; each approved and answered payment ran
    once, every other never, as ADK recorded; the ledger has no double execution."""
    for p in pendings:
        for gw in (r.a, r.b):
            replay = send_answer(r, gw.base, p)
            p.replays.append(replay.status)
            assert replay.status != 200 or "tool-output-available" not in types_of(replay.chunks)[:2], replay.body
    for p in pendings:
        ran = r.ledger.of(p.chat)
        assert len(ran) == (1 if p.approved and p.outcome == "answered" else 0), (p, ran)
        r.ledger.assert_matches(p.chat, payment_responses(r.adk, p.chat, r.user))
    r.ledger.assert_no_double_execution()


def assert_no_reset(r: Replicas) -> None:
    """The promoted replica held the dataset's epoch: no replica took the failover for lost data
    (which would write its chats back over the new primary's), and nothing logged an error."""
    for gw in (r.a, r.b):
        assert not log_events(gw, "shared_state_reset"), log_events(gw, "shared_state_reset")
        assert not [line for line in gw.log_lines() if line.get("level") in ("error", "critical")], gw.log_text()[-3000:]


@dataclass
class Failover:
    promoted_in: float  # seconds from the kill to the sentinels naming the replica
    watch: ReadyWatch
    held: dict[str, str]  # the gateway's keys the replica held once the primary was dead


def failover(ha: Store, r: Replicas, *, resume: subprocess.Popen[Any] | None = None) -> Failover:
    """kill -9 of the primary (then SIGCONT to `resume`, a stopped replica); back once the sentinels
    promoted the replica and both gateways are ready again (without a restart)."""
    killed = time.monotonic()
    watch = ReadyWatch(r, killed)
    ha.primary.stop()  # kill -9
    if resume is not None:
        resume.send_signal(signal.SIGCONT)
    # With its primary dead, the replica holds all it will ever get, and nobody writes to it
    # before its promotion (half a second of down-after at least): what the new primary starts with.
    held = gateway_keys(ha.replica.port)
    watch.start()
    wait_until(ha.promoted, "the sentinels to promote the replica", 60, every=0.05)
    promoted_in = time.monotonic() - killed
    watch.join(60)
    assert set(watch.back) == {"a", "b"}, watch.seen
    return Failover(promoted_in, watch, held)


def _stack(tmp_path: Path, ha: Store) -> Any:
    return replicas(
        tmp_path, plugin_via="balancer", adk_env={"DEMO_CHUNK_DELAY": "0.15"},
        store=(ha.primary, ha.reach()),
    )


def test_sentinel_failover_with_approvals_pending_and_a_relayed_stream(tmp_path: Path) -> None:
    """kill -9 of the primary mid-traffic: followed, nothing lost that was answered, nothing run twice."""
    with sentinel_store(tmp_path) as ha, _stack(tmp_path, ha) as r:
        browser = Browser(r.headers)
        pendings = ask_four(r)
        relayed_chat, history = owned_by(r, r.a)
        _, relayed = long_stream(r, r.b, relayed_chat, history)

        probe = WriteProbe(ha.primary.port)
        probe.start()
        wait_until(lambda: probe.acked > 1000, "the write probe to run", 10)
        before = gateway_keys(ha.primary.port)
        done = failover(ha, r)
        promoted_in, watch = done.promoted_in, done.watch
        probe.join(10)
        # Serving again, each replica on its own: a new chat (claimed in the new primary) answered.
        serving_in = {}
        for name in ("a", "b"):
            fresh = browser.post(r.replica(name).base, new_chat(), [user("weather in Kyoto")])
            assert fresh.status == 200 and "Kyoto" in text_of(assert_one_terminal(fresh, error=False)), fresh.body
            serving_in[name] = time.monotonic() - watch.since
        # The response relayed through Redis across the kill ended once, cleanly, for the SDK.
        relayed_end = assert_one_terminal(relayed.rest())
        assert_sdk_clean(relayed_end)

        kept = int(resp_command(ha.replica.port, "GET", "probe:count") or 0)
        _, lost = window_loss(before, done.held)
        assert_no_reset(r)
        # Each inbox subscribed again, on the new primary (the answers below are forwarded through
        # them). Asked of the primary itself: redis-py's one retry may resubscribe before the inbox
        # loop sees the failure, and then no reconnect is logged.
        wait_until(lambda: len(resp_command(ha.replica.port, "PUBSUB", "CHANNELS", f"{PREFIX}:inbox:*")) == 2,
                   "both replicas' inboxes to subscribe on the promoted primary", 15)
        for p in pendings:
            answer_through_the_other(r, p)
        assert_nothing_twice(r, pendings)

        relayed_how = "finished" if "error" not in types_of(relayed_end) else "one error chunk, then finish"
        print(
            f"\nsentinel failover: promoted {promoted_in:.2f}s after kill -9 (the test saw it), replicas ready again "
            f"A {watch.back['a']:.2f}s, B {watch.back['b']:.2f}s; a new chat answered by A at {serving_in['a']:.2f}s, "
            f"by B at {serving_in['b']:.2f}s"
            f"\n  sentinel: {_sentinel_events(ha.sentinels[0])}"
            f"\n  window: the primary acked {probe.acked} INCRs, the promoted replica has {kept} "
            f"({max(probe.acked - kept, 0)} lost); gateway {lost}"
            f"\n  readiness: {watch.seen}"
            f"\n  relayed stream: {relayed_how}; approvals: {[(p.owner, p.approved, p.outcome, p.replays) for p in pendings]}"
        )


@pytest.mark.chaos
def test_sentinel_failover_that_loses_the_last_writes_fails_closed(tmp_path: Path) -> None:
    """The worst window asynchronous replication allows: the replica is cut off (SIGSTOP, its link
    killed) while two payments are approved and run, the primary dies with everything those
    answers wrote unreplicated, the replica resumes (SIGCONT) and is promoted without it. The
    gateways must not run either payment again for a replayed answer, or for a vote on an approval
    the lost writes had decided, on either replica; the other approvals still work."""
    with sentinel_store(tmp_path) as ha, _stack(tmp_path, ha) as r:
        pendings = ask_four(r)
        early = [p for p in pendings if p.approved]
        assert ha.replica.proc is not None
        offset = _offset(ha.primary.port)
        ha.replica.proc.send_signal(signal.SIGSTOP)
        # The link cut while the replica cannot reconnect: from here on the primary's writes stay in
        # its backlog, never sent (a stopped replica alone would still read them from its socket).
        assert resp_command(ha.primary.port, "CLIENT", "KILL", "TYPE", "replica") == 1
        answering = [threading.Thread(target=answer_through_the_other, args=(r, p)) for p in early]
        for thread in answering:
            thread.start()
        for thread in answering:
            thread.join(30)
        assert [p.outcome for p in early] == ["answered", "answered"], early
        assert [len(r.ledger.of(p.chat)) for p in early] == [1, 1]
        unreplicated = _offset(ha.primary.port) - offset
        before = gateway_keys(ha.primary.port)
        done = failover(ha, r, resume=ha.replica.proc)
        promoted_in, watch = done.promoted_in, done.watch
        differ, lost = window_loss(before, done.held)
        assert differ > 0, lost  # the window did lose what the answers wrote
        assert_no_reset(r)
        # The answered approvals' decisions were lost with the window: the directory may list them
        # as pending again. A vote on one now is refused or decides nothing that runs: the call was
        # released once, by its owner, and its owner holds no call to release again.
        relisted = []
        for gw in (r.a, r.b):
            listed = request(gw.base, "GET", "/api/approvals?state=pending", headers=r.headers)
            assert listed.status == 200, listed.body
            ids = {a["id"] for a in listed.json()["approvals"]}
            for p in early:
                approval = _approval_id(p)
                if approval in ids:
                    vote = request(gw.base, "POST", f"/api/approvals/{approval}", {"approved": True}, headers=r.headers)
                    relisted.append((p.owner, vote.status, vote.json().get("error", {}).get("code") or vote.json().get("state")))
        time.sleep(1)  # a decision, had one gone out, would have reached its owner by now
        assert [len(r.ledger.of(p.chat)) for p in early] == [1, 1], relisted
        for p in pendings:
            if p not in early:
                answer_through_the_other(r, p)
        assert_nothing_twice(r, pendings)
        print(
            f"\nsentinel failover, lossy window: promoted {promoted_in:.2f}s after kill -9, replicas ready again "
            f"A {watch.back['a']:.2f}s, B {watch.back['b']:.2f}s"
            f"\n  {unreplicated} bytes of writes never reached the replica; gateway {lost}"
            f"\n  answered approvals listed pending again, and the vote on them: {relisted}"
            f"\n  approvals: {[(p.owner, p.approved, p.outcome, p.replays) for p in pendings]}"
        )


def _approval_id(p: Pending) -> str:
    return next(c for c in p.first if c["type"] == "tool-approval-request")["approvalId"]


def _offset(port: int) -> int:
    """The primary's replication offset: how many bytes of writes it has sent its replicas' way."""
    info = resp_command(port, "INFO", "replication")
    return int(next(line for line in info.splitlines() if line.startswith("master_repl_offset:")).split(":")[1])
