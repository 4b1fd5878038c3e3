"""The typed Python API; the CLI is a thin skin over it.

>>> run = pisub.launch("reviewer", "review the diff")      # doctest: +SKIP
>>> run.wait(timeout=600).details.results[0].output          # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from pisub.core.polling import Every, poll
from pisub.errors import InvalidInput, PisubError, ProtocolError, RunNotFound, WaitTimeout
from pisub.protocol.codec import now_iso
from pisub.protocol.control import FollowUp, Interrupt, Receipt, ReceiptState, Request, Steer, Stop
from pisub.protocol.result import Result
from pisub.protocol.status import RunState, Status
from pisub.store.paths import Home, RunPaths, is_run_id, open_home, open_home_to_read, validate_run_ref
from pisub.store.runs import RunStore, load_manifest, load_result, load_status

if TYPE_CHECKING:
    from typing import Unpack

    from pisub.agents.catalog import Catalog
    from pisub.api.options import LaneInput, TaskInput, WorkflowOptions
    from pisub.children.pi.models import Model
    from pisub.protocol.events import Event
    from pisub.protocol.manifest import Manifest
    from pisub.protocol.placement import Placement
    from pisub.protocol.workflow import Isolation, WorkflowSpec
    from pisub.store.retained import Retained


def _warm_up() -> None:
    """Start a warm runner now, so that it starts and imports while the launch is checked."""
    from pisub.backends.warm import prestart

    prestart()


def _text(value: str, what: str) -> str:
    from pisub.runs.launch import check_text

    return check_text(value, what)


def _label(label: str | None) -> str | None:
    """A run's label when given (:func:`pisub.store.paths.check_label`)."""
    from pisub.store.paths import check_label

    return None if label is None else check_label(label, "label")


def _seconds(value: float | None, what: str) -> float | None:
    """``value`` when it is None or a finite number of seconds >= 0 (never NaN: a NaN deadline
    never comes)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise InvalidInput(f"the {what} must be a finite number of seconds >= 0")
    return value


def agent_catalog(*, home: Path | None = None, cwd: Path | None = None) -> Catalog:
    """Every agent visible from ``cwd`` (user scope, then project scope)."""
    from pisub.agents.catalog import discover

    h = open_home_to_read(home)  # (a reader: a missing home has only project and builtin agents)
    return discover(h.agents, Path(cwd or os.getcwd()).resolve())


def launch(
    agent: str,
    task: str,
    *,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    tool_timeout: float | None = None,
    checkpoint_before_deadline: float | None = None,
    tool_budget: dict[str, Any] | None = None,
    acceptance: Any = None,
    gate: str | None = None,
    model: str | None = None,
    on_done: str | None = None,
    backend: str | None = None,
    max_output_bytes: int | None = None,
    max_output_lines: int | None = None,
    artifacts: bool = True,
    include_progress: bool = False,
    session_dir: str | Path | None = None,
    context: str | None = None,
    fork_from: str | None = None,
    parent_session: str | None = None,
    isolation: str | None = None,
    base_ref: str | None = None,
    group: str | None = None,
    priority: int | None = None,
    after: Sequence[str] | None = None,
    label: str | None = None,
    review: bool | None = None,
    home: Path | None = None,
) -> Run:
    """Start a detached run of ``agent`` on ``task`` and return once its runner committed
    (``backend="slurm"``: once Slurm accepted the job; the run is ``starting`` until it runs).
    ``model`` (pi agents: ``provider/id``) replaces the agent's. ``on_done``: a command (split
    like a shell line, run without a shell) run once when the run has ended.
    ``tool_timeout`` (seconds one pi tool call may take), ``checkpoint_before_deadline`` (ask a
    pi child to checkpoint this long before its runtime deadline) and ``tool_budget``
    (``{hard, soft?, block?}`` tool calls) apply to pi runs. ``gate`` (a command that must
    pass on the child's tree) or ``acceptance`` (``{level, verify?, ...}``) is checked by the
    runner when the child has ended.

    ``max_output_bytes`` / ``max_output_lines``: how much of the final output the result
    returns (200 KiB / 5000 lines; the rest is cut with a marker naming the full log).
    ``artifacts=False``: no debugging copies (raw pi events, ``stderr-0.log``).
    ``include_progress``: the result carries the child's progress. pi runs only:
    ``session_dir`` keeps pi's session file there (``<run id>.jsonl``); ``context``
    (``fresh``, ``fork``, ``profile``) and ``fork_from`` (a run or a session file) say how its
    conversation begins (:mod:`pisub.runs.run_options`); ``parent_session``: the caller's own pi
    session, what a fork that is only a preference copies (a missing file: it begins fresh).
    ``isolation="worktree"``: the child
    works in a git worktree of its own at ``base_ref`` (``HEAD``), captured at its end
    (``pisub worktree apply``). ``label``: a name for the run that ``list``, ``status`` and
    ``fleet`` show and ``@LABEL`` finds (one printable line, at most 80 characters).
    ``review``: a writer's work is reviewed by a reviewer run (real tokens; default: config
    ``[acceptance] review``, else off). What acceptance adds is in ``manifest().acceptance_plan``.
    ``group``: the group it waits in for a slot (``queued`` until admitted; ``spec/queue.md``),
    ``priority`` (higher first) and ``after`` (runs that must end ``complete`` first).

    Raises:
        InvalidInput: empty task, bad cwd or limits, a bad option (named).
        UnknownAgent: no such agent.
        LaunchFailed: the command is missing or the runner could not start.
        HomeUnusable: the pisub home is not usable.
    """
    _warm_up()  # first: it starts while the launch is checked
    from pisub.protocol.manifest import LimitValues
    from pisub.runs.launch import check_task, outside_home, plan_run, working_dir
    from pisub.store.lineage import caller_lineage

    check_task(task)
    checked_label = _label(label)
    caller = LimitValues(
        timeout=timeout,
        idle_timeout=idle_timeout,
        tool_timeout=tool_timeout,
        checkpoint_before_deadline=checkpoint_before_deadline,
        tool_budget=_tool_budget(tool_budget),
    ).check("the call")
    lineage = caller_lineage(os.environ)  # refused here, before anything else, when too deep
    workdir = working_dir(cwd)
    h = open_home(home)
    if cwd is not None:  # a directory given (a script in a run's directory launching: its own)
        outside_home(workdir, h)
    from pisub.acceptance.spec import parse

    accept = parse(acceptance, gate, "the call")
    from pisub.protocol.manifest import MaxOutput
    from pisub.runs.run_options import check_context

    max_output = MaxOutput.of(max_output_bytes, max_output_lines, "the call")
    for name, flag in (("artifacts", artifacts), ("include_progress", include_progress)):
        if not isinstance(flag, bool):
            raise InvalidInput(f"{name}: give true or false, not {type(flag).__name__}")
    check_context(context)
    worktree = _isolation(isolation, base_ref)
    if worktree is not None:
        _check_worktree_source(workdir, "", base_ref, SINGLE_RUN_KEY, h)
    catalog = agent_catalog(home=h.root, cwd=workdir)
    from pisub.runs.launch import review_runs_of, single_plan
    from pisub.store.config import load_config

    config = load_config(h.root)
    review = review_runs_of(review, config)
    manifest = plan_run(
        h,
        agent,
        task,
        cwd=workdir,
        caller=caller,
        lineage=lineage,
        acceptance=accept,
        model=model,
        backend=backend,
        catalog=catalog,
        review=review,
    )
    manifest.queue = _queue(h, group, priority, after, lineage.parent_run_id is None, backend)
    manifest.acceptance_plan = single_plan(manifest, catalog, review, config)
    manifest.max_output, manifest.artifacts, manifest.include_progress = (
        max_output,
        artifacts,
        include_progress,
    )
    if on_done is not None:
        manifest.on_done = _on_done(on_done, workdir)
    manifest.label = checked_label
    sources = (fork_from, parent_session)
    seeds = _pi_session(h, manifest, catalog, session_dir, context, sources, workdir)
    if worktree is not None:
        from pisub.worktrees.workspace import workspace

        manifest = workspace(worktree).prepare(h, manifest, SINGLE_RUN_KEY, base_ref)
    return _start_handle(manifest, h, seeds=seeds)


def _queue(
    home: Home,
    group: str | None,
    priority: int | None,
    after: Sequence[str] | None,
    top_level: bool,
    backend: str | None,
) -> Any:
    """The run's place in a group (``Manifest.queue``), checked before anything is created."""
    from pisub.runs.queue import request_for

    if isinstance(after, str):
        after = [after]
    return request_for(home, group, priority, list(after or []), top_level=top_level, backend=backend)


