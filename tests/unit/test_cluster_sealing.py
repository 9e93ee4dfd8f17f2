"""What replicas exchange through Redis is sealed (gateway/cluster/sealing.py), and what fails the
seal is dropped as if absent (issue 24).

First the seal itself, sans IO; then a real redis-server into which a party who can write to Redis
(but does not hold `sessions.secret`) writes forgeries: a verdict that would release a gated call,
a ticket record, a relay entry, a refusal carrying a cookie; or replays what it captured. None of
them is acted on.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from gateway.core.approvals import REFUSAL_KEY, RUN
from gateway.access.auth import Identity
from gateway.cluster import redis_inbox as inbox_module
from gateway.cluster.liveness import Liveness
from gateway.cluster.messages import Decided, Refused, Released, Reply, from_json
from gateway.cluster.redis import RedisState
from gateway.cluster.remote_gate import RemoteGate
from gateway.cluster.sealing import Seal, Tampered
from gateway.cluster.shared import RelayEntry
from gateway.cluster.tasks import Tasks
from gateway.config.schema import parse_config
from gateway.core.refusals import HttpError
from gateway.ops.metrics import GatewayMetrics
from gateway.chat.registry import Registry
from gateway.access.tickets import Tickets
from tests.support.shared_state import HEARTBEAT, redis_state
from tests.support.cluster import never_asked
from tests.support.service import chat_service
from tests.procs import RedisServer, redis_server
from tests.support.logs import RecordingLog

SECRET = "s" * 32
NEW_SECRET = "n" * 32
BOUND = 5.0


# ---- the seal --------------------------------------------------------------------------------


def test_a_sealed_value_opens_to_what_was_sealed() -> None:
    seal = Seal([SECRET])
    for payload in (b"", b"{}", b'{"op":"verdict"}' * 1000, bytes(range(256))):
        assert seal.open(seal.seal(payload, "inbox:a"), "inbox:a") == payload


@pytest.mark.parametrize("position", [0, 1, 20, 33, -1])
def test_a_value_changed_anywhere_does_not_open(position: int) -> None:
    seal = Seal([SECRET])
    sealed = bytearray(seal.seal(b'{"op":"verdict","verdict":{"verdict":"deny"}}', "inbox:a"))
    sealed[position] ^= 0x01
    with pytest.raises(Tampered):
        seal.open(bytes(sealed), "inbox:a")


@pytest.mark.parametrize("forged", [b"", b"\x01", b'{"op":"verdict"}', b"\x01" + b"\x00" * 32 + b"{}"])
def test_what_was_never_sealed_does_not_open(forged: bytes) -> None:
    with pytest.raises(Tampered):
        Seal([SECRET]).open(forged, "inbox:a")


def test_a_value_sealed_under_another_key_does_not_open() -> None:
    with pytest.raises(Tampered):
        Seal([SECRET]).open(Seal(["x" * 32]).seal(b"{}", "inbox:a"), "inbox:a")


def test_a_value_sealed_for_one_place_does_not_open_in_another() -> None:
    # A call's sealed verdict copied to another call's record, or a message replayed to another
    # replica's inbox, is refused.
    seal = Seal([SECRET])
    with pytest.raises(Tampered):
        seal.open(seal.seal(b"run", "call:gw-1:verdict"), "call:gw-2:verdict")
    with pytest.raises(Tampered):
        seal.open(seal.seal(b"ab", "inbox:a"), "inbox:ab")


def test_rotation_accepts_every_listed_key_and_signs_with_the_first() -> None:
    old, both_old_signing, both_new_signing, new = (
        Seal([SECRET]), Seal([SECRET, NEW_SECRET]), Seal([NEW_SECRET, SECRET]), Seal([NEW_SECRET]),
    )
    # Step 1: the new key accepted everywhere, the old one still signing: everyone reads everyone.
    assert both_old_signing.open(old.seal(b"x", "c"), "c") == b"x"
    assert old.open(both_old_signing.seal(b"x", "c"), "c") == b"x"
    # Step 2: the new key signs; replicas still listing the old one read both.
    assert both_old_signing.open(both_new_signing.seal(b"x", "c"), "c") == b"x"
    assert both_new_signing.open(both_old_signing.seal(b"x", "c"), "c") == b"x"
    # Step 3: the old key dropped: what it sealed no longer opens.
    assert new.open(both_new_signing.seal(b"x", "c"), "c") == b"x"
    with pytest.raises(Tampered):
        new.open(old.seal(b"x", "c"), "c")


def test_a_seal_needs_a_key() -> None:
    with pytest.raises(ValueError):
        Seal([])
    with pytest.raises(ValueError):
        Seal([""])


# ---- forgeries in a real Redis -----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as running:
        yield running


class Forger:
    """A party that can read and write Redis, but does not hold the replicas' secret."""

    def __init__(self, server: RedisServer, prefix: str) -> None:
        self.redis = aioredis.Redis.from_url(server.url)
        self.prefix = prefix

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def publish(self, replica: str, message: dict[str, Any], seal: Seal | None = None) -> None:
        data = orjson.dumps(message)
        channel = self.key("inbox", replica)
        await self.redis.publish(channel, seal.seal(data, channel) if seal is not None else data)


