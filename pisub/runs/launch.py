"""Starting runs: a launch request becomes a manifest, a run directory and a committed runner.

The client API (a person's launch, or a child process's) and a workflow's coordinator (its
children) both go through :func:`plan_run` — every check, before anything is created — and
:func:`start_run`.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pisub import defaults
from pisub.core.polling import poll
from pisub.errors import InvalidInput, LaunchFailed, NotResumable, PisubError, UnknownAgent
from pisub.protocol.codec import now_iso
from pisub.protocol.manifest import AgentSpec, Limits, LimitValues, Manifest
from pisub.protocol.status import RunState, Status
from pisub.store.lineage import Lineage
from pisub.store.paths import Home, RunPaths
from pisub.store.runs import RunStore

if TYPE_CHECKING:
    from pisub.acceptance.infer import Setting
    from pisub.agents.catalog import Agent, Catalog
    from pisub.protocol.acceptance import Acceptance, AcceptancePlan, ReviewerAgent
    from pisub.protocol.agent import AgentFrontmatter
    from pisub.protocol.config import Config
    from pisub.protocol.placement import PlacementRequest
    from pisub.protocol.workflow import ChildCall

MAX_TASK_BYTES = 1024 * 1024


def check_text(value: str, what: str) -> str:
    """``value``, refused when it cannot be written as UTF-8 (undecodable bytes from argv).

    Raises:
        InvalidInput: naming ``what``.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"the {what} is not valid UTF-8 (it holds undecodable bytes)") from None
    return value


def check_task(task: str, what: str = "task") -> str:
    """``task`` when it is a usable task: text, not blank, at most :data:`MAX_TASK_BYTES`.

    Raises:
        InvalidInput: naming ``what``.
    """
    if not isinstance(task, str):
        raise InvalidInput(f"the {what} must be text, not {type(task).__name__}")
    if not check_text(task, what).strip():
        raise InvalidInput(f"the {what} is empty")
    if len(task.encode("utf-8")) > MAX_TASK_BYTES:
        raise InvalidInput(f"the {what} is larger than {MAX_TASK_BYTES} bytes")
    return task


def working_dir(cwd: str | Path | None, base: Path | None = None) -> Path:
    """The absolute, existing working directory ``cwd`` names (relative to ``base``, else to
    this process's).

    Raises:
        InvalidInput: it does not exist, is not a directory, or its name is not UTF-8.
    """
    start = base if base is not None else Path(os.getcwd())
    workdir = (start / cwd if cwd is not None else start).resolve()
    if not workdir.is_dir():
        said = "is not a directory" if workdir.exists() else "does not exist"
        raise InvalidInput(f"working directory {workdir} {said}")
    check_text(str(workdir), "working directory's path")
    return workdir


def outside_home(workdir: Path, home: Home) -> Path:
    """``workdir``, when it is not inside pisub's ``home`` (where a run could overwrite the
    files of pisub's runs) — its worktrees (an isolated child's checkout) excepted.

    Raises:
        InvalidInput: it is the home or below it, outside its worktrees.
    """
    if in_pisub_files(workdir, home):
        raise InvalidInput(
            f"working directory {workdir} is inside pisub's home {home.root}; "
            "give a directory of your own (--cwd)"
        )
    return workdir


def in_pisub_files(path: Path, home: Home) -> bool:
    """Whether ``path`` is pisub's own: inside its home, not in the worktrees it made there."""
    from pisub.runs.run_options import inside

    return inside(path, home.root) and not inside(path, home.worktrees)


