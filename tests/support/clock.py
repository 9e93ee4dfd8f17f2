"""The clock a test moves: the one fake time source of the tests."""

from __future__ import annotations


class Clock:
    """A clock that stands still until the test moves it. Called, it is the time (a
    `Callable[[], float]`, as the gateway takes clocks); `sleep` moves it instead of waiting, for code
    that takes its sleep as a parameter."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
