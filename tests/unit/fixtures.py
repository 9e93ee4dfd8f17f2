"""The old home of the recordings' helpers, now in tests/support (recordings.py, service.py): this
re-export keeps importing the few modules that still name it. Import tests.support instead."""

from __future__ import annotations

from tests.support.recordings import (  # noqa: F401
    LIVE,
    LIVE_FOLDERS,
    ROOT,
    SSE_FOLDERS,
    VERSIONS,
    check_stream_rules,
    continuing,
    convert,
    events,
    fixture_names,
    lines as _load,
    types,
)
from tests.support.service import GONE, held_engine  # noqa: F401
