"""Webhook delivery: the outbox relay, the sender that signs and posts, and the worker role.

A terminal request with a ``webhook_url`` has a delivery row, written with its state change.
The relay claims due rows and hands each to a sender (a Celery task on the ``webhooks`` queue,
or an in-process task in the embedded mode); the sender makes one signed attempt and records
what came of it. See ``core.store.webhooks`` for the lease that makes this at-least-once.
"""
