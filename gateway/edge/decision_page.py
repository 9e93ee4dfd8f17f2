"""The decision page a mailed link opens (`notifications.email`, approvals/email.py sends the mail).

- `GET /approve/{token}`: verifies the token (approvals/email_links.py: 403 altered or not ours,
  410 expired), reads the approval as the approvals API reads one for the approver the token names,
  and shows it with a form: Approve, or Deny with a reason. It decides nothing: mail scanners and
  link previews open links.
- `POST /approve/{token}` (a form): the vote of that approver, through the approvals API's own path
  (edge/approvals_api.py `cast_vote`): the first decision of any channel wins, a late one is told so.

A link is a credential for one approver and one approval, so the page guards it as one: the form's
hidden nonce must be the token's, a POST from another origin is refused, the answer is never framed,
cached or sent on as a Referer, and the access log names the route, never the path. A link is used
once: the sender kept its nonce in the shared store until it expires, and the POST takes it out in
one step (two POSTs of one link never both vote); a vote the store or the rate refused gives it back.
"""

from __future__ import annotations

import hmac
import html
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import structlog
from aiohttp import web

from ..access.approvers import ApproverIdentity
from ..approvals.email import Deciders, summary
from ..approvals.email_links import LinkRefused, LinkToken, link_key, nonce_key, verify_link
from ..cluster.shared import SharedStateDown
from ..core.refusals import HttpError, Refusal
from .admit import read_body
from .approvals_api import cast_vote, may_vote, read_pending, spend_rate
from .state import GATEWAY, Gateway

__all__ = ["ROUTE", "link_deciders", "routes"]

log = structlog.get_logger("adk_gateway.edge.decision_page")

ROUTE = "/approve/{token}"
# No script, no style, no frame, forms only to this origin; the token in the URL goes nowhere else.
_HEADERS = MappingProxyType({
    "Content-Security-Policy": "default-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
})
_MAX_REASON = 1000
# What each refusal of the vote tells the approver.
_REFUSED = {
    "already_decided": "This approval was already decided (or it expired).",
    "approval_not_found": "This approval was already decided, expired, or is no longer yours to decide.",
    "already_voted": "You already answered this approval.",
    "approval_gone": "The chat this approval belonged to is gone; nothing was decided.",
    "not_an_approver": "You may not decide this approval.",
    "self_approval": "The person who asked may not approve this call.",
}


def _page(status: int, title: str, body: str) -> web.Response:
    text = (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html.escape(title) +
        "</title></head><body><h1>" + html.escape(title) + "</h1>" + body + "</body></html>"
    )
    return web.Response(status=status, text=text, content_type="text/html", headers=_HEADERS)


def _message(status: int, title: str, text: str) -> web.Response:
    return _page(status, title, f"<p>{html.escape(text)}</p>")


def _token(gateway: Gateway, request: web.Request) -> LinkToken | web.Response:
    email = gateway.config.notifications.email
    if email is None:
        return _message(404, "Not found", "Approval mails are not configured here.")
    try:
        return verify_link(link_key(email.signing_key.get_secret_value()), request.match_info["token"], time.time())
    except LinkRefused as exc:
        if exc.why == "expired":
            return _message(410, "Link expired", "This link has expired; nothing was decided.")
        return _message(403, "Invalid link", "This link is not valid; nothing was decided.")


def _identity(gateway: Gateway, token: LinkToken) -> ApproverIdentity | None:
    return gateway.approver_auth().by_link(token.approver)


async def show(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    token = _token(gateway, request)
    if isinstance(token, web.Response):
        return token
    who = _identity(gateway, token)
    if who is None:
        return _message(403, "Invalid link", "This link names nobody who may decide; nothing was decided.")
    try:
        record = await read_pending(gateway, token.approval_id, who)
    except HttpError as exc:
        return _refused(exc)
    if record.get("state", "pending") != "pending":
        return _message(410, "Already decided", _REFUSED["already_decided"])
    return _page(200, "Approval needed", _details(record) + _form(token))


def _details(record: dict[str, Any]) -> str:
    # The arguments too: whoever holds the link may decide the call, and the API shows them its arguments.
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary(record, with_args=True))
    return f"<table>{cells}</table>"


def _form(token: LinkToken) -> str:
    nonce = html.escape(token.nonce, quote=True)
    return (
        f"<form method=\"post\"><input type=\"hidden\" name=\"nonce\" value=\"{nonce}\">"
        f"<p><label>Reason (optional) <input name=\"reason\" maxlength=\"{_MAX_REASON}\"></label></p>"
        "<p><button name=\"decision\" value=\"approve\">Approve</button> "
        "<button name=\"decision\" value=\"deny\">Deny</button></p></form>"
    )


