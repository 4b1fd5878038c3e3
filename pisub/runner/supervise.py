"""The supervision loop: start the child, enforce limits, write the result.

One thread, one selector: the child's pipes, its pidfd and a signal wake-up pipe are
all watched by ``select`` with a timeout that is the nearest deadline (runtime, idle,
KILL escalation, coalesced status write). The outcome is narrated: a timeout, a
flood, a stop and an ordinary exit each end with their own code and message.

Nothing the runner fails to write stops it supervising: the limits are enforced from memory,
failed writes are retried (:mod:`pisub.runner.recorder`), the final files get
:data:`FINAL_WRITE_S` of retries, and an unexpected exception ends the child's whole tree
before the runner exits, so no child ever runs on without a supervisor.
"""

from __future__ import annotations

import contextlib
import enum
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pisub import defaults
from pisub.children.base import Child, ChildHooks, ChildOutcome
from pisub.children.external_cli import child_env
from pisub.core.procs import start_ticks, start_time
from pisub.errors import PisubError, storage_error
from pisub.protocol.codec import now_iso
from pisub.protocol.control import ReceiptState
from pisub.protocol.manifest import Manifest
from pisub.protocol.result import ErrorCode, ErrorInfo
from pisub.protocol.status import RunState, StepState, StepStatus
from pisub.runner.ending import Circumstances, EndCause, Verdict, judge
from pisub.runner.lifecycle import (
    FINAL_WRITE_S,
    RETRY_S,
    drain,
    mark_running,
    persist,
    placed_by_engine,
    take_signals,
)
from pisub.runner.recorder import Recorder, WriteTrouble, note
from pisub.runner.tree import ProcessTree, Subreaper
from pisub.store.paths import RunPaths
from pisub.store.runs import load_status, write_result

if TYPE_CHECKING:  # imported where used: a launch waits only for what its start-up needs
    from pisub.protocol.acceptance import AcceptanceRecord, AcceptanceSpec, Check, EvidenceStatus, Level
    from pisub.protocol.lease import LeaseOwner
    from pisub.runner.dispatch import Dispatcher
    from pisub.runner.inbox import InboxWatcher
    from pisub.runner.review import ReviewOutcome

ABORT_CONFIRM_S = 3.0
"""How long pi has to end its work after an abort before it is TERMed."""

MAX_CHECKED_CLAIMS = 2000
"""The most changed files a ``checked`` report may claim (each may cost a git call)."""

DRAIN_AFTER_EXIT_S = 0.5
"""How long output is still read after the child exits while descendants hold its pipes."""


class Deadline(enum.Enum):
    """What the supervision loop waits for; the causes share their names with :class:`EndCause`."""

    RUNTIME = "runtime"
    IDLE = "idle"
    SIGNAL = "signal"
    OUTPUT = "output"
    TOOL = "tool"
    """A tool call ran past the tool timeout."""
    CHECKPOINT = "checkpoint"
    """Time to ask a pi child to checkpoint before its runtime deadline."""
    INTERRUPT = "interrupt"
    """pi had :data:`ABORT_CONFIRM_S` to end its work after an abort."""
    KILL = "kill"
    """The grace period after TERM ran out."""
    DRAIN = "drain"
    """Output is still read for a moment after the child exited."""


CHECKPOINT_MESSAGE = (
    "Your runtime ends in about {seconds:.0f} seconds. Checkpoint now: finish the tool you are "
    "running and start nothing new; then report the files you changed, the build and test "
    "state, the work that remains, and what is committed or not."
)
"""The steer a pi child gets ``checkpointBeforeDeadline`` before its runtime deadline."""

TOOL_BUDGET_MESSAGE = (
    "You have made {calls} tool calls of the {hard} your tool budget allows; past it, reading "
    "tools are blocked. Finish the task with what you have."
)
"""The steer a pi child gets at its tool budget's soft limit."""

Report = Callable[[dict[str, object]], None]
ChildFactory = Callable[[Manifest, RunPaths, ChildHooks], Child]