def plan_run(
    home: Home,
    agent: str,
    task: str,
    *,
    cwd: Path,
    caller: LimitValues,
    lineage: Lineage,
    key: str | None = None,
    model: str | None = None,
    catalog: Catalog | None = None,
    run_id: str | None = None,
    acceptance: Acceptance | None = None,
    setting: Setting | None = None,
    backend: str | None = None,
    review: bool | None = None,
) -> Manifest:
    """The manifest of a new run of ``agent`` on ``task`` in ``cwd`` (already checked by
    :func:`working_dir`), after every check; nothing is created. ``acceptance``: the call's
    (else the agent file's ``acceptance`` / ``gate``, else inferred for ``setting``, a run of
    its own by default: :mod:`pisub.acceptance.infer`). ``review``: the person opted in to
    review runs for inferred reviews (None: config ``[acceptance] review``, else off).

    Raises:
        InvalidInput: empty task, bad limits, a model for a non-pi agent.
        UnknownAgent: no such agent.
        LaunchFailed: the command is missing.
        UnsupportedPi: the pi found is not supported.
    """
    check_task(task)
    caller.check("the call")
    if catalog is None:
        from pisub.agents.catalog import discover

        catalog = discover(home.agents, cwd)
    found = catalog.get(agent)
    if found.frontmatter.disabled:
        from pisub.errors import AgentDisabled

        raise AgentDisabled(
            f"agent {found.name!r} is disabled; enable it with: pisub agents enable {found.name}"
        )
    spec = found.spec()
    if model is not None and spec.runner != "pi":
        raise InvalidInput(f"agent {agent!r} is an {spec.runner} agent: a model applies to pi agents")
    if spec.runner == "pi":
        resolve_pi(spec, home)
    if model is not None:
        _choose_model(spec, check_text(model, "model"))
    else:
        check_command(spec.command, cwd)
    from pisub.store.config import ENV_TOOL_TIMEOUT_MS, config_limits, config_path, env_limits, load_config

    config = load_config(home.root)
    limits = Limits.resolve(
        (caller, "the call"),
        (found.limits(), str(found.path)),
        (config_limits(config), str(config_path(home.root))),
        (env_limits(), ENV_TOOL_TIMEOUT_MS),
    )
    lineage = lineage.lowered(spec.max_depth)
    manifest = new_manifest(spec, task, str(cwd), limits, lineage=lineage, key=key, run_id=run_id)
    runs = review_runs_of(review, config)
    manifest.acceptance = _acceptance(acceptance, found, catalog, config, setting, lineage, runs)
    manifest.placement = placement_request(backend, found.frontmatter, config)
    with_report_section(manifest)
    return manifest


def _acceptance(
    given: Acceptance | None,
    found: Agent,
    catalog: Catalog,
    config: Config,
    setting: Setting | None,
    lineage: Lineage,
    review_runs: bool,
) -> Acceptance | None:
    """The call's acceptance, else the agent file's, else the inferred one (None when the
    config turns inference off); a level left to ``auto`` takes the inferred one. A required
    review takes its reviewer only when the launch opted in to review runs (``review_runs``):
    else it is recorded, not run (:func:`take_reviewer`).

    Raises:
        InvalidInput: a bad ``acceptance`` / ``gate`` in the agent file, or no reviewer agent.
    """
    from pisub.acceptance.infer import TABLE, Setting, infer, role_of
    from pisub.acceptance.spec import parse, resolve_level

    fm = found.frontmatter
    chosen = given if given is not None else parse(fm.acceptance, fm.gate, str(found.path))
    role = role_of(fm.acceptance_role, found.effective.runner, found.effective.tools)
    setting = setting or Setting.DIRECT
    if chosen is None:
        if config.acceptance.infer is False:
            return None
        why = _no_reviewer(found.name, catalog, config, lineage)
        known = None if why else (config.acceptance.reviewer or "reviewer")
        chosen = infer(role, setting, known, review_runs=review_runs, no_reviewer=why or "")
    resolve_level(chosen, TABLE[(role, setting)].level, "the call" if given is not None else str(found.path))
    return take_reviewer(chosen, catalog, config, lineage, review_runs)


