"""Model backends (fixed-latency, transformers, faulty) and the model registry."""
