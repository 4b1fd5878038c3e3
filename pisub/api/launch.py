"""Starting a run the way ``pisub run`` takes it: one agent on a task, or one workflow shape (a
script, tasks side by side or in a chain, lanes), from values or from files. Which options go
together is decided here, so the Python API refuses the same combinations as the command line,
with the same ``INVALID_INPUT`` messages; :func:`pisub.launch` and the ``launch_*`` functions
are the single-shape entries this dispatches to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pisub.errors import InvalidInput, PisubError

if TYPE_CHECKING:
    from pisub.api.client import Run
    from pisub.api.options import LaneInput, TaskInput, WorkflowOptions
    from pisub.protocol.result import Result
    from pisub.protocol.workflow import ChildCall

ONE_SHAPE = "give one of --workflow, --parallel, --chain, --lanes or --task"
NO_AGENT_IN_WORKFLOW = "a workflow takes no --agent or TASK (they belong in its calls)"
AGENT_AND_TASK = "give --agent NAME and TASK (or a workflow: --workflow FILE)"
WORKFLOW_ONLY = "--isolation, --base-ref and --usage-budget are for workflows"
ARGS_ONLY_FOR_SCRIPTS = "--arg is for --workflow"


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
    tasks: Sequence[TaskInput] | None = None,
    parallel: str | Path | Sequence[TaskInput] | None = None,
    chain: str | Path | Sequence[TaskInput] | None = None,
    lanes: str | Path | Sequence[LaneInput] | None = None,
    args: dict[str, Any] | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    tool_timeout: float | None = None,
    checkpoint_before_deadline: float | None = None,
    tool_budget: dict[str, Any] | None = None,
    acceptance: Any = None,
    gate: str | None = None,
    model: str | None = None,
    concurrency: int | None = None,
    max_spawns: int | None = None,
    state_ns: str | None = None,
    fork_from: str | None = None,
    isolation: str | None = None,
    base_ref: str | None = None,
    usage_budget: dict[str, Any] | None = None,
    on_done: str | None = None,
    backend: str | None = None,
    home: Path | None = None,
) -> Run:
    """Start ``agent`` on ``task`` (:func:`pisub.launch`), or one workflow: a ``workflow`` script
    with ``args``, ``tasks`` side by side, a ``parallel`` or ``chain`` tasks file (or list), or a
    ``lanes`` file (or list). The single-run options (``idle_timeout``, ``tool_timeout``,
    ``checkpoint_before_deadline``, ``tool_budget``, ``acceptance``, ``gate``, ``model``,
    ``backend``) are a single run's; the workflow options (``concurrency``, ``max_spawns``,
    ``state_ns``, ``fork_from``, ``isolation``, ``base_ref``, ``usage_budget``) a workflow's.

    Raises:
        InvalidInput: two shapes, a workflow with an agent or task or a backend, a single run
            without both or with a workflow's options, ``args`` without a script; and whatever
            the launcher refuses.
    """
    shapes = [x for x in (workflow, parallel, chain, lanes, tasks or None) if x is not None]
    if len(shapes) > 1:
        raise InvalidInput(ONE_SHAPE)
    if not shapes:
        from pisub.api.client import launch

        if agent is None or task is None:
            raise InvalidInput(AGENT_AND_TASK)
        if isolation is not None or base_ref is not None or usage_budget is not None:
            raise InvalidInput(WORKFLOW_ONLY)
        return launch(
            agent,
            task,
            cwd=cwd,
            timeout=timeout,
            idle_timeout=idle_timeout,
            tool_timeout=tool_timeout,
            checkpoint_before_deadline=checkpoint_before_deadline,
            tool_budget=tool_budget,
            acceptance=acceptance,
            gate=gate,
            model=model,
            on_done=on_done,
            backend=backend,
            home=home,
        )
    if agent is not None or task is not None:
        raise InvalidInput(NO_AGENT_IN_WORKFLOW)
    from pisub.api.client import WORKFLOW_BACKEND

    if backend is not None:
        raise InvalidInput(WORKFLOW_BACKEND)
    options: WorkflowOptions = {
        "on_done": on_done,
        "cwd": cwd,
        "concurrency": concurrency,
        "max_spawns": max_spawns,
        "state_ns": state_ns,
        "fork_from": fork_from,
        "timeout": timeout,
        "isolation": isolation,
        "base_ref": base_ref,
        "usage_budget": usage_budget,
        "home": home,
    }
    return _start_workflow(workflow, tasks or parallel, chain, lanes, args, options)


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
