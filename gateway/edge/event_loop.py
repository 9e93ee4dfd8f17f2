"""Which asyncio event loop the gateway runs on, and running the server on it.

uvloop (libuv under asyncio's API) is the default where it is installed: on the bench's streams
the gateway executes 4-6% fewer instructions per event on it (callgrind), and a quiet trial took
~10% off the CPU per event and ~20% off an isolated paced event (docs/performance.md, issue 29). The standard loop is the fallback when uvloop is absent, and the
choice when `listen.event_loop: asyncio` or `ADK_GATEWAY_LOOP=asyncio` asks for it (e.g. to rule
the loop out while chasing a defect). Asking for uvloop where it is not installed is an error at
start, not a silent fallback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["ENV", "LoopChoice", "choose", "run"]

ENV = "ADK_GATEWAY_LOOP"
LoopChoice = Literal["auto", "uvloop", "asyncio"]
_CHOICES = ("auto", "uvloop", "asyncio")
T = TypeVar("T")


def choose(setting: str, environ: dict[str, str] | None = None) -> str:
    """The loop to run ("uvloop" or "asyncio") for the config's `listen.event_loop`; the
    environment variable, when set, wins over the file. Raises ValueError for an unknown value or
    for uvloop asked for and not installed."""
    env = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    wanted = env or setting
    if wanted not in _CHOICES:
        raise ValueError(f"${ENV} {env!r}: expected auto, uvloop or asyncio")
    installed = importlib.util.find_spec("uvloop") is not None
    if wanted == "uvloop" and not installed:
        source = f"${ENV}" if env else "listen.event_loop"
        raise ValueError(f"{source} uvloop: uvloop is not installed (pip install uvloop, or choose auto or asyncio)")
    return "uvloop" if wanted == "uvloop" or (wanted == "auto" and installed) else "asyncio"


def _factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """`asyncio.run(main)` on the loop `choose` named."""
    with asyncio.Runner(loop_factory=_factory(loop)) as runner:
        return runner.run(main)
