"""Workers: the Celery app, the batch task, maintenance."""
