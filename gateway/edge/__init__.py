"""The HTTP edge: the aiohttp application and process, the browser transports (SSE, WebSocket), admission, the internal listener and reload.
"""
