"""A workflow's children: admitting the script's calls, starting, watching and settling child
runs, and passing control requests and receipts between the workflow and them.

Calls are admitted from the script's thread (:meth:`ChildRuns.admit`) and run on the
coordinator's control loop; :attr:`ChildRuns.lock` guards the entries between the two. Every
start is journaled (durably) before the child's run is created, every end once its result is
in (:mod:`pisub.store.journal`).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from pisub.errors import InvalidInput, PisubError, RunNotFound
from pisub.protocol.budget import UsageTotals
from pisub.protocol.codec import now_iso
from pisub.protocol.control import Interrupt, Receipt, ReceiptState, Request, Steer, Stop
from pisub.protocol.manifest import LimitValues, Manifest, seconds_of_ms
from pisub.protocol.result import SingleResult
from pisub.protocol.status import RepairCause, RunState, Status, StepState, StepStatus
from pisub.protocol.workflow import (
    ChildCall,
    ChildResult,
    Context,
    Isolation,
    Shape,
    SteerResult,
    WorkflowSpec,
)
from pisub.store.journal import Journal, Replay
from pisub.store.lineage import Lineage
from pisub.store.paths import Home, RunPaths
from pisub.store.runs import load_result
from pisub.store.spawn_budget import SpawnBudget, claim_name
from pisub.store.usage_budget import UsageBudget
from pisub.workflow import outcomes
from pisub.workflow.calls import fingerprint
from pisub.workflow.watch import ChildWatch

if TYPE_CHECKING:
    from pisub.agents.catalog import Catalog
    from pisub.workflow.futures import ChildFuture

LAUNCH_THREADS = 4
"""Child runners started at once (each start waits for the runner's commit)."""

MAX_RELAUNCHES = 3
"""How many times one coordinator starts a key again whose run never started its child."""


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
    phase: Phase
    step: StepStatus
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
    relaunches: int = 0
    """Times this coordinator started the key again because its run never started its child."""
    never_ran: bool = False
    """It ended without its child ever starting (not the key's result: a resume starts it)."""


class ChildRuns:
    """The children of one workflow run."""

    def __init__(
        self,
        host: Host,
        home: Home,
        manifest: Manifest,
        steps: list[StepStatus],
        journal: Journal,
        replayed: Replay,
    ) -> None:
        assert manifest.workflow is not None
        self.host = host
        self.home = home
        self.manifest = manifest
        self.spec: WorkflowSpec = manifest.workflow
        self.steps = steps
        self.journal = journal
        self.replayed = replayed
        self.lineage = Lineage(
            parent_run_id=manifest.parent_run_id,
            root_run_id=manifest.root_run_id,
            depth=manifest.depth,
            max_depth=manifest.max_depth,
        )
        self.budget = SpawnBudget(home.budgets, self.spec.budget, self.spec.max_spawns)
        self.usage = UsageBudget(home.budgets, self.spec.budget)
        self.watch = ChildWatch()
        self.lock = threading.RLock()
        """Guards the entries: the script thread admits calls while the loop runs them."""
        self.entries: list[ChildEntry] = []
        self.by_key: dict[str, ChildEntry] = {}
        self.by_run: dict[str, ChildEntry] = {}
        self.waiting: deque[ChildEntry] = deque()
        self.tracked: list[ChildFuture] = []
        self.launcher = ThreadPoolExecutor(max_workers=LAUNCH_THREADS, thread_name_prefix="launch")
        self.ending: type[Stop] | type[Interrupt] | None = None
        """Set when the workflow ends: what every child still running is sent."""
        self.next_poll = 0.0
        self._catalogs: dict[Path, Catalog] = {}

    def active(self) -> list[ChildEntry]:
        """The children starting or running."""
        with self.lock:
            return [e for e in self.entries if e.phase in (Phase.STARTING, Phase.RUNNING)]

    def results(self) -> list[SingleResult]:
        """One entry of the workflow's ``details.results`` per child that has an outcome."""
        with self.lock:
            return outcomes.results_of([e.result for e in self.entries if e.result is not None])

    def end_all(self, request: type[Stop] | type[Interrupt]) -> None:
        """The workflow ends: queued children never start, running ones are sent ``request``."""
        self.ending = request
        with self.lock:
            entries = list(self.entries)
            self.waiting.clear()
        for entry in entries:
            if entry.phase is Phase.QUEUED:
                self._never_started(entry, "the workflow ended before this child started")
            elif entry.phase is Phase.RUNNING:
                self._stop_child(entry)

    def give_up(self, why: str) -> None:
        """Stop waiting for the children still going (they are recorded as failed)."""
        for entry in self.active():
            self._settle(
                entry, outcomes.failure(entry.key, entry.call, why, run_id=entry.run_id), settled=False
            )

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
                id(future) in open_ids or future.label.startswith(("runs.all", "runs.steer"))
            ):
                found.append(f"{future.label} (still running)")
        return sorted(set(found))

    def close(self) -> None:
        self.launcher.shutdown(wait=False, cancel_futures=True)
        self.watch.close()
        self.journal.close()

    # == admitting calls (from the script's thread) ========================================
    def track(self, future: ChildFuture) -> None:
        with self.lock:
            self.tracked.append(future)

    def admit(
        self, calls: list[ChildCall], futures: list[ChildFuture], loop: asyncio.AbstractEventLoop, where: str
    ) -> None:
        """Admit a batch of calls (all or none): reused keys and journaled results are answered,
        new children are queued. Called from the script's thread.

        Raises:
            InvalidInput, UnknownAgent, LaunchFailed, UnsupportedPi, DepthExceeded, FanoutLimit:
                nothing of the batch was started.
        """
        self._catalogs.clear()  # agent files are read again for each batch
        with self.lock:
            known = {c.key: self.by_key.get(c.key or "") for c in calls}
        prepared: list[tuple[ChildCall, str, ChildEntry | None, Any]] = []
        for call in calls:
            assert call.key is not None
            fp = fingerprint(call)
            existing = known[call.key]
            if existing is not None:
                if existing.fingerprint != fp:
                    raise InvalidInput(
                        f"{where}: key {call.key!r} was already used with other parameters "
                        "(a key names one child)"
                    )
                prepared.append((call, fp, existing, None))
                continue
            prepared.append((call, fp, None, self._prepare(call, fp, where)))
        fresh = [call.key for call, _fp, existing, plan in prepared if existing is None and plan.needs_claim]
        if fresh:
            keys = [k for k in fresh if k is not None]
            names = [claim_name(self.spec.journal, k) for k in keys]
            self.usage.reserve(names)  # the usage budget first: all or none, like the spawns
            try:
                self.budget.claim(self.spec.journal, keys)
            except BaseException:
                self.usage.release(names)
                raise
        with self.lock:
            for (call, fp, existing, plan), future in zip(prepared, futures, strict=True):
                entry = existing if existing is not None else self._register(call, fp, plan)
                self.tracked.append(future)
                entry.futures.append((future, loop))
                if entry.result is not None:
                    future.set_result(entry.result)
        self.host.post(lambda: None)

    def _prepare(self, call: ChildCall, fp: str, where: str) -> _Plan:
        """How a new key is to be answered: from the journal, by re-attaching, or by a start."""
        assert call.key is not None
        record = self.replayed.keys.get(call.key)
        if record is not None and record.fingerprint != fp:
            raise InvalidInput(
                f"{where}: key {call.key!r} was started by this workflow's earlier run with other "
                "parameters; a resumed workflow must call each key the same way"
            )
        cwd = self._child_cwd(call, where)
        if record is not None and record.settled is not None:
            return _Plan(cwd=cwd, settled=record.settled)
        if record is not None and record.run_id is not None and record.ended is None:
            if self.home.run(record.run_id).root.is_dir():
                return _Plan(cwd=cwd, attach=record.run_id)
            if record.created:  # it ran, and its run is gone (pisub gc): never started twice
                why = "the child's run was removed before its end was journaled"
                return _Plan(cwd=cwd, settled=outcomes.failure(call.key, call, why, run_id=record.run_id))
            manifest, seeds = self._plan_start(call, cwd, where, run_id=record.run_id)
            return _Plan(cwd=cwd, manifest=manifest, seeds=seeds, journaled=True)
        manifest, seeds = self._plan_start(call, cwd, where)
        if self._isolation(call) is Isolation.WORKTREE:
            self._preflight(call, cwd, where)
        return _Plan(cwd=cwd, manifest=manifest, seeds=seeds, needs_claim=True)

    def _isolation(self, call: ChildCall) -> Isolation:
        return call.isolation if call.isolation is not None else self.spec.isolation

    def _preflight(self, call: ChildCall, cwd: Path, where: str) -> None:
        """A worktree child's source: a clean git repository, its base ref, its cwd in that
        commit, a branch name for its key (checked per batch; again when its worktree is made).
        Isolation is never dropped silently.

        Raises:
            InvalidInput: naming what is wrong (the uncommitted paths, the ref, the key).
        """
        from pisub.worktrees import check_source

        base = call.base_ref if call.base_ref is not None else self.spec.base_ref
        try:
            check_source(cwd, base, call.key)
        except PisubError as exc:
            raise type(exc)(f"{where}: isolation='worktree': {exc.message}") from None

    def _child_cwd(self, call: ChildCall, where: str) -> Path:
        from pisub.runs.launch import working_dir

        try:
            return working_dir(call.cwd, Path(self.manifest.cwd))
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: cwd: {exc.message}") from None

    def _plan_start(
        self, call: ChildCall, cwd: Path, where: str, run_id: str | None = None
    ) -> tuple[Manifest, dict[str, Path]]:
        from pisub.acceptance.infer import Setting
        from pisub.runs.launch import plan_resume, plan_run, with_report_section

        assert call.key is not None
        lineage = self.lineage.child(self.manifest.run_id)
        caller = LimitValues(
            timeout=call.timeout,
            idle_timeout=call.idle_timeout,
            tool_timeout=seconds_of_ms(call.tool_timeout_ms),
            checkpoint_before_deadline=seconds_of_ms(call.checkpoint_before_deadline_ms),
            tool_budget=call.tool_budget.budget() if call.tool_budget is not None else None,
        )
        seeds: dict[str, Path] = {}
        try:
            from pisub.acceptance.spec import parse

            accept = parse(call.acceptance, call.gate, "the call", resume=call.resume is not None)
            if call.resume is not None:
                if call.context == Context.FORK:
                    raise InvalidInput("resume and context='fork' exclude each other")
                manifest = plan_resume(
                    self.home, call.resume, call.task, lineage=lineage, key=call.key, timeout=call.timeout
                )
                manifest.acceptance = accept
                with_report_section(manifest)
                if manifest.agent.name != call.agent:
                    raise InvalidInput(
                        f"run {call.resume} is a run of agent {manifest.agent.name!r}, not {call.agent!r}"
                    )
            else:
                manifest = plan_run(
                    catalog=self._catalog(cwd),
                    home=self.home,
                    agent=call.agent,
                    task=call.task,
                    cwd=cwd,
                    caller=caller,
                    lineage=lineage,
                    key=call.key,
                    model=call.model,
                    run_id=run_id,
                    acceptance=accept,
                    setting=Setting.DYNAMIC if self.spec.shape is Shape.WORKFLOW else Setting.DECLARED,
                    backend=call.backend,
                )
                if call.context == Context.FORK:
                    seeds["session.jsonl"] = self._fork_source(manifest)
        except PisubError as exc:
            raise type(exc)(f"{where}: {exc.message}") from None
        if run_id is not None:
            manifest.run_id = run_id
        return manifest, seeds

    def check_same_calls(self, calls: list[ChildCall], where: str, resumed: set[str]) -> None:
        """Each call whose key this workflow already knows (now or from its journal) is the
        same call; for a key in ``resumed`` (its ``resume`` is only known once its predecessor
        ran) every parameter but ``resume`` is compared. Nothing is started.

        Raises:
            InvalidInput: naming the first key called with other parameters.
        """
        for call in calls:
            assert call.key is not None
            with self.lock:
                entry = self.by_key.get(call.key)
            record = self.replayed.keys.get(call.key)
            if entry is not None:
                known_fp, known_resume = entry.fingerprint, entry.call.resume
            elif record is not None and call.key not in resumed:
                known_fp, known_resume = record.fingerprint, None
            else:
                continue
            same = call if call.key not in resumed else msgspec.structs.replace(call, resume=known_resume)
            if fingerprint(same) != known_fp:
                raise InvalidInput(
                    f"{where}: key {call.key!r} was already used with other parameters "
                    "(a key names one child)"
                )

    def reserve(self, keys: list[str]) -> None:
        """Claim a start from the spawn budget for each of ``keys`` now, all or none (a key
        claimed before costs nothing).

        Raises:
            FanoutLimit: they do not fit; nothing was claimed.
        """
        self.budget.claim(self.spec.journal, keys)

    def check_agents(self, calls: list[ChildCall], where: str) -> None:
        """Every call's agent exists where its child would run (nothing is started).

        Raises:
            UnknownAgent, InvalidInput: naming ``where`` and the call's key.
        """
        self._catalogs.clear()
        for call in calls:
            try:
                self._catalog(self._child_cwd(call, where)).get(call.agent)
            except PisubError as exc:
                raise type(exc)(f"{where}: {call.key}: {exc.message}") from None

    def _catalog(self, cwd: Path) -> Catalog:
        """The agents visible from ``cwd``, read once per batch of calls."""
        from pisub.agents.catalog import discover

        if cwd not in self._catalogs:
            self._catalogs[cwd] = discover(self.home.agents, cwd)
        return self._catalogs[cwd]

    def _fork_source(self, manifest: Manifest) -> Path:
        if manifest.agent.runner != "pi":
            raise InvalidInput("context='fork' needs a pi agent")
        if self.spec.fork_from is None:
            raise InvalidInput(
                "context='fork' needs a session to fork: start the workflow with --fork-from RUN"
            )
        from pisub.runs.launch import check_session

        return check_session(self.spec.fork_from, "--fork-from")

    def _register(self, call: ChildCall, fp: str, plan: _Plan) -> ChildEntry:
        assert call.key is not None
        index = len(self.entries)
        step = StepStatus(index=index, status=StepState.QUEUED, key=call.key, agent=call.agent)
        entry = ChildEntry(
            index=index,
            key=call.key,
            call=call,
            fingerprint=fp,
            cwd=plan.cwd,
            phase=Phase.QUEUED,
            step=step,
            manifest=plan.manifest,
            seeds=plan.seeds,
        )
        self.entries.append(entry)
        self.by_key[call.key] = entry
        self.steps.append(step)
        if plan.settled is not None:
            entry.phase = Phase.ENDED
            entry.result = plan.settled
            entry.run_id = plan.settled.run_id
            step.run_id = entry.run_id
            step.status = _step_state(plan.settled.state)
            self.host.post(
                lambda: self.host.event("workflow.replayed", entry.index, key=entry.key, runId=entry.run_id)
            )
        elif plan.attach is not None:
            entry.run_id = plan.attach
            entry.phase = Phase.RUNNING
            step.run_id = plan.attach
            step.status = StepState.RUNNING
            self.by_run[plan.attach] = entry
            self.host.post(lambda: self._attached(entry))
        elif plan.skipped:
            pass  # settled by the caller
        elif self.ending is not None:
            self._never_started(entry, "the workflow is ending")
        else:
            self.waiting.append(entry)
        return entry

    def skip(self, call: ChildCall, why: str) -> None:
        """Record a call that is never started (a chain's later steps): ``skipped``."""
        assert call.key is not None
        with self.lock:
            if call.key in self.by_key:
                return
            entry = self._register(call, fingerprint(call), _Plan(cwd=Path(self.manifest.cwd), skipped=True))
        self._settle(
            entry, outcomes.not_started(entry.key, call, "skipped", why), settled=True, journal=False
        )

    # == children ======================================================================
    def launch_waiting(self) -> None:
        with self.lock:
            active = sum(1 for e in self.entries if e.phase in (Phase.STARTING, Phase.RUNNING))
            while self.waiting and active < self.spec.concurrency and self.ending is None:
                entry = self.waiting.popleft()
                if entry.phase is Phase.QUEUED:
                    self._launch(entry)
                    active += 1

    def _launch(self, entry: ChildEntry) -> None:
        assert entry.manifest is not None
        run_id = entry.manifest.run_id
        try:
            self.journal.started(entry.key, entry.fingerprint, run_id)
        except OSError as exc:
            self.host.trouble("append to the journal", exc)
            self._settle(
                entry,
                outcomes.failure(entry.key, entry.call, f"cannot journal the start: {exc.strerror or exc}"),
                settled=True,
                journal=False,
            )
            return
        entry.phase = Phase.STARTING
        entry.run_id = run_id
        entry.step.run_id = run_id
        entry.step.status = StepState.PENDING
        entry.step.started_at = now_iso()
        self.by_run[run_id] = entry
        self.host.touch()
        self.launcher.submit(self._start_child, entry, entry.manifest, dict(entry.seeds))

    def _start_child(self, entry: ChildEntry, manifest: Manifest, seeds: dict[str, Path]) -> None:
        """In a launch thread: create the child's run and wait for its runner's commit."""
        from pisub.runs.launch import start_run

        error: str | None = None
        try:
            if self._isolation(entry.call) is Isolation.WORKTREE:
                manifest = self._in_worktree(entry, manifest)
            start_run(self.home, manifest, seeds=seeds, claimed=True)  # claimed at admission
        except PisubError as exc:
            error = exc.message
        except Exception as exc:  # reported as the child's failure, never lost in this thread
            error = f"{type(exc).__name__}: {exc}"
        self.host.post(lambda: self._launched(entry, error))

    def _in_worktree(self, entry: ChildEntry, manifest: Manifest) -> Manifest:
        """``manifest`` moved into a new git worktree of its cwd's repository (its ownership
        record written first; the repository checked clean again now). A worktree this run id
        already has (a resumed workflow re-creating a journaled child) is taken as it is.

        Raises:
            InvalidInput, WorktreeError, StorageError: no worktree, so no child.
        """
        from pisub.protocol.worktree import WorktreeLink
        from pisub.worktrees import allocate, load_record, record_path, repo_root
        from pisub.worktrees.records import check_root

        cwd = Path(manifest.cwd)
        repo = repo_root(cwd)
        root = check_root(self.home.worktrees, self.home.root, repo)
        existing = record_path(root, manifest.run_id)
        if existing.is_file():
            record = load_record(existing)
        else:
            base = entry.call.base_ref if entry.call.base_ref is not None else self.spec.base_ref
            record = allocate(repo, base_ref=base, run_id=manifest.run_id, key=entry.key, root=root)
            existing = record_path(Path(record.path).parent, manifest.run_id)
        inside = Path(os.path.realpath(cwd)).relative_to(os.path.realpath(repo))
        moved = msgspec.structs.replace(manifest, cwd=str(Path(record.path) / inside))
        moved.worktree = WorktreeLink(
            record=str(existing),
            path=record.path,
            repo=record.repo,
            base_commit=record.base_commit,
            branch=record.branch,
        )
        return moved

    def _launched(self, entry: ChildEntry, error: str | None) -> None:
        assert entry.run_id is not None
        exists = self.home.run(entry.run_id).root.is_dir()
        if exists:
            try:
                self.journal.created(entry.key, entry.run_id)
            except OSError as exc:  # a resume then re-attaches it while its run is there
                self.host.trouble("append to the journal", exc)
        if error is not None and not exists:
            self._settle(
                entry, outcomes.failure(entry.key, entry.call, error, run_id=entry.run_id), settled=True
            )
            return
        entry.phase = Phase.RUNNING
        entry.step.status = StepState.RUNNING
        self.host.event("child.started", entry.index, key=entry.key, runId=entry.run_id)
        self.watch.add(entry.run_id, self.home.run(entry.run_id).root)
        if self.ending is not None:
            self._stop_child(entry)
        self._check(entry)
        self.host.touch()

    def _attached(self, entry: ChildEntry) -> None:
        assert entry.run_id is not None
        self.host.event("workflow.reattached", entry.index, key=entry.key, runId=entry.run_id)
        self.watch.add(entry.run_id, self.home.run(entry.run_id).root)
        if self.ending is not None:
            self._stop_child(entry)
        self._check(entry)

    def check(self, now: float) -> None:
        changed, receipts = self.watch.changed()
        due = now >= self.next_poll
        if due:
            self.next_poll = now + self.watch.poll_interval
        with self.lock:
            running = [e for e in self.entries if e.phase is Phase.RUNNING]
        for entry in running:
            if due or entry.run_id in changed:
                self._check(entry)
            elif entry.run_id in receipts and entry.run_id is not None:
                self._pass_receipts(entry, self.home.run(entry.run_id))  # only new receipts

    def _check(self, entry: ChildEntry) -> None:
        """Look at a running child: mirror its progress, pass on its receipts, settle its end."""
        from pisub.runs.reconcile import observe

        assert entry.run_id is not None
        paths = self.home.run(entry.run_id)
        try:
            status = observe(paths)
        except RunNotFound:
            self._settle(
                entry,
                outcomes.failure(
                    entry.key, entry.call, "the child's run directory disappeared", run_id=entry.run_id
                ),
                settled=True,
            )
            return
        except PisubError as exc:
            self.host.trouble("read a child's status", OSError(0, exc.message))
            return
        self._mirror(entry, status)
        self._pass_receipts(entry, paths)
        if not status.state.is_terminal:
            return
        if status.repaired is RepairCause.NEVER_STARTED and status.state is RunState.FAILED:
            self._never_ran(entry, status)
            return
        try:
            result = load_result(paths)
        except PisubError as exc:
            result = None
            why = exc.message
        else:
            why = "the child ended without a result"
        if result is None:
            outcome = outcomes.failure(entry.key, entry.call, why, run_id=entry.run_id)
        else:
            outcome = outcomes.from_result(entry.key, entry.call, entry.run_id, result)
            outcome = outcomes.save_output(outcome, entry.call, entry.cwd, self.manifest.umask)
        self._settle(
            entry, outcome, settled=not (entry.ended_by_workflow and outcome.state in ("stopped", "paused"))
        )

    def _never_ran(self, entry: ChildEntry, status: Status) -> None:
        """``entry``'s run ended before its runner's startup commit (its launcher died while
        launching it, or the runner could not start): its child never started, so this is not
        the key's result. The key is started again as a new run — journaled before it is
        created, by the one coordinator holding the journal — up to :data:`MAX_RELAUNCHES`
        times; after that, or while the workflow ends, it ends unsettled (a resume starts it)
        and the workflow cannot end ``complete``."""
        old = entry.run_id
        why = status.error.message if status.error is not None else "its child never started"
        if self.ending is None and entry.relaunches < MAX_RELAUNCHES:
            try:
                manifest, seeds = self._plan_start(entry.call, entry.cwd, f"key {entry.key!r}")
            except PisubError as exc:
                why = exc.message
            else:
                self._relaunch(entry, manifest, seeds)
                self.host.event(
                    "child.relaunched", entry.index, key=entry.key, runId=old, newRunId=manifest.run_id
                )
                return
        entry.never_ran = True
        outcome = outcomes.failure(entry.key, entry.call, f"the child never started: {why}", run_id=old)
        self._settle(entry, outcome, settled=False)

    def _relaunch(self, entry: ChildEntry, manifest: Manifest, seeds: dict[str, Path]) -> None:
        """Queue ``entry`` again (first in line) to start as the new run of ``manifest``."""
        old = entry.run_id
        if old is not None:
            self.watch.remove(old)
        with self.lock:
            if old is not None:
                self.by_run.pop(old, None)
            entry.relaunches += 1
            entry.manifest, entry.seeds = manifest, seeds
            entry.phase = Phase.QUEUED
            entry.run_id = None
            step = entry.step
            step.status, step.run_id, step.pid, step.started_at = StepState.QUEUED, None, None, None
            self.waiting.appendleft(entry)
        self.host.touch()

    def never_ran(self) -> list[str]:
        """The keys whose child ended without ever starting (the workflow cannot be complete)."""
        with self.lock:
            return [e.key for e in self.entries if e.never_ran]

    def _mirror(self, entry: ChildEntry, status: Any) -> None:
        step = entry.step
        step.pid = status.pid
        step.pid_start_time = status.pid_start_time
        step.pid_start_ticks = status.pid_start_ticks
        step.started_at = step.started_at or status.started_at
        if status.steps:
            child = status.steps[0]
            step.turn_count, step.tool_count = child.turn_count, child.tool_count
            step.current_tool = child.current_tool
            step.last_activity_at = child.last_activity_at
            step.output_bytes = child.output_bytes
            step.output_truncated = child.output_truncated
            step.recent_output = child.recent_output[-5:]
        self.host.touch()

    def _settle(
        self, entry: ChildEntry, outcome: ChildResult, *, settled: bool, journal: bool = True
    ) -> None:
        """A child's end: journaled, shown, handed to the script, its slot freed."""
        with self.lock:
            if entry.phase is Phase.ENDED:
                return
            entry.phase = Phase.ENDED
            entry.result = outcome
        if journal:
            try:
                self.journal.ended(entry.key, entry.fingerprint, entry.run_id, outcome, settled=settled)
            except OSError as exc:  # a resume then takes the result from the child's run
                self.host.trouble("append to the journal", exc)
        step = entry.step
        step.status = _step_state(outcome.state)
        step.exit_code = outcome.exit_code
        step.ended_at = now_iso()
        step.current_tool = None
        if entry.run_id is not None:
            self.watch.remove(entry.run_id)
        self._count_usage(entry, outcome)
        self.host.event(
            "child.settled",
            entry.index,
            key=entry.key,
            runId=entry.run_id,
            state=outcome.state,
            settled=settled,
        )
        self._fail_forwards(entry)
        for future, loop in entry.futures:
            _resolve(future, loop, outcome)
        self.host.commit()

    def _count_usage(self, entry: ChildEntry, outcome: ChildResult) -> None:
        """The child's usage counted in the tree's usage budget, its reservation given back."""
        try:
            if not self.usage.active():
                return
            name = claim_name(self.spec.journal, entry.key)
            self.usage.settle(name, outcome.usage if entry.run_id is not None else None)
            totals = self.usage.totals()
        except PisubError as exc:
            self.host.trouble("count the usage budget", OSError(0, exc.message))
            return
        if totals is not None:
            self.host.usage(totals)

    def _never_started(self, entry: ChildEntry, why: str, state: str = "stopped") -> None:
        self._settle(
            entry, outcomes.not_started(entry.key, entry.call, state, why), settled=False, journal=False
        )

    def _stop_child(self, entry: ChildEntry) -> None:
        """Ask a child to end as part of the workflow's own ending (stop, or interrupt: pause)."""
        from pisub.store.mailbox import InboxClosed, write_request

        assert entry.run_id is not None
        entry.ended_by_workflow = True
        request: Request
        reason = f"workflow {self.manifest.run_id} is ending"
        source = f"workflow {self.manifest.run_id}"
        if self.ending is Interrupt:
            request = Interrupt(v=1, reason=reason, source=source)
        else:
            request = Stop(v=1, reason=reason, source=source)
        try:
            write_request(self.home.run(entry.run_id), request)
        except InboxClosed:
            pass  # it has ended: the next check settles it
        except PisubError as exc:
            self.host.trouble("ask a child to stop", OSError(0, exc.message))

    # == control (called by the dispatcher, on the loop) ======================================
    def route(self, child: int | None) -> list[int] | str:
        """The children a request goes to: every running child, or child ``child`` (by index)."""
        with self.lock:
            if child is None:
                running = [e.index for e in self.entries if e.phase is Phase.RUNNING]
                return running or "no child of this workflow is running"
            if child >= len(self.entries):
                return f"no child {child} (this workflow has {len(self.entries)})"
            entry = self.entries[child]
        if entry.phase is Phase.QUEUED:
            return f"child {child} ({entry.key}) has not started yet"
        if entry.phase is Phase.STARTING:
            return f"child {child} ({entry.key}) is still starting"
        if entry.phase is Phase.ENDED:
            return f"child {child} ({entry.key}) has already ended"
        return [child]

    def forward(self, index: int, request_id: str, request: Request) -> str | None:
        """Write ``request`` into child ``index``'s inbox; None when written (its receipt follows
        the child's), else why not."""
        from pisub.store.mailbox import InboxClosed, write_request

        entry = self.entries[index]
        assert entry.run_id is not None
        child_rid = forwarded_id(request_id, index)
        copy = msgspec.structs.replace(
            request, id=child_rid, child=None, source=f"workflow {self.manifest.run_id}"
        )
        try:
            write_request(self.home.run(entry.run_id), copy)
        except InboxClosed:
            return f"child {index} ({entry.key}) has already ended"
        except PisubError as exc:
            return f"cannot reach child {index} ({entry.key}): {exc.message}"
        entry.forwards[child_rid] = (request_id, index)
        self.host.event("control.forwarded", index, id=request_id, childRequest=child_rid, runId=entry.run_id)
        return None

    def _pass_receipts(self, entry: ChildEntry, paths: RunPaths) -> None:
        """Forwarded requests: their receipts in the workflow follow the child's."""
        from pisub.store.mailbox import read_receipt

        if not entry.forwards:
            return
        for child_rid, (rid, index) in list(entry.forwards.items()):
            try:
                receipt = read_receipt(paths, child_rid)
            except PisubError:
                continue
            if receipt is None:
                continue
            self.host.receipt_moved(rid, index, _target_state(receipt), receipt.reason)
            if receipt.state.is_final:
                del entry.forwards[child_rid]

    def _fail_forwards(self, entry: ChildEntry) -> None:
        """A child ended: pass on the receipts it wrote; what it never answered fails."""
        if entry.run_id is not None and entry.forwards:
            self._pass_receipts(entry, self.home.run(entry.run_id))
        for rid, index in entry.forwards.values():
            self.host.receipt_moved(rid, index, ReceiptState.FAILED, "the child ended first")
        entry.forwards.clear()

    # == runs.steer (from the script's thread) =============================================
    def send_steer(self, key: str, message: str, mode: str) -> SteerResult:
        from pisub.store.mailbox import InboxClosed, write_request

        with self.lock:
            entry = self.by_key.get(key)
        if entry is None:
            raise InvalidInput(f"runs.steer: no child {key!r} was started by this workflow")
        if entry.phase is not Phase.RUNNING or entry.run_id is None:
            why = "it has not started yet" if entry.phase is not Phase.ENDED else "it has already ended"
            return SteerResult(key=key, state="missed", error=f"child {key!r}: {why}")
        request = Steer(v=1, message=message, mode=mode, source=f"workflow {self.manifest.run_id}")  # type: ignore[arg-type]
        try:
            request_id = write_request(self.home.run(entry.run_id), request)
        except InboxClosed:
            return SteerResult(key=key, state="missed", error=f"child {key!r}: it has already ended")
        except PisubError as exc:
            return SteerResult(key=key, state="failed", error=exc.message)
        return SteerResult(key=key, state="queued", request_id=request_id, delivery_status="queued")

    def steer_outcome(self, key: str, request_id: str) -> SteerResult:
        from pisub.store.mailbox import read_receipt

        with self.lock:
            entry = self.by_key[key]
        assert entry.run_id is not None
        try:
            receipt = read_receipt(self.home.run(entry.run_id), request_id)
        except PisubError as exc:
            return SteerResult(key=key, state="failed", request_id=request_id, error=exc.message)
        if receipt is None or not receipt.state.is_final:
            status = receipt.delivery_status if receipt is not None else "queued"
            return SteerResult(key=key, state="queued", request_id=request_id, delivery_status=status)
        if receipt.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
            return SteerResult(key=key, state="delivered", request_id=request_id, delivery_status="delivered")
        missed = receipt.reason is not None and "ended" in receipt.reason
        return SteerResult(
            key=key,
            state="missed" if missed else "failed",
            request_id=request_id,
            delivery_status=receipt.delivery_status,
            error=receipt.reason,
        )


