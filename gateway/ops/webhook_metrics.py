"""The approval webhooks' series (approvals/webhooks.py delivers; docs/metrics.md documents them):
deliveries, attempts, how long a notice took to arrive, what waits; and the approval mails', by
result (approvals/email.py). Part of the gateway's registry (metrics.py); each configured webhook's
series, and the mails' once `notifications.email` is set, are exported at 0 by `know`. The Slack
channel's Web API calls (approvals/slack.py) are counted as a webhook's, the webhook `@slack` (no
webhook name has an `@`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .metric_labels import EMAIL_RESULTS, WEBHOOK_ATTEMPTS, WEBHOOK_BUCKETS, WEBHOOK_EVENTS, WEBHOOK_RESULTS

if TYPE_CHECKING:
    from ..config.notifications import NotificationsConfig

__all__ = ["SLACK_WEBHOOK", "WebhookMetrics"]

# The `webhook` label of the Slack channel's calls.
SLACK_WEBHOOK = "@slack"


class WebhookMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.deliveries = Counter(
            "adk_gateway_webhook_deliveries_total",
            "Approval notices to deliver to a webhook, by webhook, event (waiting, decided, expired) and result "
            "(delivered; failed: refused with a 4xx or 3xx, or still failing after notifications.max_attempts; "
            "dropped: the webhook's queue was full or the gateway stopped first).",
            ["webhook", "event", "result"], registry=r,
        )
        self.attempts = Counter(
            "adk_gateway_webhook_attempts_total",
            "Calls to a webhook, by webhook and outcome (2xx, 3xx, 4xx, 429, 5xx, timeout, error: no answer).",
            ["webhook", "outcome"], registry=r,
        )
        self.delivery_seconds = Histogram(
            "adk_gateway_webhook_delivery_seconds",
            "From an approval's notice to its webhook call answered 2xx, retries included, by webhook.",
            ["webhook"], buckets=WEBHOOK_BUCKETS, registry=r,
        )
        self.pending = Gauge(
            "adk_gateway_webhook_pending",
            "Deliveries a webhook has on this replica (waiting, in flight or between attempts), by webhook.",
            ["webhook"], registry=r,
        )

        self.emails = Counter(
            "adk_gateway_approval_emails_total",
            "Approval mails (notifications.email), by result: sent and failed (still failing after "
            "notifications.max_attempts) count one per approver and approval; dropped one per approval whose "
            "mails were not sent (the queue was full, or the gateway stopped first).",
            ["result"], registry=r,
        )

    def know(self, notifications: NotificationsConfig) -> None:
        """Export each configured webhook's series at 0 until counted. Idempotent: a reload calls it
        again for the webhooks it adds; series of webhooks it removes stay (at their last value)."""
        names = [hook.name for hook in notifications.webhooks]
        if notifications.slack is not None:
            names.append(SLACK_WEBHOOK)
        for name in names:
            for event in WEBHOOK_EVENTS:
                for result in WEBHOOK_RESULTS:
                    self.deliveries.labels(name, event, result)
            for outcome in WEBHOOK_ATTEMPTS:
                self.attempts.labels(name, outcome)
            self.delivery_seconds.labels(name)
            self.pending.labels(name)
        if notifications.email is not None:
            for result in EMAIL_RESULTS:
                self.emails.labels(result)

    def delivery(self, webhook: str, event: str, result: str, seconds: float | None = None) -> None:
        """Count how one delivery ended (WEBHOOK_RESULTS), and how long a delivered one took."""
        self.deliveries.labels(webhook, event, result).inc()
        if seconds is not None:
            self.delivery_seconds.labels(webhook).observe(seconds)

    def attempt(self, webhook: str, outcome: str) -> None:
        """Count one call to a webhook (WEBHOOK_ATTEMPTS)."""
        self.attempts.labels(webhook, outcome).inc()

    def email(self, result: str) -> None:
        """Count one approval mail's end (EMAIL_RESULTS)."""
        self.emails.labels(result).inc()

    def queue(self, webhook: str, pending: int) -> None:
        self.pending.labels(webhook).set(pending)
