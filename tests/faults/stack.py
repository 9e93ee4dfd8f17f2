"""The demo topology (tests.procs.plugin_stack) with control over the gateway's `upstream:` keys.

plugin_stack cannot set `upstream.idle_timeout` and friends (gateway_process writes that section
itself); this builds the same stack from the same parts and carries them (see client.upstream_with).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.faults.client import upstream_with
from tests.procs import DEMO_TOOLS, PLUGIN, PluginStack, adk_server, free_port, gateway_process

__all__ = ["demo_stack"]


@contextmanager
def demo_stack(
    tmp: Path, *, payment_timeout: str = "5m", on_timeout: str = "deny", extra: str = "",
    upstream: dict[str, Any] | None = None, adk_env: dict[str, str] | None = None, tools: str | None = None,
    upstream_mode: str = "sse",
) -> Iterator[PluginStack]:
    """The stock ADK API server with the gateway plugin, and a gateway with the demo tool policy
    (or `tools`, a whole `tools:` YAML section). `upstream_mode`: "live" for the plugin's held
    requests (on sse every call that waits for a person is ADK's confirmation)."""
    internal_port = free_port()
    secret = "test-secret-" + os.urandom(6).hex()
    internal = f"http://127.0.0.1:{internal_port}"
    config = (
        (tools if tools is not None else DEMO_TOOLS.format(payment_timeout=payment_timeout, on_timeout=on_timeout))
        + f"internal:\n  port: {internal_port}\n  secret: {secret}\n  policy_refresh: 1s\n" + extra
    )
    env = {"ADK_GATEWAY_URL": internal, "ADK_GATEWAY_SECRET": secret, **(adk_env or {})}
    with adk_server(tmp, extra_plugins=(PLUGIN,), env=env) as adk, gateway_process(
        tmp, upstream_with(adk, **(upstream or {})), config, upstream_mode=upstream_mode
    ) as gw:
        yield PluginStack(gw, adk, internal, secret, gw.config_path)
