"""Who is calling: the browser-facing identity that every chat is scoped to.

Mode `none` (the demo, loopback only) makes every caller the configured anonymous user. The
returned user id namespaces chats and ADK sessions, which is what keeps one user out of another's
chats once real authentication modes are configured.
"""

from __future__ import annotations

from aiohttp import web

from .config import AuthConfig

__all__ = ["Authenticator"]


class Authenticator:
    def __init__(self, config: AuthConfig) -> None:
        self._config = config

    def user_id(self, request: web.Request) -> str:
        """The caller's user id, or raise HttpError(401)."""
        return self._config.anonymous_user
