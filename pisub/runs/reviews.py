"""The reviewer runs a workflow's children started (review gates): each child's runner says
``review.started`` with the reviewer's run id in its events; a reviewer run is a child of the
reviewed run (key ``review``), so a workflow's own table of children does not hold it."""

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


def review_runs(home: Home, workflow: Status) -> list[ReviewRun]:
    """The reviewer runs the workflow's children started, in the children's order (after crash
    repair); a child whose events or reviewer cannot be read is left out."""
    from pisub.runs.reconcile import observe
    from pisub.store.runs import read_events

    found = []
    for step in workflow.steps:
        if step.run_id is None:
            continue
        for event in read_events(home.run(step.run_id), limit=MAX_EVENTS_BYTES):
            review_id = event.data.get("runId") if event.type == "review.started" else None
            if not isinstance(review_id, str) or not is_run_id(review_id):
                continue
            try:
                found.append(ReviewRun(step.key, step.run_id, observe(home.run(review_id))))
            except PisubError:
                continue
    return found
