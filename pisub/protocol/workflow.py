"""Workflow runs: the child call (input), the workflow spec (in the manifest), what a child call
returns, the journal and the shared state file."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import msgspec

from pisub.protocol.acceptance import AcceptanceRecord
from pisub.protocol.budget import ToolBudgetInput, UsageBudgetSpec
from pisub.protocol.codec import Record, StrictRecord
from pisub.protocol.fields import KEY_PATTERN as KEY_PATTERN  # (re-exported: callers name them here)
from pisub.protocol.fields import KEY_RE as KEY_RE
from pisub.protocol.fields import BaseRef, Key, Seconds, ShortPath
from pisub.protocol.fields import Context as Context
from pisub.protocol.fields import Isolation as Isolation
from pisub.protocol.fields import OutputMode as OutputMode
from pisub.protocol.host import JournalHostEnded, JournalHostStarted
from pisub.protocol.lanes import Lane
from pisub.protocol.placement import BackendName
from pisub.protocol.result import ErrorInfo, Usage

MAX_CONCURRENCY = 64
DEFAULT_CONCURRENCY = 4
DEFAULT_MAX_SPAWNS = 64
MAX_SPAWNS_LIMIT = 10_000


class Shape(enum.StrEnum):
    """How a workflow run was asked for: a Python script, or one of the common shapes."""

    WORKFLOW = "workflow"
    PARALLEL = "parallel"
    """Every task at once (up to the concurrency); results in task order."""
    CHAIN = "chain"
    """One task after the other; ``{previous}`` in a task is the previous step's output."""
    LANES = "lanes"
    """Lanes of ordered stages side by side; the result is the board."""


MAX_SCRIPT_BYTES = 1024 * 1024
"""The largest workflow script, in any language (a file, an inline text, stdin)."""


class ScriptLanguage(enum.StrEnum):
    """The language of a workflow script (``.py`` Python, ``.js`` JavaScript)."""

    PYTHON = "python"
    JAVASCRIPT = "javascript"

    @property
    def copy_name(self) -> str:
        """The name of the script's copy in the run's directory."""
        return "workflow.js" if self is ScriptLanguage.JAVASCRIPT else "workflow.py"


class HostPermit(Record, kw_only=True):
    """What ``runs.host`` may run in a named resource's workflow (raw scripts get none)."""

    keys: list[str] = []
    """The host-step keys it may use (empty: any key)."""
    commands: list[str] = []
    """The exact commands it may run."""
    max_calls: int = 32


class ResourceOrigin(Record, kw_only=True):
    """Where a named workflow resource came from (recorded in the manifest and the result)."""

    name: str
    source: Literal["builtin", "config"]
    path: str | None = None
    """A config resource's script file."""
    sha256: str | None = None
    """The digest of the script text that ran."""


class ChildCall(StrictRecord, kw_only=True, omit_defaults=True):
    """One child of a workflow: the parameters of ``runs.run`` and one entry of a tasks file.
    Strict input: unknown fields and wrong types are errors naming the field."""

    key: Key | None = None
    """Required for ``runs.run``; a tasks file may leave it out (``task-<N>``, from 1)."""
    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    task: Annotated[str, msgspec.Meta(min_length=1)]
    resume: str | None = None
    """A finished pi run (id) whose session this child continues with ``task`` as its next turn."""
    output: ShortPath | None = None
    """Save the child's final output to this file (relative to the child's cwd)."""
    output_mode: OutputMode = OutputMode.INLINE
    timeout: Seconds | None = None
    idle_timeout: Seconds | None = None
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    context: Context = Context.FRESH
    cwd: ShortPath | None = None
    """Relative to the workflow's cwd."""
    tool_timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    """pi: milliseconds one tool call may take."""
    checkpoint_before_deadline_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    """pi: ask the child to checkpoint this long before its runtime deadline."""
    tool_budget: ToolBudgetInput | None = None
    """pi: ``{hard, soft?, block?}`` tool calls (the tightest of call, agent and config)."""
    acceptance: str | bool | dict[str, Any] | None = None
    """``"auto"`` or ``{level, verify?, ...}``: what the child's work must show."""
    gate: Annotated[str, msgspec.Meta(min_length=1, max_length=16 * 1024)] | None = None
    """A command that must pass on the child's tree (not on a resume)."""
    isolation: Isolation | None = None
    """``worktree``: the child works in its own git worktree (default: the workflow's)."""
    base_ref: BaseRef | None = None
    """The commit its worktree starts from (default: the workflow's, else ``HEAD``)."""
    backend: BackendName | None = None
    """Where the child's runner lives (``local``, ``slurm``; default: its agent file's, else
    ``config.toml``'s); the coordinator itself runs locally."""


