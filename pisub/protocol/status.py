"""``status.json``: where a run is now. The runner is its only writer while it lives."""

from __future__ import annotations

import enum
from typing import Literal

import msgspec

from pisub.protocol.budget import UsageTotals
from pisub.protocol.codec import Record
from pisub.protocol.control import InboxInfo, Ledger
from pisub.protocol.result import ErrorInfo


def children_words(count: int, *, ended: bool = False) -> str:
    """The children a run has, as an error naming one it does not have says (they are numbered
    from 0): "its children are 0 to 2, or their keys"."""
    if count <= 0:
        return "it had no children" if ended else "it has no children yet"
    if count == 1:
        return "its one child is 0, or its key"
    return f"its children are 0 to {count - 1}, or their keys"


class RunState(enum.StrEnum):
    """Lifecycle of a run: ``starting`` → (``queued`` →) ``running`` → one terminal state."""

    STARTING = "starting"
    QUEUED = "queued"
    """Its runner waits for a slot in its group (``spec/queue.md``); its child has not started."""
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    STOPPED = "stopped"
    PAUSED = "paused"

    @property
    def is_terminal(self) -> bool:
        return self not in (RunState.STARTING, RunState.QUEUED, RunState.RUNNING)


class StepState(enum.StrEnum):
    """Lifecycle of one child."""

    PENDING = "pending"
    QUEUED = "queued"
    """A workflow's child waiting for a free slot (the workflow's concurrency)."""
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    STOPPED = "stopped"
    PAUSED = "paused"
    SKIPPED = "skipped"
    """A chain's step after a failed one: never started."""


class RepairCause(enum.StrEnum):
    """Why a reader repaired a run whose runner was proven dead (``status.json``'s ``repaired``)."""

    NEVER_STARTED = "never-started"
    """The runner died before its startup commit. A runner commits ``running`` (with its pid)
    before it starts the run's child, so no process of the child ever existed: nothing ran."""
    RUNNER_DIED = "runner-died"
    """The runner died after its startup commit: the child may have run (part of the way)."""


class StepStatus(Record, kw_only=True):
    """One child of the run (``index`` from 0)."""

    index: int
    status: StepState
    key: str | None = None
    """A workflow's child: its key."""
    run_id: str | None = None
    """A workflow's child: its own run (null while it is queued)."""
    agent: str | None = None
    """A workflow's child: its agent."""
    pid: int | None = None
    pid_start_time: float | None = None
    """The child's process start time (seconds since the epoch; for people: it moves when the
    wall clock is stepped)."""
    pid_start_ticks: int | None = None
    """The child's start in clock ticks since boot (``/proc/<pid>/stat``): what pid-reuse
    checks compare, immune to wall-clock steps."""
    pgid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    last_activity_at: str | None = None
    output_bytes: int = 0
    output_truncated: bool = False
    turn_count: int = 0
    tool_count: int = 0
    current_tool: str | None = None
    """A redacted preview of the tool call in progress (``bash echo hi``)."""
    recent_output: list[str] = []
    """The last 50 lines of the child's output log, redacted."""


class HostStepStatus(Record, kw_only=True):
    """One ``runs.host`` step of a named resource's workflow (``spec/resources.md``)."""

    key: str
    state: str
    """``running``, ``done``, ``error`` or ``cancelled`` (a reader ignores a state it does not
    know)."""
    reason_code: str | None = None
    """``exit``, ``timeout``, ``cancelled``, ``start``, ``output``, ``interrupted``."""
    exit_code: int | None = None
    report_path: str | None = None
    log_path: str | None = None
    command: str | None = None
    """The command (its first 200 characters, redacted)."""
    role: str | None = None
    replayed: bool = False
    """Its result came from the journal (a resumed workflow): it did not run again."""
    started_at: str | None = None
    ended_at: str | None = None


class Status(Record, kw_only=True):
    """The run's current state, replaced atomically on every change."""

    v: Literal[1]
    run_id: str
    state: RunState
    agent: str
    runner: str
    pid: int | None = None
    """The runner's pid (None until the runner's startup commit)."""
    pid_start_time: float | None = None
    """The runner's process start time (seconds since the epoch; for people)."""
    pid_start_ticks: int | None = None
    """The runner's start in clock ticks since boot: what liveness checks compare."""
    host: str
    boot_id: str | None = None
    started_at: str
    updated_at: str
    ended_at: str | None = None
    error: ErrorInfo | None = None
    session_file: str | None = None
    """Absolute path of the child's session (pi's ``session.jsonl``), for a later resume."""
    inbox: InboxInfo | None = None
    """How the runner watches its inbox (null until it does)."""
    steering: Ledger = msgspec.field(default_factory=Ledger)
    """Monotonic counters of control requests and the last 20 of them."""
    steps: list[StepStatus] = []
    host_steps: list[HostStepStatus] = []
    """A named resource's workflow: its ``runs.host`` steps, in call order."""
    usage: UsageTotals | None = None
    """A workflow's tree's usage budget: used, reserved, soft or hard limit reached."""
    parent_run_id: str | None = None
    """The run this one was started from; None for a top-level run (see the manifest)."""
    root_run_id: str | None = None
    key: str | None = None
    """Its key in its parent workflow."""
    depth: int = 0
    repaired: RepairCause | None = None
    """Set when a reader repaired the run (its runner died): whether its child ever started."""
    label: str | None = None
    """``--label``: the name a person gave the run (copied from the manifest at creation)."""
    task: str | None = None
    """The head of the task (its first line, at most 120 characters, redacted), so that a
    listing tells runs apart with one read per run."""
    cwd: str | None = None
    """The directory the child works in (copied from the manifest at creation)."""
    group: str | None = None
    """The group the run waits or runs in (``--group``; ``spec/queue.md``); None: in none."""
    mission_id: str | None = None
    """A workflow's mission (``spec/missions.md``; copied from the manifest at creation);
    None: it has none."""
