"""The test deployment harness and chaos runs.

``batchserve chaos`` and the suites that start real roles use it; no role imports it.
"""
