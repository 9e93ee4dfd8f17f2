"""The approvals room: what an approval is, and how it is decided, stored, listed, voted, audited and told.

An approval is a tool call that waits for a person's decision: the chatting user's, or its approvers'
(a group, with a quorum and self-approval) through the approvals API. It sits below the chat shell,
the cluster and access, which use it, and above `core/`, `config/` and `ops/`, which it uses,
behind three ports: the machine's own (core/gate_decider.py `GateDecider`: the core may not import
the room), the store's (`store.py`) and the chat's (`ports.py`). The edge imports it where the
object graph is built and held, in the approvals API and in its two other faces, the Slack presses
and the mailed links' decision page (tests/unit/test_layers.py;
docs/architecture.md, "The layers' rules"):

- `decision.py`: where an approval is decided: `decide_ask` (the tool's rules, who answers, how by
  the upstream mode), and `DECIDER`, the `GateDecider` every chat's machine is handed (sans-IO).
- `notice.py`: `ApprovalNotice`, what the gateway tells the world about one approval (waiting,
  decided, expired), and the arguments' digest. Plain data (sans-IO).
- `reports.py`: `Notices`, the chat shell's one door into the room: each approval's start and
  decision reported once, after the fact, counted, and handed to the sinks (the audit trail, the
  webhooks).
- `index.py`: where the shared directory lists a pending approval and in what order; the
  listing's cursor (sans-IO).
- `votes.py`: what one approver's vote does to an approval, its quorum of distinct voters who still
  count (sans-IO; the Redis backend runs the same rule as a Lua script).
- `audit_trail.py`: `AuditTrail`, one record per decided approval, as a log line and in the store.
- `webhooks.py`: `Webhooks`, approval notices delivered to the configured webhooks, signed and retried.
- `slack.py`: `SlackChannel`, approvals its approvers decide posted to a Slack channel with Approve /
  Deny buttons, and the message updated once decided or expired; `slack_blocks.py`, those messages
  (Block Kit, sans-IO). The presses come back through edge/slack.py, as approvals API votes.
- `email.py`: `EmailNotices`, approvers of a waiting approval mailed a one-time decision link
  (`notifications.email`); `email_links.py`: those links, signed, expiring, bound to one approver.
  Their votes come back through edge/decision_page.py, as approvals API votes.
- `store.py`: `ApprovalStore`, the room's port to the store the replicas share (the directory of
  pending approvals, the audit trail), declared here and inherited by cluster/shared.py
  `SharedState`; `StoreDown`, what a store that cannot answer raises (503).
- `ports.py`: the room's ports to the chat, called by the cluster (sans-IO): `GatedCalls`, the
  plugin's ask reaching a chat (implemented by the chat's gates), and `ApprovalDecisions`,
  approvers' counted decision applied where the call's chat runs (implemented by the chat's desk view).

Its neighbours, each in the layer of its other concern: the machine's side of the decision, its
port (`core/gate_decider.py`), one call's states (`core/approvals.py` `GatedCall`) and who answers
an ADK confirmation (`core/approver_confirmations.py`, which the converter and the turn read too),
sans-IO in the core; the store's two backends of the directory and the trail in `cluster/`
(`memory_approvals.py`, `redis_approvals.py`, `redis_audit.py`); a decision carried to the replica
that runs the chat, `cluster/approval_desk.py`; the HTTP API, `edge/approvals_api.py`; who may
decide, `access/approvers.py`; the `approvers:`, `audit:` and `notifications:` sections, `config/`.
"""
