"""Who is calling: browser identity (API keys, JWTs and their signing keys) and WebSocket tickets.
"""
