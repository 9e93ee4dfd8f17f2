"""Support for the tests: the one clock, fake ADK, chat service factory, chat requests and recorded
ADK event streams the tests share (docs/testing.md, "Test support"). Use these instead of writing
another; a behaviour a test needs that they lack is an option here, not a copy there."""
