"""The wait before the next run on a session whose last run the gateway cut (upstream/cut_runs.py):
on ADK's reads of the session, with a clock the test moves and no real sleep."""

from __future__ import annotations

from typing import Any

from gateway.upstream.cut_runs import BOUND, POLL, QUIET, SessionWrites, settle_cut
from tests.support.clock import Clock

USER = {"author": "user", "content": {"parts": [{"text": "hello"}]}}
SEAL = {"author": "demo_agent", "errorCode": "INVOCATION_ABORTED", "errorMessage": "Invocation was aborted by client."}


def session(*events: dict[str, Any], updated: float = 1.0) -> dict[str, Any]:
    return {"id": "s", "events": list(events), "lastUpdateTime": updated}


class Adk:
    """ADK's session as each read finds it (the last one stays), and the time the wait takes."""

    def __init__(self, *reads: Any) -> None:
        self.reads = list(reads)
        self.count = 0
        self.clock = Clock(0.0)

    @property
    def now(self) -> float:
        return self.clock.now

    async def read(self) -> Any:
        self.count += 1
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


async def settle(adk: Adk) -> bool:
    return await settle_cut(adk.read, clock=adk.clock, sleep=adk.clock.sleep)


async def test_a_seal_that_stays_the_last_write_ends_the_wait_at_the_next_poll() -> None:
    writing = session(USER, updated=1.0)
    adk = Adk(writing, session(USER, SEAL, updated=1.2))
    assert await settle(adk)
    assert adk.count == 3 and adk.now == 2 * POLL


async def test_a_seal_followed_by_another_write_is_waited_past() -> None:
    # ADK seals each group of dangling calls with its own event: the first is not the end.
    adk = Adk(session(USER, SEAL, updated=1.0), session(USER, SEAL, SEAL, updated=1.1))
    assert await settle(adk)
    assert adk.count == 3


async def test_without_a_seal_a_session_unchanged_for_the_quiet_span_is_settled() -> None:
    # An ADK before 2.11 writes nothing after a cut.
    adk = Adk(session(USER, {"author": "a", "content": {}}))
    assert await settle(adk)
    assert QUIET <= adk.now < QUIET + 2 * POLL


async def test_a_run_that_keeps_writing_is_waited_for_at_most_the_bound() -> None:
    class Busy(Adk):
        async def read(self) -> Any:
            self.count += 1
            return session(USER, updated=float(self.count))

    adk = Busy()
    assert not await settle(adk)
    assert BOUND <= adk.now < BOUND + 2 * POLL


async def test_no_session_is_nothing_to_wait_for() -> None:
    adk = Adk(None)
    assert await settle(adk)
    assert adk.count == 1 and adk.now == 0


def test_what_a_read_says_of_the_writes_in_either_key_case() -> None:
    assert SessionWrites.of(session(USER, SEAL, updated=3.0)) == SessionWrites(2, 3.0, True)
    snake = {"events": [{"error_code": "INVOCATION_ABORTED"}], "last_update_time": 4.0}
    assert SessionWrites.of(snake) == SessionWrites(1, 4.0, True)
    assert SessionWrites.of(session(SEAL, USER)).sealed is False
    assert SessionWrites.of("not a session") == SessionWrites(0, None, False)