SINGLE_RUN_KEY = "run"
"""A single run's key in its worktree's branch name (``pisub/<run8>/run``)."""


def _pi_session(
    home: Home,
    manifest: Manifest,
    catalog: Catalog,
    session_dir: str | Path | None,
    context: str | None,
    sources: tuple[str | None, str | None],
    workdir: Path,
) -> dict[str, Path]:
    """Where a pi run's session is kept and how its conversation begins (set in ``manifest``);
    the files to seed its run with (a fork's copy, when the session is in the run).

    Raises:
        InvalidInput: a per-run session option for an agent that is not pi, a bad option.
    """
    from pisub.runs.run_options import implicit_source, resolve_context
    from pisub.store.config import load_config

    fork_from, parent_session = sources
    if manifest.agent.runner != "pi":  # a parent session is left aside: it is only a source
        chosen = (("sessionDir", session_dir), ("context", None if context == "fresh" else context))
        given = [n for n, v in (*chosen, ("forkFrom", fork_from)) if v is not None]  # fresh: a no-op
        if given:
            raise InvalidInput(
                f"{', '.join(given)}: for pi agents; {manifest.agent.name!r} is {manifest.agent.runner}"
            )
        return {}
    if fork_from is not None and context is None:
        context = "fork"  # a session to fork from is an explicit fork
    elif fork_from is not None and context != "fork":
        raise InvalidInput(f"forkFrom: a run that forks (context fork), not {context}")
    if fork_from is not None:
        source: Path | None = Path(_fork_source(fork_from, home))
    elif parent_session is not None:
        source = implicit_source(parent_session)
    else:
        source = _caller_session(home)
    found = catalog.get(manifest.agent.name)
    choice = resolve_context(context, manifest.agent.name, found.frontmatter, load_config(home.root), source)
    if choice.fork_source is not None and fork_from is None:  # a session before anything is copied
        from pisub.runs.launch import check_session

        check_session(
            choice.fork_source, "parentSession" if parent_session is not None else "the calling run's session"
        )
    manifest.context = choice.context
    manifest.forked_from = str(choice.fork_source) if choice.fork_source is not None else None
    if session_dir is not None:
        from pisub.runs.run_options import session_dir as checked_dir

        manifest.session_dir = str(checked_dir(session_dir, workdir, home.root))
    if choice.fork_source is None:
        return {}
    if manifest.session_dir is None:
        return {"session.jsonl": choice.fork_source}  # copied into the run, thinking stripped
    _fork_into(choice.fork_source, home.run(manifest.run_id).pi_session(None, manifest.session_dir))
    return {}


def _fork_into(source: Path, dest: Path) -> None:
    """A fork's copy of ``source`` at ``dest`` (a new 0600 file; private thinking stripped)."""
    from pisub.errors import storage_error
    from pisub.store.session_fork import copy_session

    try:
        copy_session(source, dest)
    except OSError as exc:
        raise storage_error(exc, "fork the session into", dest) from exc


def _caller_session(home: Home) -> Path | None:
    """The session of the pi run this process runs in (a fork's implicit source), if any."""
    from pisub.protocol.env import ENV_RUN_ID

    parent = os.environ.get(ENV_RUN_ID)
    if not parent:
        return None
    try:
        session = Run(parent, home=home.root).status().session_file
    except PisubError:
        return None
    return Path(session) if session is not None and os.path.isfile(session) else None


def _command(text: str, what: str) -> list[str]:
    """A command line split like a shell's (never run through one).

    Raises:
        InvalidInput: empty, over 16 KiB, NUL or a lone surrogate, unbalanced quotes.
    """
    import shlex

    from pisub.acceptance.report import clean_text

    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{what}: the command line is empty")
    if len(text) > 16 * 1024:
        raise InvalidInput(f"{what}: give a command line of at most 16 KiB")
    clean_text(text, what)
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise InvalidInput(f"{what}: the command does not split like a shell line ({exc})") from None


def _on_done(text: str, workdir: Path) -> list[str]:
    """``--on-done``'s command line, its command found now (on PATH, or a path relative to the
    run's working directory, executable): a typo is refused at launch, not found when the run
    has ended.

    Raises:
        InvalidInput: a bad command line, or its command is not found or not executable.
    """
    from pisub.errors import LaunchFailed
    from pisub.runs.launch import check_command

    argv = _command(text, "on_done")
    if not argv or not argv[0]:
        raise InvalidInput("--on-done: the command is empty")
    try:
        check_command(argv[0], workdir)
    except (LaunchFailed, InvalidInput) as exc:
        raise InvalidInput(
            f"--on-done: {exc.message}; give a command on PATH or the path of an executable "
            "(relative to the run's working directory)"
        ) from None
    return argv


def resume(
    ref: str,
    message: str | None = None,
    *,
    child: int | None = None,
    timeout: float | None = None,
    home: Path | None = None,
) -> Run:
    """Continue a finished pi run's session in a new run with ``message`` as the next turn.

    The new run's runner takes the session's lease before pi starts; briefs stored by
    ``follow-up`` (and steers carried from a pause) are prepended to ``message``. Without a
    message the briefs alone are the next turn.

    Raises:
        InvalidInput: no message and no brief stored.
        NotResumable: the run is stopped, running, not a pi run, or has no session file.
        LaunchFailed: e.g. another run holds the session's lease (named in the message).
    """
    source = Run(ref, home=home)
    if source.manifest().agent.runner == "workflow":
        return resume_workflow(source.id, home=home)
    if child not in (None, 0):
        raise InvalidInput(f"run {source.id} has one child, 0")
    _warm_up()  # first: it starts while the launch is checked
    from pisub.runs.launch import plan_resume
    from pisub.store.lineage import caller_lineage

    lineage = caller_lineage(os.environ)
    text = _text(message, "message") if message is not None else _briefs_only(source)
    new = plan_resume(source.home, source.id, text, lineage=lineage, timeout=timeout)
    return _start_handle(new, source.home)


def _briefs_only(source: Run) -> str:
    """The next turn of a resume given no message: its stored briefs alone.

    Raises:
        NotResumable: the run cannot be resumed at all (checked first: the advice below would
            not help).
        InvalidInput: no brief is stored (saying both ways to give the next turn).
    """
    from pisub.runs.launch import resumable_session
    from pisub.store.briefs import BRIEFS_ONLY_TASK, pending_briefs

    resumable_session(source.id, source.status(), source.manifest().agent.runner)
    if not pending_briefs(source.paths):
        raise InvalidInput(
            f"run {source.id} holds no follow-up: give the next user turn (pisub resume "
            f"{source.id[:8]} MESSAGE), or store one first (pisub follow-up {source.id[:8]} MESSAGE)"
        )
    return BRIEFS_ONLY_TASK


