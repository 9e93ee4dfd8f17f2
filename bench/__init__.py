"""The gateway's benchmark suite (`make bench`, `python -m bench`): see docs/performance.md.

Parts: `events` (streams built from ADK events recorded from the real server), `fake_upstream`
(a fast fake ADK API server that replays them), `passthrough` (the bare aiohttp reference proxy),
`nginx` (the nginx reference proxy), `procs` (processes, their CPU time and RSS from /proc),
`clients` (SSE and WebSocket load clients), `scenarios` (the measurements), `agentic` (issue 18's
short turns, approval pairs, tool-heavy stream and time to first text) and `run` (one run of
everything: the table and bench/results.json).
"""
