"""The `notifications.slack:` section: one Slack channel where approvals that approvers decide are
posted with Approve / Deny buttons, and the Slack users who may press them, as approvers.

The bot's token posts and updates the messages (approvals/slack.py); the app's signing secret proves
that a button press comes from Slack (edge/slack.py). `users` maps a Slack user id to an approver as
`approvers.groups.*.users` names one (`approver_key:supervisor`, `jwt:alice`, or bare as the file's
auth.mode reads it): a press votes as that person, through the approvals API's own vote. Whether each
entry names someone is a rule across sections: `GatewayConfig` asks `problems`.
"""

from __future__ import annotations

from collections.abc import Collection

from pydantic import Field, SecretStr, field_validator

from .approvers import ApproversConfig, Principal, UserId
from .values import Duration, Section, agents_problem, http_base

__all__ = ["SLACK_API", "SlackConfig"]

SLACK_API = "https://slack.com/api"
# Where Slack's `response_url`s point (api.slack.com/interactivity/handling#message_responses).
_SLACK_RESPONSES = "https://hooks.slack.com/"
# Slack's signing secrets are 32 hex digits; anything much shorter is no proof.
_MIN_SIGNING_SECRET = 16


class SlackConfig(Section):
    # The bot's token (`xoxb-…`, scope chat:write): from the environment, never logged.
    bot_token: SecretStr
    # The app's signing secret (Basic Information > App Credentials): button presses are checked against it.
    signing_secret: SecretStr
    # The channel the approvals are posted to: its id (`C0123ABCD`) or name; the bot must be a member.
    channel: str = Field(min_length=1, max_length=80)
    # Slack's Web API; another base only for a stand-in (tests) or a proxy you run.
    api_base: str = SLACK_API
    # Where a press's `response_url` may point: the private answers go there and nowhere else.
    response_url_prefix: str = _SLACK_RESPONSES
    # Slack user id -> the approver it is, as approvers.groups.*.users writes one.
    users: dict[str, UserId] = Field(default_factory=dict)
    # Empty: every agent, tool, rule (as a webhook's). Only approvals approvers decide are posted.
    agents: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)
    # The call's arguments in the message; their keyed digest is shown otherwise (as webhooks do).
    include_args: bool = False
    # One Web API call's limit, connecting included.
    timeout: Duration = Field(5.0, gt=0)

    @field_validator("api_base", "response_url_prefix")
    @classmethod
    def _base(cls, url: str) -> str:
        return http_base(url, "api_base and response_url_prefix")

    @field_validator("signing_secret")
    @classmethod
    def _strong(cls, secret: SecretStr) -> SecretStr:
        if len(secret.get_secret_value()) < _MIN_SIGNING_SECRET:
            raise ValueError(f"signing_secret is Slack's app signing secret (at least {_MIN_SIGNING_SECRET} characters)")
        return secret

    @field_validator("users")
    @classmethod
    def _slack_ids(cls, users: dict[str, str]) -> dict[str, str]:
        for slack_id in users:
            if not slack_id.isalnum() or not slack_id.isupper() or len(slack_id) > 32:
                raise ValueError(f"users: {slack_id!r} is not a Slack user id (such as U024BE7LH)")
        return users

    def wants(self, agent: str, tool: str, rule: str | None) -> bool:
        """Whether an approval of `agent`'s `tool` (asked by `rule`) goes to the channel."""
        return (
            (not self.agents or agent in self.agents)
            and (not self.tools or tool in self.tools)
            and (not self.rules or rule in self.rules)
        )

    def approver(self, approvers: ApproversConfig, slack_user: str) -> Principal | None:
        """The approver a Slack user is, or None (not mapped)."""
        entry = self.users.get(slack_user)
        if entry is None:
            return None
        [principal] = approvers.members([entry])
        return principal

    def problems(self, approvers: ApproversConfig, agents: Collection[str]) -> list[str]:
        """Each `users` entry names one approver (with approvers bound to the file's auth.mode),
        and each agent named exists."""
        problems = [
            f"notifications.slack.users.{slack_id}: {exc}"
            for slack_id, entry in self.users.items() if (exc := _member_problem(approvers, entry)) is not None
        ]
        if (agents_named := agents_problem("notifications.slack.agents", self.agents, agents)) is not None:
            problems.append(agents_named)
        return problems


def _member_problem(approvers: ApproversConfig, entry: str) -> ValueError | None:
    try:
        approvers.members([entry])
    except ValueError as exc:
        return exc
    return None