def launch_workflow(
    script: str | Path | None = None,
    *,
    text: str | None = None,
    language: str | None = None,
    args: dict[str, Any] | None = None,
    cwd: str | Path | None = None,
    concurrency: int | None = None,
    max_spawns: int | None = None,
    state_ns: str | None = None,
    fork_from: str | None = None,
    timeout: float | None = None,
    isolation: str | None = None,
    base_ref: str | None = None,
    usage_budget: dict[str, Any] | None = None,
    on_done: str | None = None,
    backend: str | None = None,
    group: str | None = None,
    priority: int | None = None,
    after: Sequence[str] | None = None,
    label: str | None = None,
    review: bool | None = None,
    mission_id: str | None = None,
    mission: dict[str, Any] | bool | None = None,
    session_key: str | None = None,
    home: Path | None = None,
    run_id: str | None = None,
    top_level: bool = False,
) -> Run:
    """Start a detached workflow run of the script file ``script`` — Python (``.py``: ``async
    def main(runs, state, args)``) or JavaScript (``.js``: the seed's statement body with
    ``runs``, ``state``, ``emit``, ``console``, ``args``) — or of the inline script ``text``
    (JavaScript unless ``language="python"``); a relative ``script`` is found in ``cwd`` when
    it is given (the seed's rule). Returns once its coordinator committed. The script is
    checked first (``pisub workflow validate``, every agent it names looked up from the run's
    working directory) before anything is created, and copied into the run, so later edits do
    not matter.

    ``backend`` is refused: a workflow's coordinator runs here, and its children go where their
    agent files say (``backend: slurm``).

    ``review``: each writer child's work is reviewed by a reviewer run (real tokens; default:
    config ``[acceptance] review``, else off: a script child's inferred review is recorded as
    ``review-required``, not run). What acceptance adds is in ``manifest().acceptance_plan``.

    Missions (``spec/missions.md``; every workflow launcher takes the same three): a workflow
    belongs to a default enclosing mission made for it (status ``active``, titled by its label
    or what it runs; ``session_key``: the pi session that owns it), unless ``mission=False``;
    ``mission={"title"|"summary", "objective"?, "goal"?: True, "budget"?: {"tokens": N},
    "labels"?}`` makes that mission as given; ``mission_id`` attaches the workflow to an
    existing mission of the project. The script's ``state`` is the mission's (with
    ``state_ns``, the namespace's: the mission still lists the run). The mission's id is in
    ``status().mission_id``; a default mission that cannot be made only warns
    (``manifest().workflow.mission_warning``) and the workflow runs without one.

    ``run_id`` (internal): the new run's id, chosen beforehand — a schedule's fire writes it in
    its claim before the launch (``spec/schedules.md``); a run with that id must not exist.
    ``top_level`` (internal): a top-level run even when the caller runs inside a run (its
    lineage markers are ignored) — a schedule's fire belongs to no run that happened to tick.

    Raises:
        InvalidInput: the script does not validate (the message lists the problems), or a bad
            argument (a bad ``mission`` names the field: ``mission.budget.tokens: ...``).
        MissionNotFound: ``mission_id`` names no mission of this project (nothing started).
    """
    from pisub.protocol.workflow import Shape

    if backend is not None:
        raise InvalidInput(WORKFLOW_BACKEND)
    if script is not None and cwd is not None and not Path(script).is_absolute():
        script = Path(cwd) / script  # the seed's rule: relative to the request's cwd
    source, lang, path = _script_source(script, text, language)
    return _launch_workflow(
        Shape.WORKFLOW,
        name=path.stem if path is not None else "workflow",
        script=path,
        script_text=source,
        language=lang,
        args=args,
        cwd=cwd,
        concurrency=concurrency,
        max_spawns=max_spawns,
        state_ns=state_ns,
        fork_from=fork_from,
        timeout=timeout,
        isolation=isolation,
        base_ref=base_ref,
        usage_budget=usage_budget,
        on_done=on_done,
        backend=backend,
        group=group,
        priority=priority,
        after=after,
        label=label,
        review=review,
        mission_id=mission_id,
        mission=mission,
        session_key=session_key,
        home=home,
        run_id=run_id,
        top_level=top_level,
    )


def _script_source(
    script: str | Path | None, text: str | None, language: str | None
) -> tuple[str, Any, Path | None]:
    """The script's text, language and file (None: inline) of a workflow launch.

    Raises:
        InvalidInput: neither or both given, an unknown language, a file that cannot be read.
    """
    from pisub.protocol.workflow import MAX_SCRIPT_BYTES, ScriptLanguage
    from pisub.workflow.languages import language_of
    from pisub.workflow.validate import read_script_text

    if (script is None) == (text is None):
        raise InvalidInput("give a workflow script file or an inline script (text), one of them")
    if text is not None:
        if not isinstance(text, str):
            raise InvalidInput(f"the inline workflow script must be text, not {type(text).__name__}")
        if not text.strip():
            raise InvalidInput("the inline workflow script is empty")
        lang = language_of(Path("workflowScript.js"), language)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES:
            raise InvalidInput(f"the inline workflow script is larger than {MAX_SCRIPT_BYTES} bytes")
        return text, lang, None
    assert script is not None
    path = Path(script).absolute()
    lang = language_of(path, language)
    source = read_script_text(Path(os.path.realpath(path)), str(path))  # a link is the user's own
    if lang is ScriptLanguage.PYTHON and language is None and path.suffix != ".py":
        raise InvalidInput(f"{path}: a workflow script is a .js (JavaScript) or .py (Python) file")
    return source, lang, path


def _entries(items: Any) -> Any:
    """Tasks or lanes as JSON objects: a checked record given is written back as one (anything
    else is left for the checks to name)."""
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        return items
    return [msgspec.to_builtins(item) if isinstance(item, msgspec.Struct) else item for item in items]


def launch_parallel(tasks: Sequence[TaskInput], **options: Unpack[WorkflowOptions]) -> Run:
    """Start every task at once (up to the concurrency) as one workflow run; its result lists
    the children's results in task order. ``tasks``: ``{key?, agent, task, ...}`` (camelCase
    names, as in a tasks file). Options as for :func:`launch_workflow`."""
    from pisub.protocol.workflow import Shape
    from pisub.workflow.calls import tasks_from

    calls = tasks_from(_entries(tasks), "tasks")
    _within_spawns(len(calls), "tasks", "tasks", options)
    return _launch_workflow(Shape.PARALLEL, name="parallel", tasks=calls, **options)


def launch_chain(tasks: Sequence[TaskInput], **options: Unpack[WorkflowOptions]) -> Run:
    """Run the tasks one after the other as one workflow run; ``{previous}`` in a task is the
    previous step's output, and a failed step ends the chain (the rest are ``skipped``)."""
    from pisub.protocol.workflow import Shape
    from pisub.workflow.calls import tasks_from

    calls = tasks_from(_entries(tasks), "tasks")
    _within_spawns(len(calls), "tasks", "tasks", options)
    return _launch_workflow(Shape.CHAIN, name="chain", tasks=calls, **options)


def launch_lanes(lanes: Sequence[LaneInput], **options: Unpack[WorkflowOptions]) -> Run:
    """Start a lanes workflow: lanes of ordered stages side by side (``[{key, defaults?,
    stages: [{key, agent?, task, resume?: "previous", ...}]}]``); its result is the board. The
    whole manifest is checked, and every agent looked up, before anything is created.
    Options as :func:`launch_workflow`.

    Raises:
        InvalidInput: every problem, naming the lane, stage and field.
    """
    from pisub.protocol.workflow import Shape
    from pisub.workflow.lanes import check_lanes, stage_call

    checked = check_lanes(_entries(lanes), "lanes")
    every = [stage_call(lane, n) for lane in checked for n in range(len(lane.stages))]
    labels = [
        f"lanes[{i}] ({lane.key}).stages[{n}] ({stage.key})"
        for i, lane in enumerate(checked)
        for n, stage in enumerate(lane.stages)
    ]
    _within_spawns(len(every), "lanes", "stages", options)
    return _launch_workflow(Shape.LANES, name="lanes", tasks=every, lanes=checked, labels=labels, **options)


