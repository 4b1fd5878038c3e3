"""The reviewer runs a run started (review gates): the reviewed run's runner — a single run's,
or each child's of a workflow — says ``review.started`` with the reviewer's run id in its
events; a reviewer run is a child of the reviewed run (key ``review``), so a workflow's own
table of children does not hold it."""

from __future__ import annotations

from dataclasses import dataclass

from pisub.errors import PisubError
from pisub.protocol.status import Status
from pisub.store.paths import Home, is_run_id

MAX_EVENTS_BYTES = 1024 * 1024
"""How much of a child's events is read to find its review run."""


@dataclass(frozen=True)
class ReviewRun:
    """One reviewer run and the child whose work it reviews."""

    child_key: str | None
    child_run_id: str
    status: Status


def review_runs(home: Home, status: Status) -> list[ReviewRun]:
    """The reviewer runs a run started: a workflow's children's, in the children's order, or a
    single run's own (after crash repair); a run whose events or reviewer cannot be read is
    left out."""
    if status.runner != "workflow":
        return _started_by(home, None, status.run_id)
    found = []
    for step in status.steps:
        if step.run_id is not None:
            found += _started_by(home, step.key, step.run_id)
    return found


def _started_by(home: Home, key: str | None, run_id: str) -> list[ReviewRun]:
    from pisub.runs.reconcile import observe
    from pisub.store.runs import read_events

    found = []
    for event in read_events(home.run(run_id), limit=MAX_EVENTS_BYTES):
        review_id = event.data.get("runId") if event.type == "review.started" else None
        if not isinstance(review_id, str) or not is_run_id(review_id):
            continue
        try:
            found.append(ReviewRun(key, run_id, observe(home.run(review_id))))
        except PisubError:
            continue
    return found