class WorkflowSpec(Record, kw_only=True):
    """``manifest.workflow``: what a workflow run runs, resolved at launch."""

    shape: Shape
    script: str | None = None
    """The file it was started from (a copy is ``<run>/workflow.py`` or ``<run>/workflow.js``);
    ``"-"`` for an inline script (``workflowScript``, ``--workflow-script``)."""
    language: ScriptLanguage = ScriptLanguage.PYTHON
    resource: ResourceOrigin | None = None
    """A named resource's workflow: which one (``review``, ``run-ci``, a config resource)."""
    permit: HostPermit | None = None
    """``runs.host``'s ceiling: only a named resource's workflow has one."""
    args: dict[str, Any] = {}
    tasks: list[ChildCall] = []
    """The tasks of a ``parallel`` or ``chain`` workflow."""
    lanes: list[Lane] = []
    """The lanes of a ``lanes`` workflow."""
    isolation: Isolation = Isolation.NONE
    """Every child's isolation unless its call says otherwise."""
    usage_budget: UsageBudgetSpec | None = None
    """The tree's usage budget (set by a top-level workflow only)."""
    base_ref: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    max_spawns: int = DEFAULT_MAX_SPAWNS
    state_ns: str | None = None
    """``--state-ns``: the script's ``state`` is this namespace's (even when the workflow
    belongs to a mission, which then records the run but does not hold its state)."""
    mission_id: str | None = None
    """The mission this workflow belongs to (``spec/missions.md``): its ``state`` is the
    mission's; None with ``mission: false`` (then ``state`` exists only with ``state_ns``)."""
    mission_project: str | None = None
    """The project key of that mission's store (``<home>/missions/<key>/``)."""
    mission_warning: str | None = None
    """A launch's warning about its mission: the default mission could not be made (the
    workflow runs without one, and without ``state``), or a resumed run could not be listed in
    its mission (it keeps the mission's state). None: nothing to say."""
    fork_from: str | None = None
    """The pi session a ``context="fork"`` child starts from (a copy)."""
    journal: str
    """The journal of the workflow and of every run that resumes it (in the first run's
    directory)."""
    budget: str
    """The spawn budget this workflow draws on: its root run's (kept across resumes)."""
    review: bool = False
    """Review runs: the person opted in (``--review``, config ``[acceptance] review``) to a
    reviewer run for each writer child; else an inferred review is recorded, not run."""

    def planned_keys(self) -> list[str]:
        """The keys of a parallel or chain workflow's children, by index: its tasks, called in
        order — each is known (a request may name it) before the coordinator calls it. Empty
        for a script or lanes workflow."""
        if self.shape not in (Shape.PARALLEL, Shape.CHAIN):
            return []
        return [call.key or "" for call in self.tasks]


class ChildResult(Record, kw_only=True):
    """What ``runs.run`` returns: the outcome of one child (a failure never raises)."""

    key: str
    ok: bool
    state: Literal["complete", "failed", "stopped", "paused", "skipped"]
    output: str = ""
    run_id: str | None = None
    exit_code: int | None = None
    error: ErrorInfo | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    output_reference: str | None = None
    """The file the output was saved to (``output``)."""
    agent: str = ""
    task: str = ""
    session_file: str | None = None
    acceptance: AcceptanceRecord | None = None
    """What the runner checked of the child's work (acceptance gates)."""


class SteerResult(Record, kw_only=True):
    """What ``runs.steer`` returns: the fate of the message, as the child's receipt tells it."""

    key: str
    state: Literal["queued", "delivered", "missed", "failed"]
    """``missed``: the child had not started or had already ended."""
    request_id: str | None = None
    delivery_status: Literal["delivered", "queued"] | None = None
    error: str | None = None


class JournalStarted(Record, tag="started", tag_field="t", kw_only=True):
    """A child is being started: written (durably) before its run is created, so a resumed
    workflow re-attaches it instead of starting it twice."""

    key: str
    fingerprint: str
    run_id: str
    at: str


class JournalCreated(Record, tag="created", tag_field="t", kw_only=True):
    """A child's run exists (its runner committed, or failed to): a resumed workflow that finds
    it gone (``pisub gc``) knows it ran, and does not start it again."""

    key: str
    run_id: str
    at: str


class JournalEnded(Record, tag="ended", tag_field="t", kw_only=True):
    """A child's outcome. ``settled``: the script saw it as the key's result (a resumed workflow
    returns it at once); unsettled outcomes (the workflow's own stop or interrupt ended the
    child) are started again."""

    key: str
    fingerprint: str
    run_id: str | None
    result: ChildResult
    settled: bool = True
    at: str


class JournalOwner(Record, tag="owner", tag_field="t", kw_only=True):
    """A coordinator took the journal over (a workflow's first run, then each resume): only the
    last owner may be resumed."""

    run_id: str
    at: str


JournalEntry = (
    JournalStarted | JournalCreated | JournalEnded | JournalOwner | JournalHostStarted | JournalHostEnded
)


class SharedState(Record, kw_only=True):
    """``<home>/state/<ns>.json``: the values a state namespace's workflows share."""

    v: Literal[1] = 1
    values: dict[str, Any] = {}
    updated_at: str | None = None