class Supervisor:
    """Runs one child to its end under the run's limits and control requests."""

    def __init__(
        self,
        paths: RunPaths,
        manifest: Manifest,
        report: Report,
        *,
        make: ChildFactory | None = None,
        tree: ProcessTree | None = None,
    ) -> None:
        self.paths = paths
        self.manifest = manifest
        self.report = report
        self.make = make or make_child
        """Makes the child (tests give a scripted one)."""
        self.tree: ProcessTree = tree or Subreaper(manifest.run_id, paths.root.parent)
        self.limits = manifest.limits
        self.sel = selectors.DefaultSelector()
        self.recorder: Recorder | None = None
        self.child: Child | None = None
        self.dispatcher: Dispatcher | None = None
        self.watcher: InboxWatcher | None = None
        self.started = time.monotonic()
        self.last_activity = self.started
        self.output_total = 0
        self.causes: set[EndCause] = set()
        """Why the child is being ended (the smallest wins the verdict)."""
        self.terminating = False
        self.kill_at: float | None = None
        self.abort_deadline: float | None = None
        self.exited_at: float | None = None
        self.signalled: int | None = None
        self.scan_due = True
        self.next_scan = 0.0
        self.lease: LeaseOwner | None = None
        self.leases_dir = paths.home.leases
        self.trouble = WriteTrouble()
        self.tool_timed_out: tuple[str, float] | None = None
        self.budget_soft_sent = False
        self.acceptance: AcceptanceRecord | None = None
        self.accepting = False
        """The child completed and its acceptance checks (verify commands, a review) run: a
        stop request or a signal ends them, and the run ends ``stopped``."""
        self.accept_stop = False
        self.budget_hard_noted = False
        self.checkpoint_armed = (
            manifest.agent.runner == "pi" and manifest.limits.checkpoint_before_deadline is not None
        )

    # -- hooks the child calls ---------------------------------------------------
    def activity(self, child: int) -> None:
        self.last_activity = time.monotonic()
        assert self.recorder is not None and self.child is not None
        step = self.recorder.step(child)
        step.last_activity_at = now_iso()
        progress = self.child.progress
        step.turn_count = progress.turns
        step.tool_count = progress.tools
        step.current_tool = progress.current_tool
        step.recent_output = list(progress.recent)
        self.recorder.touch()
        self._watch_tool_budget(progress.tools)

    def output(self, child: int, nbytes: int, truncated: bool) -> None:
        assert self.recorder is not None
        self.output_total += nbytes
        step = self.recorder.step(child)
        step.output_bytes += nbytes
        step.output_truncated = step.output_truncated or truncated

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        assert self.recorder is not None
        self.recorder.event(type_, child, **data)

    def raw_event(self, child: int, kind: str, raw: bytes) -> None:
        from pisub.children.pi.rpc import pi_event_line

        assert self.recorder is not None
        self.recorder.raw_line(pi_event_line(now_iso(), child, kind, raw))

    def steer_update(self, request_id: str, state: ReceiptState, reason: str | None = None) -> None:
        assert self.dispatcher is not None
        self.dispatcher.update(request_id, state, reason=reason)

    # -- the controller the dispatcher calls ------------------------------------------
    def _usable_child(self, index: int | None) -> tuple[Child | None, str | None]:
        if index not in (None, 0):
            return None, f"no child {index} (this run has one child, 0)"
        if self.child is None or self.child.poll() is not None:
            return None, "the child has already exited"
        if self.terminating:
            return None, "the child is being ended"
        return self.child, None

    def steer(self, child: int, request_id: str, message: str, behavior: str) -> str | None:
        found, why = self._usable_child(child)
        if found is None:
            return why
        if EndCause.INTERRUPT in self.causes:
            return "the child was interrupted"
        return found.steer(request_id, message, behavior)

    def interrupt(self, child: int | None, reason: str | None) -> str | None:
        found, why = self._usable_child(child)
        if found is None:
            return why
        self.causes.add(EndCause.INTERRUPT)
        self.event("child.interrupt", 0, reason=reason)
        if found.abort():
            if self.abort_deadline is None:  # a second interrupt does not postpone the escalation
                self.abort_deadline = time.monotonic() + ABORT_CONFIRM_S
        else:
            self._end(EndCause.INTERRUPT)
        return None

    def stop(self, child: int | None, reason: str | None) -> str | None:
        if child not in (None, 0):
            return f"no child {child} (this run has one child, 0)"
        if self.accepting:
            self.accept_stop = True
            self.event("acceptance.stop", 0, reason=reason)
            return None
        if self.child is None or self.child.poll() is not None:
            return "the child has already exited"
        self.event("child.stop", 0, reason=reason)
        self._end(EndCause.STOP)
        return None

    # -- the run ------------------------------------------------------------------
    def run(self) -> int:
        """Supervise the run to its end; the runner's exit code."""
        self._install_signals()
        try:
            if not self._startup():
                return 1
            self._start_inbox()
            self._loop()
            finished = self._finish()
            if finished and self.recorder is not None:
                from pisub.store.on_done import after_end  # after the terminal status: it never delays it

                after_end(self.paths, self.manifest, self.recorder.status.state.value)
            return 0 if finished else 1
        except BaseException:
            self._end_tree()
            raise

    def _end_tree(self) -> None:
        """The runner is going down unexpectedly: end the child's whole tree first (a reader's
        repair then answers the inbox and writes the result)."""
        note("the runner is failing: ending the child and everything it started")
        with contextlib.suppress(Exception):
            self.tree.end_leftovers(self.child.pid if self.child is not None else None, self.limits.grace)

    def _install_signals(self) -> None:
        take_signals(self.sel, self._on_signal, self._on_doorbell)

    def _on_doorbell(self, _signum: int, _frame: object) -> None:
        self.scan_due = True

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signalled = signum

    def _startup(self) -> bool:
        status = mark_running(load_status(self.paths))
        status.steps = [StepStatus(index=0, status=StepState.PENDING)]
        self.recorder = Recorder(self.paths, status, self.trouble)
        child = self.make(self.manifest, self.paths, self)
        self.child = child
        if self.manifest.agent.runner == "pi" and not self._take_lease(child):
            return False
        # First this runner's identity, then the child: a run whose status never named its runner
        # provably never started its child (a resumed workflow starts that key again).
        try:
            self.recorder.commit(required=True)
        except OSError as exc:
            self.report({"ok": False, "error": storage_error(exc, "write", self.paths.status).message})
            raise
        try:
            child.start()
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            message = f"cannot start {self.manifest.agent.command!r}: {reason}"
            self._fail_startup(message)
            return False
        child.register(self.sel)
        status.session_file = child.session_file
        step = self.recorder.step(0)
        step.status = StepState.RUNNING
        step.pid = step.pgid = child.pid
        step.pid_start_time = start_time(child.pid) if child.pid else None
        step.pid_start_ticks = start_ticks(child.pid) if child.pid else None
        step.started_at = step.last_activity_at = now_iso()
        try:
            self.recorder.commit(required=True)
        except OSError as exc:
            child.kill()
            self.report({"ok": False, "error": storage_error(exc, "write", self.paths.status).message})
            raise
        self.event("run.started", pid=os.getpid())
        self.event("child.started", 0, pid=child.pid, argv0=self.manifest.agent.command)
        self.report({"ok": True, "pid": os.getpid()})
        return True

    def _take_lease(self, child: Child) -> bool:
        """Hold the session's lease for the runner's whole life (before pi starts)."""
        from pisub.children.pi.rpc import PiChild
        from pisub.store.briefs import compose, mark_delivered, pending_briefs
        from pisub.store.leases import LeaseHeld, acquire, fenced

        assert child.session_file is not None
        try:
            self.lease = acquire(
                self.leases_dir, child.session_file, self.manifest.run_id, self.manifest.resumed_from
            )
        except (LeaseHeld, OSError) as exc:
            self._fail_startup(f"cannot drive the session: {exc}")
            return False
        self.event("lease.acquired", generation=self.lease.generation, session=self.lease.session_file)
        source = self.manifest.resumed_from
        if source is not None and isinstance(child, PiChild):
            src = RunPaths(self.paths.root.parent / source)
            with fenced(self.leases_dir, self.lease):
                briefs = pending_briefs(src)
                child.first_prompt = compose(briefs, self.manifest.task)
                mark_delivered(src, briefs, self.manifest.run_id)
            if briefs:
                self.event("resume.briefs", ids=[b.id for b in briefs])
        return True

    def _release_lease(self) -> None:
        if self.lease is not None:
            from pisub.store.leases import release

            released = release(self.leases_dir, self.lease)
            self.event("lease.released", generation=self.lease.generation, released=released)
            self.lease = None

    def _start_inbox(self) -> None:
        """Watch the inbox (after the startup commit, so that launching stays fast)."""
        from pisub.runner.dispatch import Dispatcher
        from pisub.runner.inbox import InboxWatcher

        assert self.recorder is not None
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(wake_r, selectors.EVENT_READ, lambda _m: self._inbox_woke(wake_r))
        self.watcher = InboxWatcher(self.paths.inbox / "new", wake_w, shared=placed_by_engine(self.manifest))
        self.recorder.status.inbox = self.watcher.start()
        self.dispatcher = Dispatcher(
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
        drain(fd)
        self.scan_due = True

    def _fail_startup(self, message: str) -> None:
        from pisub.store.mailbox import close_inbox, settle_closed_inbox

        assert self.recorder is not None
        close_inbox(self.paths, "failed")  # requests written before the start are answered
        settle_closed_inbox(self.paths, self.manifest.run_id, "the run failed to start")
        verdict = Verdict(RunState.FAILED, 127, ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message))
        self.recorder.step(0).status = StepState.FAILED
        self._write_end(verdict, ChildOutcome(exit_code=127, error=message))
        self.report({"ok": False, "error": message})

    def _loop(self) -> None:
        child = self.child
        assert child is not None and self.recorder is not None
        while True:
            now = time.monotonic()
            if child.poll() is not None:
                if self.exited_at is None:
                    self.exited_at = now
                if not child.streams_open or now - self.exited_at >= DRAIN_AFTER_EXIT_S:
                    return
            else:
                self._check_limits(now)
            self._scan_inbox(now)
            for key, mask in self.sel.select(self._next_timeout(now)):
                key.data(mask)
            self.recorder.flush_due()
            self.tree.reap(child.pid)

    def _scan_inbox(self, now: float) -> None:
        if self.dispatcher is None or self.watcher is None:
            return
        if self.scan_due or now >= self.next_scan:
            self.scan_due = False
            self.dispatcher.scan()
            retry = RETRY_S if self.dispatcher.unpublished else self.watcher.poll_interval
            self.next_scan = now + min(retry, self.watcher.poll_interval)

    def _deadlines(self) -> dict[Deadline, float]:
        """Every deadline that is set now, by what happens when it passes (monotonic seconds;
        a cause that is due at once — a signal, a flood — is due now)."""
        lim, due = self.limits, {}
        if self.exited_at is not None:
            return {Deadline.DRAIN: self.exited_at + DRAIN_AFTER_EXIT_S}
        if not self.terminating:
            if lim.timeout is not None:
                due[Deadline.RUNTIME] = self.started + lim.timeout
            if lim.idle_timeout is not None:
                due[Deadline.IDLE] = self.last_activity + lim.idle_timeout
            tool = self._tool_deadline()
            if tool is not None:
                due[Deadline.TOOL] = tool[0]
            if (
                self.checkpoint_armed
                and lim.timeout is not None
                and lim.checkpoint_before_deadline is not None
            ):
                due[Deadline.CHECKPOINT] = max(
                    self.started, self.started + lim.timeout - lim.checkpoint_before_deadline
                )
        if self.signalled is not None:
            due[Deadline.SIGNAL] = 0.0
        if self.output_total > lim.output_hard_cap:
            due[Deadline.OUTPUT] = 0.0
        if self.abort_deadline is not None:
            due[Deadline.INTERRUPT] = self.abort_deadline
        if self.kill_at is not None:
            due[Deadline.KILL] = self.kill_at
        return due

    def _check_limits(self, now: float) -> None:
        """Act on every deadline that has passed."""
        for deadline, when in sorted(self._deadlines().items(), key=lambda item: item[1]):
            if when > now:
                continue
            if deadline is Deadline.KILL:
                self.event("child.killed", 0, reasons=sorted(c.label for c in self.causes))
                assert self.child is not None
                self.child.kill()
                self.kill_at = None
            elif deadline is Deadline.INTERRUPT:
                self.abort_deadline = None
                self._end(EndCause.INTERRUPT)
            elif deadline is Deadline.TOOL:
                found = self._tool_deadline()
                if found is not None and found[0] <= now:
                    self.tool_timed_out = (found[1], found[2])
                    self._end(EndCause.TOOL)
            elif deadline is Deadline.CHECKPOINT:
                self.checkpoint_armed = False
                self._checkpoint(now)
            elif deadline is not Deadline.DRAIN:
                self._end(EndCause[deadline.name])

    def _tool_deadline(self) -> tuple[float, str, float] | None:
        """The earliest end a running tool call may have (monotonic), its tool and its timeout:
        the run's tool timeout for every tool but the exempt ones, else the fast built-in
        tools' default. Never later than the run's own deadline matters: both apply."""
        if self.child is None:
            return None
        lim = self.limits
        earliest: tuple[float, str, float] | None = None
        for name, started in self.child.progress.tools_running.values():
            if name in lim.tool_timeout_exempt:
                continue
            if lim.tool_timeout is not None:
                limit = lim.tool_timeout
            elif name in defaults.FAST_TOOLS:
                limit = defaults.FAST_TOOL_TIMEOUT_S
            else:
                continue
            if earliest is None or started + limit < earliest[0]:
                earliest = (started + limit, name, limit)
        return earliest

    def _watch_tool_budget(self, calls: int) -> None:
        """At the soft limit, nudge the child once with an ordinary steer request (so it has a
        receipt); past the hard limit, note once that pi now blocks the budget's tools."""
        budget = self.limits.tool_budget
        if budget is None or self.manifest.agent.runner != "pi":
            return
        if budget.soft is not None and calls >= budget.soft and not self.budget_soft_sent:
            self.budget_soft_sent = True
            self._steer_self(TOOL_BUDGET_MESSAGE.format(calls=calls, hard=budget.hard), "tool-budget")
            self.event("budget.soft_reached", 0, calls=calls, soft=budget.soft, hard=budget.hard)
        if calls > budget.hard and not self.budget_hard_noted:
            self.budget_hard_noted = True
            self.event("budget.hard_blocked", 0, calls=calls, hard=budget.hard, blocked=budget.block)

    def _steer_self(self, message: str, source: str) -> str | None:
        """Drop a steer request into this run's own inbox; its id (None when it failed)."""
        from pisub.protocol.control import Steer
        from pisub.store.mailbox import write_request

        try:
            return write_request(self.paths, Steer(v=1, message=message, source=source))
        except Exception as exc:  # any failure: noted; nothing else depends on it
            note(f"could not send a {source} steer: {exc}")
            return None

    def _checkpoint(self, now: float) -> None:
        """Ask the pi child, through an ordinary steer request in its own inbox (so it has a
        receipt), to wrap up before the runtime deadline; not when less than
        :data:`~pisub.defaults.CHECKPOINT_MIN_LEFT_S` would remain."""
        lim = self.limits
        assert lim.timeout is not None
        left = self.started + lim.timeout - now
        if left < defaults.CHECKPOINT_MIN_LEFT_S or self.terminating:
            return
        rid = self._steer_self(CHECKPOINT_MESSAGE.format(seconds=left), "deadline-checkpoint")
        if rid is not None:
            self.event("deadline.checkpoint", 0, requestId=rid, secondsLeft=round(left, 1))

    def _end(self, cause: EndCause) -> None:
        """End the child with TERM (to its group), then KILL after the grace period."""
        assert self.child is not None
        if cause in self.causes and self.terminating:
            return
        self.causes.add(cause)
        if self.terminating:
            return
        self.terminating = True
        self.event("child.ending", 0, reason=cause.label)
        self.child.terminate()
        self.kill_at = time.monotonic() + self.limits.grace

    def _next_timeout(self, now: float) -> float:
        """How long the loop may sleep: until the nearest deadline, scan or status write (<= 1 s)."""
        candidates = [1.0, *(when - now for when in self._deadlines().values())]
        if self.watcher is not None:
            candidates.append(0.0 if self.scan_due else self.next_scan - now)
        assert self.recorder is not None
        flush = self.recorder.next_flush_in()
        if flush is not None:
            candidates.append(flush)
        return max(0.0, min(candidates))

    def _finish(self) -> bool:
        """End the run: leftovers, verdict, inbox answered, result, terminal status. False when
        the final files could not be written within :data:`FINAL_WRITE_S` (a reader repairs)."""
        child = self.child
        assert child is not None
        self._end_leftovers(child)
        outcome = child.outcome()
        child.close(self.sel)
        verdict = self._judge(outcome)
        self.event("child.exited", 0, exitCode=outcome.exit_code, signal=outcome.signal)
        self._capture_worktree()
        verdict = self._accept(verdict, outcome)
        # The outcome in runner.log first: where a reader's repair finds it if the files cannot
        # be written (a full disk).
        why = f": {verdict.error.code}: {verdict.error.message}" if verdict.error else ""
        note(f"the run ends {verdict.state.value} (exit code {verdict.exit_code}){why}")
        deadline = time.monotonic() + FINAL_WRITE_S
        dispatcher = self.dispatcher
        if dispatcher is not None:
            # pi's queue lived in its memory: whatever it still held is lost with it.
            dispatcher.fail_open("the child ended before the message was delivered")
            if not self._persist("answer the inbox", lambda: dispatcher.close(verdict.state.value), deadline):
                self._unwritten(verdict, outcome, "answer the inbox", self.paths.outbox)
                return False
        if self.watcher is not None:
            self.watcher.stop()
        return self._write_end(verdict, outcome, deadline)

    def _unwritten(self, verdict: Verdict, outcome: ChildOutcome, what: str, path: Path) -> None:
        """The end the runner could not write, in ``runner.log`` for the repair to keep."""
        from pisub.protocol.codec import encode
        from pisub.protocol.result import UNWRITTEN_END, UnwrittenEnd

        end = UnwrittenEnd(
            state=verdict.state.value,
            exit_code=verdict.exit_code,
            signal=outcome.signal,
            path=str(path),
            error=self.trouble.last_error.get(what, "unknown error"),
        )
        note(UNWRITTEN_END + encode(end).decode("utf-8", "replace"))

    def _accept(self, verdict: Verdict, outcome: ChildOutcome) -> Verdict:
        """Run the acceptance checks of a child that completed: its report (read from its final
        output, which then loses the block) and its ``verify`` commands on its tree. An explicit
        acceptance that fails makes the run ``failed``."""
        wanted = self.manifest.acceptance
        if wanted is None:
            return verdict
        if verdict.state is not RunState.COMPLETE:
            self._take_report_out(wanted.spec, outcome)
            return verdict
        from pisub.acceptance.verify import place, run_checks
        from pisub.protocol.acceptance import AcceptanceRecord, Outcome
        from pisub.store.config import load_config

        checks = _guarded("report", lambda: self._report_checks(wanted.spec, outcome))
        try:
            allowed = load_config(self.paths.home.root).acceptance.verify_env or []
        except PisubError:
            allowed = []
        if wanted.spec.verify:
            env = child_env(os.environ, self.manifest, self.paths.root)  # marked as the child is
            where = place(Path(self.manifest.cwd), allowed, env)
            cache = self.paths.home.cache / "verify"
            not_before = time.time() - (time.monotonic() - self.started)  # when the child started
            self.accepting = True
            try:
                checks += run_checks(
                    wanted.spec.verify,
                    where,
                    cache,
                    self.paths.acceptance_dir,
                    env,
                    not_before,
                    self._stop_requested,
                )
            finally:
                self.accepting = False
                # what a command left running (setsid included: this runner is their subreaper)
                self.tree.end_leftovers(None, self.limits.grace)
        failed = [c for c in checks if c.outcome is Outcome.FAILED]
        review = None
        wants_review = wanted.spec.review is not None and wanted.spec.review.required
        if wants_review and not failed and not self.accept_stop:
            review = self._review(wanted.spec)
            checks.append(review.check)
            failed += [review.check] if review.check.outcome is Outcome.FAILED else []
        status = _evidence_status(wanted.spec.level, checks, failed, review)
        why = "; ".join(f"{c.id}: {c.reason}" for c in failed) or None
        inferred = None if wanted.explicit else wanted.spec.reason
        self.acceptance = AcceptanceRecord(
            level=wanted.spec.level,
            explicit=wanted.explicit,
            evidence_status=status,
            checks=checks,
            reason="; ".join(r for r in (inferred, why) if r) or None,
        )
        self.event(
            "acceptance.checked",
            0,
            status=status.value,
            checks=[{"id": c.id, "outcome": c.outcome.value, "cache": c.cache} for c in checks],
        )
        if self.accept_stop:
            message = "Subagent stopped by request (during its acceptance checks)."
            return Verdict(RunState.STOPPED, 0, ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message))
        if failed and wanted.explicit:
            message = f"acceptance gate failed: {why}"
            return Verdict(RunState.FAILED, 1, ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message))
        return verdict

    def _review(self, spec: AcceptanceSpec) -> ReviewOutcome:
        """Run the review gate: the reviewer as a child run; a stop request (or a signal) that
        arrives meanwhile stops the reviewer and then this run."""
        from pisub.acceptance.review import diff_of
        from pisub.runner.review import reviewer_name, run_review

        reviewer = reviewer_name(spec, None)  # named at launch
        patch = self.paths.worktree_patch if self.manifest.worktree is not None else None
        diff = diff_of(Path(self.manifest.cwd), patch)
        self.accepting = True
        try:
            return run_review(
                self.paths,
                self.manifest,
                reviewer,
                diff,
                started=lambda rid: self.event("review.started", 0, runId=rid, agent=reviewer),
                stop_requested=self._stop_requested,
            )
        finally:
            self.accepting = False

    def _stop_requested(self) -> bool:
        """While acceptance checks run: whether a stop request (answered now, not after the
        checks) or a signal asks this run to stop."""
        if self.dispatcher is not None:
            self.dispatcher.scan()
        if self.signalled is not None:
            self.accept_stop = True
        return self.accept_stop

    def _take_report_out(self, spec: AcceptanceSpec, outcome: ChildOutcome) -> None:
        """A run that did not complete is not checked, but a report it was asked for is still
        taken out of the output the caller gets (the raw log keeps it)."""
        from pisub.acceptance.report import wants_report, without_report

        if wants_report(spec):
            outcome.output = without_report(outcome.output)

    def _report_checks(self, spec: AcceptanceSpec, outcome: ChildOutcome) -> list[Check]:
        """The report's checks (none when the spec asks for no report); the block is taken out
        of ``outcome.output``."""
        from pisub.acceptance.report import extract, missing_evidence, parse, unterminated, wants_report
        from pisub.protocol.acceptance import Check, Level, Outcome

        if not wants_report(spec):
            return []
        if unterminated(outcome.output):
            why = "the last acceptance-report block is not closed (no ``` line after it)"
            return [Check(id="report", kind="report", outcome=Outcome.FAILED, reason=why)]
        text, outcome.output = extract(outcome.output)
        if text is None:
            return [
                Check(id="report", kind="report", outcome=Outcome.FAILED, reason="no acceptance-report block")
            ]
        try:
            report = parse(text)
        except PisubError as exc:
            return [Check(id="report", kind="report", outcome=Outcome.FAILED, reason=exc.message)]
        checks = [Check(id="report", kind="report", outcome=Outcome.PASSED)]
        missing = missing_evidence(spec, report)
        if missing:
            checks.append(
                Check(
                    id="evidence",
                    kind="report",
                    outcome=Outcome.FAILED,
                    reason="missing: " + ", ".join(missing),
                )
            )
        if spec.level is Level.CHECKED:
            checks.append(self._checked_claims(report))
        return checks

    def _checked_claims(self, report: dict[str, object]) -> Check:
        """``checked``: what the runner can see of the report's claims holds (the files it says
        it changed exist or are deleted in git; no staged files when it says so)."""
        from pisub.protocol.acceptance import Check, Outcome

        cwd = Path(self.manifest.cwd)
        changed = report.get("changedFiles") or []
        assert isinstance(changed, list)
        if len(changed) > MAX_CHECKED_CLAIMS:
            why = f"{len(changed)} changed files claimed; at most {MAX_CHECKED_CLAIMS} can be checked"
            return Check(id="claims", kind="report", outcome=Outcome.FAILED, reason=why)
        absent = [f for f in changed if not _changed_file_ok(cwd, str(f))]
        if absent:
            return Check(
                id="claims",
                kind="report",
                outcome=Outcome.FAILED,
                reason=f"no such changed file: {absent[0]}",
            )
        if report.get("noStagedFiles") is True and _has_staged(cwd):
            return Check(
                id="claims",
                kind="report",
                outcome=Outcome.FAILED,
                reason="it says nothing is staged; git has staged changes",
            )
        return Check(id="claims", kind="report", outcome=Outcome.PASSED)

    def _capture_worktree(self) -> None:
        """Save what the child left (nothing of it runs any more), as its workspace does
        (:mod:`pisub.worktrees.workspace`): an isolated child's work as a patch and a
        ``refs/pisub/`` commit; in place, nothing. A capture that fails leaves the worktree as it
        is: cleanup keeps it (``uncaptured``) and the failure is an event and a line in
        ``runner.log``."""
        from pisub.worktrees.workspace import workspace_of

        link = self.manifest.worktree
        try:
            record = workspace_of(self.manifest).capture(self.manifest, self.paths.worktree_patch)
        except Exception as exc:  # any failure: the work stays in the worktree, never lost
            message = exc.message if isinstance(exc, PisubError) else f"{type(exc).__name__}: {exc}"
            where = link.path if link is not None else self.manifest.cwd
            note(f"could not capture the worktree {where}: {message}")
            self.event("worktree.capture_failed", 0, path=where, error=message)
            return
        if record is None:  # the work is where the child left it
            return
        patch = record.patch
        self.event(
            "worktree.captured",
            0,
            path=record.path,
            ref=record.ref,
            sha256=patch.sha256 if patch else None,
            bytes=patch.size if patch else 0,
            files=len(patch.files) + patch.files_omitted if patch else 0,
            ignoredChanged=len(patch.ignored_changed) + patch.ignored_omitted if patch else 0,
        )
        if patch is not None and patch.ignored_changed:
            note(f"ignored files changed in the worktree (not in the patch): {patch.ignored_changed[:10]}")

    def _persist(self, what: str, write: Callable[[], object], deadline: float) -> bool:
        return persist(self.trouble, what, write, deadline)

    def _end_leftovers(self, child: Child) -> None:
        """No process of the child outlives it: its group and every adopted descendant."""
        found = self.tree.end_leftovers(child.pid, self.limits.grace)
        if found is not None:
            self.event("child.leftovers_ended", 0, pids=found[0], survivors=found[1])
        # Whatever the killed descendants still had in the pipes.
        deadline = time.monotonic() + DRAIN_AFTER_EXIT_S
        while child.streams_open and time.monotonic() < deadline:
            for key, mask in self.sel.select(0.05):
                key.data(mask)

    def _judge(self, outcome: ChildOutcome) -> Verdict:
        return judge(self.causes, outcome, Circumstances(self.limits, self.signalled, self.tool_timed_out))

    def _write_end(self, verdict: Verdict, outcome: ChildOutcome, deadline: float | None = None) -> bool:
        rec = self.recorder
        assert rec is not None
        from pisub.store.results import make_result

        result = make_result(
            run_id=self.manifest.run_id,
            state=verdict.state.value,
            agent=self.manifest.agent.name,
            task=self.manifest.task,
            exit_code=verdict.exit_code,
            output=outcome.output,
            error=verdict.error,
            usage=outcome.usage,
            timeout_reason=verdict.timeout_reason,
            session_file=outcome.session_file,
            full_output=self.paths.output_log(0),
            acceptance=self.acceptance,
        )
        deadline = deadline if deadline is not None else time.monotonic() + FINAL_WRITE_S
        # before result.json (readers take a result as the end): a resume that sees it finds
        # the lease free; the child has ended, so nothing writes the session any more
        self._persist("release the session lease", self._release_lease, deadline)
        if not self._persist("write result.json", lambda: write_result(self.paths, result), deadline):
            self._unwritten(verdict, outcome, "write result.json", self.paths.result)
            return False
        step = rec.step(0)
        if step.status == StepState.RUNNING:
            step.status = _step_state(verdict.state)
        step.exit_code = verdict.exit_code
        step.signal = outcome.signal
        step.ended_at = now_iso()
        rec.status.state = verdict.state
        rec.status.error = verdict.error
        rec.status.ended_at = result.ended_at
        if not self._persist("write the terminal status.json", lambda: rec.commit(required=True), deadline):
            return False
        rec.event("run.finished", state=verdict.state.value, exitCode=verdict.exit_code)
        rec.close()
        return True


