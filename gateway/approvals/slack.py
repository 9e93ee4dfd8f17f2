"""The Slack channel of approvals: a message with Approve / Deny buttons when an approval starts
waiting for its approvers, updated (buttons gone, who decided) when it is decided or expires.

`SlackChannel.notify(notice)` is a notice sink beside the webhooks (approvals/webhooks.py) and, like
them, only enqueues: a task per notice calls Slack's Web API (`chat.postMessage`, `chat.update`) with
the bot's token, retrying 429 (after Slack's `Retry-After`), 5xx, timeouts and connection errors after
a growing, jittered delay, at most `notifications.max_attempts` times; Slack's `{"ok": false}` is final.
Nothing here can fail or hold a decision: `notify` never raises or blocks, and a stop is bounded.

Only approvals its approvers decide are posted, and only once the approvals API lists them (the
listing's record gives the group, quorum and deadline; a press then votes on that record). Where the
message is (`channel`, `ts`) is kept in the shared store next to the approval (a call record,
`slack:<approval id>`), so the replica that reports the decision updates it, whichever posted it.
The presses come back through edge/slack.py, which votes through the approvals API's own vote.
Log lines name the approval and Slack's error code, never the token or the arguments.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import aiohttp
import orjson
import structlog

from ..config.schema import GatewayConfig
from ..config.slack import SlackConfig
from ..ops.backoff import Backoff, retry_after
from ..ops.logs import user_id_as_logged
from ..ops.metrics import GatewayMetrics
from ..ops.stopping import drain, pause
from ..ops.webhook_metrics import SLACK_WEBHOOK
from .notice import ApprovalNotice, Approver
from .slack_blocks import Facts, ended_message, waiting_message
from .store import StoreDown

__all__ = ["SlackChannel", "SlackStore", "message_key"]

log = structlog.get_logger("adk_gateway.approvals.slack")

# What a waiting notice's `asks` says when the chatting user answers (approvals/reports.py): not ours.
_CHATTING_USER = "the chatting user"
# Who ended an approval that was never the approvers' to decide: nothing was posted for it.
_NOT_POSTED = ("rule", "person")
# A notice can come before the listing it tells of (the listing is written after the chat reports):
# the record is read again after these pauses before the approval is taken as not listed.
_LISTING_WAITS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
# The message's place outlives the approval's deadline by this much (a late decision still updates it).
_KEEP_PAST_DEADLINE = 3600.0
# Web API calls in flight at once: Slack allows about one chat.postMessage a second per channel.
_CONCURRENCY = 4


def message_key(approval_id: str) -> str:
    """The shared store's call record that says where an approval's message is."""
    return f"slack:{approval_id}"


class SlackStore(Protocol):
    """What the channel reads and keeps in the shared state (cluster/shared.py `SharedState`)."""

    async def get_approval(self, approval_id: str) -> dict[str, Any] | None: ...

    async def put_call(self, call_id: str, record: dict[str, str], *, ttl: float) -> None: ...

    async def get_call(self, call_id: str) -> dict[str, str] | None: ...


class SlackChannel:
    """One replica's Slack channel: `notify` from the chat layer, `respond` for a press's private
    answer, `start` and a bounded `stop` with the app. The config is read at each notice."""

    def __init__(
        self, config: Callable[[], GatewayConfig], store: SlackStore, metrics: GatewayMetrics, *,
        wall: Callable[[], float] = time.time, jitter: Callable[[], float] = random.random,
        listing_waits: tuple[float, ...] = _LISTING_WAITS,
    ) -> None:
        self._config = config
        self._store = store
        self._metrics = metrics
        self._wall = wall
        self._jitter = jitter
        self._listing_waits = listing_waits
        self._slots = asyncio.Semaphore(_CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        # The post of each approval under way here: its update waits for it (it needs the `ts`).
        self._posting: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        """Open the HTTP client (in the running loop); notices before this are dropped."""
        if self._session is None:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), headers={"User-Agent": "adk-gateway-slack"})

    def notify(self, notice: ApprovalNotice) -> None:
        """Post or update the approval's message, in the background. Never blocks, never raises."""
        try:
            self._enqueue(notice)
        except Exception as exc:  # a message that cannot be sent must not fail the decision it tells of
            log.error("slack_notify_failed", approval_id=notice.approval_id, kind=notice.kind, error=repr(exc))

    def _enqueue(self, notice: ApprovalNotice) -> None:
        config = self._config()
        slack = config.notifications.slack
        if slack is None or not slack.wants(notice.agent, notice.tool, notice.rule):
            return
        if notice.kind == "waiting" and (not notice.asks or notice.asks[0] == _CHATTING_USER):
            return
        if notice.kind != "waiting" and notice.source in _NOT_POSTED:
            return
        why = "stopped" if self._stopping.is_set() else "not_started" if self._session is None else (
            "queue_full" if len(self._tasks) >= config.notifications.queue else None
        )
        if why is not None:
            self._counted(notice.kind, "dropped")
            log.warning("slack_dropped", approval_id=notice.approval_id, kind=notice.kind, reason=why)
            return
        if notice.kind == "waiting":
            task = self._spawn(self._post(config, slack, notice), notice)
            self._posting[notice.approval_id] = task
            task.add_done_callback(lambda done, key=notice.approval_id: self._forget_post(key, done))
        else:
            self._spawn(self._update(config, slack, notice, self._posting.get(notice.approval_id)), notice)

    def _forget_post(self, approval_id: str, done: asyncio.Task[None]) -> None:
        # Only its own entry: a second `waiting` of the approval may have replaced it meanwhile.
        if self._posting.get(approval_id) is done:
            del self._posting[approval_id]

    def _spawn(self, work: Coroutine[Any, Any, None], notice: ApprovalNotice) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._guarded(work, notice), name=f"slack-{notice.kind}-{notice.approval_id}")
        self._tasks.add(task)
        self._metrics.webhooks.queue(SLACK_WEBHOOK, len(self._tasks))
        task.add_done_callback(self._done)
        return task

    async def _guarded(self, work: Coroutine[Any, Any, None], notice: ApprovalNotice) -> None:
        try:
            await work
        except asyncio.CancelledError:
            self._counted(notice.kind, "dropped")
            raise
        except Exception as exc:  # a bug here costs this message alone, counted and logged
            self._counted(notice.kind, "failed")
            log.error("slack_delivery_error", approval_id=notice.approval_id, kind=notice.kind, error=repr(exc))

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._metrics.webhooks.queue(SLACK_WEBHOOK, len(self._tasks))

    # ---- the two messages ------------------------------------------------------------------

    async def _post(self, config: GatewayConfig, slack: SlackConfig, notice: ApprovalNotice) -> None:
        record = await self._listed(notice.approval_id)
        if record is None or not record.get("approvers"):
            log.info("slack_not_posted", approval_id=notice.approval_id, reason="not listed for approvers")
            return
        if await self._kept(notice.approval_id) is not None:
            # Told again (a replica took the chat over, or ADK's run asked again): posted already.
            log.info("slack_not_posted", approval_id=notice.approval_id, reason="posted already")
            return
        facts = Facts(str(record["approvers"]), int(record.get("quorum", 1)), float(record["deadline"]), record.get("hint"))
        body = waiting_message(notice, facts, requester=self._requester(config, notice), include_args=slack.include_args)
        answer = await self._call(config, slack, notice, "chat.postMessage", {"channel": slack.channel, **body})
        if answer is None:
            return
        kept = {"channel": str(answer.get("channel") or slack.channel), "ts": str(answer["ts"]), "group": facts.group,
                "quorum": str(facts.quorum), "deadline": repr(facts.deadline), "hint": facts.hint or ""}
        try:
            await self._store.put_call(message_key(notice.approval_id), kept, ttl=max(facts.deadline - self._wall(), 0.0) + _KEEP_PAST_DEADLINE)
        except StoreDown:
            log.warning("slack_message_not_kept", approval_id=notice.approval_id, reason="the shared store is unreachable")

    async def _update(self, config: GatewayConfig, slack: SlackConfig, notice: ApprovalNotice, post: asyncio.Task[None] | None) -> None:
        if post is not None:
            await asyncio.wait({post})  # posted here: its `ts` is kept once it ends, whichever way
        kept = await self._kept(notice.approval_id)
        if kept is None:
            return  # never posted (not the approvers', not listed, or the post failed)
        facts = Facts(kept["group"], int(kept["quorum"]), float(kept["deadline"]), kept.get("hint") or None)
        body = ended_message(
            notice, facts, requester=self._requester(config, notice), include_args=slack.include_args,
            who=lambda approver: self._decider(config, slack, approver),
        )
        await self._call(config, slack, notice, "chat.update", {"channel": kept["channel"], "ts": kept["ts"], **body})

    async def _kept(self, approval_id: str) -> dict[str, str] | None:
        """Where the approval's message is, as kept in the shared store (None: not posted, or unreadable)."""
        try:
            kept = await self._store.get_call(message_key(approval_id))
        except StoreDown:
            log.warning("slack_message_unread", approval_id=approval_id, reason="the shared store is unreachable")
            return None
        return kept if kept is not None and "ts" in kept else None

    async def _listed(self, approval_id: str) -> dict[str, Any] | None:
        for wait in (*self._listing_waits, None):
            try:
                record = await self._store.get_approval(approval_id)
            except StoreDown:
                record = None
            if record is not None or wait is None:
                return record
            await pause(wait, self._stopping)
        return None

    @staticmethod
    def _requester(config: GatewayConfig, notice: ApprovalNotice) -> str | None:
        key = config.logging.user_id_key
        return user_id_as_logged(config.logging.user_id, key.get_secret_value() if key is not None else None)(notice.requester)

    @staticmethod
    def _decider(config: GatewayConfig, slack: SlackConfig, approver: Approver) -> str:
        """A decider as the message names them: a Slack user as Slack shows them, anyone else by
        their approver id (an approver is named as the approvals API names them to other approvers)."""
        if approver.auth == "slack":
            for slack_id in slack.users:
                principal = slack.approver(config.approvers, slack_id)
                if principal is not None and principal.id == approver.user:
                    return f"<@{slack_id}>"
        text = approver.user.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return f"{text} ({approver.auth})"

    # ---- the Web API -------------------------------------------------------------------------

    async def _call(
        self, config: GatewayConfig, slack: SlackConfig, notice: ApprovalNotice, method: str, body: dict[str, Any],
    ) -> dict[str, Any] | None:
        """One Web API call, retried as the module says; Slack's answer, or None (counted, logged)."""
        settings = config.notifications
        backoff = Backoff(settings.backoff, settings.backoff_max)
        attempt = 0
        while True:
            attempt += 1
            last = self._stopping.is_set()
            async with self._slots:
                outcome, answer, wait = await self._attempt(slack, method, body)
            self._metrics.webhooks.attempt(SLACK_WEBHOOK, outcome)
            if outcome == "2xx":
                self._counted(notice.kind, "delivered", max(self._wall() - notice.at, 0.0))
                return answer
            error = str(answer.get("error")) if answer else None
            if outcome not in ("429", "5xx", "timeout", "error") or attempt >= settings.max_attempts or last:
                self._counted(notice.kind, "dropped" if last and outcome != "4xx" else "failed")
                log.warning("slack_call_failed", approval_id=notice.approval_id, method=method, attempts=attempt,
                            outcome=outcome, error=error)
                return None
            delay = backoff.failed()
            delay = delay / 2 + delay / 2 * self._jitter()
            if wait is not None:
                delay = min(max(wait, delay), settings.backoff_max)
            await pause(delay, self._stopping)

    async def _attempt(self, slack: SlackConfig, method: str, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None, float | None]:
        """(outcome, Slack's JSON answer, Retry-After seconds)."""
        assert self._session is not None  # calls start only once it is open
        # Slack reads a JSON body with its charset said (else it answers with a `missing_charset` warning).
        headers = {"Authorization": f"Bearer {slack.bot_token.get_secret_value()}", "Content-Type": "application/json; charset=utf-8"}
        try:
            async with self._session.post(
                f"{slack.api_base.rstrip('/')}/{method}", data=orjson.dumps(body), headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=slack.timeout),
            ) as response:
                status = response.status
                wait = retry_after(response.headers.get("Retry-After"), self._wall())
                answer = await response.json(content_type=None) if 200 <= status < 300 else None
        except TimeoutError:
            return "timeout", None, None
        except (aiohttp.ClientError, OSError, ValueError):
            return "error", None, None
        if status == 429:
            return "429", None, wait
        if status >= 500:
            return "5xx", None, wait
        if status >= 300 or not isinstance(answer, dict):
            return ("3xx" if 300 <= status < 400 else "4xx"), None, None
        # Slack answers its errors 200 with `ok: false`; asking again will not change them.
        return ("2xx" if answer.get("ok") is True else "4xx"), answer, None

    async def respond(self, response_url: str, text: str) -> None:
        """A private answer to the person who pressed (Slack's `response_url`): one try, bounded;
        never raises. Only to a URL under `response_url_prefix`."""
        slack = self._config().notifications.slack
        if slack is None or self._session is None or not response_url.startswith(slack.response_url_prefix):
            log.warning("slack_response_skipped", reason="no channel, or a response_url off Slack's")
            return
        body = {"response_type": "ephemeral", "replace_original": False, "text": text}
        try:
            async with self._session.post(response_url, json=body, allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=slack.timeout)) as response:
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("slack_response_failed", error=type(exc).__name__)
            return
        if status != 200:
            log.warning("slack_response_failed", status=status)

    # ---- counting, stopping -------------------------------------------------------------

    def _counted(self, kind: str, result: str, seconds: float | None = None) -> None:
        self._metrics.webhooks.delivery(SLACK_WEBHOOK, kind, result, seconds)

    async def stop(self, timeout: float) -> None:
        """Stop taking notices, give calls under way up to `timeout`, cancel the rest, close the client."""
        self._stopping.set()
        await drain(self._tasks, timeout, what="slack calls")
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