def resumed_acceptance(
    given: Acceptance | None,
    agent: str,
    catalog: Catalog,
    config: Config,
    lineage: Lineage,
    review_runs: bool,
) -> Acceptance | None:
    """A resume's acceptance: the call's only (a resume infers nothing; a level left to
    ``auto`` is the one of a run of its own), its reviewer taken as for a new run.

    Raises:
        InvalidInput: as :func:`take_reviewer`, or a level that contradicts the rest.
    """
    from pisub.acceptance.infer import TABLE, Role, Setting, role_of
    from pisub.acceptance.spec import resolve_level

    if given is None:
        return None
    found = catalog.agents.get(agent)
    role = Role.UNKNOWN
    if found is not None:
        role = role_of(found.frontmatter.acceptance_role, found.effective.runner, found.effective.tools)
    resolve_level(given, TABLE[(role, Setting.DIRECT)].level, "the call")
    return take_reviewer(given, catalog, config, lineage, review_runs)


def _no_reviewer(agent: str, catalog: Catalog, config: Config, lineage: Lineage) -> str | None:
    """Why an inferred review of ``agent`` can have no reviewer (None: it can)."""
    reviewer = config.acceptance.reviewer or "reviewer"
    if reviewer not in catalog.agents:
        return f"no reviewer agent {reviewer!r}"
    if reviewer == agent:
        return f"the reviewer {reviewer!r} is this agent: it does not review its own work"
    if lineage.depth >= lineage.max_depth:
        return "at the depth limit, a reviewer could not start"
    return None


def take_reviewer(
    chosen: Acceptance, catalog: Catalog, config: Config, lineage: Lineage, review_runs: bool
) -> Acceptance:
    """``chosen`` with its reviewer agent taken now, when it requires a review and the launch
    opted in to review runs; without the opt-in (``--no-review`` included, whoever asked: the
    call, an agent file, a script's child) the review is recorded, not run.

    Raises:
        InvalidInput: the review could never start (the depth limit), or no such reviewer.
    """
    review = chosen.spec.review
    if review is None or not review.required or not review_runs:
        return chosen
    if lineage.depth >= lineage.max_depth:
        raise InvalidInput(
            f"acceptance.review: this run sits at the depth limit (depth {lineage.depth}, max "
            f"{lineage.max_depth}), so its reviewer could not start; raise the limit or drop the review"
        )
    name = review.agent or config.acceptance.reviewer or "reviewer"
    try:
        agent = catalog.get(name)
    except UnknownAgent:
        available = ", ".join(sorted(catalog.agents)) or "(none)"
        raise InvalidInput(
            f"acceptance.review.agent: no agent {name!r} to review with (available: {available}); "
            "write one (a read-only pi agent) or name another"
        ) from None
    review.agent = agent.name
    chosen.reviewer = _snapshot(agent)  # the runner reviews with the agent as it is now
    return chosen


def review_runs_of(given: bool | None, config: Config) -> bool:
    """Whether review runs are on: the call's ``review``, else config ``[acceptance] review``
    (default off: an inferred review is recorded, not run).

    Raises:
        InvalidInput: ``given`` is not a boolean.
    """
    if given is not None and not isinstance(given, bool):
        raise InvalidInput(f"review: give true or false, not {type(given).__name__}")
    return given if given is not None else bool(config.acceptance.review)


def reviewer_of(catalog: Catalog, config: Config) -> Agent:
    """The agent an inferred review runs (config ``[acceptance] reviewer``, else ``reviewer``).

    Raises:
        InvalidInput: there is no such agent (review runs were asked for).
    """
    name = config.acceptance.reviewer or "reviewer"
    try:
        return catalog.get(name)
    except UnknownAgent as exc:
        raise InvalidInput(f"review runs: no reviewer agent {name!r} ({exc.message})") from None


