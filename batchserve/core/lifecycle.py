"""The request lifecycle: every state a request may be in and every move between them.

A request is admitted ``queued``; a batcher claims it into a batch (``running``); it ends in
exactly one terminal state, or a reap or retry puts it back in the queue. The job store builds
each of its state-changing statements from this table (the states a move may start from are
the ``WHERE state IN (...)`` of its statement), so no write can make a move that is not listed
here. Pure data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from batchserve.core.domain import TERMINAL_STATES, RequestState

S = RequestState


class Cause(StrEnum):
    """Why a request changes state."""

    CLAIM = "claim"  # a batcher dispatches it in a batch
    RESULT = "result"  # its batch's worker writes the model's answer or the item's error
    POISON = "poison"  # it made the model fail alone once too often
    REQUEUE = "requeue"  # its batch crashed or was abandoned, or it is retried alone
    CANCEL = "cancel"  # the caller cancelled it
    DEADLINE = "deadline"  # its deadline passed or cannot be met
    JOB_ENDED = "job_ended"  # its bulk job expired or was cancelled first


@dataclass(frozen=True, slots=True)
class Transition:
    source: RequestState
    target: RequestState
    cause: Cause
    actor: str  # the role that makes it


TRANSITIONS: tuple[Transition, ...] = (
    Transition(S.QUEUED, S.RUNNING, Cause.CLAIM, "batcher"),
    Transition(S.RUNNING, S.SUCCEEDED, Cause.RESULT, "worker"),
    Transition(S.RUNNING, S.FAILED, Cause.RESULT, "worker"),
    Transition(S.RUNNING, S.FAILED, Cause.POISON, "worker, maintenance"),
    Transition(S.RUNNING, S.QUEUED, Cause.REQUEUE, "worker, maintenance, batcher"),
    Transition(S.QUEUED, S.CANCELLED, Cause.CANCEL, "api"),
    Transition(S.RUNNING, S.CANCELLED, Cause.CANCEL, "api"),
    Transition(S.QUEUED, S.EXPIRED, Cause.DEADLINE, "batcher, maintenance"),
    # While an engine runs it, or when a reap finds it past its deadline.
    Transition(S.RUNNING, S.EXPIRED, Cause.DEADLINE, "worker, maintenance"),
    Transition(S.QUEUED, S.EXPIRED, Cause.JOB_ENDED, "job driver"),
    Transition(S.RUNNING, S.EXPIRED, Cause.JOB_ENDED, "job driver"),
    Transition(S.QUEUED, S.CANCELLED, Cause.JOB_ENDED, "job driver"),
    Transition(S.RUNNING, S.CANCELLED, Cause.JOB_ENDED, "job driver"),
)

INITIAL_STATE = S.QUEUED
# Re-exported: ``RequestState.terminal`` reads the same set.
TERMINAL = TERMINAL_STATES
# Not yet ended: a request in one of these may still be answered.
OPEN = frozenset(s for s in RequestState if s not in TERMINAL)


def allowed(source: RequestState, target: RequestState) -> bool:
    return any(t.source is source and t.target is target for t in TRANSITIONS)


def targets(cause: Cause) -> tuple[RequestState, ...]:
    """The states ``cause`` may move a request to, in the table's order."""
    return tuple(dict.fromkeys(t.target for t in TRANSITIONS if t.cause is cause))


def sources(cause: Cause, target: RequestState) -> tuple[RequestState, ...]:
    """The states ``cause`` may move a request from to reach ``target``; none is an error."""
    found = tuple(t.source for t in TRANSITIONS if t.cause is cause and t.target is target)
    if not found:
        raise ValueError(f"no transition to {target.value} for {cause.value}")
    return found


def common_sources(cause: Cause) -> tuple[RequestState, ...]:
    """The states ``cause`` may move a request from, whichever of its targets it reaches
    (a result write sets each row's own); a cause whose targets differ there has none."""
    found = [set(sources(cause, target)) for target in targets(cause)]
    common = set.intersection(*found) if found else set()
    if not common or any(f != common for f in found):
        raise ValueError(f"{cause.value} moves requests from different states by target")
    return tuple(s for s in RequestState if s in common)


def values(states: tuple[RequestState, ...] | frozenset[RequestState]) -> tuple[str, ...]:
    """The stored values of ``states``, in a stable order (for ``IN (...)`` clauses)."""
    return tuple(s.value for s in RequestState if s in states)
