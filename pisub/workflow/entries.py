"""A workflow's children as one table: each call's entry, by index, key and run, and the
state its jobs share — :mod:`~pisub.workflow.admission` admits calls,
:mod:`~pisub.workflow.placement` says where and as what each child runs,
:mod:`~pisub.workflow.launching` starts them, :mod:`~pisub.workflow.settling` watches and settles
them, :mod:`~pisub.workflow.stopping` ends them with the workflow and
:mod:`~pisub.workflow.forwarding` passes control requests and receipts
(:class:`~pisub.workflow.children.ChildRuns` puts them together).

Calls are admitted from the script's thread and run on the coordinator's control loop;
:attr:`ChildTable.lock` guards the entries between the two.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pisub.protocol.budget import UsageTotals
from pisub.protocol.control import Interrupt, ReceiptState, Request, Stop
from pisub.protocol.manifest import Manifest
from pisub.protocol.result import SingleResult
from pisub.protocol.status import StepState, StepStatus
from pisub.protocol.workflow import ChildCall, ChildResult, WorkflowSpec
from pisub.store.journal import Journal, Replay
from pisub.store.lineage import Lineage
from pisub.store.paths import Home
from pisub.store.spawn_budget import SpawnBudget
from pisub.store.usage_budget import UsageBudget
from pisub.workflow import outcomes
from pisub.workflow.watch import ChildWatch

if TYPE_CHECKING:
    from pisub.workflow.futures import ChildFuture


class Host(Protocol):
    """What the children need from their coordinator."""

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the control loop (from any thread)."""

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        """Append to the workflow's ``events.jsonl``."""

    def touch(self) -> None:
        """The workflow's status changed a little (written within 250 ms)."""

    def commit(self) -> None:
        """The workflow's status changed: write it now."""

    def trouble(self, what: str, exc: OSError) -> None:
        """Something could not be done (noted in ``runner.log``)."""

    def receipt_moved(self, request_id: str, index: int, state: ReceiptState, reason: str | None) -> None:
        """Child ``index``'s receipt of forwarded request ``request_id`` moved to ``state``."""

    def usage(self, totals: UsageTotals) -> None:
        """The tree's usage budget changed (shown in the workflow's status)."""


class Phase(enum.Enum):
    """Where one child call is."""

    QUEUED = "queued"
    """Waiting for a free slot (the workflow's concurrency)."""
    STARTING = "starting"
    """Its start is journaled and its runner is being started."""
    RUNNING = "running"
    ENDED = "ended"


@dataclass
class ChildEntry:
    """One child call of this workflow run (``index`` in call order)."""

    index: int
    key: str
    call: ChildCall
    fingerprint: str
    cwd: Path
    step: StepStatus
    phase: Phase = Phase.QUEUED
    manifest: Manifest | None = None
    """What to create (None for a child re-attached to a run that exists)."""
    seeds: dict[str, Path] = field(default_factory=dict)
    run_id: str | None = None
    result: ChildResult | None = None
    futures: list[tuple[ChildFuture, asyncio.AbstractEventLoop]] = field(default_factory=list)
    ended_by_workflow: bool = False
    """The workflow's own stop or interrupt ended it: not the key's result (a resume starts it
    again)."""
    forwards: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Requests forwarded into the child's inbox: child request id → (workflow request id, index)."""
    held: list[tuple[str, Request]] = field(default_factory=list)
    """Requests for the child that came before it started (workflow request id, request): sent
    into its inbox when it starts, failed when it never does."""
    relaunches: int = 0
    """Times this coordinator started the key again because its run never started its child."""
    steers: int = 0
    """``runs.steer`` calls to this child so far (its next steer's ordinal: see
    :func:`~pisub.workflow.forwarding.steer_id`)."""
    never_ran: bool = False
    """It ended without its child ever starting (not the key's result: a resume starts it)."""

    @classmethod
    def queued(cls, index: int, call: ChildCall, fp: str, cwd: Path) -> ChildEntry:
        """Call ``call`` (fingerprint ``fp``) as child ``index``, queued, its step too."""
        assert call.key is not None
        step = StepStatus(index=index, status=StepState.QUEUED, key=call.key, agent=call.agent)
        return cls(index=index, key=call.key, call=call, fingerprint=fp, cwd=cwd, step=step)