def single_plan(manifest: Manifest, catalog: Catalog, review: bool, config: Config) -> AcceptancePlan:
    """What acceptance adds to one run (its manifest planned with review runs ``review``): the
    report block, a reviewer run or a review recorded and not run.

    Raises:
        InvalidInput: review runs are on and there is no reviewer agent.
    """
    from pisub.acceptance.infer import asks_review, runs_review
    from pisub.acceptance.report import wants_report
    from pisub.protocol.acceptance import AcceptancePlan

    if review:
        reviewer_of(catalog, config)
    accepted = manifest.acceptance
    report = accepted is not None and wants_report(accepted.spec)
    reviews = int(runs_review(accepted))
    plan = AcceptancePlan(
        tasks=1,
        report_blocks=int(report),
        review_runs=review,
        reviews=reviews,
        recorded_reviews=int(asks_review(accepted) and not reviews),
    )
    if accepted is not None and accepted.reviewer is not None and accepted.spec.review is not None:
        _name_reviewer(plan, accepted.spec.review.agent or "", accepted.reviewer)
    elif review:
        lineage = Lineage(manifest.parent_run_id, manifest.root_run_id, manifest.depth, manifest.max_depth)
        plan.no_review = _unreviewed(accepted, manifest.agent.name, catalog, config, lineage)
    return plan


def _unreviewed(
    accepted: Acceptance | None, agent: str, catalog: Catalog, config: Config, lineage: Lineage
) -> str:
    """Why a run launched with review runs on gets none."""
    from pisub.protocol.acceptance import Level

    if accepted is None:
        return "acceptance is off ([acceptance] infer = false)"
    if accepted.explicit:
        return "its acceptance asks for no review"
    if accepted.spec.level is Level.NONE:
        return "not a writer"
    return _no_reviewer(agent, catalog, config, lineage) or "not a writer"


def workflow_plan(
    home: Home,
    catalog: Catalog,
    calls: list[ChildCall] | None,
    lineage: Lineage,
    review: bool,
) -> AcceptancePlan:
    """What acceptance adds to a workflow: for declared tasks (``calls``), the report blocks,
    the reviewer runs and the reviews recorded, not run, each child will get; for a script
    (None), what each child it starts gets (not known ahead: ``None`` counts). A script's
    review runs need their reviewer now.

    Raises:
        InvalidInput: review runs are on and there is no reviewer agent; a bad task (as the
            launch's own checks say).
    """
    from pisub.acceptance.infer import Setting, asks_review, runs_review
    from pisub.acceptance.report import wants_report
    from pisub.acceptance.spec import parse
    from pisub.protocol.acceptance import AcceptancePlan
    from pisub.store.config import load_config

    config = load_config(home.root)
    reviewer = reviewer_of(catalog, config) if review else None
    if calls is None:
        inferring = config.acceptance.infer is not False
        plan = AcceptancePlan(review_runs=review, report_blocks=None if inferring else 0)
        if reviewer is not None:
            _name_reviewer(plan, reviewer.name, _snapshot(reviewer))
        return plan
    plan = AcceptancePlan(
        tasks=len(calls), report_blocks=0, review_runs=review, reviews=0, recorded_reviews=0
    )
    for call in calls:
        given = parse(call.acceptance, call.gate, "acceptance", resume=call.resume is not None)
        found = catalog.get(call.agent)
        if call.resume is None:
            chosen = _acceptance(given, found, catalog, config, Setting.DECLARED, lineage, review)
        else:
            chosen = resumed_acceptance(given, found.name, catalog, config, lineage, review)
        plan.report_blocks = (plan.report_blocks or 0) + bool(chosen and wants_report(chosen.spec))
        if runs_review(chosen):
            assert chosen is not None and chosen.reviewer is not None and chosen.spec.review is not None
            plan.reviews = (plan.reviews or 0) + 1
            if plan.reviewer is None:
                _name_reviewer(plan, chosen.spec.review.agent or "", chosen.reviewer)
        elif asks_review(chosen):
            plan.recorded_reviews = (plan.recorded_reviews or 0) + 1
        elif review and plan.no_review is None:
            why = _unreviewed(chosen, found.name, catalog, config, lineage)
            plan.no_review = None if why == "not a writer" else why
    if review and not plan.reviews:
        plan.no_review = plan.no_review or "no writer"
    return plan