def _within_spawns(count: int, where: str, what: str, options: WorkflowOptions) -> None:
    """Refuse, before anything is created, a fan-out whose ``count`` children are known to
    exceed its spawn budget (``max_spawns``, else the config's).

    Raises:
        FanoutLimit: naming ``where``.
    """
    from pisub.errors import FanoutLimit
    from pisub.protocol.workflow import DEFAULT_MAX_SPAWNS
    from pisub.store.config import load_config

    limit = options.get("max_spawns") or load_config(open_home(options.get("home")).root).workflow.max_spawns
    limit = limit or DEFAULT_MAX_SPAWNS
    if count > limit:
        raise FanoutLimit(f"{where}: {count} {what} would start more than {limit} children (--max-spawns)")


def _launch_workflow(
    shape: Any,
    *,
    name: str,
    script: Path | None = None,
    script_text: str | None = None,
    language: Any = None,
    permit: Any = None,
    resource: Any = None,
    tasks: list[Any] | None = None,
    lanes: list[Any] | None = None,
    labels: list[str] | None = None,
    args: dict[str, Any] | None = None,
    cwd: str | Path | None = None,
    concurrency: int | None = None,
    max_spawns: int | None = None,
    state_ns: str | None = None,
    fork_from: str | None = None,
    timeout: float | None = None,
    isolation: str | None = None,
    base_ref: str | None = None,
    usage_budget: dict[str, Any] | None = None,
    on_done: str | None = None,
    backend: str | None = None,
    group: str | None = None,
    priority: int | None = None,
    after: Sequence[str] | None = None,
    label: str | None = None,
    review: bool | None = None,
    mission_id: str | None = None,
    mission: dict[str, Any] | bool | None = None,
    session_key: str | None = None,
    home: Path | None = None,
    run_id: str | None = None,
    top_level: bool = False,
) -> Run:
    import uuid

    from pisub.runs.mission_link import choose, default_title, link

    if backend is not None:
        raise InvalidInput(WORKFLOW_BACKEND)
    _warm_up()  # first: it starts while the launch is checked
    checked_label = _label(label)
    mission_choice = choose(mission_id, mission, session_key, state_ns)
    from pisub.protocol.workflow import (
        DEFAULT_CONCURRENCY,
        DEFAULT_MAX_SPAWNS,
        MAX_CONCURRENCY,
        Isolation,
        ScriptLanguage,
        WorkflowSpec,
    )
    from pisub.runs.launch import new_manifest, outside_home, working_dir
    from pisub.store.lineage import caller_lineage
    from pisub.store.shared_state import check_json, check_namespace

    lineage = caller_lineage(_top_level_environ() if top_level else os.environ)
    workdir = working_dir(cwd)
    h = open_home(home)
    if cwd is not None:  # a directory given (a script in a run's directory launching: its own)
        outside_home(workdir, h)
    spec_args = dict(args or {})
    check_json(spec_args, "the workflow's args")
    from pisub.store.config import load_config

    config = load_config(h.root)
    configured = config.workflow
    from pisub.runs.launch import review_runs_of, workflow_plan

    review = review_runs_of(review, config)
    concurrency = _count(
        concurrency, configured.concurrency or DEFAULT_CONCURRENCY, 1, MAX_CONCURRENCY, "concurrency"
    )
    max_spawns = _count(max_spawns, configured.max_spawns or DEFAULT_MAX_SPAWNS, 1, 10_000, "max-spawns")
    if state_ns is not None:
        check_namespace(state_ns)
    default_isolation = _isolation(isolation, base_ref)
    catalog = agent_catalog(home=h.root, cwd=workdir)
    if script_text is None and script is not None:  # the old call: a Python file
        script_text, language, _path = _script_source(script, None, None)
    lang = language or ScriptLanguage.PYTHON
    if script_text is not None:
        _check_script(script_text, lang, script, catalog, max_spawns, resource)
    if tasks:
        _check_tasks(tasks, catalog, workdir, fork_from, default_isolation, base_ref, labels, h)
    elif default_isolation is not None:
        _check_worktree_source(workdir, "the workflow", base_ref, home=h)
    budget = _usage_budget(usage_budget, lineage.root_run_id)
    from pisub.protocol.manifest import AgentSpec, Limits, LimitValues

    caller = LimitValues(timeout=timeout).check("the call")
    if run_id is not None and not is_run_id(run_id):
        raise InvalidInput(f"run_id: {run_id[:40]!r} is not a run id (a lower-case UUID)")
    run_id = run_id or str(uuid.uuid4())
    spec = WorkflowSpec(
        shape=shape,
        script=str(script) if script is not None else ("-" if script_text is not None else None),
        language=lang,
        resource=resource,
        permit=permit,
        args=spec_args,
        tasks=list(tasks or []) if lanes is None else [],
        lanes=list(lanes or []),
        isolation=default_isolation or Isolation.NONE,
        usage_budget=budget,
        base_ref=base_ref,
        concurrency=concurrency,
        max_spawns=max_spawns,
        state_ns=state_ns,
        fork_from=_fork_source(fork_from, h) if fork_from is not None else None,
        journal=str(h.run(run_id).journal),
        budget=lineage.root_run_id or run_id,
        review=review,
    )
    agent = AgentSpec(name=name, runner="workflow", description=f"{shape.value} workflow")
    limits = Limits.resolve((caller, "the call"))
    limits.timeout = caller.timeout  # a workflow has no runtime limit unless it is given one
    count = len(tasks or [])
    what = f"{shape.value} {script.name}" if script is not None else f"{shape.value}: {count} tasks"
    if script is None and script_text is not None:
        what = (
            f"{shape.value} {resource.name}"
            if resource is not None
            else f"{shape.value} (inline {lang.value})"
        )
    if lanes is not None:
        what = f"lanes: {len(lanes)} lanes, {count} stages"
    manifest = new_manifest(agent, what, str(workdir), limits, lineage=lineage, run_id=run_id)
    manifest.workflow = spec
    manifest.queue = _queue(h, group, priority, after, lineage.parent_run_id is None, None)
    manifest.label = checked_label
    calls = None if script_text is not None else list(tasks or [])
    if resource is not None and script_text is not None:
        from pisub.workflow.resources import may_start_children

        calls = None if may_start_children(script_text) else []  # run-ci: no child, no line
    children = lineage.child(run_id) if lineage.depth < lineage.max_depth else lineage  # too deep: it fails
    manifest.acceptance_plan = workflow_plan(h, catalog, calls, children, review)
    if on_done is not None:
        manifest.on_done = _on_done(on_done, workdir)
    seeds: dict[str, Path | bytes] = {}
    if script_text is not None:  # the text that was checked is the text that runs
        seeds[lang.copy_name] = script_text.encode("utf-8", "surrogatepass")
    from pisub.runs.manifest_size import check_manifest_size

    check_manifest_size(manifest)  # before the mission lists the run: a refusal leaves nothing
    # Last, right before the run is created: the run is listed in its mission first (a launcher
    # dying in between leaves a mission naming a run that never appeared, shown as gone).
    first = script_text if script_text is not None else (tasks[0].task if tasks else None)
    linked = link(h, workdir, mission_choice, run_id, lineage, default_title(checked_label, what, first))
    spec.mission_id, spec.mission_project = linked.mission_id, linked.project
    spec.mission_warning = linked.warning
    return _start_handle(manifest, h, seeds=seeds)


def _top_level_environ() -> dict[str, str]:
    """This process's environment without a run's lineage markers (and its depth limit): what
    a launch that must be top-level sees."""
    from pisub.protocol.env import ENV_MAX_DEPTH
    from pisub.store.paths import without_markers

    env = without_markers(os.environ)
    env.pop(ENV_MAX_DEPTH, None)
    return env


WORKFLOW_BACKEND = (
    "--backend places one run; a workflow's coordinator runs here and its children go "
    "where their agent files say (backend: slurm)"
)


