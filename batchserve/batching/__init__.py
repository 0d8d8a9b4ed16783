"""Batching: the pure policy, the batch-time model, the simulator, and the batcher process."""
