"""``manifest.json``: the launch request, written once before the runner starts."""

from __future__ import annotations

import math
from typing import Literal

from pisub import defaults
from pisub.errors import InvalidInput
from pisub.protocol.acceptance import Acceptance, AcceptancePlan
from pisub.protocol.budget import ToolBudget
from pisub.protocol.codec import Record
from pisub.protocol.fields import Context
from pisub.protocol.placement import PlacementRequest
from pisub.protocol.queue import QueueRequest
from pisub.protocol.workflow import WorkflowSpec
from pisub.protocol.worktree import WorktreeLink

AgentRunner = Literal["external-cli", "pi"]
"""What an agent file may name as its runner."""
RunnerKind = Literal["external-cli", "pi", "workflow"]
"""What a run runs: one child process (``external-cli``, ``pi``) or a workflow's coordinator."""
ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]


class LimitValues(Record, kw_only=True, omit_defaults=True):
    """Limits as one source gives them (the caller, an agent file, later a config file): each
    may be absent."""

    timeout: float | None = None
    idle_timeout: float | None = None
    output_cap: int | None = None
    output_hard_cap: int | None = None
    tool_timeout: float | None = None
    """Seconds one tool call of a pi child may take (from its start event to its end)."""
    tool_timeout_exempt: list[str] | None = None
    """Tools that wait on purpose: no tool timeout."""
    checkpoint_before_deadline: float | None = None
    """Seconds before the runtime deadline at which a pi child is asked to checkpoint."""
    tool_budget: ToolBudget | None = None

    def check(self, where: str) -> LimitValues:
        """``self``, once every value is usable: seconds positive and finite, bytes positive.

        Raises:
            InvalidInput: naming ``where`` and the field.
        """
        for name in ("timeout", "idle_timeout", "tool_timeout", "checkpoint_before_deadline"):
            value = getattr(self, name)
            if value is not None and not _is_seconds(value):
                raise InvalidInput(f"{where}: {_camel(name)} must be a positive number of seconds")
        for name in ("output_cap", "output_hard_cap"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, int) and not isinstance(value, bool) and value > 0
            ):
                raise InvalidInput(f"{where}: {_camel(name)} must be a positive number of bytes")
        budget = self.tool_budget
        if budget is not None:
            if budget.soft is not None and budget.soft > budget.hard:
                raise InvalidInput(f"{where}: toolBudget.soft must not be above toolBudget.hard")
            if not budget.block:
                raise InvalidInput(f'{where}: toolBudget.block must name at least one tool (or "*")')
        return self


def seconds_of_ms(milliseconds: int | None) -> float | None:
    """A limit given in milliseconds (agent files, the config, workflow children) in seconds."""
    return milliseconds / 1000 if milliseconds is not None else None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


DEFAULT_LIMITS = LimitValues(
    timeout=defaults.DEFAULT_TIMEOUT_S,
    idle_timeout=defaults.DEFAULT_IDLE_TIMEOUT_S,
    output_cap=defaults.DEFAULT_OUTPUT_CAP,
    output_hard_cap=defaults.DEFAULT_OUTPUT_HARD_CAP,
)
"""pisub's own limits, when no source sets one."""


