"""Several replicas as one gateway: where each chat runs, and the state replicas share (docs/scaling.md)."""
