"""The `grants:` section: bounds on standing grants (approvals/grants.py, the grants API
edge/grants_api.py), which people give at run time; the section only limits them."""

from __future__ import annotations

from pydantic import Field

from .values import Duration, Section

__all__ = ["GrantsConfig"]


class GrantsConfig(Section):
    """How long a grant may stand, and how many one granter may keep."""

    # The longest `ttl` a grant may ask for (a request asking more is refused, 400): a standing
    # approval should lapse within a working day unless someone gives it again.
    max_ttl: Duration = Field(86400.0, gt=0)
    # Grants one chatting user, or one approver group, may keep at once (429 beyond): each is read
    # on every gated call of its users, so their number is bounded.
    max_per_owner: int = Field(50, ge=1, le=1000)