class Limits(Record, kw_only=True):
    """Resource limits of one run, resolved at launch (:meth:`resolve`)."""

    timeout: float | None
    """Runtime limit in seconds; None means unlimited."""
    idle_timeout: float | None
    """Seconds without child activity before the child is ended; None means unlimited."""
    grace: float
    """Seconds between TERM and KILL."""
    output_cap: int
    """Bytes of each child stream written to its log."""
    output_hard_cap: int
    """Bytes of child output after which the child is stopped."""
    tool_timeout: float | None = None
    """Seconds any one tool call may take; None: only the fast built-in tools'
    :data:`~pisub.defaults.FAST_TOOL_TIMEOUT_S` applies."""
    tool_timeout_exempt: list[str] = []
    checkpoint_before_deadline: float | None = None
    """pi runs: this long before the runtime deadline the runner asks the child to checkpoint."""
    tool_budget: ToolBudget | None = None
    """pi runs: the tightest of the call's, the agent's and the config's."""

    @classmethod
    def resolve(cls, *sources: tuple[LimitValues | None, str]) -> Limits:
        """The limits of a run from ``(values, where)`` sources, the first that sets a value
        winning — caller, then agent file, then config — over pisub's defaults. Every value is
        checked first (its error names the source and the field).

        Raises:
            InvalidInput: a value is not usable.
        """
        given = [values.check(where) for values, where in sources if values is not None]
        timeout = next((v.timeout for v in given if v.timeout is not None), defaults.DEFAULT_TIMEOUT_S)
        idle = next(
            (v.idle_timeout for v in given if v.idle_timeout is not None), defaults.DEFAULT_IDLE_TIMEOUT_S
        )
        cap = next((v.output_cap for v in given if v.output_cap is not None), defaults.DEFAULT_OUTPUT_CAP)
        hard = next(
            (v.output_hard_cap for v in given if v.output_hard_cap is not None),
            defaults.DEFAULT_OUTPUT_HARD_CAP,
        )
        return cls(
            timeout=timeout,
            idle_timeout=idle,
            grace=defaults.DEFAULT_GRACE_S,
            output_cap=cap,
            output_hard_cap=hard,
            tool_timeout=next((v.tool_timeout for v in given if v.tool_timeout is not None), None),
            tool_timeout_exempt=next(
                (list(v.tool_timeout_exempt) for v in given if v.tool_timeout_exempt is not None), []
            ),
            checkpoint_before_deadline=next(
                (v.checkpoint_before_deadline for v in given if v.checkpoint_before_deadline is not None),
                None,
            ),
            tool_budget=min(
                (v.tool_budget for v in given if v.tool_budget is not None),
                key=lambda b: (b.hard, b.soft or b.hard),
                default=None,
            ),
        )


MAX_OUTPUT_BYTES_LIMIT = 2 * 1024 * 1024
"""The most ``maxOutput.bytes`` may ask of a result (a result file stays readable)."""
MAX_OUTPUT_LINES_LIMIT = 100_000


class MaxOutput(Record, kw_only=True):
    """How much of the child's final output the result returns (the rest is marked as cut)."""

    bytes: int = defaults.RESULT_MAX_BYTES
    lines: int = defaults.RESULT_MAX_LINES

    @classmethod
    def of(cls, given_bytes: object, given_lines: object, where: str) -> MaxOutput | None:
        """The limits a caller gave (None: neither, pisub's defaults apply).

        Raises:
            InvalidInput: a value that is not a whole number in range, naming ``where`` and the
                field (``maxOutput.bytes``, ``maxOutput.lines``).
        """
        if given_bytes is None and given_lines is None:
            return None
        checked = cls()
        for name, value, high in (
            ("bytes", given_bytes, MAX_OUTPUT_BYTES_LIMIT),
            ("lines", given_lines, MAX_OUTPUT_LINES_LIMIT),
        ):
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise InvalidInput(
                    f"{where}: maxOutput.{name} must be a whole number from 1 to {high}, not {value!r:.40}"
                )
            setattr(checked, name, value)
        return checked


class AgentSpec(Record, kw_only=True):
    """The agent definition as resolved at launch; later edits of the agent file do not matter."""

    name: str
    description: str = ""
    runner: RunnerKind
    command: str | None = None
    """The executable: the agent's command, or the resolved pi binary for ``runner: pi``."""
    args: list[str] = []
    system_prompt: str = ""
    source: str | None = None
    """Path of the agent file it came from."""
    model: str | None = None
    tools: list[str] | None = None
    thinking: ThinkingLevel | None = None
    extensions: bool = False
    skills: bool = False
    prompt_templates: bool = False
    trust_project: bool = False
    pi_version: str | None = None
    """The version of ``command`` for ``runner: pi``, detected at launch (it decides how the
    runner talks to pi: :mod:`pisub.children.pi.versions`)."""
    max_depth: int | None = None
    """Lowers the depth limit for the runs this agent starts (never raises it)."""
    system_prompt_mode: Literal["append", "replace"] = "append"
    """pi only: ``replace`` gives pi the system prompt with ``--system-prompt`` instead of
    appending it to pi's own (the agent file's ``systemPromptMode``)."""
    ignored: list[IgnoredKey] = []
    """The agent file's keys pisub read but does not act on, each with why."""