def _check_script(
    source: str, language: Any, path: Path | None, catalog: Catalog, max_spawns: int, resource: Any = None
) -> None:
    """The checks of ``pisub workflow validate``, agents included, before a run directory exists.

    Raises:
        UnknownAgent: every problem is a name that is no agent here (the first ones, with
            "did you mean").
        InvalidInput: the script does not validate (the first problems, with their lines).
    """
    from pisub.errors import UnknownAgent
    from pisub.workflow.languages import runtime

    shown = str(path) if path is not None else "the inline workflow script"
    if resource is not None:  # a named resource's script: its name and where it is
        shown = f"resource {resource.name} ({resource.path or resource.source})"
    report = runtime(language).check(source, set(catalog.agents), shown, max_spawns)
    if not report.ok:
        first = "; ".join(f"line {e.line}: {e.message}" for e in report.errors[:5])
        error = UnknownAgent if all(e.unknown_agent for e in report.errors) else InvalidInput
        raise error(f"{shown} does not validate: {first}")


def _tool_budget(given: dict[str, Any] | None) -> Any:
    """A call's tool budget, checked (``{hard, soft?, block?}``).

    Raises:
        InvalidInput: naming the field.
    """
    if given is None:
        return None
    from pisub.errors import PisubError
    from pisub.protocol.budget import ToolBudgetInput
    from pisub.protocol.codec import convert

    try:
        return convert(given, ToolBudgetInput, "toolBudget").budget()
    except PisubError as exc:
        raise InvalidInput(exc.message) from None


def _usage_budget(given: dict[str, Any] | None, root_run_id: str | None) -> Any:
    """The workflow's usage budget (``{tokens?: {soft?, hard}, costUsd?: {soft?, hard}}``).

    Raises:
        InvalidInput: a bad field (named), or a workflow started inside a tree sets one.
    """
    if given is None:
        return None
    from pisub.errors import PisubError
    from pisub.protocol.budget import UsageBudgetSpec
    from pisub.protocol.codec import convert

    if root_run_id is not None:
        raise InvalidInput("a usage budget is set by the top-level workflow of a tree (this one is nested)")
    try:
        spec = convert(given, UsageBudgetSpec, "usageBudget")
    except PisubError as exc:
        raise InvalidInput(exc.message) from None
    if spec.tokens is None and spec.cost_usd is None:
        raise InvalidInput("usageBudget: give tokens and/or costUsd, each {hard, soft?}")
    for name, limit in (("tokens", spec.tokens), ("costUsd", spec.cost_usd)):
        if limit is not None and limit.soft is not None and limit.soft > limit.hard:
            raise InvalidInput(f"usageBudget.{name}: soft must not be above hard")
    return spec


def _isolation(isolation: str | None, base_ref: str | None) -> Isolation | None:
    """The workflow's default isolation (None: none).

    Raises:
        InvalidInput: an unknown isolation, or a base ref without worktree isolation.
    """
    from pisub.protocol.workflow import Isolation

    if isolation is None or isolation == Isolation.NONE:
        if base_ref is not None:
            raise InvalidInput("--base-ref needs --isolation worktree")
        return None
    if isolation != Isolation.WORKTREE:
        raise InvalidInput(f"isolation must be none or worktree, not {isolation!r:.40}")
    if base_ref is not None:
        from pisub.worktrees.repo import check_ref_text

        check_ref_text(base_ref)
    return Isolation.WORKTREE


def _check_worktree_source(
    cwd: Path, where: str, base_ref: str | None, key: str | None = None, home: Home | None = None
) -> None:
    """A worktree child's source (a clean repository, its base ref, its cwd in that commit, a
    branch name for its key): checked before anything is created.

    Raises:
        InvalidInput: naming ``where`` and what is wrong.
    """
    from pisub.errors import PisubError
    from pisub.worktrees import check_source

    try:
        repo = check_source(cwd, base_ref, key)
        if home is not None:
            from pisub.worktrees.records import check_root

            check_root(home.worktrees, home.root, repo)
    except PisubError as exc:
        prefix = f"{where}: " if where else ""
        raise type(exc)(f"{prefix}isolation='worktree': {exc.message}") from None


def _check_tasks(
    tasks: list[Any],
    catalog: Catalog,
    workdir: Path,
    fork_from: str | None,
    isolation: Isolation | None = None,
    base_ref: str | None = None,
    labels: list[str] | None = None,
    home: Home | None = None,
) -> None:
    """Every check a task's child will meet, before the workflow is created: an unknown agent
    or a bad field starts nothing (the error names ``tasks[i]``)."""
    from pisub.errors import PisubError
    from pisub.protocol.workflow import Context, Isolation
    from pisub.runs.launch import check_task, working_dir

    for index, call in enumerate(tasks):
        where = labels[index] if labels is not None else f"tasks[{index}] ({call.key})"
        try:
            agent = catalog.get(call.agent).spec()
            check_task(call.task, "task")
            from pisub.acceptance.spec import parse

            parse(call.acceptance, call.gate, "acceptance", resume=call.resume is not None)
            working_dir(call.cwd, workdir)
            if call.resume is not None:
                validate_run_ref(call.resume)
            pi_only = [
                n for n, on in (("model", call.model), ("context='fork'", call.context == Context.FORK)) if on
            ]
            if pi_only and agent.runner != "pi":
                raise InvalidInput(f"{', '.join(pi_only)} needs a pi agent; {call.agent!r} is {agent.runner}")
            if call.context == Context.FORK and fork_from is None:
                raise InvalidInput("context='fork' needs a session to fork: give --fork-from RUN")
            if (call.isolation or isolation) == Isolation.WORKTREE:
                base = call.base_ref if call.base_ref is not None else base_ref
                _check_worktree_source(working_dir(call.cwd, workdir), "", base, call.key, home)
        except PisubError as exc:
            raise type(exc)(f"{where}: {exc.message}") from None


def _count(value: int | None, default: int, low: int, high: int, what: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} must be a whole number from {low} to {high}, not {value!r}")
    return value


def _fork_source(ref: str, home: Home) -> str:
    """The session to fork: a session file, or the session of a run (id or prefix)."""
    from pisub.runs.launch import check_session

    if os.path.sep in ref or ref.endswith(".jsonl"):
        return str(check_session(ref, "--fork-from"))
    status = Run(ref, home=home.root).status()
    if status.session_file is None:
        raise InvalidInput(f"--fork-from: run {status.run_id} has no pi session")
    return str(check_session(status.session_file, "--fork-from"))


def resume_workflow(ref: str, *, home: Path | None = None) -> Run:
    """Continue a failed or paused workflow run in a new run: its script runs again from the top,
    children whose results the journal holds are not run again, children still running are
    re-attached, and only the rest start.

    Raises:
        NotResumable: the run is not a workflow, or is running, complete or stopped.
        LeaseHeld: another run drives the workflow's journal.
    """
    import uuid

    from pisub.errors import NotResumable
    from pisub.store.journal import replay

    _warm_up()  # first: it starts while the launch is checked
    from pisub.runs.launch import current_umask
    from pisub.store.leases import unleased

    source = Run(ref, home=home)
    status, manifest = source.status(), source.manifest()
    if manifest.workflow is None:
        raise NotResumable(f"run {source.id} is not a workflow run")
    if not status.state.is_terminal:
        raise NotResumable(f"run {source.id} is {status.state}; stop it or steer it")
    if status.state in (RunState.COMPLETE, RunState.STOPPED):
        raise NotResumable(f"run {source.id} is {status.state}; start a new workflow")
    with unleased(source.home.leases, manifest.workflow.journal):
        owner = replay(Path(manifest.workflow.journal)).owner
    if owner not in (None, source.id):
        raise NotResumable(f"run {source.id} was resumed by run {owner}: resume that one, if it needs it")
    new = msgspec.structs.replace(
        manifest,
        run_id=str(uuid.uuid4()),
        created_at=now_iso(),
        umask=current_umask(),
        resumed_from=source.id,
        label=None,  # a label names one run (@LABEL finds it): a resume starts without one
    )
    copy = manifest.workflow.language.copy_name
    seeds: dict[str, Path | bytes] = (
        {copy: source.paths.root / copy} if manifest.workflow.script is not None else {}
    )
    spec = manifest.workflow
    warning = None
    if spec.mission_id is not None and spec.mission_project is not None:  # it keeps its mission
        from pisub.runs.mission_link import attach_again

        warning = attach_again(source.home, spec.mission_id, spec.mission_project, new.run_id).warning
    new.workflow = msgspec.structs.replace(spec, mission_warning=warning)
    return _start_handle(new, source.home, seeds=seeds)