def _name_reviewer(plan: AcceptancePlan, name: str, taken: ReviewerAgent) -> None:
    """The plan's reviewer: the agent a review run starts, as it was taken at launch."""
    from pisub.agents.catalog import parse_agent
    from pisub.agents.files import shipped_names

    plan.reviewer, plan.reviewer_path, plan.reviewer_scope = name, taken.path, taken.scope
    if taken.scope == "builtin":
        return
    plan.reviewer_overrides_builtin = name in shipped_names()
    try:
        plan.reviewer_access = parse_agent(taken.text, Path(taken.path), "project").access()
    except (PisubError, RecursionError):
        plan.reviewer_access = "its file no longer parses"


def placement_request(call: str | None, fm: AgentFrontmatter, config: Config) -> PlacementRequest | None:
    """Where the run's runner is to live: the call's backend, else the agent file's, else
    ``config.toml``'s (None: ``local``); Slurm options key by key, the agent file's over the
    config's.

    Raises:
        InvalidInput: an unknown backend. LaunchFailed: Slurm's ``sbatch`` is not installed.
    """
    from pisub.protocol.placement import (
        RESERVED_SBATCH,
        BackendName,
        PlacementRequest,
        SlurmOptions,
        reserved_sbatch,
    )

    name = call or fm.backend or config.placement.backend or BackendName.LOCAL
    try:
        backend = BackendName(name)
    except ValueError:
        known = ", ".join(b.value for b in BackendName)
        raise InvalidInput(f"backend: {name!r} is not one of {known}") from None
    if backend == BackendName.LOCAL:
        return None
    if shutil.which("sbatch") is None:
        raise LaunchFailed("backend slurm: sbatch is not on PATH (run pisub on a Slurm submit host)")
    options = (fm.slurm or SlurmOptions()).over(config.slurm)
    bad = reserved_sbatch(options.sbatch or [])
    if bad is not None:
        raise InvalidInput(
            f"slurm.sbatch: {bad!r} is an option pisub sets itself or one that breaks a run "
            f"(reserved: {', '.join(RESERVED_SBATCH)}); leave it out"
        )
    ttl = config.placement.heartbeat_ttl or defaults.HEARTBEAT_TTL_S
    return PlacementRequest(backend=backend, slurm=options, heartbeat_ttl=ttl)


def _snapshot(agent: Agent) -> ReviewerAgent:
    """Raises: InvalidInput: the agent file cannot be read again."""
    from pisub.core.fsio import read_bytes
    from pisub.protocol.acceptance import ReviewerAgent

    try:
        text = read_bytes(agent.path, limit=256 * 1024).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the reviewer {agent.name!r} cannot be read ({agent.path}): {exc}") from None
    return ReviewerAgent(path=str(agent.path), scope=agent.scope, text=text)


def _refuse_disabled(home: Home, name: str, cwd: Path) -> None:
    """A resume of an agent disabled since is refused, like a new run of it.

    Raises:
        AgentDisabled.
    """
    from pisub.agents.catalog import discover
    from pisub.errors import AgentDisabled

    agent = discover(home.agents, cwd).agents.get(name)
    if agent is not None and agent.frontmatter.disabled:
        raise AgentDisabled(f"agent {name!r} is disabled; enable it with: pisub agents enable {name}")


def _choose_model(spec: AgentSpec, model: str) -> None:
    """``provider/id[:thinking]`` (the suffix replaces the agent's thinking level), or a bare id
    that exactly one model pi knows has.

    Raises:
        InvalidInput: an unknown or ambiguous bare id. LaunchFailed: pi cannot list its models.
    """
    from typing import cast

    from pisub.children.pi.models import list_models, resolve, split_thinking
    from pisub.protocol.manifest import ThinkingLevel

    name, thinking = split_thinking(model)
    if "/" in name:
        name = resolve(name, [])  # checked: provider and id both given
    else:
        assert spec.command is not None
        name = resolve(name, list_models(spec.command))
    spec.model = name
    if thinking is not None:
        spec.thinking = cast(ThinkingLevel, thinking)


