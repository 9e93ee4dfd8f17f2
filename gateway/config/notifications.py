"""The `notifications:` section: the webhooks told when an approval starts waiting, is decided or expires,
and the approvers' own channels: a Slack channel with buttons (`slack`, config/slack.py) and mail
with a one-time link (`email`, config/email.py).

Each webhook names where to POST (`url`), the secret its calls are signed with (Standard Webhooks,
approvals/webhooks.py), which notices it wants (`events`) and of which approvals (`agents`, `tools`,
`rules`: empty means every one). The delivery settings (attempts, backoff, the queue's bound) are
the section's. Whether an agent a webhook names exists is a rule across sections: `GatewayConfig`
asks `unknown_agents`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from .email import EmailConfig
from .slack import SlackConfig
from .values import Duration, Section, agents_problem, http_base

__all__ = ["MIN_WEBHOOK_SECRET", "NotificationsConfig", "WebhookConfig", "secret_bytes"]

Event = Literal["waiting", "decided", "expired"]

# Shorter is refused: the receiver's only proof that a call is ours is an HMAC under it.
MIN_WEBHOOK_SECRET = 16
# The Standard Webhooks secret form: `whsec_` and the key's bytes in base64.
_WHSEC = "whsec_"


def secret_bytes(secret: str) -> bytes:
    """The HMAC key of a webhook secret: a `whsec_` secret is the base64 of the key (as Svix and
    the Standard Webhooks libraries read it); any other is the key's UTF-8 bytes."""
    if secret.startswith(_WHSEC):
        return base64.b64decode(secret.removeprefix(_WHSEC), validate=True)
    return secret.encode("utf-8")


class WebhookConfig(Section):
    # Unique among the webhooks; the `webhook` label of its metrics and the name its log lines give
    # (the URL may carry a token, so it is never logged).
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str
    secret: SecretStr
    events: list[Event] = Field(default_factory=lambda: ["waiting", "decided", "expired"], min_length=1)
    # Empty: every agent, tool, rule. Else only approvals of these (a notice without a rule never
    # matches a non-empty `rules`).
    agents: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)
    # The call's arguments in the body; their digest is always there.
    include_args: bool = False
    # One attempt's limit, connecting included.
    timeout: Duration = Field(5.0, gt=0)
    # Calls to this receiver in flight at once; the rest wait their turn (1: one at a time, in order).
    concurrency: int = Field(4, ge=1, le=64)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a webhook url is http(s)://host[:port]/path")
        return url

    @field_validator("secret")
    @classmethod
    def _strong_secret(cls, secret: SecretStr) -> SecretStr:
        value = secret.get_secret_value()
        if value.startswith(_WHSEC):
            try:
                key = secret_bytes(value)
            except (binascii.Error, ValueError):
                raise ValueError("a whsec_ secret is `whsec_` and the key in base64, which this is not") from None
            if len(key) < MIN_WEBHOOK_SECRET:
                raise ValueError(f"a whsec_ secret's key is at least {MIN_WEBHOOK_SECRET} bytes")
        elif len(value) < MIN_WEBHOOK_SECRET:
            raise ValueError(f"a webhook secret is at least {MIN_WEBHOOK_SECRET} characters")
        return secret

    def wants(self, kind: str, agent: str, tool: str, rule: str | None) -> bool:
        """Whether a notice of `kind` about this approval goes to this webhook."""
        return (
            kind in self.events
            and (not self.agents or agent in self.agents)
            and (not self.tools or tool in self.tools)
            and (not self.rules or rule in self.rules)
        )


class NotificationsConfig(Section):
    webhooks: list[WebhookConfig] = Field(default_factory=list)
    # Attempts per delivery (the first included): 5xx, 429 and connection errors are retried,
    # after `backoff`, then twice as long each time up to `backoff_max` (with jitter); other
    # answers are not.
    max_attempts: int = Field(6, ge=1, le=100)
    backoff: Duration = Field(1.0, gt=0)
    backoff_max: Duration = Field(60.0, gt=0)
    # Deliveries each webhook may have pending on a replica (waiting, in flight or between
    # attempts); beyond it, new ones are dropped and counted, so one receiver that is down holds
    # neither memory without bound nor another receiver's share.
    queue: int = Field(1000, ge=1)
    # The gateway's public base URL (`https://chat.example.com`), for the approval's link in the
    # body; empty: the link is the path alone (`/api/approvals/<id>`).
    public_url: str = ""
    # The Slack channel approvers answer in (config/slack.py, approvals/slack.py); none by default.
    slack: SlackConfig | None = None
    # Approvers told by mail, with a one-time decision link (config/email.py); None: no mail.
    email: EmailConfig | None = None

    @field_validator("public_url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        return http_base(url, "public_url").rstrip("/") if url else url

    @model_validator(mode="after")
    def _names_unique(self) -> NotificationsConfig:
        names = [hook.name for hook in self.webhooks]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"webhooks: each name is used once ({', '.join(twice)} more than once)")
        if self.backoff_max < self.backoff:
            raise ValueError("backoff_max is at least backoff")
        return self

    def unknown_agents(self, agents: Collection[str]) -> list[str]:
        """One problem per webhook naming an agent the config does not have."""
        return [
            problem for i, hook in enumerate(self.webhooks)
            if (problem := agents_problem(f"notifications.webhooks[{i}].agents", hook.agents, agents)) is not None
        ]
