"""What a request's message on ``requests.<model>`` carries: a small interactive request's
work travels with it (the batcher offers it to a batch sent ahead without a read); a bulk or
a large one travels without, as before."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import orjson

from batchserve.core.domain import Lane, QueueMessage
from batchserve.core.records import CARRIED_WORK_BYTES, command_message
from tests.support.stepped import command


def test_a_small_interactive_request_carries_its_work_through_the_queue() -> None:
    """As the README says (the batcher's offer to a batch sent ahead; the offer itself:
    ``tests/unit/test_late_joiners.py``, carried and read)."""
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "a small interactive request's work travels in its message" in readme
    cmd = command("three word prompt", model="echo", now=time.time())
    message = command_message(cmd)
    assert message.work == {"input": cmd.input, "messages": None, "params": cmd.params}
    assert QueueMessage.decode(message.encode()) == message
    assert QueueMessage.decode_any(QueueMessage.encode_pack([message, message])) == [message] * 2


def test_a_bulk_or_a_large_request_is_read_back_instead() -> None:
    now = time.time()
    bulk = replace(command("a line of a batch file", model="echo", now=now), lane=Lane.BULK)
    large = command("x" * CARRIED_WORK_BYTES, model="echo", now=now)
    for cmd in (bulk, large):
        message = command_message(cmd)
        assert message.work is None
        assert "work" not in orjson.loads(message.encode())  # not a byte more than before


def test_a_message_whose_work_is_not_the_workers_fields_carries_none() -> None:
    """A message from elsewhere (an older or a foreign publisher) whose ``work`` is not
    exactly the fields a worker runs is read back from Postgres, never run as it came."""
    message = command_message(command("prompt", model="echo", now=time.time()))
    data = message.as_dict()
    for work in ([1, 2], {"input": "x"}, {**data["work"], "extra": 1}):
        assert QueueMessage.from_dict({**data, "work": work}).work is None
