"""Benchmarks: ``batchserve bench`` and its scenarios.

Loaded only when that command runs; its libraries come with ``pip install batchserve[bench]``.
"""