@pytest.fixture
async def cluster(server: RedisServer) -> AsyncIterator[tuple[RedisState, RedisState, list[dict[str, Any]], Forger]]:
    """Replicas a and b on one Redis and one secret; b's inbox is recorded."""
    prefix = "t" + secrets.token_hex(4)
    a, b = (
        redis_state(server, name, prefix, seal=Seal([SECRET]))
        for name in ("a", "b")
    )
    inbox: list[dict[str, Any]] = []
    await a.start(lambda message: None, lambda: [])
    await b.start(inbox.append, lambda: [])
    forger = Forger(server, prefix)
    try:
        yield a, b, inbox, forger
    finally:
        await a.close()
        await b.close()
        await forger.redis.aclose()


async def _until(condition: Any) -> None:
    async with asyncio.timeout(BOUND):
        while not condition():
            await asyncio.sleep(0.01)


async def test_an_inbox_message_not_sealed_by_a_replica_is_dropped(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, inbox, forger = cluster
    log = RecordingLog()
    monkeypatch.setattr(inbox_module, "log", log)
    await asyncio.sleep(0.2)  # b's subscription is up
    release = Released("gw-1", Decided(RUN, "run")).to_json()
    await forger.publish("b", release)  # no seal at all
    await forger.publish("b", release, Seal(["x" * 32]))  # another key
    # A refusal whose cookie would have been copied into b's browser's response.
    await forger.publish("b", Reply("r1", Refused(503, "x", "y", {"Set-Cookie": "sid=forged"})).to_json())
    await a.send("b", {"op": "genuine"})
    await _until(lambda: inbox)
    await asyncio.sleep(0.1)
    assert inbox == [{"op": "genuine"}]
    dropped = log.named("inbox_message_tampered")
    assert dropped == [{"replica": "b"}] * 3  # said without the content


async def test_a_sealed_message_replayed_to_another_replicas_inbox_is_dropped(cluster: Any) -> None:
    a, b, inbox, forger = cluster
    await asyncio.sleep(0.2)
    # Sealed with the right key, but for a's inbox: a copy of a's traffic published to b.
    channel = forger.key("inbox", "a")
    await forger.redis.publish(forger.key("inbox", "b"), Seal([SECRET]).seal(b'{"op":"copied"}', channel))
    await a.send("b", {"op": "genuine"})
    await _until(lambda: inbox)
    await asyncio.sleep(0.1)
    assert inbox == [{"op": "genuine"}]


async def test_a_sealed_message_published_again_is_delivered_once(cluster: Any) -> None:
    """A Redis reader captures a forwarded message (say, a user's Submit) and publishes it again to
    the same inbox: the owner does the work once."""
    a, b, inbox, forger = cluster
    spy = forger.redis.pubsub()
    await spy.subscribe(forger.key("inbox", "b"))
    await asyncio.sleep(0.2)
    await a.send("b", {"op": "genuine"})
    async with asyncio.timeout(BOUND):
        captured = None
        while captured is None:
            message = await spy.get_message(ignore_subscribe_messages=True, timeout=0.1)
            captured = message["data"] if message else None
    await forger.redis.publish(forger.key("inbox", "b"), captured)
    await a.send("b", {"op": "after"})
    await _until(lambda: len(inbox) >= 2)
    await asyncio.sleep(0.1)
    assert inbox == [{"op": "genuine"}, {"op": "after"}]
    await spy.aclose()


async def test_a_sealed_message_older_than_its_window_is_dropped(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captured long ago (past the window a replica remembers messages it received), it is stale."""
    a, b, inbox, forger = cluster
    log = RecordingLog()
    monkeypatch.setattr(inbox_module, "log", log)
    await asyncio.sleep(0.2)
    channel = forger.key("inbox", "b")
    # As a sent it, but stamped a minute ago on Redis's clock.
    seconds, micros = await forger.redis.time()
    old = seconds * 1000 + micros // 1000 - 60_000
    await forger.redis.publish(channel, Seal([SECRET]).seal(b"%d\n{\"op\":\"stale\"}" % old, channel))
    await a.send("b", {"op": "genuine"})
    await _until(lambda: inbox)
    await asyncio.sleep(0.1)
    assert inbox == [{"op": "genuine"}]
    [replayed] = log.named("inbox_message_replayed")
    assert replayed["reason"] == "stale" and 59 <= replayed["age_s"] <= 61


async def test_a_forged_call_record_reads_as_absent(cluster: Any) -> None:
    a, b, inbox, forger = cluster
    await a.put_call("gw-1", {"user": "alice", "chat": "c1", "owner": "a", "tool": "pay"}, ttl=60)
    assert await b.get_call("gw-1") == {"user": "alice", "chat": "c1", "owner": "a", "tool": "pay"}
    await a.put_call("gw-1", {"verdict": '{"verdict":"deny"}'}, ttl=60)
    assert (await b.get_call("gw-1") or {}).get("verdict") == '{"verdict":"deny"}'
    # The verdict overwritten in place: the record is tampered with, so it is lost.
    await forger.redis.hset(forger.key("call", "gw-1"), "verdict", orjson.dumps(RUN.as_json()))
    assert await b.get_call("gw-1") is None
    # A whole record written by the forger.
    await forger.redis.hset(forger.key("call", "gw-2"), mapping={"owner": "a", "verdict": orjson.dumps(RUN.as_json())})
    assert await b.get_call("gw-2") is None
    # A genuine sealed verdict copied from another call's record.
    await a.put_call("gw-3", {"verdict": orjson.dumps(RUN.as_json()).decode()}, ttl=60)
    copied = await forger.redis.hget(forger.key("call", "gw-3"), "verdict")
    await forger.redis.hset(forger.key("call", "gw-4"), "verdict", copied)
    assert await b.get_call("gw-4") is None


async def test_a_forged_or_moved_deadline_is_never_claimed(cluster: Any) -> None:
    from gateway.core.deadlines import Deadline

    a, b, inbox, forger = cluster
    genuine = Deadline("demo_agent", "alice", "c1", "adk-1", "call-1", "pay", 10.0)
    await a.add_deadline(genuine)
    # A deadline written by the forger, due now, for someone else's confirmation.
    forged = Deadline("demo_agent", "bob", "c2", "adk-2", "call-2", "pay", 5.0)
    await forger.redis.zadd(forger.key("deadlines"), {forged.key: 5.0})
    await forger.redis.hset(forger.key("deadline"), forged.key, forged.to_json())
    # The genuine sealed record copied to another confirmation's key.
    sealed = await forger.redis.hget(forger.key("deadline"), genuine.key)
    await forger.redis.zadd(forger.key("deadlines"), {"c3/adk-3": 5.0})
    await forger.redis.hset(forger.key("deadline"), "c3/adk-3", sealed)
    assert await b.claim_deadlines(100.0, lease=30.0) == [genuine]
    # The forged ones are gone for good; only the genuine one comes back, once b's lease ended.
    assert await a.claim_deadlines(100.0) == [] and await a.next_deadline() == 130.0
    assert await forger.redis.zrange(forger.key("deadlines"), 0, -1) == [genuine.key.encode()]
    assert await a.claim_deadlines(1e12) == [genuine]


async def test_a_forged_ticket_record_opens_no_socket(cluster: Any) -> None:
    a, b, inbox, forger = cluster
    issued = await Tickets(a).issue(Identity("alice", {}), agent="demo_agent", origin=None, fingerprint="f", ttl=30)
    assert (await Tickets(b).redeem(issued.value, agent="demo_agent", origin=None, fingerprint="f")).user_id == "alice"
    # The forger makes up a ticket and writes its record, as a replica would have.
    value = "wst_" + secrets.token_urlsafe(32)
    record = {"user": "alice", "claims": "{}", "agent": "demo_agent", "origin": "", "auth": "f"}
    await forger.redis.set(forger.key("ticket", hashlib.sha256(value.encode()).hexdigest()), orjson.dumps(record), px=30_000)
    with pytest.raises(HttpError) as refused:
        await Tickets(b).redeem(value, agent="demo_agent", origin=None, fingerprint="f")
    assert refused.value.status == 401


async def test_a_genuine_ticket_record_written_back_after_its_lifetime_opens_no_socket(cluster: Any) -> None:
    a, b, inbox, forger = cluster
    issued = await Tickets(a).issue(Identity("alice", {}), agent="demo_agent", origin=None, fingerprint="f", ttl=0.2)
    name = forger.key("ticket", hashlib.sha256(issued.value.encode()).hexdigest())
    captured = await forger.redis.get(name)
    await Tickets(b).redeem(issued.value, agent="demo_agent", origin=None, fingerprint="f")
    await asyncio.sleep(0.3)
    await forger.redis.set(name, captured, px=30_000)  # replayed, with a longer expiry
    with pytest.raises(HttpError) as refused:
        await Tickets(b).redeem(issued.value, agent="demo_agent", origin=None, fingerprint="f")
    assert refused.value.status == 401


async def test_a_forged_relay_entry_is_not_handed_out(cluster: Any) -> None:
    a, b, inbox, forger = cluster
    # The forger gets in first, with the entry a reader expects next.
    await forger.redis.xadd(forger.key("relay", "k1"), {"n": 0, "f": b'{"type":"text-delta","delta":"phish"}'})
    await forger.redis.xadd(forger.key("relay", "k1"), {"s": b"\x01" + b"\x00" * 32 + b"0\n\n{}"})
    await a.relay_append("k1", RelayEntry(0, [b'{"type":"start"}', b'{"type":"finish"}']))
    await a.relay_append("k1", RelayEntry(2, end="done"))
    entries: list[RelayEntry] = []
    after = ""
    while not entries or entries[-1].end is None:
        after, more = await b.relay_read("k1", after, timeout=1.0)
        assert more or entries, "the relay's genuine entries were not read"
        entries += more
    assert entries == [RelayEntry(0, [b'{"type":"start"}', b'{"type":"finish"}']), RelayEntry(2, end="done")]


async def test_a_forged_or_moved_chat_state_reads_as_absent(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat's state says which calls wait for a person and what was answered: one written by the
    forger, or a genuine one copied from another chat, is not read (logged without its content)."""
    from gateway.cluster import redis_records as records_module

    a, b, inbox, forger = cluster
    log = RecordingLog()
    monkeypatch.setattr(records_module, "log", log)
    state = {"ledger": {"adk-1": {"tool": "pay", "secret_arg": "IBAN-123"}}}
    await a.put_chat_state("alice", "c1", state, ttl=60)
    assert await b.get_chat_state("alice", "c1") == state
    # Not sealed at all.
    await forger.redis.set(forger.key("state", "c2"), orjson.dumps({"user": "alice", "state": state}), px=60_000)
    assert await b.get_chat_state("alice", "c2") is None
    # Sealed under another key.
    other = Seal(["x" * 32]).seal(orjson.dumps({"user": "alice", "state": state}), forger.key("state", "c2"))
    await forger.redis.set(forger.key("state", "c2"), other, px=60_000)
    assert await b.get_chat_state("alice", "c2") is None
    # Alice's genuine state copied to another chat's key (mallory's chat, or another of alice's).
    copied = await forger.redis.get(forger.key("state", "c1"))
    await forger.redis.set(forger.key("state", "c3"), copied, px=60_000)
    assert await b.get_chat_state("alice", "c3") is None
    assert await b.get_chat_state("mallory", "c3") is None
    # A byte changed in place.
    await forger.redis.set(forger.key("state", "c1"), copied[:-2] + b"0}", px=60_000)
    assert await b.get_chat_state("alice", "c1") is None
    assert log.named("chat_state_tampered") == [{"replica": "b", "chat_id": c} for c in ("c2", "c2", "c3", "c3", "c1")]
    assert "IBAN" not in repr(log.events)


async def test_a_sealed_chat_state_that_is_no_state_reads_as_absent(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sealed by a replica (of another release, say) but not `{"user", "state": {...}}`: not read."""
    from gateway.cluster import redis_records as records_module

    a, b, inbox, forger = cluster
    log = RecordingLog()
    monkeypatch.setattr(records_module, "log", log)
    seal = Seal([SECRET])
    for n, payload in enumerate([b"not json", b"[1, 2]", b'{"user": "alice", "state": [1]}', b'{"user": "alice"}']):
        name = forger.key("state", f"c{n}")
        await forger.redis.set(name, seal.seal(payload, name), px=60_000)
        assert await b.get_chat_state("alice", f"c{n}") is None
    assert len(log.named("chat_state_tampered")) == 1  # not JSON
    assert len(log.named("chat_state_unreadable")) == 3
    # Under its user's id only: another's read is refused and said, without the content.
    await a.put_chat_state("alice", "c9", {"ledger": {"adk-1": {"secret_arg": "IBAN-123"}}}, ttl=60)
    assert await b.get_chat_state("mallory", "c9") is None
    assert log.named("chat_state_foreign") == [{"replica": "b", "chat_id": "c9"}]
    assert "IBAN" not in repr(log.events)


# ---- a forged verdict does not release a gated call ---------------------------------------------

GATED = """
internal:
  secret: test-secret
# The held engine (the plugin's held request, `gw-` ids): live mode's one way to wait.
upstream:
  mode: live
tools:
  pay:
    approval: true
    timeout: 300ms
sessions:
  forward_timeout: 100ms
"""


async def test_a_forged_released_never_releases_a_gated_call(cluster: Any) -> None:
    """b holds the plugin's request for a call waiting on a (alive); the forger publishes a
    `Released` that runs it and writes the verdict into the call's record: b refuses the call when
    the owner's deadline passes, as when the verdict is lost."""
    a, b, inbox, forger = cluster
    config = parse_config(GATED, env={})
    metrics = GatewayMetrics()
    chats = chat_service(config, registry=Registry(10), metrics=metrics)
    tasks = Tasks()
    gates = RemoteGate(b, chats.gates, metrics, tasks, Liveness(b, HEARTBEAT), never_asked, forward_timeout=0.1)
    # What b's router does with a message that opened (gateway/cluster/router.py).
    delivered = len(inbox)

    async def route() -> None:
        nonlocal delivered
        while True:
            await asyncio.sleep(0.01)
            for raw in inbox[delivered:]:
                message = from_json(raw)
                if isinstance(message, Released):
                    gates.released(message)
            delivered = len(inbox)

    router = asyncio.create_task(route())
    try:
        await a.put_call("gw-9", {"user": "alice", "chat": "c1", "owner": "a", "tool": "pay"}, ttl=60)
        waiting = asyncio.create_task(gates.await_verdict("gw-9", "a", "demo_agent", "pay"))
        await asyncio.sleep(0.2)
        await forger.publish("b", Released("gw-9", Decided(RUN, "run")).to_json())
        await forger.redis.hset(forger.key("call", "gw-9"), "verdict", orjson.dumps(RUN.as_json()))
        async with asyncio.timeout(BOUND):
            verdict, result = await waiting
        assert not verdict.run and verdict.response is not None and REFUSAL_KEY in verdict.response
        assert result == "verdict_lost"
    finally:
        router.cancel()
        await tasks.close(1.0)
