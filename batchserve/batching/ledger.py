"""An engine model's capacity as its batcher sees it: what is free, what is out. Pure.

Engine workers announce what their engines hold at once (sequences, and KV tokens: prompt plus
``max_tokens`` summed over sequences). The batcher counts every request it dispatched against
that until it hears the request's sequence left its engine (``SequencesFreed``), its batch
closed, or Postgres says it is no longer running; only what is left over is offered to the
policy. So the rule of the batch world holds here too: no work is sent that no engine has room
for, and requests arriving meanwhile wait in the batcher and join the next dispatch.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Credit:
    """Room for ``seqs`` more sequences holding ``tokens`` more KV tokens between them."""

    seqs: int
    tokens: int


class EngineLedger:
    def __init__(self) -> None:
        self.capacity = Credit(0, 0)
        self._out: dict[uuid.UUID, dict[str, int]] = {}  # batch -> request id -> token cost

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._out

    def batches(self) -> set[uuid.UUID]:
        return set(self._out)

    def resize(self, capacity: Credit) -> None:
        self.capacity = capacity

    @property
    def seqs_out(self) -> int:
        return sum(len(members) for members in self._out.values())

    @property
    def tokens_out(self) -> int:
        return sum(sum(members.values()) for members in self._out.values())

    def free(self) -> Credit:
        """What can be sent now."""
        return Credit(
            max(0, self.capacity.seqs - self.seqs_out),
            max(0, self.capacity.tokens - self.tokens_out),
        )

    def cost(self, prompt_tokens: int, max_tokens: int) -> int:
        """A request's KV tokens, never more than a whole engine: one too big for any engine
        still goes (to an empty one) and is refused there with an error naming the limit."""
        return min(prompt_tokens + max_tokens, max(1, self.capacity.tokens))

    def take(self, batch_id: uuid.UUID, costs: Mapping[str, int]) -> None:
        self._out.setdefault(batch_id, {}).update(costs)

    def release(self, batch_id: uuid.UUID, request_ids: Iterable[str]) -> bool:
        """Sequences left their engine; True if that freed anything."""
        members = self._out.get(batch_id)
        if members is None:
            return False
        freed = [members.pop(r) for r in request_ids if r in members]
        if not members:
            del self._out[batch_id]
        return bool(freed)

    def close(self, batch_id: uuid.UUID) -> bool:
        """The batch is over, whatever became of its members."""
        return self._out.pop(batch_id, None) is not None

    def sync(
        self, running: Mapping[uuid.UUID, Mapping[str, int]], keep: Collection[uuid.UUID]
    ) -> bool:
        """Make what is out equal what Postgres says is running (``running``: batch -> its
        running members), except batches in ``keep`` (dispatched while the query ran, or
        closed since). True if that freed anything."""
        freed = False
        for batch_id in list(self._out):
            if batch_id in keep:
                continue
            now_running: Mapping[str, int] = running.get(batch_id, {})
            members = self._out[batch_id]
            for request_id in [r for r in members if r not in now_running]:
                del members[request_id]
                freed = True
            if not members:
                del self._out[batch_id]
        for batch_id, found in running.items():
            if batch_id not in self._out and batch_id not in keep:
                self._out[batch_id] = dict(found)  # another batcher's, found after takeover
        return freed
