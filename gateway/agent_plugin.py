"""The old import path of the gateway's ADK plugin, kept for existing agents.

The plugin is its own small distribution now, `adk-gateway-plugin` (plugin/ in this repository,
module `adk_gateway_plugin`): it depends on google-adk and httpx only, so installing it never
changes an agent's ADK. `--extra_plugins gateway.agent_plugin.GatewayPlugin` keeps working wherever
that distribution is installed next to this package (`make` and the Docker image install both);
new deployments use `--extra_plugins adk_gateway_plugin.GatewayPlugin` (docs/approvals.md).
"""

from __future__ import annotations

try:
    from adk_gateway_plugin import REFUSAL_KEY, GatewayPlugin
except ImportError as exc:  # pragma: no cover - the message is for an agent's log
    # ADK logs this text ("Failed to load plugin ...") and runs on without the plugin.
    raise ImportError(
        "gateway.agent_plugin.GatewayPlugin now comes from the adk-gateway-plugin distribution, which "
        "is not installed here: `pip install ./plugin` from a checkout of adk-gateway, then prefer "
        f"--extra_plugins adk_gateway_plugin.GatewayPlugin (docs/approvals.md). ({exc})"
    ) from exc

__all__ = ["REFUSAL_KEY", "GatewayPlugin"]