def with_report_section(manifest: Manifest) -> None:
    """A child asked for an acceptance report is told so at the end of its task."""
    from pisub.acceptance.report import prompt_section, wants_report

    if manifest.acceptance is not None and wants_report(manifest.acceptance.spec):
        manifest.task = manifest.task + "\n" + prompt_section(manifest.acceptance.spec)


def new_manifest(
    spec: AgentSpec,
    task: str,
    cwd: str,
    limits: Limits,
    *,
    lineage: Lineage,
    key: str | None = None,
    resumed_from: str | None = None,
    session_file: str | None = None,
    run_id: str | None = None,
) -> Manifest:
    """A new run's launch request: a fresh id (unless given), now, the caller's umask."""
    return Manifest(
        v=1,
        run_id=run_id or str(uuid.uuid4()),
        created_at=now_iso(),
        agent=spec,
        task=task,
        cwd=cwd,
        umask=current_umask(),
        limits=limits,
        resumed_from=resumed_from,
        session_file=session_file,
        parent_run_id=lineage.parent_run_id,
        root_run_id=lineage.root_run_id,
        key=key,
        depth=lineage.depth,
        max_depth=lineage.max_depth,
    )


def current_umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def check_command(command: str | None, cwd: Path) -> None:
    """Raises LaunchFailed when ``command`` cannot be found (relative to ``cwd`` or on PATH)."""
    if not command:
        raise InvalidInput("the agent has no command")
    if "/" in command:
        path = (cwd / command) if not os.path.isabs(command) else Path(command)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LaunchFailed(f"command not found or not executable: {command}")
    elif shutil.which(command) is None:
        raise LaunchFailed(f"command not found on PATH: {command}")


def resolve_pi(spec: AgentSpec, home: Home) -> None:
    """Fill in the pi binary and its version (refused in one line when unsupported)."""
    from pisub.children.pi.rpc import find_pi
    from pisub.children.pi.versions import supported_version

    spec.command = find_pi()
    spec.pi_version = supported_version(spec.command, home.cache)


def start_run(
    home: Home, manifest: Manifest, *, seeds: Mapping[str, Path | bytes] | None = None, claimed: bool = False
) -> RunPaths:
    """Create the run of ``manifest`` and start its runner; returns once the runner committed
    its startup. ``seeds``: files copied in (by name: ``session.jsonl`` to start from a copy of
    a pi session, ``workflow.py``). A run inside a tree of runs is first charged to the tree's
    spawn budget (:func:`pisub.store.spawn_budget.charge_run`), unless ``claimed``: a workflow's child,
    claimed by its workflow when its batch was admitted.

    Raises:
        FanoutLimit: the tree's spawn budget is used up (nothing was created).
        LaunchFailed: the runner could not start (the run is then marked failed).
        HomeUnusable, StorageError: the run directory cannot be created.
    """
    from pisub.backends import backend_for, warm
    from pisub.protocol.placement import BackendName, PlacementRequest

    if manifest.root_run_id is not None and not claimed:
        from pisub.store.spawn_budget import charge_run

        charge_run(home.budgets, _budget_id(home, manifest.root_run_id), manifest.run_id)
    request = manifest.placement or PlacementRequest()
    if request.backend == BackendName.LOCAL:
        warm.prestart()  # no-op when one is waiting (started early by the caller, or a spare)
    paths, lock_fd = RunStore(home).create(manifest, seeds=seeds)
    try:
        backend_for(request.backend).start(paths, lock_fd, request)
    except LaunchFailed:
        from pisub.runs.reconcile import observe

        os.close(lock_fd)
        lock_fd = -1
        # The failing runner may hold runner.lock for a moment more; once it is free, the
        # repair marks the run failed, so a failed launch never leaves a "starting" run.
        _wait_unlocked(paths.runner_lock, defaults.STARTUP_TIMEOUT_S)
        observe(paths)
        raise
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
    if request.backend == BackendName.LOCAL:
        warm.launched()  # a spare for this process's next launch (when it has none yet)
    return paths


