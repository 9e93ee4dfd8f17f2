"""The support agent app, in the layout ADK's agent loader expects (``<app>/agent.py``)."""

from . import agent as agent
