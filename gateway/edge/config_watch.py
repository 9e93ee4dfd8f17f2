"""Reloading on a change of the config file's content, without a SIGHUP (`reload.watch`).

A Kubernetes ConfigMap (or Secret) volume updates its files by writing a new directory and swapping
the `..data` symlink to it: the file's own name never changes, its inode and mtime as `stat` on the
name sees them may or may not, and inotify on the name sees nothing. So the watcher looks at the
content: a digest of the config file's bytes and of the files the running configuration reads
(`auth.jwt.public_key_file`), taken every `reload.watch_interval` through the resolved path. No
inotify, no extra dependency.

A change runs the reload SIGHUP runs (edge/reload.py, given as `reload`): the same validation, the
same refusal of loosening, the same log lines and counters. Each content is acted on once: every
reload, whatever started it, records the digest of what it read (`Gateway.config_seen`), so a file
a SIGHUP just reloaded is not reloaded again, and a bad file is refused and reported once, not at
every look, until its content changes again. A new content is acted on only once it has stayed the
same for one look, so a file still being written in place (an editor, a copy) is not read half-way.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import structlog

from ..config.schema import GatewayConfig
from ..ops.stopping import cancel_and_wait

__all__ = ["ConfigWatcher", "config_digest", "files_read"]

log = structlog.get_logger("adk_gateway.edge.config_watch")

# What a file that cannot be read counts as: a content of its own, so a file that disappears (and
# stays away) is reported once, like any bad content.
_UNREADABLE = b"\0unreadable\0"
# The bound on stopping the watcher: a look is a few small reads; one stuck on a dead network
# filesystem is left behind rather than waited for.
_STOP_BOUND = 1.0


def files_read(config: GatewayConfig) -> list[Path]:
    """The files other than the config file itself whose content the configuration takes at load."""
    jwt = config.auth.jwt
    return [jwt.public_key_file] if jwt is not None and jwt.public_key_file is not None else []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return _UNREADABLE


def config_digest(config_bytes: bytes | None, also: list[Path]) -> str:
    """The digest of a config file's bytes (None: it could not be read) and of the files in `also`."""
    digest = hashlib.sha256()
    for part in [_UNREADABLE if config_bytes is None else config_bytes, *(_read(path) for path in also)]:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


class ConfigWatcher:
    """Looks at the config's content every `reload.watch_interval` and calls `reload` on a change.

    `config` gives the running configuration (read at each look: a reload may turn the watch off,
    or change its interval or the files read), `seen` the digest the last reload read, from
    any path, and `reload` is the SIGHUP reload, which records the digest it read.
    """

    def __init__(
        self, path: Path, *, config: Callable[[], GatewayConfig], seen: Callable[[], str | None],
        reload: Callable[[], object],
    ) -> None:
        self._path = path
        self._config = config
        self._seen = seen
        self._reload = reload
        self._pending: str | None = None
        self._task: asyncio.Task[None] | None = None

    def digest(self) -> str:
        """The content now: the files the running configuration reads, then the config file."""
        also = files_read(self._config())
        return config_digest(_read(self._path), also)

    def look(self, now: str | None = None) -> bool:
        """One look (`now`: the digest, if already taken): True when it ran a reload. A new content
        is reloaded at the second look that finds it unchanged; one a reload has read is left alone."""
        now = self.digest() if now is None else now
        if now == self._seen():
            self._pending = None
            return False
        if now != self._pending:
            self._pending = now  # changed since the last look: wait one more, it may still be being written
            return False
        self._pending = None
        log.info("config_changed", path=str(self._path))
        self._reload()
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._config().reload.watch_interval)
            if not self._config().reload.watch:
                self._pending = None
                continue
            try:
                # The reads off the event loop (a config volume on a slow filesystem must not stall
                # streams); the reload itself on it, as SIGHUP's runs.
                self.look(await asyncio.to_thread(self.digest))
            except Exception:  # noqa: BLE001 - the watcher must outlive any one look
                log.exception("config_watch_failed", path=str(self._path))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="config_watch")

    async def stop(self) -> None:
        """Stop looking; bounded, whatever a look in progress is doing."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait((task,), _STOP_BOUND, what="config_watch")