def make_child(manifest: Manifest, paths: RunPaths, hooks: ChildHooks) -> Child:
    """The child adapter for the manifest's runner kind."""
    env = child_env(os.environ, manifest, paths.root)
    from pisub.children.external_cli import ExternalCliChild
    from pisub.children.pi.rpc import PiChild

    kinds: dict[str, type[ExternalCliChild] | type[PiChild]] = {
        "external-cli": ExternalCliChild,
        "pi": PiChild,
    }
    return kinds[manifest.agent.runner](0, hooks, manifest, paths, env)


def _guarded(what: str, checks: Callable[[], list[Check]]) -> list[Check]:
    """``checks()``, or one failed check when it raised: what a child or a model wrote never
    ends the runner."""
    from pisub.protocol.acceptance import Check, Outcome

    try:
        return checks()
    except Exception as exc:
        why = exc.message if isinstance(exc, PisubError) else f"{type(exc).__name__}: {exc}"
        return [
            Check(id=what, kind="report", outcome=Outcome.FAILED, reason=f"could not be checked: {why}"[:500])
        ]


def _step_state(state: RunState) -> StepState:
    return StepState(state.value)


def _evidence_status(
    level: Level, checks: list[Check], failed: list[Check], review: ReviewOutcome | None
) -> EvidenceStatus:
    from pisub.protocol.acceptance import EvidenceStatus, Level

    if review is not None and not review.finished:
        return EvidenceStatus.REVIEW_REQUIRED
    if failed:
        return EvidenceStatus.REJECTED
    if review is not None:
        return EvidenceStatus.REVIEWED
    if any(c.kind == "verify" for c in checks):
        return EvidenceStatus.VERIFIED
    if level is Level.CHECKED:
        return EvidenceStatus.CHECKED
    if level is Level.ATTESTED:
        return EvidenceStatus.ATTESTED
    return EvidenceStatus.CLAIMED


