"""Starting a run the way ``pisub run`` takes it: one agent on a task, or one workflow shape (a
script, tasks side by side or in a chain, lanes), from values or from files. Which options go
together is decided here, so the Python API refuses the same combinations as the command line,
with the same ``INVALID_INPUT`` messages; :func:`pisub.launch` and the ``launch_*`` functions
are the single-shape entries this dispatches to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pisub.errors import InvalidInput, PisubError

if TYPE_CHECKING:
    from typing import Unpack

    from pisub.api.client import Run
    from pisub.api.options import LaneInput, LaunchOptions, StartOptions, TaskInput, WorkflowOptions
    from pisub.protocol.result import Result
    from pisub.protocol.workflow import ChildCall

ONE_SHAPE = "give one of --workflow, --workflow-script, --parallel, --chain, --lanes or --task"
NO_AGENT_IN_WORKFLOW = "a workflow takes no --agent or TASK (they belong in its calls)"
AGENT_AND_TASK = "give --agent NAME and TASK (or a workflow: --workflow FILE)"
WORKFLOW_ONLY = "--usage-budget is for workflows"
ARGS_ONLY_FOR_SCRIPTS = "--arg is for --workflow or --workflow-script"
MISSION_OPTIONS = {
    "mission_id": "--mission-id",
    "mission": "--mission",
    "session_key": "--session-key",
}
"""A workflow's mission options (``spec/missions.md``): refused for a single run, except
``mission=False`` (``--no-mission``), which a single run already is."""
SINGLE_RUN_ONLY = {
    "session_dir": ("--session-dir", None),
    "max_output_bytes": ("--max-output-bytes", None),
    "max_output_lines": ("--max-output-lines", None),
    "artifacts": ("--no-artifacts", True),
    "include_progress": ("--include-progress", False),
    "context": ("--context", None),
}
"""A single run's options a workflow cannot honour (its flag, and the value that is no choice):
refused for a workflow, never left aside silently. ``parent_session`` is not one: it only names
where a fork would come from (the pi tool passes it with every launch), so a workflow, like an
agent that is not pi, leaves it aside."""


def load_tasks(path: str | Path) -> list[ChildCall]:
    """The tasks of a tasks file (``--parallel`` / ``--chain``): a JSON list of ``{key?, agent,
    task, ...}``, each checked (keys default to ``task-1``, ``task-2``...).

    Raises:
        InvalidInput: the file cannot be read or an entry is bad (naming ``[i].field``).
    """
    from pisub.workflow.calls import load_tasks as load

    return load(Path(path))


def load_lanes(path: str | Path) -> Any:
    """The lanes of a lanes file (``--lanes``), as JSON (checked when launched).

    Raises:
        InvalidInput: it cannot be read, is too large, or is not JSON.
    """
    from pisub.workflow.lanes import load_lanes as load

    return load(Path(path))


def start(
    agent: str | None = None,
    task: str | None = None,
    *,
    workflow: str | Path | None = None,
    workflow_script: str | None = None,
    resource: str | None = None,
    tasks: Sequence[TaskInput] | None = None,
    parallel: str | Path | Sequence[TaskInput] | None = None,
    chain: str | Path | Sequence[TaskInput] | None = None,
    lanes: str | Path | Sequence[LaneInput] | None = None,
    args: dict[str, Any] | None = None,
    **options: Unpack[StartOptions],
) -> Run:
    """Start ``agent`` on ``task`` (:func:`pisub.launch`, with its options), or one workflow: a
    ``workflow`` script file (``.py``, ``.js``) or an inline JavaScript ``workflow_script`` with
    ``args``, a named workflow ``resource`` (``run-ci``) with ``args``, ``tasks`` side by side,
    a ``parallel`` or ``chain`` tasks file (or list), or a ``lanes`` file (or list), with the
    workflow options (see :func:`pisub.launch_workflow`). A single run's options that a
    workflow has no use for (``idle_timeout``, ``gate``, ``model``...) are left aside for a
    workflow (those the seed names per run — :data:`SINGLE_RUN_ONLY`, ``session_dir``,
    ``context``... — are refused), as workflow-only ones other than ``fork_from``,
    ``isolation``, ``base_ref`` and ``usage_budget`` are for a single run.

    Raises:
        InvalidInput: two shapes, a workflow with an agent or task or a backend or a
            :data:`SINGLE_RUN_ONLY` option, a single run
            without both or with ``usage_budget`` or a :data:`MISSION_OPTIONS` one, ``args`` without a
            script; and whatever the launcher refuses.
    """
    from pisub.api.options import LaunchOptions, StartOptions, WorkflowOptions

    unknown = sorted(set(options) - StartOptions.__optional_keys__)
    if unknown:  # a misspelt option is refused, never left aside
        raise InvalidInput(
            f"unknown option {unknown[0]!r}; "
            f"the options are: {', '.join(sorted(StartOptions.__optional_keys__))}"
        )
    given = (workflow, workflow_script, resource, parallel, chain, lanes, tasks or None)
    shapes = [x for x in given if x is not None]
    if len(shapes) > 1:
        raise InvalidInput(ONE_SHAPE)
    if not shapes:
        from pisub.api.client import launch

        if agent is None or task is None:
            raise InvalidInput(AGENT_AND_TASK)
        if options.get("usage_budget") is not None:
            raise InvalidInput(WORKFLOW_ONLY)
        for name, flag in MISSION_OPTIONS.items():
            if options.get(name) not in (None, False if name == "mission" else None):
                raise InvalidInput(f"{flag} is for workflows (a single run belongs to no mission of its own)")
        return launch(agent, task, **cast("LaunchOptions", _only(options, LaunchOptions.__optional_keys__)))
    if agent is not None or task is not None:
        raise InvalidInput(NO_AGENT_IN_WORKFLOW)
    from pisub.api.client import WORKFLOW_BACKEND

    if options.get("backend") is not None:
        raise InvalidInput(WORKFLOW_BACKEND)
    for name, (flag, default) in SINGLE_RUN_ONLY.items():
        if options.get(name, default) not in (None, default):
            raise InvalidInput(
                f"{flag} is for a single run (--agent NAME TASK); a workflow's children take it "
                "in their calls or not at all"
            )
    chosen = cast("WorkflowOptions", _only(options, WorkflowOptions.__optional_keys__))
    if resource is not None:  # a named workflow resource (spec/resources.md)
        from pisub.api.resources import launch_resource

        return launch_resource(resource, args, **chosen)
    if workflow_script is not None:
        from pisub.api.client import launch_workflow

        return launch_workflow(text=workflow_script, args=args, **chosen)
    return _start_workflow(workflow, tasks or parallel, chain, lanes, args, chosen)


def _only(options: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    return {name: options[name] for name in names if name in options}


def _start_workflow(
    script: str | Path | None,
    parallel: str | Path | Sequence[TaskInput] | None,
    chain: str | Path | Sequence[TaskInput] | None,
    lanes: str | Path | Sequence[LaneInput] | None,
    args: dict[str, Any] | None,
    options: WorkflowOptions,
) -> Run:
    from pisub.api.client import launch_chain, launch_lanes, launch_parallel, launch_workflow

    if script is not None:
        return launch_workflow(script, args=args, **options)
    if args:
        raise InvalidInput(ARGS_ONLY_FOR_SCRIPTS)
    if lanes is not None:
        return launch_lanes(load_lanes(lanes) if isinstance(lanes, str | Path) else lanes, **options)
    if parallel is not None:
        return launch_parallel(_tasks(parallel), **options)
    assert chain is not None
    return launch_chain(_tasks(chain), **options)


def _tasks(given: str | Path | Sequence[TaskInput]) -> Sequence[TaskInput]:
    return load_tasks(given) if isinstance(given, str | Path) else given


def refusal(error: PisubError) -> Result:
    """A launch refused before anything was created (e.g. ``SUBAGENT_DEPTH_EXCEEDED``), as a result
    of mode ``management`` (what ``pisub run --json`` prints for it)."""
    from pisub.store.results import management_result

    return management_result(error.code, error.message)
