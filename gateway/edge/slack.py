"""`POST /api/slack/interactions`: a press of an approval message's Approve or Deny button, as Slack
sends it (the app's Interactivity Request URL), becomes its approver's vote.

Slack signs each request (api.slack.com/authentication/verifying-requests-from-slack): `X-Slack-Signature`
is `v0=` and the hex HMAC-SHA256, under the app's signing secret, of `v0:<X-Slack-Request-Timestamp>:<raw body>`.
A request whose signature does not match (compared in constant time) or whose timestamp is more than
five minutes off is answered 401 and decides nothing. The body is form-encoded, `payload=` and the
interaction's JSON; a `block_actions` press carries the approval id as the button's `value`
(approvals/slack_blocks.py) and the Slack user's id.

The Slack user votes as the approver `notifications.slack.users` maps them to, through the approvals
API's own vote (edge/approvals_api.py `cast_vote`, after its rate, `spend_rate`): its group, quorum,
four-eyes and "first decision wins" hold as for any vote. A user not mapped decides nothing. Slack wants an answer within 3 s and a vote
can wait for a busy chat, so the route answers 200 at once and the vote runs in the background; what
came of it is told to the person privately through the press's `response_url` (approvals/slack.py
`respond`). The message itself changes when the decision's notice arrives (approvals/slack.py).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any
from urllib.parse import parse_qs

import orjson
import structlog
from aiohttp import web

from ..access.approvers import SLACK, ApproverIdentity
from ..approvals.slack_blocks import ACTION_APPROVE, ACTION_DENY
from ..approvals.votes import approvals
from ..core.limits import Limited
from ..core.refusals import HttpError
from .admit import count_refusal, read_body
from .approvals_api import cast_vote, spend_rate
from .state import GATEWAY, Gateway

__all__ = ["routes", "signature_valid"]

log = structlog.get_logger("adk_gateway.edge.slack")

# Slack's own bound on a request's age: older ones may be replays.
MAX_SKEW = 300.0
_NOT_AN_APPROVER = "You are not an approver here: your Slack account is not mapped to one, so nothing was decided."
# A refusal of the vote, as the person who pressed reads it.
_REFUSED = {
    "already_decided": "This approval was already decided (or expired): your answer changed nothing.",
    "approval_gone": "This approval was already decided (or expired): your answer changed nothing.",
    # The listing forgets an approval once it is answered: to an approver in its channel, that is "decided".
    "approval_not_found": "This approval was already decided (or expired, or is not yours to decide): your answer changed nothing.",
    "already_voted": "You already answered this approval.",
    "self_approval": "You asked for this call yourself, and this approval needs someone else.",
    "not_an_approver": "You may not decide this approval.",
}


def signature_valid(secret: bytes, timestamp: str, body: bytes, signature: str, now: float) -> bool:
    """Whether a request is Slack's: its signature matches and its timestamp is within `MAX_SKEW` of `now`."""
    if not timestamp.isdigit() or len(timestamp) > 12 or abs(now - int(timestamp)) > MAX_SKEW:
        return False
    expected = "v0=" + hmac.new(secret, b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace"))


def _payload(raw: bytes) -> dict[str, Any]:
    try:
        [text] = parse_qs(raw.decode("utf-8"), strict_parsing=True)["payload"]
        payload = orjson.loads(text)
    except (UnicodeDecodeError, ValueError, KeyError, orjson.JSONDecodeError):
        raise HttpError(400, "invalid_request", "a Slack interaction is form-encoded `payload=` and its JSON") from None
    if not isinstance(payload, dict):
        raise HttpError(400, "invalid_request", "a Slack interaction's payload is a JSON object")
    return payload


def _press(payload: dict[str, Any]) -> tuple[str, str, bool, str] | None:
    """(Slack user id, approval id, approved, response_url) of a press of our buttons; None for anything else."""
    actions, user = payload.get("actions"), payload.get("user")
    if payload.get("type") != "block_actions" or not isinstance(actions, list) or not actions or not isinstance(user, dict):
        return None
    action = actions[0]
    if not isinstance(action, dict) or action.get("action_id") not in (ACTION_APPROVE, ACTION_DENY):
        return None
    approval_id, user_id, url = action.get("value"), user.get("id"), payload.get("response_url", "")
    if not isinstance(approval_id, str) or not approval_id or not isinstance(user_id, str) or not isinstance(url, str):
        return None
    return user_id, approval_id, action["action_id"] == ACTION_APPROVE, url


async def interactions(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    slack = gateway.config.notifications.slack
    if slack is None:
        raise HttpError(404, "slack_not_configured", "no Slack channel is configured (notifications.slack)")
    raw = await read_body(request)
    headers = request.headers
    if not signature_valid(
        slack.signing_secret.get_secret_value().encode(), headers.get("X-Slack-Request-Timestamp", ""), raw,
        headers.get("X-Slack-Signature", ""), time.time(),
    ):
        count_refusal(request, "unauthorized")
        raise HttpError(401, "invalid_signature", "not signed with the Slack app's signing secret, or too old")
    press = _press(_payload(raw))
    if press is None:
        return web.Response(status=200)  # another interaction (or another app's button): nothing of ours
    slack_user, approval_id, approved, response_url = press
    principal = slack.approver(gateway.config.approvers, slack_user)
    if principal is None:
        log.info("slack_press_refused", approval_id=approval_id, reason="not_mapped")
        gateway.spawn(gateway.slack.respond(response_url, _NOT_AN_APPROVER))
        return web.Response(status=200)
    who = ApproverIdentity(principal.id, auth=SLACK, source=principal.source)
    structlog.contextvars.bind_contextvars(user_id=who.user_id)
    try:
        await spend_rate(request, who)
    except Limited:
        gateway.spawn(gateway.slack.respond(response_url, "Too many answers at once: press again in a moment."))
        return web.Response(status=200)
    gateway.spawn(_vote(gateway, who, approval_id, approved, response_url))
    return web.Response(status=200)


async def _vote(gateway: Gateway, who: ApproverIdentity, approval_id: str, approved: bool, response_url: str) -> None:
    """The press's vote, then the person's private answer (what the message does not show)."""
    try:
        _status, answer = await cast_vote(gateway, who, approval_id, approved, None)
    except HttpError as exc:
        text = _REFUSED.get(exc.code, f"Your answer could not be counted ({exc.code}): {exc.message}")
    except Exception as exc:  # a bug costs this press alone: logged, and the person told
        log.error("slack_vote_failed", approval_id=approval_id, error=repr(exc))
        text = "Your answer could not be counted: the gateway failed. Use the approvals inbox."
    else:
        if answer.get("state") == "decided":
            text = f"You {'approved' if approved else 'denied'} this call."
        else:
            text = f"Your approval is counted ({approvals(answer.get('votes', []))} of {answer.get('quorum', 1)} needed)."
    await gateway.slack.respond(response_url, text)


def routes() -> list[web.RouteDef]:
    return [web.post("/api/slack/interactions", interactions)]