class IgnoredKey(Record, kw_only=True):
    """One agent-file key pisub does not act on (``pisub agents show`` prints the same)."""

    key: str
    reason: str


class Manifest(Record, kw_only=True):
    """The launch request. Never changed after the run directory appears."""

    v: Literal[1]
    run_id: str
    created_at: str
    agent: AgentSpec
    task: str
    cwd: str
    umask: int
    """The launcher's umask, given to the child (the runner itself uses 077)."""
    limits: Limits
    resumed_from: str | None = None
    """The run whose session this run continues (``pisub resume``)."""
    session_file: str | None = None
    """The pi session to continue; absent: a new session in ``<run>/session.jsonl``."""
    parent_run_id: str | None = None
    """The run this one was started from (its workflow, or the run whose child launched it);
    None for a top-level run."""
    root_run_id: str | None = None
    """The top-level run of its tree; None for a top-level run."""
    key: str | None = None
    """Its key in its parent workflow."""
    depth: int = 0
    """0 for a top-level run, its parent's depth + 1 otherwise."""
    max_depth: int = defaults.DEFAULT_MAX_DEPTH
    """The depth limit inside this run: a run it starts is refused when ``depth`` reached it."""
    workflow: WorkflowSpec | None = None
    """What a workflow run (``agent.runner`` ``workflow``) runs."""
    acceptance: Acceptance | None = None
    """What the runner checks of the child's work when it ends (acceptance gates)."""
    acceptance_plan: AcceptancePlan | None = None
    """What acceptance adds at launch — report blocks, reviewer runs — said before it happens."""
    on_done: list[str] | None = None
    """``--on-done``: an argv run once when the run has ended (:mod:`pisub.store.on_done`)."""
    worktree: WorktreeLink | None = None
    """The git worktree this run works in (``cwd`` is inside it); its runner captures the work
    when the child ends."""
    placement: PlacementRequest | None = None
    """Where the runner is to live (absent: ``local``)."""
    max_output: MaxOutput | None = None
    """How much of the final output the result returns (absent: 200 KiB / 5000 lines)."""
    artifacts: bool = True
    """False (``--no-artifacts``): the runner keeps no debugging copies — no raw pi events in
    ``events.jsonl``, no ``stderr-N.log`` — only what the protocol needs."""
    include_progress: bool = False
    """The result carries the child's progress (``details.results[0].progress``)."""
    session_dir: str | None = None
    """pi: the directory the session file is kept in (``<run id>.jsonl``) instead of the run's."""
    context: Context | None = None
    """pi: how the child's conversation began, as resolved at launch (absent: fresh)."""
    forked_from: str | None = None
    """``context`` fork: the session file copied (signed thinking blocks stripped)."""
    queue: QueueRequest | None = None
    """The group a top-level run waits in for a slot, its priority and the runs it waits for
    (``--group``, ``--priority``, ``--after``; ``spec/queue.md``); absent: it starts at once."""
    label: str | None = None
    """``--label``: a person's name for the run (printable, one line, at most 80 characters)."""


def _is_seconds(value: object) -> bool:
    """A positive, finite number of seconds up to a year — an int or float, not a bool (the
    Python API takes what a caller gives: ``True`` or ``10**400`` is no number of seconds)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and 0 < value <= 366 * 86400
    except OverflowError:
        return False
