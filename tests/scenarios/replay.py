"""ADK's `/run_sse` replayed from recordings, in process: the upstream a scenario's ChatService talks to.

`ReplayAdk` is the scripted ADK of tests/support fed from a fixture set instead of by hand: each run
the gateway starts streams the next recording played (one upstream read per recorded event), so a
recording queued while an earlier run still streams is the next run's, never the earlier one's.
It keeps ADK's side of what happened:
- `sent`: what the gateway started each run with (`new_message`, `state_delta`), to compare with
  what the recorder sent the real server (`Recordings.request`): an approval answer reached ADK as
  the recorded one did, and so ADK would answer with the recorded continuation;
- the plugin's asks: a run recorded in the demo's topology (the gateway's plugin in ADK) asks the
  gateway what it asked the recorder, through `asker` (the gateway's Gates, as its internal listener
  does), right after the event that holds the call; a verdict other than the recorded one is kept
  in `mismatches` (ADK's recorded continuation followed the recorded verdict);
- each session's history as ADK's GET answers it: the user's messages, the events played that are
  not partial (ADK does not store its run-error object), and, after a run the gateway cut, ADK's
  abort seal (2.11 and later write one: gateway/upstream/cut_runs.py); the native confirmations
  the gateway reads come from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.upstream.client import SessionConfirmations, _parsed
from gateway.upstream.session_history import session_confirmations
from tests.scenarios.recordings import Recordings
from tests.support.adk import ScriptedAdk

# ADK writes the abort seal of a cut run from this release on (its changelog: a client disconnect
# cancels the run).
SEALS_CUT_RUNS = (2, 11)


class ReplayAdk(ScriptedAdk):
    def __init__(self, recordings: Recordings) -> None:
        super().__init__()
        self.recordings = recordings
        self.sent: list[dict[str, Any]] = []
        self._history: dict[str, list[dict[str, Any]]] = {}
        # Per run to come: its payloads, whether its stream ends after them, the plugin's asks.
        self._runs: asyncio.Queue[tuple[list[bytes], bool, list[dict[str, Any]]]] = asyncio.Queue()
        # The plugin's ask (its body, the run's user and session in it) -> the gateway's verdict JSON.
        self.asker: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
        self.mismatches: list[str] = []

    def play(self, run: str, *, until: int | None = None) -> None:
        """The next run streams the recording `run`, one event per upstream read; `until`: only its
        first events, and the stream stays open (a reply still streaming) until the gateway cuts it."""
        self._runs.put_nowait((self.recordings.payloads(run)[:until], until is None, self.recordings.plugin_asks(run)))

    async def session(self, user_id: str, session_id: str) -> Any:
        self.calls.append("session")
        history = self._history.get(session_id)
        return None if history is None else {"events": list(history), "lastUpdateTime": float(len(history))}

    async def confirmations(self, user_id: str, session_id: str) -> SessionConfirmations:
        return session_confirmations(await self.session(user_id, session_id))

    async def run_sse_batches(self, **request: Any) -> AsyncIterator[list[Any]]:  # type: ignore[override]
        sent = {key: value for key, value in request.items() if key in ("new_message", "state_delta")}
        self.sent.append(sent)
        self.messages.append(request["new_message"])  # the scripted ADK's record, as its own runs keep it
        history = self._history.setdefault(request["session_id"], [])
        history.append({"author": "user", "content": request["new_message"]})
        self.calls.append("run")
        payloads, ends, asks = await self._runs.get()
        ended = False
        try:
            for raw in payloads:
                batch = list(_parsed([raw]))  # as AdkClient parses a read (it raises on what is not JSON)
                event = orjson.loads(raw)
                if "author" in event and not event.get("partial"):
                    history.append(event)
                yield batch
                # The gateway has the call's event now; ADK runs the tool, and the plugin asks first.
                self._ask(asks, _calls(event), request)
            if not ends:
                await asyncio.Event().wait()  # still streaming, until the gateway cuts the run
            ended = True
            self.mismatches += [f"the recorded ask about {a['body']['function_call_id']} was never made" for a in asks]
        finally:
            if not ended and self.recordings.adk_version >= SEALS_CUT_RUNS:
                history.append({"author": "demo_agent", "errorCode": "INVOCATION_ABORTED"})

    def _ask(self, asks: list[dict[str, Any]], calls: set[str], request: dict[str, Any]) -> None:
        for ask in [a for a in asks if a["body"]["function_call_id"] in calls]:
            asks.remove(ask)
            body = {**ask["body"], "user_id": request["user_id"], "session_id": request["session_id"]}
            verdict = self.asker(body) if self.asker is not None else None
            if verdict != ask["verdict"]:
                self.mismatches.append(f"{body['tool']} {body['args']}: the gateway answered {verdict}, recorded {ask['verdict']}")


def _calls(event: dict[str, Any]) -> set[str]:
    """The ids of the function calls a (final) event holds."""
    if event.get("partial"):
        return set()
    parts = (event.get("content") or {}).get("parts") or ()
    return {p["functionCall"]["id"] for p in parts if isinstance(p.get("functionCall"), dict) and "id" in p["functionCall"]}
