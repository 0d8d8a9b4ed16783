"""A worker stopped at the moment it hands a batch to a pool process: Python imports this module
at start-up when its folder is on ``PYTHONPATH`` (tests/chaos/test_workers.py).

The first pool process to take a task sends its parent, the worker's main process, SIGTERM
before it acknowledges the task, and acknowledges it 3 s later: Celery's warm shutdown then
begins with a batch in a pool process whose acknowledgement it has not read. (After 1 s, on a
loaded machine the main process had sometimes not flushed its pool yet: it read the
acknowledgement, kept the batch on its books and the moment never happened.) A SIGTERM from
outside lands there by chance, more often on a busy machine (a CI run's rolling restart). The
time of the SIGTERM (``time.time()``) is written to ``BATCHSERVE_TEST_STOP_MARK``, which also
makes it happen once per worker.
"""

import os

mark = os.environ.get("BATCHSERVE_TEST_STOP_MARK", "")
if mark:
    import signal
    import time

    import billiard.pool

    _after_fork = billiard.pool.Worker.after_fork

    def _acknowledging_late(self: billiard.pool.Worker) -> None:
        _after_fork(self)
        put = self.outq.put

        def late_put(message: object) -> None:
            if isinstance(message, tuple) and message and message[0] == billiard.pool.ACK:
                try:
                    fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass  # another process of this worker did it
                else:
                    os.write(fd, f"{time.time()}\n".encode())
                    os.close(fd)
                    os.kill(os.getppid(), signal.SIGTERM)
                    time.sleep(3.0)
            put(message)

        self.outq.put = late_put

    billiard.pool.Worker.after_fork = _acknowledging_late