@dataclass
class _Plan:
    """How a newly called key is answered."""

    cwd: Path
    settled: ChildResult | None = None
    attach: str | None = None
    manifest: Manifest | None = None
    seeds: dict[str, Path] = field(default_factory=dict)
    needs_claim: bool = False
    journaled: bool = False
    skipped: bool = False


def _target_state(receipt: Receipt) -> ReceiptState:
    if receipt.state in (ReceiptState.PENDING, ReceiptState.QUEUED, ReceiptState.SCHEDULED):
        return ReceiptState.QUEUED if receipt.state != ReceiptState.PENDING else ReceiptState.PENDING
    if receipt.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
        return ReceiptState.DELIVERED
    return ReceiptState.FAILED


def _resolve(future: ChildFuture, loop: asyncio.AbstractEventLoop, outcome: ChildResult) -> None:
    from pisub.workflow.futures import call_soon

    def deliver() -> None:
        if not future.done():
            future.set_result(outcome)

    call_soon(loop, deliver)


def _step_state(state: str) -> StepState:
    return StepState(state) if state in StepState.__members__.values() else StepState.FAILED


def forwarded_id(request_id: str, index: int) -> str:
    """The id of ``request_id`` forwarded to child ``index``: ``<id>.c<index>``, or for a long
    id its first 150 characters and a hash of the whole (two ids never share a forward)."""
    if len(request_id) <= 180:
        return f"{request_id}.c{index}"
    digest = hashlib.sha256(request_id.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{request_id[:150]}.{digest}.c{index}"
