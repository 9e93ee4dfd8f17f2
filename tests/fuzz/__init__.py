"""Property-based bad-input suite (hypothesis): HTTP bodies, headers, resume GETs, WebSocket frames,
forged approval answers and upstream faults, against real gateway processes. See conftest.py."""