def _start_handle(manifest: Manifest, home: Home, seeds: Mapping[str, Path | bytes] | None = None) -> Run:
    """Create and start the run of ``manifest``: its handle knows the manifest it was made
    from (the launcher wrote it; a manifest is never changed), so reading it costs nothing."""
    from pisub.runs.launch import start_run

    run = Run(start_run(home, manifest, seeds=seeds).run_id, home=home.root)
    run._manifest = manifest
    return run


def takes_no_messages(runner: str, state: RunState) -> bool:
    """A live run whose runner cannot pass its child a message (a steer, a follow-up) or pause
    it for a resume: an external CLI's. A pi run's can; a workflow routes to its children,
    which answer for themselves; an ended run refuses every request anyway (``RUN_CLOSED``)."""
    return runner not in ("pi", "workflow") and not state.is_terminal


class Run:
    """A handle on one run, found by id or unique prefix."""

    def __init__(self, ref: str, *, home: Path | None = None) -> None:
        validate_run_ref(ref)  # refused before the disk is touched
        self.home = open_home_to_read(home)  # a run is found, never made: a missing home has none
        self.paths: RunPaths = RunStore(self.home).resolve(ref)
        self._manifest: Manifest | None = None

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    @property
    def id(self) -> str:
        return self.paths.run_id

    @property
    def dir(self) -> Path:
        return self.paths.root

    def manifest(self) -> Manifest:
        """The run's manifest (read once: a manifest is never changed once its run exists)."""
        if self._manifest is None:
            self._manifest = load_manifest(self.paths)
        return self._manifest

    def child_index(self, which: str | int) -> int:
        """The index (in ``steps[]``) of this run's child ``which``: an index, or a workflow
        child's key.

        Raises:
            InvalidInput: no such child.
        """
        st = self.status()
        steps = st.steps
        planned = self._planned_keys()
        if isinstance(which, int) or (isinstance(which, str) and which.isascii() and which.isdigit()):
            index = int(which)
            known = max(len(steps), len(planned))
            if not 0 <= index < max(known, 1):
                words = self._children_words(known, st.state.is_terminal)
                raise InvalidInput(f"run {self.id} has no child {index} ({words})")
            return index
        for step in steps:
            if step.key == which:
                return step.index
        if which in planned:
            return planned.index(which)
        if which in self._lane_stage_keys():
            raise InvalidInput(
                f"child {which} of run {self.id} has not started yet: a lanes stage is a child "
                "once its lane reaches it (until then it has no index); send it the request then"
            )
        keys = ", ".join(dict.fromkeys([*(s.key for s in steps if s.key), *planned])) or "none"
        raise InvalidInput(f"run {self.id} has no child with key {which!r} (keys: {keys})")

    def _workflow_spec(self) -> WorkflowSpec | None:
        """The workflow this run is, as its manifest says; None for a single run, and for a run
        whose manifest cannot be read (its children are then named by its status alone)."""
        try:
            return self.manifest().workflow
        except PisubError:
            return None

    def _children_words(self, count: int, ended: bool) -> str:
        """The children this run has, for an error naming one it does not have."""
        from pisub.protocol.status import children_words

        single = self._workflow_spec() is None and self.status().runner != "workflow"
        return "it has one child, 0" if single else children_words(count, ended=ended)

    def _lane_stage_keys(self) -> set[str]:
        """The keys of a lanes workflow's stages (``<lane>.<stage>``); empty for any other run."""
        spec = self._workflow_spec()
        if spec is None:
            return set()
        return {f"{lane.key}.{stage.key}" for lane in spec.lanes for stage in lane.stages}

    def _planned_keys(self) -> list[str]:
        """The keys of a parallel or chain workflow's children, in order: each has its index
        before it has a step (a chain's later steps, any task just launched). Empty for any
        other run."""
        spec = self._workflow_spec()
        return spec.planned_keys() if spec is not None else []

    def child(self, which: str | int) -> Run:
        """The run of this workflow's child ``which`` (index or key).

        Raises:
            InvalidInput: no such child, or it has no run yet (queued).
        """
        index = self.child_index(which)
        st = self.status()
        steps = st.steps
        if index >= len(steps):  # (a workflow that has started no child yet, or a planned step)
            when = "never started" if st.state.is_terminal else "has not started yet"
            raise InvalidInput(f"child {which} of run {self.id} has no run (it {when})")
        run_id = steps[index].run_id
        if run_id is None:
            raise InvalidInput(f"child {which} of run {self.id} has no run (it is {steps[index].status})")
        return Run(run_id, home=self.home.root)

    def status(self) -> Status:
        """The current status, after crash detection and repair."""
        from pisub.runs.reconcile import observe

        return observe(self.paths)

    def liveness(self, status: Status | None = None) -> str:
        """``alive``, ``dead`` or ``unknown``: whether this host can prove the run's runner lives
        (a run ended is ``dead``), for ``status`` (default: the current one); see spec/protocol.md
        "Crash detection"."""
        from pisub.backends import liveness

        status = status if status is not None else self.status()
        return "dead" if status.state.is_terminal else liveness(self.paths, status).value

    def events(self) -> list[Event]:
        """The run's events (``events.jsonl`` and a repairer's ``events.repair.jsonl``, by time)."""
        from pisub.store.runs import read_events

        return read_events(self.paths)

    def placement(self) -> Placement:
        """Where the run's runner lives (``placement.json``).

        Raises:
            ProtocolError: the file is malformed.
        """
        from pisub.store.runs import load_placement

        return load_placement(self.paths)

    def result(self) -> Result | None:
        """The result, or None while the run has none."""
        return load_result(self.paths)

    def wait(self, timeout: float | None = None) -> Result:
        """Block until the terminal status is written; the result.

        Raises:
            WaitTimeout: the run was still going after ``timeout`` seconds.
        """
        self.wait_until_terminal(_seconds(timeout, "timeout"))
        result = self.result()
        assert result is not None, "a terminal run always has a result"
        return result

    # -- control ------------------------------------------------------------------------
    def send(self, request: Request) -> str:
        """Publish a control request into the run's inbox; its id.

        Raises:
            InboxClosed: the run has finished (the request was not written, or withdrawn).
        """
        import msgspec

        from pisub.store.mailbox import write_request

        for what in ("message", "reason", "source"):
            value = getattr(request, what, None)
            if isinstance(value, str):
                _text(value, what)
        try:  # what a runner would reject (a Struct is not checked when built): refused here
            msgspec.convert(msgspec.to_builtins(request), type(request))
        except (msgspec.ValidationError, TypeError) as exc:
            raise InvalidInput(f"not a valid {type(request).__name__.lower()} request: {exc}") from None
        request_id = write_request(self.paths, request)
        self._ring()
        return request_id

    def _ring(self) -> None:
        """Ring the doorbell of a runner an engine placed (it may not see the inbox change)."""
        from pisub.backends import backend_for
        from pisub.protocol.placement import BackendName
        from pisub.store.runs import load_placement

        try:
            placement = load_placement(self.paths)
        except PisubError:
            return  # the runner's safety scan finds the request
        if placement.backend != BackendName.LOCAL:
            backend_for(placement.backend).ring(placement)

    def _child_number(self, child: int | str | None) -> int | None:
        """A child given by index or by key (a workflow child's), as its index."""
        return self.child_index(child) if isinstance(child, str) else child

    def stop(
        self, *, child: int | str | None = None, reason: str | None = None, wait: float = 3.0
    ) -> tuple[str, Receipt | None]:
        """Ask the run to stop (an inbox request) and wait up to ``wait`` seconds for its receipt;
        the request id and the latest receipt. A whole run an engine placed whose runner gave no
        receipt in time is cancelled through the engine as well (``scancel``: the runner takes
        it as a stop).

        Raises:
            InboxClosed: the run has finished.
        """
        child = self._child_number(child)
        request_id = self.send_stop(child=child, reason=reason)
        if wait <= 0:
            return request_id, None
        receipt = self.wait_for_receipt(request_id, wait)
        if child is None and (receipt is None or receipt.state == ReceiptState.PENDING):
            self.cancel_placement()
        return request_id, receipt

    def cancel_placement(self) -> None:
        """Cancel the run through the engine that placed it (``scancel``: its runner takes it as
        a stop), while it has not ended; nothing for a local run."""
        from pisub.backends import backend_for
        from pisub.store.runs import load_placement

        try:
            placement = load_placement(self.paths)
        except PisubError:
            return
        if not self.status().state.is_terminal:
            backend_for(placement.backend).cancel(placement)

    def send_steer(
        self, message: str, *, mode: str = "steer", child: int | None = None, source: str | None = "pisub"
    ) -> str:
        """Steer the child (``mode``: ``steer``, ``follow_up`` or ``auto``); the request id."""
        if mode not in ("steer", "follow_up", "auto"):
            raise InvalidInput(f"unknown mode {mode!r}; one of steer, follow_up, auto")
        return self.send(Steer(v=1, message=message, mode=mode, child=child, source=source))  # type: ignore[arg-type]

    def steer(
        self,
        message: str,
        *,
        mode: str = "steer",
        child: int | str | None = None,
        wait: float = 3.0,
        recover: bool = True,
        on_recovery: Callable[[str], None] | None = None,
    ) -> tuple[str, Receipt | None]:
        """Steer the child and wait up to ``wait`` seconds for the receipt; the request id and
        the latest receipt (None when none came, or with ``wait`` 0).

        With ``recover``, a plain steer (mode ``steer``, the run's one child) that a running pi
        run has not taken in time triggers pause-and-revive (:mod:`pisub.api.revive`): the run is
        paused and resumed with the message, and the receipt becomes ``recovered`` — or, when the
        run does not pause in time, the recovery is abandoned without side effects.
        ``on_recovery`` is told (with the request id) before a recovery starts.

        Raises:
            InboxClosed: the run has finished.
        """
        _text(message, "message")  # a bad message is the caller's first problem
        self.check_steerable("steer")
        child = self._child_number(child)
        request_id = self.send_steer(message, mode=mode, child=child)
        if wait <= 0:
            return request_id, None
        receipt = self.wait_for_receipt(request_id, wait)
        unanswered = receipt is None or receipt.state == ReceiptState.PENDING
        if recover and mode == "steer" and child in (None, 0) and unanswered and self._revivable():
            from pisub.api.revive import revive

            if on_recovery is not None:
                on_recovery(request_id)
            receipt = revive(self, request_id, message) or self.receipt(request_id)
        return request_id, receipt

    def _revivable(self) -> bool:
        state = self.status().state  # (a queued run's steer waits for its child: nothing to revive)
        return self.manifest().agent.runner == "pi" and not state.is_terminal and state != RunState.QUEUED

    def resume(self, message: str, *, timeout: float | None = None) -> Run:
        """Continue this finished pi run's session in a new run (see :func:`resume`)."""
        return resume(self.id, message, timeout=timeout, home=self.home.root)

    def check_steerable(self, what: str) -> None:
        """Refused before anything is written: an external CLI's runner cannot pass it messages
        (a workflow routes to its children, which answer for themselves).

        Raises:
            NotSteerable: naming the run and what to do instead.
        """
        from pisub.errors import NotSteerable

        runner = self._refusing_runner()
        if runner is not None:
            raise NotSteerable(
                f"run {self.id} is an {runner} run: its runner cannot pass it a {what}; "
                f"stop it (pisub stop {self.id[:8]}) and start a new run with the message"
            )

    def _refusing_runner(self) -> str | None:
        """The runner kind of this run when it is live and cannot pass its child a message
        (:func:`takes_no_messages`); None when it can — and for a run that has ended, whose
        closed inbox refuses every request (``RUN_CLOSED``) whatever else of it is damaged."""
        from pisub.store.mailbox import is_closed

        if is_closed(self.paths):
            return None
        runner = self.manifest().agent.runner
        if runner in ("pi", "workflow"):
            return None
        try:
            state = self.status().state
        except ProtocolError:
            if is_closed(self.paths):  # (it ended meanwhile)
                return None
            raise
        return runner if takes_no_messages(runner, state) else None

    def send_follow_up(self, message: str, *, child: int | None = None, source: str | None = "pisub") -> str:
        return self.send(FollowUp(v=1, message=message, child=child, source=source))

    def send_interrupt(
        self, *, child: int | None = None, reason: str | None = None, source: str | None = "pisub"
    ) -> str:
        return self.send(Interrupt(v=1, child=child, reason=reason, source=source))

    def interrupt(
        self, *, child: int | str | None = None, reason: str | None = None, source: str | None = "pisub"
    ) -> str:
        """Interrupt the child: its run ends ``paused``, to be resumed; the request id (its
        receipt: :meth:`wait_for_receipt`).

        Raises:
            NotResumable: the run cannot be resumed (an external CLI): stop it instead.
            InboxClosed: the run has finished.
        """
        from pisub.errors import NotResumable

        runner = self._refusing_runner()
        if runner is not None:
            raise NotResumable(
                f"run {self.id} is an {runner} run: an interrupt pauses a run to resume it, and "
                f"only pi runs can be resumed; end it with: pisub stop {self.id[:8]}"
            )
        return self.send_interrupt(child=self._child_number(child), reason=reason, source=source)

    def send_stop(
        self, *, child: int | None = None, reason: str | None = None, source: str | None = "pisub"
    ) -> str:
        return self.send(Stop(v=1, child=child, reason=reason, source=source))

    def follow_up(self, message: str, *, child: int | str | None = None) -> tuple[str, Receipt | None]:
        """A follow-up: a request to a running run, or a brief for a finished pi run.

        Returns the request id and, for a brief, its ``scheduled`` receipt.

        Raises:
            NotResumable: the run is finished and cannot take briefs (stopped, not pi, no session).
        """
        child = self._child_number(child)
        if child is not None and (target := self._ended_child(child)) is not None:
            return target.follow_up(message)  # a finished (retained) child: a brief for its resume
        status = self.status()
        if not status.state.is_terminal:
            _text(message, "message")  # a bad message is the caller's first problem
            self.check_steerable("follow-up")
            return self.send_follow_up(message, child=child), None
        if child is not None:
            steps = status.steps
            if not 0 <= child < len(steps):
                raise InvalidInput(
                    f"run {self.id} has no child {child} ({self._children_words(len(steps), True)})"
                )
            raise InvalidInput(
                f"child {steps[child].key or child} of run {self.id} never started ({steps[child].status}): "
                "there is no session to follow up"
            )
        from pisub.runs.launch import resumable_session
        from pisub.store.briefs import add_brief

        session = resumable_session(self.id, status, self.manifest().agent.runner)
        receipt = add_brief(self.paths, self.home.leases, session, self.id, _text(message, "message"))
        return receipt.request_id, receipt

    def _ended_child(self, index: int) -> Run | None:
        """Child ``index``'s run when it has ended (its own follow-ups become briefs)."""
        steps = self.status().steps
        if not 0 <= index < len(steps) or steps[index].run_id is None:
            return None
        child = Run(steps[index].run_id or "", home=self.home.root)
        try:
            ended = child.status().state.is_terminal
        except RunNotFound:
            return None
        return child if ended else None

    def receipt(self, request_id: str) -> Receipt | None:
        """The receipt of a request, or None while there is none."""
        from pisub.store.mailbox import read_receipt

        return read_receipt(self.paths, request_id)

    def wait_for_receipt(self, request_id: str, timeout: float) -> Receipt | None:
        """Wait until the request's receipt is past ``pending``; the latest receipt (None if none).

        A run that ends meanwhile answers every request, so this never waits on a dead run
        longer than the crash check takes.
        """
        crash_check = Every(0.5, now=False)  # a crashed runner's requests are answered by the repair

        def answered() -> Receipt | None:
            receipt = self.receipt(request_id)
            if receipt is not None and receipt.state != ReceiptState.PENDING:
                return receipt
            if crash_check.due():
                self.status()
            return None

        got = poll(answered, _seconds(timeout, "wait"), interval=0.02, first=0.005)
        return got if got is not None else self.receipt(request_id)

    def wait_until_terminal(self, timeout: float | None = None) -> Status:
        """Block until the run's terminal status is written (with a crash check twice a second).

        Raises:
            WaitTimeout: the run was still going after ``timeout`` seconds.
        """
        liveness = Every(0.5)
        last: list[Status] = []

        def ended() -> Status | None:
            status = self.status() if liveness.due() else load_status(self.paths)
            last[:] = [status]
            return self.status() if status.state.is_terminal else None

        done = poll(ended, _seconds(timeout, "timeout"))
        if done is None:
            raise WaitTimeout(f"run {self.id} is still {last[0].state} after {timeout:g}s")
        return done


