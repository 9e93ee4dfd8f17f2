"""Scenarios: recorded ADK runs and AI SDK browser requests played against the chat service in process
(docs/testing.md, "Scenarios")."""