def _refused(exc: HttpError) -> web.Response:
    if exc.status in (409, 404, 410):
        return _message(410 if exc.status != 409 else 409, "Already decided", _REFUSED.get(exc.code, str(exc)))
    if exc.status == 403:
        return _message(403, "Not allowed", _REFUSED.get(exc.code, "You may not decide this approval."))
    return _message(exc.status, "Try again", "The gateway could not take your answer now; nothing was decided. Try again shortly.")


def _same_origin(request: web.Request, link_base: str) -> bool:
    """A form posted from the page itself: no Origin (older browsers, mail clients) or the links' own."""
    origin = request.headers.get("Origin")
    if origin is None:
        return request.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")
    base = urlsplit(link_base)
    return origin.rstrip("/") == f"{base.scheme}://{base.netloc}"


async def decide(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    token = _token(gateway, request)
    if isinstance(token, web.Response):
        return token
    email = gateway.config.notifications.email
    assert email is not None  # _token answered 404 otherwise
    who = _identity(gateway, token)
    if who is None or not _same_origin(request, email.link_base):
        return _message(403, "Not allowed", "This form must be sent from the page the link opened; nothing was decided.")
    if request.content_type != "application/x-www-form-urlencoded":
        return _message(415, "Not a form", "Send the page's form; nothing was decided.")
    form = parse_qs((await read_body(request)).decode("utf-8", "replace"), max_num_fields=8)
    nonce, choice, reason = (form.get(k, [""])[0] for k in ("nonce", "decision", "reason"))
    if not hmac.compare_digest(nonce.encode(), token.nonce.encode()):
        return _message(403, "Not allowed", "This form does not belong to this link; nothing was decided.")
    if choice not in ("approve", "deny") or len(reason) > _MAX_REASON:
        return _message(400, "Not understood", "Choose Approve or Deny (a reason is at most 1000 characters).")
    return await _vote(request, gateway, token, who, choice == "approve", reason.strip() or None)


async def _vote(request: web.Request, gateway: Gateway, token: LinkToken, who: ApproverIdentity, approved: bool, reason: str | None) -> web.Response:
    try:
        await spend_rate(request, who)
        kept = await gateway.cluster.state.take_ticket(nonce_key(token.nonce))
    except SharedStateDown:
        return _message(503, "Try again", "The gateway could not take your answer now; nothing was decided. Try again shortly.")
    except Refusal as exc:  # the rate's 429 (`Limited`, not an HttpError): a page, as every answer here
        return _refused(exc.http())
    if kept is None:
        return _message(410, "Link used", "This link was used already (or it expired); nothing more was decided.")
    if kept.get("approval") != token.approval_id or kept.get("approver") != token.approver:
        return _message(403, "Invalid link", "This link is not valid; nothing was decided.")
    try:
        status, decided = await cast_vote(gateway, who, token.approval_id, approved, reason)
    except HttpError as exc:
        if exc.status >= 500 or exc.status == 429:
            await _give_back(gateway, token)
        return _refused(exc)
    log.info("approval_link_vote", approval_id=token.approval_id, approved=approved, state=decided["state"])
    if decided["state"] == "pending":
        return _message(200, "Vote counted", "Your approval is counted; the call waits for more approvers.")
    said = "approved" if approved else "denied"
    return _message(status, f"Call {said}", f"You {said} the call; the agent is told.")


async def _give_back(gateway: Gateway, token: LinkToken) -> None:
    """The link's nonce kept again for its lifetime left, after a vote that decided nothing."""
    left = token.expires - time.time()
    if left > 0:
        try:
            await gateway.cluster.state.put_ticket(nonce_key(token.nonce), {"approval": token.approval_id, "approver": token.approver}, ttl=left)
        except SharedStateDown:
            pass  # the link stays used: the approver asks for another decision path


def link_deciders(gateway_of: Callable[[], Gateway]) -> Deciders:
    """Who of the mail's recipients may decide an approval, as the running config says: the
    sender's `Deciders` port (`gateway_of`: the gateway, made after the sender)."""

    def deciders(entry: str, record: dict[str, Any]) -> str | None:
        gateway = gateway_of()
        who = gateway.approver_auth().by_link(entry)
        return str(who.principal) if who is not None and may_vote(gateway, who, record) else None

    return deciders


def routes() -> list[web.RouteDef]:
    return [web.get(ROUTE, show), web.post(ROUTE, decide)]