@dataclass
class Unstarted:
    """The requests for a planned child the script has not called yet (a chain's later step):
    known by its index and key from the workflow's tasks, it has no entry until it is called."""

    key: str
    held: list[tuple[str, Request]] = field(default_factory=list)
    """Steers and follow-ups for its start (workflow request id, request), as
    :attr:`ChildEntry.held`."""
    stopped: str | None = None
    """Why it was stopped by request (it never starts), or None."""


@dataclass(eq=False)
class ChildTable:
    """The children of one workflow run and what their jobs share."""

    host: Host
    home: Home
    manifest: Manifest
    """The workflow's (its ``workflow`` spec set)."""
    steps: list[StepStatus]
    """The workflow's ``steps[]``, one per child, shown in its status."""
    journal: Journal
    replayed: Replay
    """What the journal of this workflow's earlier runs says of each key."""
    entries: list[ChildEntry] = field(default_factory=list)
    by_key: dict[str, ChildEntry] = field(default_factory=dict)
    by_run: dict[str, ChildEntry] = field(default_factory=dict)
    waiting: deque[ChildEntry] = field(default_factory=deque)
    tracked: list[ChildFuture] = field(default_factory=list)
    ending: type[Stop] | type[Interrupt] | None = None
    """Set when the workflow ends: what every child still running is sent."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Guards the entries: the script thread admits calls while the loop runs them."""
    watch: ChildWatch = field(default_factory=ChildWatch)
    host_keys: Callable[[str], bool] = lambda _key: False
    """Whether a key is a ``runs.host`` key (they share the children's key namespace)."""
    unstarted: dict[int, Unstarted] = field(default_factory=dict)
    """Requests for planned children not called yet, by their index (see :attr:`planned`)."""

    def __post_init__(self) -> None:
        manifest = self.manifest
        assert manifest.workflow is not None
        self.spec: WorkflowSpec = manifest.workflow
        self.planned: list[str] = self.spec.planned_keys()
        """The keys of a parallel or chain workflow's children, by index (its tasks, called in
        order): a request may name one the script has not called yet (empty for a script)."""
        self.lineage = Lineage(
            manifest.parent_run_id, manifest.root_run_id, manifest.depth, manifest.max_depth
        )
        self.budget = SpawnBudget(self.home.budgets, self.spec.budget, self.spec.max_spawns)
        self.usage = UsageBudget(self.home.budgets, self.spec.budget)

    @property
    def source(self) -> str:
        """Who the children's control requests are from: ``workflow <run id>``."""
        return f"workflow {self.manifest.run_id}"

    def active(self) -> list[ChildEntry]:
        """The children starting or running."""
        with self.lock:
            return [e for e in self.entries if e.phase in (Phase.STARTING, Phase.RUNNING)]

    def results(self) -> list[SingleResult]:
        """One entry of the workflow's ``details.results`` per child that has an outcome."""
        with self.lock:
            return outcomes.results_of([e.result for e in self.entries if e.result is not None])

    def leftovers(self) -> list[str]:
        """The calls ``main`` returned without waiting for: never awaited, or still running."""
        with self.lock:
            tracked = list(self.tracked)
            open_ids = {id(f) for e in self.entries for f, _ in e.futures if e.phase is not Phase.ENDED}
        found = []
        for future in tracked:
            if not future.observed:
                found.append(f"{future.label} (never awaited)")
            elif not future.done() and (
                id(future) in open_ids or future.label.startswith(("runs.all", "runs.steer", "runs.host"))
            ):
                found.append(f"{future.label} (still running)")
        return sorted(set(found))

    def never_ran(self) -> list[str]:
        """The keys whose child ended without ever starting (the workflow cannot be complete)."""
        with self.lock:
            return [e.key for e in self.entries if e.never_ran]


def step_state(state: str) -> StepState:
    return StepState(state) if state in StepState.__members__.values() else StepState.FAILED
