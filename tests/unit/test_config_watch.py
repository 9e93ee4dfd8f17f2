"""The config watcher (`reload.watch`): a change of the file's content reloads it as SIGHUP does,
fails closed as SIGHUP does, reports a bad content once, follows a Kubernetes ConfigMap's symlink
swap, and stops within its bound."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.config.schema import load_config
from gateway.edge import config_watch
from gateway.edge.app import create_app
from gateway.edge.config_watch import ConfigWatcher, config_digest, files_read
from gateway.edge.reload import reload_config
from gateway.edge.state import GATEWAY, Gateway

CONFIG = """\
auth:
  mode: api_key
  api_keys:
    - id: web
      key: k-123
internal:
  secret: s-456
reload:
  watch_interval: 50ms
limits:
  max_messages: 50
tools:
  process_payment:
    approval: true
"""


def _gateway(path: Path) -> tuple[Gateway, ConfigWatcher]:
    """A gateway started from `path` with its watcher, wired as serve() wires them."""
    gateway = create_app(load_config(path, env={}))[GATEWAY]
    gateway.config_path = path
    watcher = ConfigWatcher(
        path, config=lambda: gateway.config, seen=lambda: gateway.config_seen,
        reload=lambda: reload_config(gateway, path),
    )
    gateway.config_seen = watcher.digest()
    return gateway, watcher


def _count(gateway: Gateway, result: str) -> float:
    return gateway.metrics.config_reloads.labels(result)._value.get()


async def _until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _write(path: Path, text: str) -> None:
    """As an operator's tool does: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def test_a_changed_file_is_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    gateway, watcher = _gateway(path)
    watcher.start()
    try:
        _write(path, CONFIG.replace("max_messages: 50", "max_messages: 7"))
        await _until(lambda: gateway.config.limits.max_messages == 7, "the reload")
        assert _count(gateway, "success") == 1
        await asyncio.sleep(0.3)  # several more looks: the same content is not reloaded again
        assert _count(gateway, "success") == 1
        assert gateway.admission.config.max_messages == 7
    finally:
        await watcher.stop()


async def test_a_bad_file_is_refused_the_old_config_kept_and_reported_once(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    gateway, watcher = _gateway(path)
    running = gateway.config
    watcher.start()
    try:
        with capture_logs() as logs:
            # A loosening (the payment no longer gated) and then a file start would refuse.
            _write(path, CONFIG.replace("    approval: true\n", "    approval: false\n"))
            await _until(lambda: _count(gateway, "failure") == 1, "the refusal")
            await asyncio.sleep(0.4)  # eight more looks at the same bad content
            assert _count(gateway, "failure") == 1
            _write(path, CONFIG + "bogus: 1\n")
            await _until(lambda: _count(gateway, "failure") == 2, "the second refusal")
            await asyncio.sleep(0.4)
        assert _count(gateway, "failure") == 2 and _count(gateway, "success") == 0
        assert gateway.config is running
        assert gateway.config.agents[gateway.config.default].tool_policy("process_payment").approval
        failed = [entry for entry in logs if entry["event"] == "config_reload_failed"]
        assert len(failed) == 2, failed
        assert "a reload cannot stop requiring approval" in " ".join(failed[0]["problems"])
        assert failed[1]["problems"] == [f"{path}: bogus: unknown key"]
        # Put back, the file reloads: the watcher acts on every new content, good or bad.
        _write(path, CONFIG.replace("max_messages: 50", "max_messages: 9"))
        await _until(lambda: gateway.config.limits.max_messages == 9, "the good file")
    finally:
        await watcher.stop()


async def test_a_configmap_symlink_swap_is_reloaded(tmp_path: Path) -> None:
    """As the kubelet updates a ConfigMap volume: `gateway.yaml -> ..data/gateway.yaml`, and
    `..data -> ..<timestamp>`, swapped by renaming a new symlink over `..data`."""
    volume = tmp_path / "config"
    volume.mkdir()

    def version(name: str, text: str) -> None:
        (volume / name).mkdir()
        (volume / name / "gateway.yaml").write_text(text)
        (volume / "..data_tmp").symlink_to(name)
        os.replace(volume / "..data_tmp", volume / "..data")

    version("..2026_11_27_10_00_00.1", CONFIG)
    (volume / "gateway.yaml").symlink_to("..data/gateway.yaml")
    path = volume / "gateway.yaml"
    gateway, watcher = _gateway(path)
    before = os.stat(path, follow_symlinks=False)
    watcher.start()
    try:
        version("..2026_11_27_10_05_00.2", CONFIG.replace("max_messages: 50", "max_messages: 3"))
        # The name the gateway opened is the same symlink, untouched: only the content tells.
        assert os.stat(path, follow_symlinks=False).st_ino == before.st_ino
        await _until(lambda: gateway.config.limits.max_messages == 3, "the reload after the swap")
        assert _count(gateway, "success") == 1
    finally:
        await watcher.stop()


async def test_a_sighup_reload_is_not_repeated_by_the_watcher(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    gateway, watcher = _gateway(path)
    _write(path, CONFIG.replace("max_messages: 50", "max_messages: 8"))
    assert reload_config(gateway, path).ok  # the SIGHUP, before the watcher looks
    watcher.start()
    try:
        await asyncio.sleep(0.4)
        assert _count(gateway, "success") == 1
    finally:
        await watcher.stop()


async def test_watch_off_reloads_nothing_and_a_reload_may_turn_it_on(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    off = CONFIG.replace("reload:\n", "reload:\n  watch: false\n")
    path.write_text(off)
    gateway, watcher = _gateway(path)
    watcher.start()
    try:
        _write(path, CONFIG)  # the watch turned on, by a file the watcher does not look at
        await asyncio.sleep(0.4)
        assert _count(gateway, "success") == 0
        assert reload_config(gateway, path).ok  # a SIGHUP applies it
        _write(path, CONFIG.replace("max_messages: 50", "max_messages: 4"))
        await _until(lambda: gateway.config.limits.max_messages == 4, "the watched reload")
    finally:
        await watcher.stop()


def test_the_digest_covers_the_files_the_config_reads(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def pem() -> bytes:
        return ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo,
        )

    key = tmp_path / "jwt.pem"
    key.write_bytes(pem())
    path = tmp_path / "gateway.yaml"
    path.write_text(f"auth:\n  mode: jwt\n  jwt:\n    algorithms: [ES256]\n    public_key_file: {key}\n")
    config = load_config(path, env={})
    assert files_read(config) == [key]
    before = config_digest(path.read_bytes(), files_read(config))
    key.write_bytes(pem())  # a key rotated in its Secret: the reload judges it (a new key takes a restart)
    assert config_digest(path.read_bytes(), files_read(config)) != before
    assert config_digest(None, []) != config_digest(b"", [])  # a file gone is a content of its own


async def test_stop_is_bounded_even_during_a_stuck_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    gateway, watcher = _gateway(path)
    stuck = threading.Event()
    release = threading.Event()
    real_read = config_watch._read

    def hanging_read(p: Path) -> bytes:
        stuck.set()
        release.wait(10)  # a read on a dead network filesystem
        return real_read(p)

    monkeypatch.setattr(config_watch, "_read", hanging_read)
    watcher.start()
    try:
        await _until(stuck.is_set, "a look to start")
        began = time.monotonic()
        await watcher.stop()
        assert time.monotonic() - began < 1.5
    finally:
        release.set()
    assert _count(gateway, "success") == _count(gateway, "failure") == 0