def _budget_id(home: Home, root_run_id: str) -> str:
    """The spawn budget of the tree of ``root_run_id``: a resumed top-level workflow is the root
    of its children's tree but keeps the budget of the workflow it continues."""
    from pisub.store.runs import load_manifest

    try:
        root = load_manifest(home.run(root_run_id))
    except (PisubError, OSError):
        return root_run_id  # no such root here (a marker from elsewhere): its own id
    from pisub.store.paths import is_run_id

    budget = root.workflow.budget if root.workflow is not None else None
    return budget if budget is not None and is_run_id(budget) else root_run_id


def _wait_unlocked(lock: Path, timeout: float) -> None:
    from pisub.core.locks import is_held

    poll(lambda: None if is_held(lock) else True, timeout, interval=0.01)


def check_session(path: str | Path, what: str) -> Path:
    """The absolute path of an existing pi session file to fork from, checked like the copy
    will check it (:func:`pisub.store.session_fork.open_session`).

    Raises:
        InvalidInput: it is missing, not a regular file, too large, unreadable or not a pi
            session (naming ``what``).
    """
    from pisub.store.session_fork import open_session

    session = Path(path).absolute()
    os.close(open_session(session, what))
    return session


def resumable_session(run_id: str, status: Status, runner: str) -> str:
    """The session a finished pi run left, for a run that continues it.

    Raises:
        NotResumable: the run is stopped, still going, not a pi run, or has no session file.
    """
    if runner != "pi":
        article = "an" if runner[:1] in "aeiou" else "a"
        raise NotResumable(f"run {run_id} is {article} {runner} run; only pi runs can be resumed")
    if status.state == RunState.STOPPED:
        raise NotResumable(f"run {run_id} is stopped; start a new run")
    if not status.state.is_terminal:
        raise NotResumable(f"run {run_id} is {status.state}; use steer")
    if not status.session_file or not Path(status.session_file).exists():
        raise NotResumable(
            f"run {run_id} ({status.state}) has no session file: pi writes it only after its first reply"
        )
    return status.session_file


def plan_resume(
    home: Home,
    source_ref: str,
    message: str,
    *,
    lineage: Lineage,
    key: str | None = None,
    timeout: float | None = None,
) -> Manifest:
    """The manifest of a run that continues finished pi run ``source_ref``'s session with
    ``message``; nothing is created.

    Raises:
        RunNotFound, NotResumable, InvalidInput, LeaseHeld (a live run drives the session).
    """
    from pisub.runs.reconcile import observe
    from pisub.store.leases import unleased
    from pisub.store.runs import load_manifest

    check_task(message, "message")
    LimitValues(timeout=timeout).check("the call")
    paths = RunStore(home).resolve(source_ref)
    status, source = observe(paths), load_manifest(paths)
    session = resumable_session(paths.run_id, status, source.agent.runner)
    with unleased(home.leases, session):
        pass  # refused at once (LEASE_HELD, naming the owner); the new runner takes it itself
    spec = source.agent
    _refuse_disabled(home, spec.name, Path(source.cwd))
    resolve_pi(spec, home)
    limits = source.limits  # the source's, resolved at its launch; a new timeout may replace its own
    if timeout is not None:
        limits.timeout = timeout
    resumed = new_manifest(
        spec,
        message,
        source.cwd,
        limits,
        lineage=lineage.lowered(spec.max_depth),
        key=key,
        resumed_from=paths.run_id,
        session_file=session,
    )
    resumed.placement = source.placement  # placed as the run it continues
    return resumed