def retained_children(
    *, parent: str | None = None, limit: int = 10, home: Path | None = None
) -> list[Retained]:
    """The ``limit`` most recently ended child runs (of workflow ``parent``, or of every run),
    newest first, each ``resumable`` or not with the reason; continue one with
    ``runs.run(key, resume=RUN_ID, ...)`` or ``pisub resume RUN``.

    Raises:
        InvalidInput: a bad limit. RunNotFound: no such parent.
    """
    from pisub.store.retained import retained

    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidInput("limit must be 1 to 1000")
    parent_id = Run(parent, home=home).id if parent is not None else None
    statuses = list_runs(home=home, children=True)
    return retained(open_home_to_read(home), statuses, parent_id, limit)


def list_runs(
    *,
    home: Path | None = None,
    state: RunState | None = None,
    problems: list[str] | None = None,
    children: bool = False,
    agent: str | None = None,
    since: float | None = None,
    limit: int | None = None,
) -> Iterator[Status]:
    """Statuses of the top-level runs — with ``children``, of every run — after crash repair,
    oldest first; only ``agent``'s, only those started in the last ``since`` seconds (by the
    wall clock: a display filter), only the newest ``limit``.

    A run whose files cannot be read is left out and described in ``problems``; a run removed
    meanwhile (``pisub gc``) is left out silently.
    """
    from pisub.runs.listing import list_statuses

    live_only = state is not None and not state.is_terminal
    listing = list_statuses(open_home_to_read(home), live_only=live_only)  # (no home: no runs)
    if problems is not None:
        problems += listing.problems
    statuses = [
        st
        for st in listing.statuses
        if (state is None or st.state == state) and (children or st.parent_run_id is None)
    ]
    statuses.sort(key=lambda s: s.started_at)
    if agent is not None:
        statuses = [st for st in statuses if st.agent == agent]
    if since is not None:
        import datetime as dt

        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=since)
        statuses = [st for st in statuses if _started(st) >= cutoff]
    if limit is not None:
        statuses = statuses[-limit:] if limit > 0 else []
    return iter(statuses)


