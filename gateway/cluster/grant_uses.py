"""The shell's side of standing grants on the owner of a chat: before the chat's machine decides a
plugin's ask, read the user's grants from the shared store, keep those that could decide the call
(approvals/grants.py `candidates`) whose granter still stands for their group, and reserve a
use of one; after, keep the use if the grant
decided the call, else give it back (cluster/remote_gate.py `here` calls both).

Reserved before the decision, and in one step with every replica's (the store's atomic take): two
calls at once never spend one use twice. A store that cannot answer grants nothing: the call is
asked as it would be without grants (fail closed).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from ..approvals.grants import Grant, candidates, grant_rule, granter_stands
from ..approvals.ports import GatedCalls
from ..approvals.store import GrantStore
from .messages import Gate
from .shared import SharedStateDown

__all__ = ["GrantUses"]

log = structlog.get_logger("adk_gateway.cluster.grant_uses")

# Candidates tried when a use cannot be reserved (another call took the last one meanwhile).
_MAX_TRIES = 4


class GrantUses:
    """Reserve and settle grant uses for the plugin's asks answered here."""

    def __init__(self, store: GrantStore, calls: GatedCalls, wall: Callable[[], float] = time.time) -> None:
        self._store = store
        self._calls = calls
        self._wall = wall

    async def reserve(self, gate: Gate) -> Grant | None:
        """A grant that could decide the gate's call, a use of it reserved (None: none could)."""
        scope = self._calls.grant_scope(gate.app, gate.user, gate.session)
        if scope is None:
            return None
        try:
            kept = await self._store.grants_of(gate.user)
            found = candidates(
                kept, agent=scope.agent, tool=gate.tool, user=gate.user, chat=scope.chat_id, args=gate.args,
                claims=scope.claims, now=self._wall(),
            )
            standing = [grant for grant in found if granter_stands(grant, scope.approvers)]
            for grant in standing[:_MAX_TRIES]:
                if grant.uses_left is None or await self._store.take_grant_use(grant.id):
                    return grant
        except SharedStateDown:
            log.warning("grants_unreadable", tool=gate.tool)
        return None

    async def settle(self, grant: Grant | None, gate: Gate, *, opened: bool) -> None:
        """Keep the reserved use if `grant` decided the call (`opened`: the machine decided a new
        ask, so its ledger says who decided it), else give it back."""
        if grant is None:
            return
        call = self._calls.find(app_name=gate.app, user_id=gate.user, session_id=gate.session, tool_call_id=gate.tool_call_id)
        if opened and call is not None and call.rule == grant_rule(grant.id):
            log.info("gate_decided_by_grant", approval_id=call.id, grant_id=grant.id, tool=gate.tool)
            return
        if grant.uses_left is None:
            return
        try:
            await self._store.give_back_grant_use(grant.id)
        except SharedStateDown:
            # Lost with the outage: the grant decides one call fewer, never one more.
            log.warning("grant_use_not_given_back", grant_id=grant.id)
