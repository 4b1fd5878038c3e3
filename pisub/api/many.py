"""Acting on several runs at once: ``pisub stop A B``, ``stop --all|--agent A|--label L``,
``interrupt A B``.

Every run is resolved before anything is written (an unknown id or a prefix that matches several
runs refuses the whole command: nothing is acted on), the same run named twice is acted on once,
every request is written before any receipt is awaited (one deadline for all), and each run gets
one :class:`Outcome`. A selection (``--all``, ``--agent``, ``--label``) is the live runs no live
workflow stops with itself (:func:`live_runs`) at the moment it is read: a run that starts
later is not in it, and one that ends before its request is written is ``ended`` (not a
failure: it is no longer live); so is a run whose stop failed because its child had already
exited, once it has ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pisub.api.client import Run
from pisub.errors import InboxClosed, InvalidInput, PisubError
from pisub.protocol.control import Receipt, ReceiptState

OK_STATES = frozenset(
    {ReceiptState.DELIVERED, ReceiptState.QUEUED, ReceiptState.SCHEDULED, ReceiptState.RECOVERED}
)
ENDED = "ended"
"""An :class:`Outcome` state: the run of a selection ended before its request was written."""
REFUSED = "refused"
"""An :class:`Outcome` state: the request was refused before it was written (``code`` says why)."""
NO_ANSWER = "no answer"
"""An :class:`Outcome` state: no receipt past ``pending`` within the wait."""
WRITTEN = "written"
"""An :class:`Outcome` state: written, not awaited (``wait`` 0)."""


@dataclass
class Outcome:
    """What became of one run's request."""

    run_id: str
    type: str
    state: str
    """A receipt state (``delivered``, ``failed``...), or ended, refused, no answer, written."""
    request_id: str | None = None
    reason: str | None = None
    code: str | None = None
    """The error code of a refusal (``RUN_CLOSED``, ``NOT_RESUMABLE``...)."""
    receipt: Receipt | None = None

    @property
    def ok(self) -> bool:
        return self.state in OK_STATES or self.state in (ENDED, WRITTEN)


def resolve_runs(refs: Sequence[str], *, home: Path | None = None) -> list[Run]:
    """The runs named by ``refs`` (ids or unique prefixes), each once, in the order given.

    Raises:
        RunNotFound, AmbiguousRun, InvalidInput: naming the first bad reference (nothing is done).
    """
    if not refs:
        raise InvalidInput("give at least one run")
    runs: dict[str, Run] = {}
    for ref in refs:
        run = Run(ref, home=home)
        runs.setdefault(run.id, run)
    return list(runs.values())


WORKFLOW = "workflow"
"""A workflow coordinator's ``runner`` in its status."""


def live_runs(*, agent: str | None = None, label: str | None = None, home: Path | None = None) -> list[Run]:
    """The live (not ended) runs that no live workflow stops with itself, oldest first; only
    ``agent``'s, only those labelled ``label`` (exactly). A live workflow's children — those its
    status lists, a resumed workflow's re-attached ones included, and those naming it as their
    parent — are left to it; every other live run is in: the top-level ones, those whose
    parent has ended (a killed coordinator's children), and those started inside a single run
    (a single run's stop does not reach the runs it started)."""
    from pisub.runs.listing import list_statuses
    from pisub.store.paths import open_home_to_read

    h = open_home_to_read(home)  # (no home: no live run)
    live = [st for st in list_statuses(h, live_only=True).statuses if not st.state.is_terminal]
    workflows = {st.run_id: st for st in live if st.runner == WORKFLOW}
    coordinated = {step.run_id for st in workflows.values() for step in st.steps if step.run_id}
    statuses = [
        st
        for st in live
        if st.run_id not in coordinated
        and st.parent_run_id not in workflows
        and (agent is None or st.agent == agent)
        and (label is None or st.label == label)
    ]
    statuses.sort(key=lambda st: st.started_at)
    return [Run(st.run_id, home=h.root) for st in statuses]


def stop_runs(
    runs: Sequence[Run], *, reason: str | None = None, wait: float = 3.0, selected: bool = False
) -> list[Outcome]:
    """Stop every run in ``runs``; one outcome each, in order. ``selected``: the runs are a
    selection (a run that has ended meanwhile is ``ended``, not refused with RUN_CLOSED)."""
    outcomes = _act(runs, "stop", lambda run: run.send_stop(reason=reason), wait, selected)
    for run, outcome in zip(runs, outcomes, strict=True):
        if outcome.state == NO_ANSWER:
            run.cancel_placement()  # an engine's job whose runner did not answer: scancel
    return outcomes


def interrupt_runs(
    runs: Sequence[Run], *, reason: str | None = None, wait: float = 3.0, selected: bool = False
) -> list[Outcome]:
    """Interrupt every run in ``runs`` (each ends ``paused``); one outcome each, in order. A
    run that cannot be resumed (an external CLI) is refused (``NOT_RESUMABLE``): stop it."""
    return _act(runs, "interrupt", lambda run: run.interrupt(reason=reason), wait, selected)


def _act(
    runs: Sequence[Run], type_: str, write: Callable[[Run], str], wait: float, selected: bool
) -> list[Outcome]:
    from pisub.api.client import _seconds

    _seconds(wait, "wait")
    outcomes = [_write(run, type_, write, selected) for run in runs]
    deadline = time.monotonic() + wait
    for run, outcome in zip(runs, outcomes, strict=True):
        if outcome.request_id is None or outcome.state != WRITTEN or wait <= 0:
            continue
        receipt = run.wait_for_receipt(outcome.request_id, max(0.0, deadline - time.monotonic()))
        outcome.receipt = receipt
        if receipt is None or receipt.state == ReceiptState.PENDING:
            outcome.state = NO_ANSWER
        elif closed_meanwhile(receipt):  # it ended between the write and the claim
            outcome.state, outcome.reason = (ENDED, receipt.reason) if selected else (REFUSED, receipt.reason)
            outcome.code = None if selected else InboxClosed.code
        elif receipt.state == ReceiptState.FAILED and type_ == "stop" and _ends(run, deadline):
            # its child had exited already (it was ending, or stopped by someone else): it is
            # no longer live, which is what a stop asks
            outcome.state, outcome.reason = ENDED, f"it ended meanwhile ({run.status().state})"
        else:
            outcome.state, outcome.reason = receipt.state.value, receipt.reason
    return outcomes


def _ends(run: Run, deadline: float) -> bool:
    """Whether ``run`` reaches a terminal state by ``deadline`` (at least a second from now)."""
    from pisub.core.polling import poll

    wait = max(1.0, deadline - time.monotonic())
    return poll(lambda: run.status().state.is_terminal or None, wait, interval=0.05) is not None


def closed_meanwhile(receipt: Receipt) -> bool:
    """The request was written, but the run finished before its runner took it (``failed``:
    "the run finished before the request was consumed") — a ``RUN_CLOSED`` refusal in effect."""
    from pisub.store.mailbox import FINISHED_REASON

    return receipt.state == ReceiptState.FAILED and receipt.reason == FINISHED_REASON


def _write(run: Run, type_: str, write: Callable[[Run], str], selected: bool) -> Outcome:
    try:
        return Outcome(run.id, type_, WRITTEN, request_id=write(run))
    except InboxClosed as exc:
        if selected:
            return Outcome(run.id, type_, ENDED, reason=f"it ended meanwhile ({run.status().state})")
        return Outcome(run.id, type_, REFUSED, reason=exc.message, code=exc.code)
    except PisubError as exc:
        return Outcome(run.id, type_, REFUSED, reason=exc.message, code=exc.code)