def _started(st: Status) -> Any:
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(st.started_at.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return dt.datetime.max.replace(tzinfo=dt.UTC)  # unknown: never filtered out
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def edit_agent(
    op: str,
    name: str | None = None,
    *,
    config: dict[str, Any] | None = None,
    scope: str | None = None,
    expect: str | None = None,
    home: Path | None = None,
    cwd: Path | None = None,
) -> Path:
    """Create, update, delete, disable, enable, eject or reset an agent file (``op``); the
    file's path. ``config``: frontmatter keys in camelCase plus ``systemPrompt`` (and
    ``scope`` for create); ``false`` or ``""`` clears a key. ``expect``: the SHA-256 of the
    file as the caller read it (``pisub agents show --json``).

    Raises:
        InvalidInput, UnknownAgent, AgentConflict (the file changed, or exists already).
    """
    from pisub.agents import files as af
    from pisub.errors import InvalidInput

    h = open_home(home)
    where = Path(cwd or os.getcwd()).resolve()
    if op == "create":
        fields = dict(config or {})
        if scope is not None and fields.get("scope", scope) != scope:
            raise InvalidInput(f"two scopes given: {scope!r} and config.scope {str(fields['scope'])[:16]!r}")
        return af.create(h.agents, where, dict(fields, **({"scope": scope} if scope else {}))).path
    if name is None:
        raise InvalidInput(f"{op} needs the agent's name")
    if op == "update":
        return af.update(h.agents, where, name, dict(config or {}), scope=scope, expect=expect).path
    if op == "delete":
        return af.delete(h.agents, where, name, scope=scope, expect=expect)
    if op in ("disable", "enable"):
        return af.set_disabled(h.agents, where, name, op == "disable", scope=scope).path
    if op == "eject":
        return af.eject(h.agents, where, name, scope or "user").path
    if op == "reset":
        return af.reset(h.agents, where, name, scope=scope).path
    raise InvalidInput(f"unknown agent operation {op[:32]!r}")


def agent_file_sha(path: Path) -> str:
    """The SHA-256 of an agent file's bytes (what ``expect`` names)."""
    import hashlib

    from pisub.core.fsio import read_bytes

    return hashlib.sha256(read_bytes(path, limit=256 * 1024)).hexdigest()


NO_MODEL_FIX = (
    "give pi a provider's key (export ANTHROPIC_API_KEY or OPENAI_API_KEY, or run pi and /login), "
    "or, in a pisub checkout, . scripts/env.sh (a local scripted model)"
)


def pi_models(search: str | None = None, *, required: bool = False) -> list[Model]:
    """The models the pi pisub runs knows (``pi --list-models [search]``).

    Raises:
        LaunchFailed: pi is missing, or cannot list its models.
        NoModel: ``required`` and pi lists none (with the fix), or none matches ``search``.
    """
    from pisub.agents.catalog import pi_agent_dir
    from pisub.children.pi.models import list_models
    from pisub.children.pi.rpc import find_pi
    from pisub.errors import NoModel
    from pisub.termsafe import printable

    found = list_models(find_pi(), search)
    if required and not found:
        if search:
            shown = printable(search[:80], one_line=True)
            raise NoModel(f"pi has no model matching {shown!r} (pisub models lists every model pi has)")
        where = printable(os.fspath(pi_agent_dir()), one_line=True)
        raise NoModel(f"pi has no model (pi --list-models lists none; its agent dir {where}); {NO_MODEL_FIX}")
    return found


def wait_runs(
    runs: list[Run],
    *,
    every: bool,
    timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Run]:
    """Block until one of ``runs`` (``every``: all of them) has its terminal status; the runs
    that have ended, in the order given (with a crash check twice a second, so a run whose
    runner died ends too). ``progress(ended, total)`` is called whenever the count changes.

    Raises:
        WaitTimeout: naming the runs still going after ``timeout`` seconds.
        InvalidInput: no runs.
    """
    if not runs:
        raise InvalidInput("give at least one run to wait for")
    liveness = Every(0.5)
    told = -1

    def ended() -> list[Run] | None:
        nonlocal told
        check = liveness.due()
        done = [r for r in runs if (r.status() if check else load_status(r.paths)).state.is_terminal]
        if progress is not None and len(done) != told:
            told = len(done)
            progress(told, len(runs))
        if every:
            return done if len(done) == len(runs) else None
        return done or None

    found = poll(ended, _seconds(timeout, "timeout"))
    if found is None:
        going = [r.id[:8] for r in runs if not load_status(r.paths).state.is_terminal]
        raise WaitTimeout(f"still going after {timeout:g}s: {', '.join(going)}")
    return found
