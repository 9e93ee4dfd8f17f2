"""The operations fault suite: the failures an operator meets, each proved on the production topology.

Two gateway replicas on a real redis-server, the stock ADK API server with the gateway plugin
behind a round-robin balancer, and a ledger of every payment the agent really made
(`DEMO_TOOL_LEDGER`). Each scenario of test_failure_modes.py is one row of the "Failure modes"
table in docs/operations.md. `make chaos` runs just this package; `make test` runs it too.
"""
