"""The upstream side: ADK API servers reached over HTTP (`/run_sse`) and WebSocket (`/run_live`), per agent, with their health.
"""