def _git_quiet(cwd: Path, args: list[str]) -> int | None:
    """git's exit code in ``cwd`` (hardened, timed: :func:`pisub.worktrees.git.run_git`);
    None when git could not run."""
    from pisub.worktrees.git import WorktreeError, run_git

    try:
        return run_git(cwd, args, what="check the report's claims", check=False).returncode
    except WorktreeError:
        return None


def _deleted_in_git(cwd: Path, name: str) -> bool:
    """Whether ``name`` is tracked at HEAD (so its absence is a deletion)."""
    return _git_quiet(cwd, ["cat-file", "-e", f"HEAD:./{name}"]) == 0


def _has_staged(cwd: Path) -> bool:
    return _git_quiet(cwd, ["diff", "--cached", "--quiet"]) == 1


def _changed_file_ok(cwd: Path, name: str) -> bool:
    """A claimed changed file: a relative path inside the tree (not in ``.git``), naming a
    regular file there or one deleted from HEAD."""
    if not name.strip() or os.path.isabs(name):
        return False
    root = os.path.realpath(cwd)
    target = os.path.realpath(os.path.join(root, name))
    if not target.startswith(root + os.sep) or ".git" in Path(os.path.relpath(target, root)).parts:
        return False
    if os.path.isfile(target):
        return True
    return not os.path.lexists(target) and _deleted_in_git(cwd, name)
