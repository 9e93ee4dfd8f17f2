"""The `notifications.email:` section: approvers told by mail that a call waits for them, with a
link to a one-time decision page (approvals/email.py sends, edge/decision_page.py answers).

Who gets mail is `recipients`: an approver as groups list them (`approver_key:supervisor`, `jwt:alice`,
or bare) and their address; a waiting approval's mail goes to each recipient who may decide it (a
member of its group, not its requester under four-eyes). `agents` and `tools` narrow which approvals
(empty: every one). The SMTP password and the links' signing key are secrets: never logged, never
dumped. Whether each recipient names someone is a rule across sections: `GatewayConfig` asks
`unknown_recipients`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from .values import Duration, Section, agents_problem, http_base

__all__ = ["MIN_SIGNING_KEY", "EmailConfig", "SmtpConfig"]

# The links' only proof of who may vote is an HMAC under this key: shorter is refused.
MIN_SIGNING_KEY = 32
# A bare address: no display name, no line break, no second address (the header must hold one).
_ADDRESS = re.compile(r"^[^@\s<>,;:\"()\[\]\\]{1,64}@[A-Za-z0-9.-]{1,253}$")


def _address(value: str) -> str:
    if _ADDRESS.fullmatch(value) is None:
        raise ValueError(f"{value!r} is not a bare e-mail address (local@domain)")
    return value


class SmtpConfig(Section):
    host: str = Field(min_length=1)
    port: int = Field(587, ge=1, le=65535)
    # STARTTLS before anything else is said (and before any password is sent).
    starttls: bool = True
    username: str | None = None
    password: SecretStr | None = None
    # One connection's limit (connect, STARTTLS, login, send), per attempt.
    timeout: Duration = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _credentials(self) -> SmtpConfig:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if self.username is not None and not self.starttls:
            raise ValueError("a password is never sent in clear: set starttls: true to log in")
        return self


class EmailConfig(Section):
    # `from` is a Python keyword: the field is `from_`, written and dumped as `from` (a dump is read
    # back when the command line overrides a value: cli.py).
    model_config = ConfigDict(**Section.model_config, serialize_by_alias=True)

    smtp: SmtpConfig
    from_: str = Field(alias="from")
    # The gateway's public base URL, which the links in the mail start with (`https://gw.example.com`).
    link_base: str
    # How long a link may be used; never past the approval's deadline.
    link_ttl: Duration = Field(3600.0, gt=0, le=7 * 86400)
    signing_key: SecretStr
    recipients: dict[str, str] = Field(min_length=1)
    agents: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    # The call's arguments in the mail (the decision page shows them, behind the link, either way).
    include_args: bool = False
    # Mails a replica may have pending (waiting, in flight or between attempts); beyond it new ones
    # are dropped and counted, as a webhook's deliveries are.
    queue: int = Field(1000, ge=1)

    @field_validator("from_")
    @classmethod
    def _from(cls, value: str) -> str:
        return _address(value)

    @field_validator("recipients")
    @classmethod
    def _addresses(cls, value: dict[str, str]) -> dict[str, str]:
        for address in value.values():
            _address(address)
        return value

    @field_validator("link_base")
    @classmethod
    def _base_url(cls, url: str) -> str:
        return http_base(url, "link_base").rstrip("/")

    @field_validator("signing_key")
    @classmethod
    def _strong_key(cls, key: SecretStr) -> SecretStr:
        if len(key.get_secret_value()) < MIN_SIGNING_KEY:
            raise ValueError(f"signing_key is at least {MIN_SIGNING_KEY} characters")
        return key

    def wants(self, agent: str, tool: str) -> bool:
        """Whether approvals of this agent's tool are mailed."""
        return (not self.agents or agent in self.agents) and (not self.tools or tool in self.tools)

    def unknown_recipients(self, names: Callable[[str], object], agents: Collection[str]) -> list[str]:
        """One problem per recipient that names nobody (`names` raises ValueError, as a group's member
        would) and per agent that is not among `agents`."""
        problems = []
        for entry in self.recipients:
            try:
                names(entry)
            except ValueError as exc:
                problems.append(f"notifications.email.recipients: {exc}")
        if (agents_named := agents_problem("notifications.email.agents", self.agents, agents)) is not None:
            problems.append(agents_named)
        return problems
