"""When a batch leaves: a pure function of (pending requests, now, free slots, config).

No I/O, no clock: the live batcher and the simulator call the same ``decide`` with numbers.
A batch is formed only when a worker slot is free. It leaves when it is full, when its oldest
request has waited ``max_batch_delay_s`` (measured from that request's arrival at the batcher,
never restarted), or when waiting longer would make a member miss its deadline. A request whose
deadline cannot be met even if it were dispatched now is expired without running.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from batchserve.batching.estimate import BatchShape, BatchTimeEstimator
from batchserve.batching.ledger import Credit
from batchserve.core.domain import Lane

POLICY_KINDS = ("timer", "greedy", "size-only", "adaptive")

# A request expires this long after the last moment it could start and still finish in time;
# waking at exactly that moment gives the same float on both sides of the comparison.
_EXPIRY_SLACK_S = 1e-6


@dataclass(frozen=True, slots=True)
class Pending:
    """A request waiting in the batcher."""

    id: str
    arrived_at: float
    deadline: float
    lane: Lane = Lane.INTERACTIVE
    prompt_tokens: int = 1
    max_tokens: int = 1
    group: str | None = None  # requests requeued after a crash batch only within their group
    tenant: str = ""

    @property
    def cost_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """``timer`` waits up to ``max_batch_delay_s``; ``adaptive`` treats it as a ceiling (and
    never waits longer than one batch time); ``greedy`` and ``size-only`` ignore it."""

    kind: str = "adaptive"
    max_batch_size: int = 32
    max_batch_delay_s: float = 0.010
    max_batch_tokens: int | None = None
    # With a batch time that grows with the longest generation, requests batch only with
    # others of their length class (max_tokens up to each edge): a short answer then never
    # waits for a long one to finish. Empty: no grouping.
    length_edges: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"unknown policy {self.kind!r}; one of {', '.join(POLICY_KINDS)}")


@dataclass(frozen=True, slots=True)
class Load:
    """What the adaptive rule reads besides the pending requests."""

    arrival_rate: float = 0.0  # requests/s, recently observed
    busy_until: tuple[float, ...] = ()  # expected end of each batch now running
    last_dispatch_at: float = -math.inf  # when the latest batch left
    weights: Mapping[str, float] = field(default_factory=dict)  # tenant -> share (default 1)


@dataclass(frozen=True, slots=True)
class Decision:
    """Batches to dispatch now (at most one per free slot), requests to expire, next wake-up."""

    batches: tuple[tuple[Pending, ...], ...] = ()
    expire: tuple[Pending, ...] = ()
    wake_at: float | None = None


def decide(
    pending: Sequence[Pending],
    now: float,
    free_slots: int,
    config: PolicyConfig,
    estimator: BatchTimeEstimator,
    load: Load | None = None,
) -> Decision:
    """What to do at ``now``: see the module docstring for the rules."""
    load = load or Load()
    expire, alive, wake_at = _split_unmeetable(pending, now, estimator)
    batches: list[tuple[Pending, ...]] = []
    # With every slot busy nothing can leave: skip ordering what waits (a backlog of n made
    # each of its n decisions sort all n).
    for group in _groups_in_order(alive, config.length_edges) if free_slots > 0 else ():
        remaining = list(group)
        while remaining and free_slots > len(batches):
            batch, full = _fill(remaining, config, load.weights)
            slots = free_slots + len(load.busy_until)
            leave_at = (
                float("-inf")
                if full
                else _leave_at(batch, now, config, estimator, load, total_slots=slots)
            )
            if leave_at > now:
                wake_at = _min(wake_at, leave_at)
                break
            batches.append(tuple(batch))
            taken = {p.id for p in batch}
            remaining = [p for p in remaining if p.id not in taken]
    if wake_at is not None and math.isinf(wake_at):
        wake_at = None  # nothing but an arrival or a free slot can change the answer
    return Decision(batches=tuple(batches), expire=tuple(expire), wake_at=wake_at)


def decide_engine(
    pending: Sequence[Pending],
    now: float,
    free: Credit,
    config: PolicyConfig,
    estimator: BatchTimeEstimator,
    load: Load | None = None,
    *,
    cost: Callable[[Pending], int] = lambda p: p.cost_tokens,
) -> Decision:
    """What to send engines that have room for ``free`` more sequences and KV tokens.

    An engine takes a new sequence at its next step whatever else it runs, so waiting for
    company buys nothing: everything that fits goes now, in batches of at most
    ``max_batch_size``, interactive before bulk and tenants by weighted fair share. A retry
    group (members of a batch that crashed its engine) goes whole, as a batch of its own, once
    there is room for all of it. Requests that cannot meet their deadline even if they started
    now are expired; the rest wait for room.
    """
    load = load or Load()
    expire, alive, wake_at = _split_unmeetable(pending, now, estimator)
    seqs, tokens = free.seqs, free.tokens
    batches: list[tuple[Pending, ...]] = []
    for group in _groups_in_order(alive, ()) if seqs > 0 else ():  # full: nothing can go
        if group[0].group is not None:
            need = sum(cost(p) for p in group)
            if len(group) > seqs or need > tokens:
                break  # the oldest work first: nothing overtakes a waiting retry group
            batches.append(tuple(group))
            seqs, tokens = seqs - len(group), tokens - need
            continue
        batch: list[Pending] = []
        for p in fair_order(group, load.weights):
            if seqs <= 0:
                break
            if cost(p) > tokens:
                continue  # a smaller one behind it may still fit
            batch.append(p)
            seqs, tokens = seqs - 1, tokens - cost(p)
            if len(batch) == config.max_batch_size:
                batches.append(tuple(batch))
                batch = []
        if batch:
            batches.append(tuple(batch))
    return Decision(batches=tuple(batches), expire=tuple(expire), wake_at=wake_at)


def estimate_batch_s(batch: Sequence[Pending], estimator: BatchTimeEstimator) -> float:
    return estimator.batch_s(
        BatchShape(
            size=len(batch),
            prompt_tokens=sum(p.prompt_tokens for p in batch),
            max_new_tokens=max((p.max_tokens for p in batch), default=0),
        )
    )


def _split_unmeetable(
    pending: Sequence[Pending], now: float, estimator: BatchTimeEstimator
) -> tuple[list[Pending], list[Pending], float | None]:
    """Requests to expire, requests still meetable, and when the first of those stops being.

    A request expires just after the last moment it could be dispatched alone and still
    finish by its deadline.
    """
    expire: list[Pending] = []
    alive: list[Pending] = []
    earliest = math.inf
    alone_s: dict[tuple[int, int], float] = {}  # one estimate per request shape
    for p in pending:
        if math.isinf(p.deadline):
            alive.append(p)
            continue
        shape = (p.prompt_tokens, p.max_tokens)
        if shape not in alone_s:
            alone_s[shape] = estimate_batch_s((p,), estimator)
        expires_at = p.deadline - alone_s[shape] + _EXPIRY_SLACK_S
        if now >= expires_at:
            expire.append(p)
        else:
            alive.append(p)
            earliest = min(earliest, expires_at)
    return expire, alive, (None if math.isinf(earliest) else earliest)


def serving_order(pending: Sequence[Pending], weights: Mapping[str, float]) -> list[Pending]:
    """The order in which requests take seats: interactive lane first, FIFO, tenants taking
    turns by weight (as :func:`_fill` seats them)."""
    return fair_order(sorted(pending, key=_order_key), weights)


def _order_key(p: Pending) -> tuple[int, float, str]:
    return (0 if p.lane is Lane.INTERACTIVE else 1, p.arrived_at, p.id)


def length_class(max_tokens: int, edges: Sequence[int]) -> int:
    """Index of the first edge ``max_tokens`` fits under (``len(edges)`` past the last)."""
    for index, edge in enumerate(edges):
        if max_tokens <= edge:
            return index
    return len(edges)


def _groups_in_order(alive: Sequence[Pending], length_edges: Sequence[int]) -> list[list[Pending]]:
    """Requests split into groups that never share a batch, in the order they are served.

    Retry groups first (they have waited). Then the rest, one group per length class when
    ``length_edges`` is set, ordered by their first request. Within a group: interactive lane
    before bulk, FIFO within a lane.
    """
    groups: dict[tuple[str | None, int], list[Pending]] = {}
    for p in sorted(alive, key=_order_key):
        klass = length_class(p.max_tokens, length_edges) if p.group is None else 0
        groups.setdefault((p.group, klass), []).append(p)
    retries = [members for (group, _), members in groups.items() if group is not None]
    fresh = [members for (group, _), members in groups.items() if group is None]
    return retries + sorted(fresh, key=lambda members: _order_key(members[0]))


def _fill(
    ordered: Sequence[Pending], config: PolicyConfig, weights: Mapping[str, float]
) -> tuple[list[Pending], bool]:
    """The next batch within the count limit and the token budget; and whether it is full.

    Seats go to tenants by weighted fair share (see :func:`fair_order`), interactive lane
    first. A batch is full when it reached the count limit or when the token budget turned a
    waiting request away: waiting longer could not make it any fuller.
    """
    batch: list[Pending] = []
    tokens = 0
    turned_away = False
    for p in fair_order(ordered, weights):
        if len(batch) >= config.max_batch_size:
            return batch, True
        budget = config.max_batch_tokens
        if budget is not None and batch and tokens + p.cost_tokens > budget:
            turned_away = True
            continue  # a later, smaller request may still fit
        batch.append(p)
        tokens += p.cost_tokens
    return batch, turned_away or len(batch) >= config.max_batch_size


def fair_order(ordered: Sequence[Pending], weights: Mapping[str, float]) -> list[Pending]:
    """``ordered`` interleaved so tenants take turns, each in proportion to its weight.

    Weighted round robin with a deficit counter, lane by lane (interactive before bulk), FIFO
    within a tenant, tenants served in the order of their oldest request. One enthusiastic
    caller with a thousand requests waiting then takes its share of each batch, not all of it.
    """
    if len({p.tenant for p in ordered}) <= 1:
        return list(ordered)
    out: list[Pending] = []
    for lane in (Lane.INTERACTIVE, Lane.BULK):
        queues: dict[str, deque[Pending]] = {}
        for p in ordered:
            if p.lane is lane:
                queues.setdefault(p.tenant, deque()).append(p)
        if not queues:
            continue
        smallest = min(weights.get(t, 1.0) for t in queues)
        credit = dict.fromkeys(queues, 0.0)
        while queues:
            for tenant in list(queues):
                credit[tenant] += weights.get(tenant, 1.0) / smallest
                queue = queues[tenant]
                while credit[tenant] >= 1.0 and queue:
                    out.append(queue.popleft())
                    credit[tenant] -= 1.0
                if not queue:
                    del queues[tenant]
    return out


def _leave_at(
    batch: Sequence[Pending],
    now: float,
    config: PolicyConfig,
    estimator: BatchTimeEstimator,
    load: Load,
    *,
    total_slots: int,
) -> float:
    """The earliest time this partial batch should leave; at or before ``now`` means go."""
    if batch[0].group is not None:
        return float("-inf")  # a retry group never waits for company it may not have
    run_s = estimate_batch_s(batch, estimator)
    # Latest moment that still lets every member finish by its deadline.
    deadline_risk = min(p.deadline for p in batch) - run_s
    if config.kind == "greedy":
        return float("-inf")
    if config.kind == "size-only":
        return deadline_risk
    oldest = min(p.arrived_at for p in batch)
    if config.kind == "timer":
        return min(oldest + config.max_batch_delay_s, deadline_risk)
    # Adaptive: never hold a request longer than one batch time (or the configured ceiling).
    ceiling = oldest + min(config.max_batch_delay_s, run_s)
    adaptive = _adaptive_leave_at(len(batch), run_s, load, total_slots, config.max_batch_size)
    return min(adaptive, ceiling, deadline_risk)


def _adaptive_leave_at(
    size: int, run_s: float, load: Load, total_slots: int, max_batch_size: int
) -> float:
    """Pace partial batches one slot-period apart, and fill them when the load needs it.

    Pacing: with ``W`` slots each busy ``run_s`` per batch, a slot frees every ``run_s / W`` in
    steady state. Letting batches leave at most that often keeps the slots staggered, so a
    newcomer never waits much longer than one period for the next departure; sending every
    small batch at once instead (greedy) ties up all slots together and makes the next
    arrivals wait a whole batch time. At low load the last departure is long past and a batch
    goes at once.

    Filling: keeping up needs batches of ``rate * run_s / W`` on average; near saturation a
    smaller partial batch wastes capacity the queue will miss, so it waits to reach that size.
    """
    slots = max(1, total_slots)
    paced = load.last_dispatch_at + run_s / slots
    needed = load.arrival_rate * run_s / slots
    if needed < _FILL_FROM * max_batch_size or size >= needed:
        return paced
    return float("inf")  # an arrival (or the ceiling) will change the answer


# Fill partial batches only when keeping up needs batches at least this full on average.
_FILL_FROM = 0.8


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)
