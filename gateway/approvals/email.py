"""Mailing approvers: a call that waits for an approver group gets each mapped approver a message
with a one-time decision link, never in the chat's way.

`EmailNotices.notify(notice)` is a sink of the approval notices (approvals/reports.py), as the
webhooks are. It acts on `waiting` notices of approvals an approver group decides (the chatting
user's own are answered in the chat) whose agent and tool `notifications.email` wants. It only
enqueues: a task per notice reads the approval as the approvals API does (the shared directory,
through the `ApprovalReader` port; the listing may land just after the notice, so it is read again a
few times), and for each recipient who may decide it (`Deciders`: a member of its group, not its
requester under four-eyes) keeps a fresh nonce in the shared store for the link's lifetime, signs the
link (approvals/email_links.py) and sends a text and HTML message over SMTP (smtplib, in a thread,
each step bounded by `smtp.timeout`). Failed steps are retried with the webhooks' backoff settings
(`notifications.max_attempts`, `backoff`, `backoff_max`); pending mails are bounded by `email.queue`.

The link expires at `link_ttl` or the approval's deadline, whichever is first. Log lines name the
approval and the recipient's id, never the address, the link, the SMTP password or the signing key.
"""

from __future__ import annotations

import asyncio
import html
import secrets
import smtplib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any, Protocol

import orjson
import structlog

from ..config.email import EmailConfig, SmtpConfig
from ..config.notifications import NotificationsConfig
from ..ops.backoff import Backoff
from ..ops.webhook_metrics import WebhookMetrics
# The pause between attempts and the bounded drain are the webhooks' and the Slack channel's.
from ..ops.stopping import drain, pause
from .email_links import LinkToken, link_key, nonce_key, sign_link
from .notice import ApprovalNotice

__all__ = ["ApprovalReader", "Deciders", "EmailNotices", "NonceStore", "compose", "summary"]

log = structlog.get_logger("adk_gateway.approvals.email")

# The chatting user answers in the chat: `asks` of such a notice (approvals/reports.py).
_CHATTING_USER = "the chatting user"
# Reads of the directory before giving up on a notice whose approval is not listed (it was decided
# at once, or the store is away), a backoff apart from 0.2 s.
_READS = 5
# SMTP connections in flight at once per replica; the rest wait their turn.
_CONCURRENCY = 4


class ApprovalReader(Protocol):
    """The shared directory of pending approvals (cluster/shared.py), as the approvals API reads one."""

    async def get_approval(self, approval_id: str) -> dict[str, Any] | None: ...


class NonceStore(Protocol):
    """Where a link's nonce waits to be used once (the shared store's single-use records)."""

    async def put_ticket(self, key: str, record: dict[str, str], *, ttl: float) -> None: ...


class Deciders(Protocol):
    def __call__(self, entry: str, record: dict[str, Any]) -> str | None:
        """The recipient `entry` as a principal (`approver_key:supervisor`) if they may decide the
        approval `record` now, else None."""
        ...


@dataclass(frozen=True, slots=True)
class _Mail:
    """One approver's message, with the settings in force when it was made."""

    approval_id: str
    approver: str
    message: EmailMessage
    smtp: SmtpConfig


