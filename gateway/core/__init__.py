"""The sans-IO core: what a chat's turn, its approvals and the browser's and ADK's formats mean, as data in and data out.

Nothing here does I/O or reads a clock: no asyncio, aiohttp, redis or structlog (tests/unit/test_layers.py checks it).
"""
