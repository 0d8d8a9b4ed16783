"""batchserve: a durable, batched LLM inference service."""
