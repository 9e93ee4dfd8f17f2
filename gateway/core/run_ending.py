"""How a chat's run under way is being ended before its end, and what its cancelled task then comes to (sans-IO).

The shell ends a run early by cancelling the task that reads its upstream stream; why it does so is
a fact it tells the chat's machine first (`EndAsked`), and the machine, not the shell, decides what
the cancellation (`RunCancelled`) comes to:

- `abort`: the browser's stop (a WebSocket `abort`), or a new message in a chat whose response
  nobody reads any more: the response ends with an `abort` chunk and no `finish`;
- `cancel`: the gateway closes the run saying why (the agent a reload removed, a shutdown): an
  `error` chunk with that sentence, then `finish {error}`;
- nothing asked (a task cancelled by its event loop going away): a `cancel` saying `CANCELLED`.

Either way the run's outcome (the `outcome` label of the runs counted) is `cancelled`. When more
than one ask reaches a run (a browser stops a run a shutdown is closing), an abort outranks a
cancel, since the person's own stop is what their screen expects, and of two cancels the first
sentence stands: the run was already being closed for that reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .chat_events import EndAsked, EndHow
from .chat_outputs import Output
from .turn import Turn

__all__ = ["CANCELLED", "Ending", "asked", "cancelled"]

# The sentence of a run cancelled with no reason of its own.
CANCELLED: Final = "This response was cancelled."


@dataclass(frozen=True, slots=True)
class Ending:
    """How the run under way ends once its task is cancelled."""

    how: EndHow
    reason: str = CANCELLED


def asked(ending: Ending | None, event: EndAsked) -> Ending:
    """The ending recorded once `event` is told to a run that had `ending` (None: nothing asked)."""
    if ending is None or (event.how == "abort" and ending.how != "abort"):
        return Ending(event.how, event.reason or CANCELLED)
    return ending


def cancelled(turn: Turn, ending: Ending | None, now: float) -> list[Output]:
    """The run's task was cancelled: end `turn` as `ending` says (a cancel by default)."""
    if ending is not None and ending.how == "abort":
        return turn.abort(now)
    return turn.fail(ending.reason if ending is not None else CANCELLED, now, outcome="cancelled")
