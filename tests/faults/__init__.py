"""Fault injection for tests: an ADK API server look-alike that misbehaves on demand (see upstream/client.py)."""