class EmailNotices:
    """The approval mails of one replica: `notify` from the chat's notices, `start` and a bounded `stop`."""

    def __init__(
        self, config: Callable[[], NotificationsConfig], directory: ApprovalReader, nonces: NonceStore,
        deciders: Deciders, metrics: WebhookMetrics, *, wall: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._directory = directory
        self._nonces = nonces
        self._deciders = deciders
        self._wall = wall
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(_CONCURRENCY)
        self._started = False
        self._stopping = asyncio.Event()

    def start(self) -> None:
        self._started = True

    def notify(self, notice: ApprovalNotice) -> None:
        """Enqueue the mails of a waiting approval its approvers decide. Never blocks, never raises."""
        try:
            config = self._config()
            email = config.email
            if email is None or notice.kind != "waiting" or _CHATTING_USER in notice.asks:
                return
            if not email.wants(notice.agent, notice.tool):
                return
            why = "stopped" if self._stopping.is_set() else "not_started" if not self._started else (
                "queue_full" if len(self._tasks) >= email.queue else None
            )
            if why is not None:
                self._metrics.email("dropped")
                log.warning("email_dropped", approval_id=notice.approval_id, reason=why)
                return
            task = asyncio.get_running_loop().create_task(self._mail(notice.approval_id, config, email))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        except Exception as exc:  # a mail that cannot be sent must not fail the approval it tells of
            log.error("email_notify_failed", approval_id=notice.approval_id, error=repr(exc))

    async def _mail(self, approval_id: str, config: NotificationsConfig, email: EmailConfig) -> None:
        try:
            record = await self._read(approval_id)
            if record is None or record.get("state", "pending") != "pending":
                log.info("email_not_sent", approval_id=approval_id, reason="not_pending")
                return
            if record.get("approvers") is None:
                # The chatting user's own (a held call in live mode is listed too): answered in the chat.
                return
            # One mail per person, however they are listed; each retried on its own, so an address
            # that keeps failing does not hold up the others.
            mails: dict[str, str] = {}
            for entry, address in email.recipients.items():
                approver = self._deciders(entry, record)
                if approver is not None:
                    mails.setdefault(approver, address)
            ends = await asyncio.gather(
                *(self._one(record, who, address, config, email) for who, address in mails.items()), return_exceptions=True,
            )
            for end in ends:
                if isinstance(end, Exception):  # a bug (a message that cannot be composed): this mail alone
                    log.error("email_error", approval_id=approval_id, error=repr(end))
        except asyncio.CancelledError:
            self._metrics.email("dropped")
            log.warning("email_dropped", approval_id=approval_id, reason="stopped")
            raise
        except Exception as exc:  # a bug here costs this approval's mails alone, logged
            log.error("email_error", approval_id=approval_id, error=repr(exc))

    async def _read(self, approval_id: str) -> dict[str, Any] | None:
        backoff = Backoff(0.2, 2.0)
        for _ in range(_READS):
            try:
                record = await self._directory.get_approval(approval_id)
            except Exception:  # the store is away: read again
                record = None
            if record is not None:
                return record
            await pause(backoff.failed(), self._stopping)
        return None

    async def _one(self, record: dict[str, Any], approver: str, address: str, config: NotificationsConfig, email: EmailConfig) -> None:
        now = self._wall()
        expires = int(min(now + email.link_ttl, float(record.get("deadline") or now + email.link_ttl)))
        if expires <= now:
            return
        nonce = secrets.token_urlsafe(18)
        token = LinkToken(record["id"], approver, expires, nonce)
        link = f"{email.link_base}/approve/{sign_link(link_key(email.signing_key.get_secret_value()), token)}"
        mail = _Mail(record["id"], approver, compose(record, email, address, link, expires), email.smtp)
        backoff = Backoff(config.backoff, config.backoff_max)
        kept = False
        for attempt in range(1, config.max_attempts + 1):
            try:
                if not kept:
                    left = max(expires - self._wall(), 1.0)
                    await self._nonces.put_ticket(nonce_key(nonce), {"approval": record["id"], "approver": approver}, ttl=left)
                    kept = True
                async with self._slots:
                    await asyncio.to_thread(_send, mail.smtp, mail.message)
                self._metrics.email("sent")
                log.info("email_sent", approval_id=mail.approval_id, approver=approver, attempts=attempt)
                return
            # SMTP and network errors, and a store that could not keep the nonce (SharedStateDown):
            # tried again; no link goes out before its nonce is kept.
            except Exception as exc:  # noqa: BLE001
                failure = type(exc).__name__
            if attempt >= config.max_attempts or self._stopping.is_set():
                break
            await pause(backoff.failed(), self._stopping)
        self._metrics.email("failed")
        log.warning("email_failed", approval_id=mail.approval_id, approver=approver, attempts=attempt, error=failure)

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def stop(self, timeout: float) -> None:
        """Stop taking notices, give mails under way up to `timeout` (those between attempts end now),
        then cancel what is left. A send already in its thread ends within `smtp.timeout`."""
        self._stopping.set()
        await drain(self._tasks, timeout, what="approval mails")


def _send(smtp: SmtpConfig, message: EmailMessage) -> None:
    """One SMTP session (blocking: run in a thread): connect, STARTTLS when asked (verified against
    the system's CAs), log in when configured, send."""
    with smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout) as client:
        if smtp.starttls:
            client.starttls(context=ssl.create_default_context())
        if smtp.username is not None and smtp.password is not None:
            client.login(smtp.username, smtp.password.get_secret_value())
        client.send_message(message)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def summary(record: dict[str, Any], *, with_args: bool) -> list[tuple[str, str]]:
    """What an approver is shown of an approval (the mail, the decision page), as (name, value) rows."""
    rows = [
        ("Agent", record.get("agent", "")), ("Tool", record.get("tool", "")), ("Rule", record.get("rule") or "-"),
        ("Requested by", record.get("requester", "")),
        ("Approvers", f"{record.get('approvers')} (quorum {record.get('quorum', 1)})"),
        ("Deadline", _when(float(record["deadline"])) if record.get("deadline") else "-"),
    ]
    if record.get("hint"):
        rows.append(("Hint", record["hint"]))
    if with_args:
        rows.append(("Arguments", orjson.dumps(record.get("args", {}), option=orjson.OPT_SORT_KEYS).decode()))
    return [(name, str(value)) for name, value in rows]


def compose(record: dict[str, Any], email: EmailConfig, address: str, link: str, expires: float) -> EmailMessage:
    """The message to one approver: what waits (tool, agent, rule, who asked, the deadline, the hint,
    the arguments only with `include_args`) and the link, as text and as simple HTML."""
    rows = summary(record, with_args=email.include_args)
    message = EmailMessage()
    message["Subject"] = f"Approval needed: {record.get('tool', '')} ({record.get('agent', '')})"
    message["From"] = email.from_
    message["To"] = address
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid("approval", domain=email.from_.rpartition("@")[2])
    # Vacation responders and ticket systems answer no mail that says it is automatic (RFC 3834).
    message["Auto-Submitted"] = "auto-generated"
    valid = f"It works once, for you only, until {_when(expires)}; opening it decides nothing."
    text = "\n".join(
        ["A tool call waits for your decision.", "", *(f"{name}: {value}" for name, value in rows), "",
         "Approve or deny it here:", link, valid, ""]
    )
    message.set_content(text)
    cells = "".join(f"<tr><th align=\"left\">{html.escape(name)}</th><td>{html.escape(str(value))}</td></tr>" for name, value in rows)
    message.add_alternative(
        f"<!doctype html><html><body><p>A tool call waits for your decision.</p><table>{cells}</table>"
        f"<p><a href=\"{html.escape(link)}\">Approve or deny it</a></p><p>{html.escape(valid)}</p></body></html>",
        subtype="html",
    )
    return message
