"""The workflow run mode: a detached coordinator that starts many child runs.

One thread runs the control loop (like a single run's supervisor: one selector over the signal
pipe, the inbox watch, the children's inotify descriptor and a wake-up pipe); the workflow's
``main`` runs in a thread of its own (:mod:`pisub.workflow.script`), child runners are started
by a few launch threads. Every child is a real run (:mod:`pisub.launcher`) with its own
runner; the coordinator journals each start before it creates the run and each end once it has
the result (:mod:`pisub.journal`), mirrors the children's progress into its ``steps[]``,
forwards control requests to them, and writes the workflow's result when ``main`` has returned
and every child has ended.

If the coordinator dies, its children go on under their own runners; ``pisub resume`` replays
the script against the journal and re-attaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import queue
import selectors
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from pisub.errors import InvalidInput, PisubError, RunNotFound, storage_error
from pisub.journal import Journal, Replay, replay
from pisub.lineage import Lineage
from pisub.paths import RunPaths
from pisub.procs import boot_id, start_ticks, start_time
from pisub.protocol.codec import encode, now_iso
from pisub.protocol.control import Interrupt, Receipt, ReceiptState, Request, Steer, Stop
from pisub.protocol.manifest import LimitValues, Manifest
from pisub.protocol.result import Details, ErrorCode, ErrorInfo, Result, TextContent
from pisub.protocol.status import RunState, StepState, StepStatus
from pisub.protocol.workflow import ChildCall, ChildResult, Context, Shape, SteerResult
from pisub.redact import redact
from pisub.runner.recorder import Recorder, WriteTrouble, note
from pisub.runner.tree import ProcessTree, Subreaper
from pisub.spawn_budget import SpawnBudget
from pisub.store import load_result, load_status, write_result
from pisub.workflow import outcomes
from pisub.workflow.calls import fingerprint
from pisub.workflow.watch import ChildWatch

if TYPE_CHECKING:
    from pisub.protocol.lease import LeaseOwner
    from pisub.runner.inbox import InboxWatcher
    from pisub.workflow.api import ChildFuture
    from pisub.workflow.dispatch import WorkflowDispatcher
    from pisub.workflow.script import ScriptThread

Report = Callable[[dict[str, object]], None]

STOP_WAIT_S = 60.0
"""How long the coordinator waits for its children to end after it asked them to stop."""

SCRIPT_GRACE_S = 5.0
"""How long a cancelled script may take to return once its children have ended."""

FINAL_WRITE_S = 30.0
LAUNCH_THREADS = 4


class Phase(enum.Enum):
    """Where one child call is."""

    QUEUED = "queued"
    """Waiting for a free slot (the workflow's concurrency)."""
    STARTING = "starting"
    """Its start is journaled and its runner is being started."""
    RUNNING = "running"
    ENDED = "ended"


class Ending(enum.Enum):
    """Why the workflow ends (the first one decides)."""

    RETURNED = "returned"
    STOP = "stop"
    SIGNAL = "signal"
    TIMEOUT = "timeout"
    FAILED = "failed"
    """The script raised, did not load, or left calls un-awaited."""
    INTERRUPT = "interrupt"


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


class Coordinator:
    """Runs one workflow run to its end."""

    def __init__(
        self, paths: RunPaths, manifest: Manifest, report: Report, *, tree: ProcessTree | None = None
    ) -> None:
        assert manifest.workflow is not None
        self.paths = paths
        self.manifest = manifest
        self.spec = manifest.workflow
        self.report = report
        self.home = paths.home
        self.tree: ProcessTree = tree or Subreaper(manifest.run_id, paths.root.parent)
        self.limits = manifest.limits
        self.lineage = Lineage(
            parent_run_id=manifest.parent_run_id,
            root_run_id=manifest.root_run_id,
            depth=manifest.depth,
            max_depth=manifest.max_depth,
        )
        self.sel = selectors.DefaultSelector()
        self.trouble = WriteTrouble()
        self.recorder: Recorder | None = None
        self.dispatcher: WorkflowDispatcher | None = None
        self.inbox: InboxWatcher | None = None
        self.watch = ChildWatch()
        self.lock = threading.RLock()
        """Guards the entries: the script thread admits calls while the loop runs them."""
        self.entries: list[ChildEntry] = []
        self.by_key: dict[str, ChildEntry] = {}
        self.by_run: dict[str, ChildEntry] = {}
        self.waiting: deque[ChildEntry] = deque()
        self.tracked: list[ChildFuture] = []
        self.posted: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.launcher = ThreadPoolExecutor(max_workers=LAUNCH_THREADS, thread_name_prefix="launch")
        self.journal: Journal | None = None
        self.replayed = Replay()
        self.budget = SpawnBudget(self.home.budgets, self.spec.budget, self.spec.max_spawns)
        self.lease: LeaseOwner | None = None
        self.script: ScriptThread | None = None
        self.script_result: tuple[Any, BaseException | None] | None = None
        self.ending: Ending | None = None
        self.end_error: ErrorInfo | None = None
        self.return_text = ""
        self.ending_since: float | None = None
        self.started = time.monotonic()
        self.signalled: int | None = None
        self.scan_due = True
        self.next_scan = 0.0
        self.next_poll = 0.0

    # == the run ========================================================================
    def run(self) -> int:
        """Coordinate the workflow to its end; the runner's exit code."""
        self._install_signals()
        try:
            if not self._startup():
                return 1
            self._start_inbox()
            self._start_script()
            self._loop()
            return 0 if self._finish() else 1
        except BaseException:
            note("the coordinator is failing; its children go on under their own runners")
            raise

    def _install_signals(self) -> None:
        sig_r, sig_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(sig_w, warn_on_full_buffer=False)
        self.sel.register(sig_r, selectors.EVENT_READ, lambda: _drain(sig_r))
        self.sel.register(self.wake_r, selectors.EVENT_READ, lambda: _drain(self.wake_r))
        if self.watch.fd is not None:
            self.sel.register(self.watch.fd, selectors.EVENT_READ, lambda: None)
        signal.signal(signal.SIGHUP, _ignore)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signalled = signum

    def _startup(self) -> bool:
        from pisub.leases import LeaseHeld, acquire

        status = load_status(self.paths)
        status.state = RunState.RUNNING
        status.pid = os.getpid()
        status.pid_start_time = start_time(os.getpid())
        status.pid_start_ticks = start_ticks(os.getpid())
        status.boot_id = boot_id()
        self.recorder = Recorder(self.paths, status, self.trouble)
        try:
            self.lease = acquire(
                self.home.leases, self.spec.journal, self.manifest.run_id, self.manifest.resumed_from
            )
            self.replayed = replay(Path(self.spec.journal))
            self.journal = Journal(Path(self.spec.journal))
            self.journal.owned_by(self.manifest.run_id)
        except (LeaseHeld, PisubError, OSError) as exc:
            self._fail_startup(f"cannot take over the workflow's journal: {exc}")
            return False
        try:
            self.recorder.commit(required=True)
        except OSError as exc:
            self.report({"ok": False, "error": storage_error(exc, "write", self.paths.status).message})
            raise
        self.event("run.started", pid=os.getpid())
        self.event("lease.acquired", generation=self.lease.generation, journal=self.spec.journal)
        if self.replayed.skipped:
            self.event("workflow.journal_skipped", lines=self.replayed.skipped)
        self.report({"ok": True, "pid": os.getpid()})
        return True

    def _fail_startup(self, message: str) -> None:
        from pisub.mailbox import close_inbox, settle_closed_inbox

        close_inbox(self.paths, "failed")
        settle_closed_inbox(self.paths, self.manifest.run_id, "the run failed to start")
        self.end_error = ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message)
        self.ending = Ending.FAILED
        self._write_end(time.monotonic() + FINAL_WRITE_S)
        self.report({"ok": False, "error": message})

    def _start_inbox(self) -> None:
        from pisub.runner.inbox import InboxWatcher
        from pisub.workflow.dispatch import WorkflowDispatcher

        assert self.recorder is not None
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(wake_r, selectors.EVENT_READ, lambda: self._inbox_woke(wake_r))
        self.inbox = InboxWatcher(self.paths.inbox / "new", wake_w)
        self.recorder.status.inbox = self.inbox.start()
        self.dispatcher = WorkflowDispatcher(
            self.paths,
            self.manifest.run_id,
            self.recorder.status.steering,
            self,
            self.recorder.touch,
            self.event,
            self.trouble,
        )
        self.recorder.commit()

    def _inbox_woke(self, fd: int) -> None:
        _drain(fd)
        self.scan_due = True

    def _start_script(self) -> None:
        from pisub.workflow.api import Runs, State
        from pisub.workflow.script import ScriptThread, load_main

        state: Any = None
        if self.spec.state_ns is not None:
            from pisub.shared_state import StateNamespace

            state = State(StateNamespace(self.home.state, self.spec.state_ns))
        runs = Runs(self)
        try:
            if self.spec.shape == Shape.WORKFLOW:
                main = load_main(self.paths.workflow_script, self._script_name)
            else:
                from pisub.workflow.shapes import shape_main

                main = shape_main(self.spec.shape, self.spec.tasks)
        except PisubError as exc:
            self._end(Ending.FAILED, exc.message)
            self.script_result = (None, exc)
            return
        self.script = ScriptThread(main, (runs, state, dict(self.spec.args)), self._script_done)
        self.event("workflow.started", shape=self.spec.shape.value)
        self.script.start()

    def _script_done(self, value: Any, error: BaseException | None) -> None:
        """Called from the script's thread."""
        self.post(lambda: self._script_finished(value, error))

    @property
    def _script_name(self) -> str:
        """The script's own file name (the run holds a copy named ``workflow.py``)."""
        return Path(self.spec.script).name if self.spec.script else "workflow.py"

    # == the loop ======================================================================
    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the control loop (from any thread)."""
        self.posted.put(fn)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.wake_w, b"w")

    def _loop(self) -> None:
        assert self.recorder is not None
        while True:
            now = time.monotonic()
            self._run_posted()
            self._check_limits(now)
            self._launch_waiting()
            self._check_children(now)
            self._scan_inbox(now)
            if self._done(now):
                return
            for key, _mask in self.sel.select(self._next_timeout(now)):
                key.data()
            self.recorder.flush_due()
            self.tree.reap(None)

    def _run_posted(self) -> None:
        while True:
            try:
                fn = self.posted.get_nowait()
            except queue.Empty:
                return
            fn()

    def _next_timeout(self, now: float) -> float:
        assert self.recorder is not None
        candidates = [1.0, self.next_poll - now]
        if self.inbox is not None:
            candidates.append(0.0 if self.scan_due else self.next_scan - now)
        if self.limits.timeout is not None and self.ending is None:
            candidates.append(self.started + self.limits.timeout - now)
        if self.ending_since is not None:
            candidates.append(0.2)
        flush = self.recorder.next_flush_in()
        if flush is not None:
            candidates.append(flush)
        return max(0.0, min(candidates))

    def _check_limits(self, now: float) -> None:
        if self.signalled is not None and self.ending is None:
            self._end(Ending.SIGNAL, f"Workflow stopped: the runner received signal {self.signalled}.")
        timeout = self.limits.timeout
        if timeout is not None and self.ending is None and now >= self.started + timeout:
            self._end(Ending.TIMEOUT, f"Workflow exceeded maximum runtime after {timeout:g}s.")

    def _scan_inbox(self, now: float) -> None:
        from pisub.runner.supervise import RETRY_S

        if self.dispatcher is None or self.inbox is None:
            return
        if self.scan_due or now >= self.next_scan:
            self.scan_due = False
            self.dispatcher.scan()
            retry = RETRY_S if self.dispatcher.unpublished else self.inbox.poll_interval
            self.next_scan = now + min(retry, self.inbox.poll_interval)

    def _done(self, now: float) -> bool:
        with self.lock:
            active = [e for e in self.entries if e.phase in (Phase.STARTING, Phase.RUNNING)]
        script_over = self.script_result is not None
        if self.ending is None:
            return False
        if not active:
            grace_over = (
                self.ending_since is not None and now - self.ending_since > STOP_WAIT_S + SCRIPT_GRACE_S
            )
            return script_over or grace_over
        if self.ending_since is not None and now - self.ending_since > STOP_WAIT_S:
            for entry in active:
                self._settle(
                    entry,
                    outcomes.failure(
                        entry.key,
                        entry.call,
                        "the child did not end in time after the workflow asked it to",
                        run_id=entry.run_id,
                    ),
                    settled=False,
                )
            return script_over
        return False

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
            assert self.journal is not None
            self.budget.claim(self.spec.journal, [k for k in fresh if k is not None])
        with self.lock:
            for (call, fp, existing, plan), future in zip(prepared, futures, strict=True):
                entry = existing if existing is not None else self._register(call, fp, plan)
                self.tracked.append(future)
                entry.futures.append((future, loop))
                if entry.result is not None:
                    future.set_result(entry.result)
        self.post(lambda: None)

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
            manifest, seeds = self._plan_start(call, cwd, where, run_id=record.run_id)
            return _Plan(cwd=cwd, manifest=manifest, seeds=seeds, journaled=True)
        manifest, seeds = self._plan_start(call, cwd, where)
        return _Plan(cwd=cwd, manifest=manifest, seeds=seeds, needs_claim=True)

    def _child_cwd(self, call: ChildCall, where: str) -> Path:
        from pisub.launcher import working_dir

        try:
            return working_dir(call.cwd, Path(self.manifest.cwd))
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: cwd: {exc.message}") from None

    def _plan_start(
        self, call: ChildCall, cwd: Path, where: str, run_id: str | None = None
    ) -> tuple[Manifest, dict[str, Path]]:
        from pisub.launcher import plan_resume, plan_run

        assert call.key is not None
        lineage = self.lineage.child(self.manifest.run_id)
        caller = LimitValues(timeout=call.timeout, idle_timeout=call.idle_timeout)
        seeds: dict[str, Path] = {}
        try:
            if call.resume is not None:
                if call.context == Context.FORK:
                    raise InvalidInput("resume and context='fork' exclude each other")
                manifest = plan_resume(
                    self.home, call.resume, call.task, lineage=lineage, key=call.key, timeout=call.timeout
                )
                if manifest.agent.name != call.agent:
                    raise InvalidInput(
                        f"run {call.resume} is a run of agent {manifest.agent.name!r}, not {call.agent!r}"
                    )
            else:
                manifest = plan_run(
                    self.home,
                    call.agent,
                    call.task,
                    cwd=cwd,
                    caller=caller,
                    lineage=lineage,
                    key=call.key,
                    model=call.model,
                    run_id=run_id,
                )
                if call.context == Context.FORK:
                    seeds["session.jsonl"] = self._fork_source(manifest)
        except PisubError as exc:
            raise type(exc)(f"{where}: {exc.message}") from None
        if run_id is not None:
            manifest.run_id = run_id
        return manifest, seeds

    def _fork_source(self, manifest: Manifest) -> Path:
        if manifest.agent.runner != "pi":
            raise InvalidInput("context='fork' needs a pi agent")
        if self.spec.fork_from is None:
            raise InvalidInput(
                "context='fork' needs a session to fork: start the workflow with --fork-from RUN"
            )
        from pisub.launcher import check_session

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
        if self.recorder is not None:
            self.recorder.status.steps.append(step)
        if plan.settled is not None:
            entry.phase = Phase.ENDED
            entry.result = plan.settled
            entry.run_id = plan.settled.run_id
            step.run_id = entry.run_id
            step.status = _step_state(plan.settled.state)
            self.post(lambda: self.event("workflow.replayed", entry.index, key=entry.key, runId=entry.run_id))
        elif plan.attach is not None:
            entry.run_id = plan.attach
            entry.phase = Phase.RUNNING
            step.run_id = plan.attach
            step.status = StepState.RUNNING
            self.by_run[plan.attach] = entry
            self.post(lambda: self._attached(entry))
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
    def _launch_waiting(self) -> None:
        with self.lock:
            active = sum(1 for e in self.entries if e.phase in (Phase.STARTING, Phase.RUNNING))
            while self.waiting and active < self.spec.concurrency and self.ending is None:
                entry = self.waiting.popleft()
                if entry.phase is Phase.QUEUED:
                    self._launch(entry)
                    active += 1

    def _launch(self, entry: ChildEntry) -> None:
        assert entry.manifest is not None and self.journal is not None
        run_id = entry.manifest.run_id
        try:
            self.journal.started(entry.key, entry.fingerprint, run_id)
        except OSError as exc:
            self.trouble("append to the journal", exc)
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
        self._touch()
        self.launcher.submit(self._start_child, entry, entry.manifest, dict(entry.seeds))

    def _start_child(self, entry: ChildEntry, manifest: Manifest, seeds: dict[str, Path]) -> None:
        """In a launch thread: create the child's run and wait for its runner's commit."""
        from pisub.launcher import start_run

        error: str | None = None
        try:
            start_run(self.home, manifest, seeds=seeds)
        except PisubError as exc:
            error = exc.message
        except Exception as exc:  # reported as the child's failure, never lost in this thread
            error = f"{type(exc).__name__}: {exc}"
        self.post(lambda: self._launched(entry, error))

    def _launched(self, entry: ChildEntry, error: str | None) -> None:
        assert entry.run_id is not None
        if error is not None and not self.home.run(entry.run_id).root.is_dir():
            self._settle(
                entry, outcomes.failure(entry.key, entry.call, error, run_id=entry.run_id), settled=True
            )
            return
        entry.phase = Phase.RUNNING
        entry.step.status = StepState.RUNNING
        self.event("child.started", entry.index, key=entry.key, runId=entry.run_id)
        self.watch.add(entry.run_id, self.home.run(entry.run_id).root)
        if self.ending is not None:
            self._stop_child(entry)
        self._check(entry)
        self._touch()

    def _attached(self, entry: ChildEntry) -> None:
        assert entry.run_id is not None
        self.event("workflow.reattached", entry.index, key=entry.key, runId=entry.run_id)
        self.watch.add(entry.run_id, self.home.run(entry.run_id).root)
        if self.ending is not None:
            self._stop_child(entry)
        self._check(entry)

    def _check_children(self, now: float) -> None:
        changed = self.watch.changed()
        due = now >= self.next_poll
        if due:
            self.next_poll = now + self.watch.poll_interval
        with self.lock:
            running = [e for e in self.entries if e.phase is Phase.RUNNING]
        for entry in running:
            if due or entry.run_id in changed:
                self._check(entry)

    def _check(self, entry: ChildEntry) -> None:
        """Look at a running child: mirror its progress, pass on its receipts, settle its end."""
        from pisub.reconcile import observe

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
            self.trouble("read a child's status", OSError(0, exc.message))
            return
        self._mirror(entry, status)
        self._pass_receipts(entry, paths)
        if not status.state.is_terminal:
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
        self._touch()

    def _settle(
        self, entry: ChildEntry, outcome: ChildResult, *, settled: bool, journal: bool = True
    ) -> None:
        """A child's end: journaled, shown, handed to the script, its slot freed."""
        with self.lock:
            if entry.phase is Phase.ENDED:
                return
            entry.phase = Phase.ENDED
            entry.result = outcome
        if journal and self.journal is not None:
            try:
                self.journal.ended(entry.key, entry.fingerprint, entry.run_id, outcome, settled=settled)
            except OSError as exc:  # a resume then takes the result from the child's run
                self.trouble("append to the journal", exc)
        step = entry.step
        step.status = _step_state(outcome.state)
        step.exit_code = outcome.exit_code
        step.ended_at = now_iso()
        step.current_tool = None
        if entry.run_id is not None:
            self.watch.remove(entry.run_id)
        self.event(
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
        if self.recorder is not None:
            self.recorder.commit()

    def _never_started(self, entry: ChildEntry, why: str, state: str = "stopped") -> None:
        self._settle(
            entry, outcomes.not_started(entry.key, entry.call, state, why), settled=False, journal=False
        )

    def _stop_child(self, entry: ChildEntry) -> None:
        """Ask a child to end as part of the workflow's own ending (stop, or interrupt: pause)."""
        from pisub.mailbox import InboxClosed, write_request

        assert entry.run_id is not None
        entry.ended_by_workflow = True
        request: Request
        reason = f"workflow {self.manifest.run_id} is ending"
        source = f"workflow {self.manifest.run_id}"
        if self.ending is Ending.INTERRUPT:
            request = Interrupt(v=1, reason=reason, source=source)
        else:
            request = Stop(v=1, reason=reason, source=source)
        try:
            write_request(self.home.run(entry.run_id), request)
        except InboxClosed:
            pass  # it has ended: the next check settles it
        except PisubError as exc:
            self.trouble("ask a child to stop", OSError(0, exc.message))

    # == the end =======================================================================
    def _end(self, why: Ending, message: str | None = None, code: str | None = None) -> None:
        """Begin the workflow's end: cancel ``main``, stop (or pause) every child, drop the queued."""
        if self.ending is not None:
            return
        self.ending = why
        self.ending_since = time.monotonic()
        if message is not None:
            if code is None:
                code = ErrorCode.SUBAGENT_TIMEOUT if why is Ending.TIMEOUT else ErrorCode.SUBAGENT_FAILED
            self.end_error = ErrorInfo(code=code, message=redact(message))
        self.event("workflow.ending", reason=why.name.lower(), message=message)
        if why is not Ending.RETURNED and self.script is not None:
            self.script.cancel()
        with self.lock:
            entries = list(self.entries)
            self.waiting.clear()
        for entry in entries:
            if entry.phase is Phase.QUEUED:
                self._never_started(entry, "the workflow ended before this child started")
            elif entry.phase is Phase.RUNNING:
                self._stop_child(entry)

    def _script_finished(self, value: Any, error: BaseException | None) -> None:
        self.script_result = (value, error)
        if self.ending is not None:
            return
        if error is not None:
            from pisub.workflow.api import WorkflowFailed
            from pisub.workflow.script import describe

            if isinstance(error, WorkflowFailed):
                self.return_text = error.text
                self._end(Ending.FAILED, error.message)
            elif isinstance(error, asyncio.CancelledError):
                self._end(Ending.FAILED, "the workflow's main was cancelled")
            else:
                where = describe(error, self.paths.workflow_script, self._script_name)
                # A pisub error the script let through keeps its code (RUN_FANOUT_LIMIT, ...).
                code = error.code if isinstance(error, PisubError) else None
                self._end(Ending.FAILED, f"the workflow failed: {where}", code)
            return
        leftovers = self._leftovers()
        if leftovers:
            self._end(Ending.FAILED, "main returned before these calls were awaited: " + ", ".join(leftovers))
            return
        try:
            self.return_text = value if isinstance(value, str) else encode(value).decode("utf-8")
        except (TypeError, msgspec.EncodeError, UnicodeDecodeError) as exc:
            self._end(Ending.FAILED, f"main returned a value that is not JSON: {exc}")
            return
        self._end(Ending.RETURNED)

    def _leftovers(self) -> list[str]:
        """The calls ``main`` returned without waiting for (their children are then stopped)."""
        with self.lock:
            tracked = list(self.tracked)
            open_entries = {
                id(f): e for e in self.entries for f, _ in e.futures if e.phase is not Phase.ENDED
            }
        found = []
        for future in tracked:
            if not future.observed:
                found.append(f"{future.label} (never awaited)")
            elif not future.done():
                entry = open_entries.get(id(future))
                if entry is not None or future.label.startswith(("runs.all", "runs.steer")):
                    found.append(f"{future.label} (still running)")
        return sorted(set(found))

    def _finish(self) -> bool:
        deadline = time.monotonic() + FINAL_WRITE_S
        with contextlib.suppress(Exception):
            self.tree.end_leftovers(None, self.limits.grace)  # anything the script itself started
        self.launcher.shutdown(wait=False, cancel_futures=True)
        dispatcher = self.dispatcher
        state = self._final_state()
        note(f"the workflow ends {state.value}" + (f": {self.end_error.message}" if self.end_error else ""))
        if dispatcher is not None:
            dispatcher.fail_open("the workflow ended before the request was answered")
            if not self._persist("answer the inbox", lambda: dispatcher.close(state.value), deadline):
                return False
        if self.inbox is not None:
            self.inbox.stop()
        self.watch.close()
        return self._write_end(deadline)

    def _final_state(self) -> RunState:
        return {
            Ending.RETURNED: RunState.COMPLETE,
            Ending.STOP: RunState.STOPPED,
            Ending.SIGNAL: RunState.STOPPED,
            Ending.INTERRUPT: RunState.PAUSED,
        }.get(Ending.FAILED if self.ending is None else self.ending, RunState.FAILED)

    def _result(self, state: RunState) -> Result:
        with self.lock:
            singles = [outcomes.as_single(e.result) for e in self.entries if e.result is not None]
        error = self.end_error
        if state is RunState.COMPLETE:
            text = redact(self.return_text)
        elif error is not None:
            text = f"{error.code}: {error.message}"
            if self.return_text:
                text += "\n\n" + redact(self.return_text)
        else:
            text = f"Workflow {state.value}."
        return Result(
            v=1,
            state=state.value,  # type: ignore[arg-type]
            ended_at=now_iso(),
            content=[TextContent(type="text", text=text)],
            details=Details(
                mode=self.spec.shape.value,
                run_id=self.manifest.run_id,
                results=singles,
                error=error,
            ),
        )

    def _write_end(self, deadline: float) -> bool:
        rec = self.recorder
        assert rec is not None
        state = self._final_state()
        if state is RunState.STOPPED and self.end_error is None:
            self.end_error = ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message="Workflow stopped by request.")
        result = self._result(state)
        if not self._persist("write result.json", lambda: write_result(self.paths, result), deadline):
            return False
        if self.lease is not None:
            from pisub.leases import release

            lease = self.lease
            self._persist("release the journal's lease", lambda: release(self.home.leases, lease), deadline)
            self.lease = None
        if self.journal is not None:
            self.journal.close()
        rec.status.state = state
        rec.status.error = self.end_error
        rec.status.ended_at = result.ended_at
        if not self._persist("write the terminal status.json", lambda: rec.commit(required=True), deadline):
            return False
        rec.event("run.finished", state=state.value)
        rec.close()
        return True

    def _persist(self, what: str, write: Callable[[], object], deadline: float) -> bool:
        delay = 0.05
        while True:
            try:
                write()
                return True
            except (OSError, PisubError) as exc:
                self.trouble(what, exc if isinstance(exc, OSError) else OSError(0, str(exc)))
                if time.monotonic() + delay > deadline:
                    note(f"gave up trying to {what}; a reader will repair the run when it can write")
                    return False
            time.sleep(delay)  # a retry back-off while the disk is full
            delay = min(delay * 2, 2.0)

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
        from pisub.mailbox import InboxClosed, write_request

        entry = self.entries[index]
        assert entry.run_id is not None
        child_rid = f"{request_id[:180]}.c{index}"
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
        self.event("control.forwarded", index, id=request_id, childRequest=child_rid, runId=entry.run_id)
        return None

    def stop_workflow(self, reason: str | None) -> str | None:
        if self.ending is not None:
            return "the workflow is already ending"
        self._end(Ending.STOP, "Workflow stopped by request." + (f" ({reason})" if reason else ""))
        return None

    def interrupt_workflow(self, reason: str | None) -> str | None:
        if self.ending is not None:
            return "the workflow is already ending"
        self._end(Ending.INTERRUPT)
        return None

    def _pass_receipts(self, entry: ChildEntry, paths: RunPaths) -> None:
        """Forwarded requests: their receipts in the workflow follow the child's."""
        from pisub.mailbox import read_receipt

        if not entry.forwards or self.dispatcher is None:
            return
        for child_rid, (rid, index) in list(entry.forwards.items()):
            try:
                receipt = read_receipt(paths, child_rid)
            except PisubError:
                continue
            if receipt is None:
                continue
            self.dispatcher.update_target(rid, index, _target_state(receipt), receipt.reason)
            if receipt.state.is_final:
                del entry.forwards[child_rid]

    def _fail_forwards(self, entry: ChildEntry) -> None:
        """A child ended: pass on the receipts it wrote; what it never answered fails."""
        if entry.run_id is not None and entry.forwards:
            self._pass_receipts(entry, self.home.run(entry.run_id))
        if self.dispatcher is not None:
            for rid, index in entry.forwards.values():
                self.dispatcher.update_target(rid, index, ReceiptState.FAILED, "the child ended first")
        entry.forwards.clear()

    # == runs.steer (from the script's thread) =============================================
    def send_steer(self, key: str, message: str, mode: str) -> SteerResult:
        from pisub.mailbox import InboxClosed, write_request

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
        from pisub.mailbox import read_receipt

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

    # == bookkeeping ===================================================================
    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        if self.recorder is not None:
            self.recorder.event(type_, child, **data)

    def _touch(self) -> None:
        if self.recorder is not None:
            self.recorder.touch()


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
    from pisub.workflow.script import call_soon

    def deliver() -> None:
        if not future.done():
            future.set_result(outcome)

    call_soon(loop, deliver)


def _step_state(state: str) -> StepState:
    return StepState(state) if state in StepState.__members__.values() else StepState.FAILED


def _ignore(_signum: int, _frame: object) -> None:
    return None


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass
