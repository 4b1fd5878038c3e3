"""The single-run mode: one child process run to its end under the run's limits.

The skeleton every mode shares — signals, the startup commit, the inbox, the loop, the lease,
the final writes and their retry — is :class:`~pisub.runner.shell.RunShell`; this mode fills it
in: it starts the child (a pi child after taking its session's lease), waits for the child's
nearest deadline (:mod:`pisub.runner.deadlines`), answers control requests for it, narrates its
end (:mod:`pisub.runner.ending`: a timeout, a flood, a stop and an ordinary exit each end with
their own code and message) and has the evidence of a completed child judged
(:mod:`pisub.acceptance.evidence`). The limits are enforced from memory whatever the runner fails
to write, and an unexpected exception ends the child's whole tree before the runner exits, so no
child ever runs on without a supervisor.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pisub.children.base import Child, ChildHooks, ChildOutcome
from pisub.children.external_cli import child_env
from pisub.core.procs import start_ticks, start_time
from pisub.errors import PisubError
from pisub.protocol.codec import now_iso, parse_iso
from pisub.protocol.control import ReceiptState
from pisub.protocol.manifest import Manifest
from pisub.protocol.result import ErrorCode, ErrorInfo, ResultProgress
from pisub.protocol.status import RunState, StepState, StepStatus
from pisub.runner.deadlines import DRAIN_AFTER_EXIT_S, Deadlines
from pisub.runner.ending import Circumstances, EndCause, Verdict, judge
from pisub.runner.recorder import note
from pisub.runner.shell import Report, RunShell
from pisub.runner.tree import ProcessTree
from pisub.store.paths import RunPaths

if TYPE_CHECKING:  # imported where used: a launch waits only for what its start-up needs
    from pisub.acceptance.evidence import Judge
    from pisub.acceptance.review import ReviewOutcome
    from pisub.protocol.acceptance import AcceptanceRecord, AcceptanceSpec
    from pisub.protocol.result import Result
    from pisub.protocol.status import Status
    from pisub.runner.dispatch import Dispatcher


ChildFactory = Callable[[Manifest, RunPaths, ChildHooks], Child]


class Supervisor(RunShell["Dispatcher"]):
    """Runs one child to its end under the run's limits and control requests."""

    LEASED = "session lease"
    OPEN_AT_END = "the child ended before the message was delivered"
    """pi's queue lived in its memory: whatever it still held is lost with it."""

    def __init__(
        self,
        paths: RunPaths,
        manifest: Manifest,
        report: Report,
        *,
        make: ChildFactory | None = None,
        tree: ProcessTree | None = None,
    ) -> None:
        super().__init__(paths, manifest, report, tree)
        self.make = make or make_child
        """Makes the child (tests give a scripted one)."""
        self.child: Child | None = None
        self._untaken: dict[str, str] = {}
        """Steers pi dropped (an interrupt cleared them): request id → why; answered at the end."""
        self.deadlines: Deadlines | None = None
        """The child's deadlines, and how it is ended (made with the child)."""
        self.judge: Judge | None = None
        """The completed child's acceptance checks, while they run (a stop request ends them)."""
        self.acceptance: AcceptanceRecord | None = None
        self.end: tuple[Verdict, ChildOutcome] | None = None
        """The run's end, once judged: the verdict and the child's outcome."""

    # -- hooks the child calls ---------------------------------------------------
    def activity(self, child: int) -> None:
        assert self.recorder is not None and self.child is not None and self.deadlines is not None
        self.deadlines.last_activity = time.monotonic()
        step = self.recorder.step(child)
        step.last_activity_at = now_iso()
        progress = self.child.progress
        step.turn_count = progress.turns
        step.tool_count = progress.tools
        step.current_tool = progress.current_tool
        step.recent_output = list(progress.recent)
        self.recorder.touch()
        self.deadlines.watch_tool_budget(progress.tools)

    def output(self, child: int, nbytes: int, truncated: bool) -> None:
        assert self.recorder is not None and self.deadlines is not None
        self.deadlines.output_total += nbytes
        step = self.recorder.step(child)
        step.output_bytes += nbytes
        step.output_truncated = step.output_truncated or truncated

    def raw_event(self, child: int, kind: str, raw: bytes) -> None:
        from pisub.children.pi.rpc import pi_event_line

        assert self.recorder is not None
        if self.manifest.artifacts:  # the raw pi stream is a debugging copy (--no-artifacts: none)
            self.recorder.raw_line(pi_event_line(now_iso(), child, kind, raw))

    def steer_update(self, request_id: str, state: ReceiptState, reason: str | None = None) -> None:
        assert self.dispatcher is not None
        if (
            state is ReceiptState.FAILED
            and reason in _untaken_reasons()
            and request_id in self.dispatcher.messages
        ):
            self._untaken[request_id] = reason  # answered when the run ends: carried, or failed
            return
        self.dispatcher.update(request_id, state, reason=reason)

    def _carry_steers(self, state: RunState) -> None:
        """A pi run that can be resumed keeps every steer pi did not take (an interrupt cleared
        it, or the run ended first) as a brief for its next resume; otherwise each fails with
        why it was not taken."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        if not dispatcher.messages:  # nothing to carry (and nothing imported: most runs end here)
            return
        from pisub.store.briefs import CARRIED_REASON
        from pisub.store.mailbox import recovery_claim

        reviving = recovery_claim(self.paths)  # a pause-and-revive delivers that one itself
        for rid, message in list(dispatcher.messages.items()):
            if rid == reviving:
                continue
            why = self._untaken.pop(rid, None) or self.OPEN_AT_END
            refusal = self._keep_as_brief(rid, message, state)
            if refusal is None:
                dispatcher.carry(rid, f"{CARRIED_REASON} ({why})")
                self.event("control.carried", id=rid, reason=why)
            else:
                dispatcher.update(rid, ReceiptState.FAILED, reason=why)
                self.event("control.not_carried", id=rid, reason=refusal)

    def _keep_as_brief(self, rid: str, message: str, state: RunState) -> str | None:
        """Store the steer ``rid`` as a brief for the next resume; None when kept, else why not."""
        from pisub.store.briefs import carry_brief
        from pisub.store.leases import fenced

        if state is RunState.STOPPED:
            return "a stopped run cannot be resumed"
        lease, child = self.lease, self.child
        session = child.session_file if child is not None else None
        if lease is None or session is None or not os.path.isfile(session):
            return "the run has no session to resume"
        try:
            with fenced(self.paths.home.leases, lease):
                return carry_brief(self.paths, rid, message, lease.generation)
        except PisubError as exc:
            return f"it could not be kept: {exc.message}"

    # -- the controller the dispatcher calls ------------------------------------------
    def _usable_child(self, index: int | None) -> tuple[Child | None, str | None]:
        if index not in (None, 0):
            return None, f"no child {index} (this run has one child, 0)"
        if self.child is None or self.child.poll() is not None:
            return None, "the child has already exited"
        if self.deadlines is None or self.deadlines.terminating:
            return None, "the child is being ended"
        return self.child, None

    def steer(self, child: int, request_id: str, message: str, behavior: str) -> str | None:
        found, why = self._usable_child(child)
        if found is None:
            return why
        assert self.deadlines is not None
        if EndCause.INTERRUPT in self.deadlines.causes:
            return "the child was interrupted"
        return found.steer(request_id, message, behavior)

    def interrupt(self, child: int | None, reason: str | None) -> str | None:
        found, why = self._usable_child(child)
        if found is None:
            return why
        assert self.deadlines is not None
        self.deadlines.causes.add(EndCause.INTERRUPT)
        self.event("child.interrupt", 0, reason=reason)
        if found.abort():
            self.deadlines.abort_sent()
        else:
            self.deadlines.end(EndCause.INTERRUPT)
        return None

    def stop(self, child: int | None, reason: str | None) -> str | None:
        if child not in (None, 0):
            return f"no child {child} (this run has one child, 0)"
        if self.judge is not None and self.judge.stop(reason):
            return None
        if self.child is None or self.child.poll() is not None:
            return "the child has already exited"
        self.event("child.stop", 0, reason=reason)
        assert self.deadlines is not None
        self.deadlines.end(EndCause.STOP)
        return None

    # -- the start (the shell's hooks) ---------------------------------------------
    def _prepare(self, status: Status) -> bool:
        status.steps = [StepStatus(index=0, status=StepState.PENDING)]
        self.child = self.make(self.manifest, self.paths, self)
        self.deadlines = Deadlines(self.child, self.manifest, self.paths, self.started, self.event)
        return self.manifest.agent.runner != "pi" or self._take_session(self.child)

    def _start(self) -> bool:
        child, rec = self.child, self.recorder
        assert child is not None and rec is not None
        try:
            child.start()
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._fail_startup(f"cannot start {self.manifest.agent.command!r}: {reason}")
            return False
        child.register(self.sel)
        rec.status.session_file = child.session_file
        step = rec.step(0)
        step.status = StepState.RUNNING
        step.pid = step.pgid = child.pid
        step.pid_start_time = start_time(child.pid) if child.pid else None
        step.pid_start_ticks = start_ticks(child.pid) if child.pid else None
        step.started_at = step.last_activity_at = now_iso()
        # The child's pid: not fsynced (the launcher waits for this commit). The durable startup
        # commit before the child started already says that a child may run; this one names a
        # process of this boot only, which a power loss ends with it (spec/guarantees.md 1).
        self._commit_startup(undo=child.kill, durable=False)
        self.event("run.started", pid=os.getpid())
        self.event("child.started", 0, pid=child.pid, argv0=self.manifest.agent.command)
        return True

    def _take_session(self, child: Child) -> bool:
        """Hold the session's lease for the runner's whole life (before pi starts); a resumed
        session's pending briefs go into pi's first prompt, under the lease's fence."""
        from pisub.children.pi.rpc import PiChild
        from pisub.errors import LeaseHeld
        from pisub.store.briefs import compose, mark_delivered, pending_briefs
        from pisub.store.leases import fenced

        assert child.session_file is not None
        try:
            lease = self._take_lease(child.session_file)
        except (LeaseHeld, OSError) as exc:
            self._fail_startup(f"cannot drive the session: {exc}")
            return False
        self.event("lease.acquired", generation=lease.generation, session=lease.session_file)
        source = self.manifest.resumed_from
        if source is not None and isinstance(child, PiChild):
            src = RunPaths(self.paths.root.parent / source)
            with fenced(self.paths.home.leases, lease):
                briefs = pending_briefs(src)
                child.first_prompt = compose(briefs, self.manifest.task)
                mark_delivered(src, briefs, self.manifest.run_id)
            if briefs:
                self.event("resume.briefs", ids=[b.id for b in briefs])
        return True

    def _dispatcher_class(self) -> type[Dispatcher]:
        from pisub.runner.dispatch import Dispatcher

        return Dispatcher

    def _write_failed_start(self, message: str) -> None:
        assert self.recorder is not None
        verdict = Verdict(RunState.FAILED, 127, ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message))
        self.recorder.step(0).status = StepState.FAILED
        self.end = (verdict, ChildOutcome(exit_code=127, error=message))
        self._write_end()

    def _abandon(self) -> None:
        """The runner is going down unexpectedly: end the child's whole tree first (a reader's
        repair then answers the inbox and writes the result)."""
        note("the runner is failing: ending the child and everything it started")
        with contextlib.suppress(Exception):
            self.tree.end_leftovers(self.child.pid if self.child is not None else None, self.limits.grace)

    # -- the loop -------------------------------------------------------------------
    def _tend(self, now: float) -> bool:
        child, deadlines = self.child, self.deadlines
        assert child is not None and deadlines is not None
        if child.poll() is not None:
            if deadlines.exited_at is None:
                deadlines.exited_at = now
            if not child.streams_open or now - deadlines.exited_at >= DRAIN_AFTER_EXIT_S:
                return True
        else:
            deadlines.check(now, self.signalled)
        self._scan_inbox(now)
        return False

    def _due(self, now: float) -> list[float]:
        assert self.deadlines is not None
        return [when - now for when in self.deadlines.due(self.signalled).values()]

    def _child_pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    def _conclude(self) -> RunState:
        """The child's leftovers ended, its verdict judged, its work captured and checked."""
        child, deadlines = self.child, self.deadlines
        assert child is not None and deadlines is not None
        self._end_leftovers(child)
        outcome = child.outcome()
        child.close(self.sel)
        circumstances = Circumstances(self.limits, self.signalled, deadlines.tool_timed_out)
        verdict = judge(deadlines.causes, outcome, circumstances)
        self.event("child.exited", 0, exitCode=outcome.exit_code, signal=outcome.signal)
        self._capture_worktree()
        verdict = self._accept(verdict, outcome)
        # The outcome in runner.log first: where a reader's repair finds it if the files cannot
        # be written (a full disk).
        why = f": {verdict.error.code}: {verdict.error.message}" if verdict.error else ""
        note(f"the run ends {verdict.state.value} (exit code {verdict.exit_code}){why}")
        self.end = (verdict, outcome)
        return verdict.state

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

    def _accept(self, verdict: Verdict, outcome: ChildOutcome) -> Verdict:
        """Judge the evidence of a child that completed (:mod:`pisub.acceptance.evidence`); an
        explicit acceptance that fails makes the run ``failed``, a stop meanwhile ``stopped``."""
        wanted = self.manifest.acceptance
        if wanted is None:
            return verdict
        from pisub.acceptance.evidence import Judge, Place, started_at, take_report_out

        if verdict.state is not RunState.COMPLETE:
            take_report_out(wanted.spec, outcome)
            return verdict
        env = child_env(os.environ, self.manifest, self.paths.root)  # marked as the child is
        home = self.paths.home
        place = Place(
            Path(self.manifest.cwd),
            home.root,
            home.cache / "verify",
            self.paths.acceptance_dir,
            env,
            started_at(self.started),
        )
        self.judge = Judge(wanted, place, self)
        judged = self.judge.judge(outcome)
        self.judge = None
        self.acceptance = judged.record
        if judged.stopped:
            message = "Subagent stopped by request (during its acceptance checks)."
            return Verdict(RunState.STOPPED, 0, ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message))
        if judged.gate_failed is not None:
            return Verdict(
                RunState.FAILED, 1, ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=judged.gate_failed)
            )
        return verdict

    # the judge's host (pisub.acceptance.evidence.Host)
    def poll_stop(self) -> bool:
        if self.dispatcher is not None:
            self.dispatcher.scan()
        return self.signalled is not None

    def end_descendants(self) -> None:
        self.tree.end_leftovers(None, self.limits.grace)

    def review(self, spec: AcceptanceSpec, stop_requested: Callable[[], bool]) -> ReviewOutcome:
        from pisub.runner.review import review_gate

        return review_gate(self.paths, self.manifest, spec, self.event, stop_requested)

    def _capture_worktree(self) -> None:
        """Save what the child left (nothing of it runs any more), as its workspace does
        (:mod:`pisub.worktrees.workspace`): an isolated child's work as a patch and a
        ``refs/pisub/`` commit; in place, nothing. A capture that fails leaves the worktree as it
        is: cleanup keeps it (``uncaptured``) and the failure is an event and a line in
        ``runner.log``."""
        link = self.manifest.worktree
        if link is None:  # in place (InPlace.capture): the work is where the child left it
            return
        from pisub.worktrees.workspace import workspace_of

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

    def _result(self) -> Result:
        assert self.end is not None
        verdict, outcome = self.end
        from pisub.store.results import make_result

        return make_result(
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
            max_output=self.manifest.max_output,
            progress=self._progress() if self.manifest.include_progress else None,
        )

    def _progress(self) -> ResultProgress:
        """The child's progress as its step in ``status.json`` has it now (``--include-progress``)."""
        assert self.recorder is not None
        step = self.recorder.step(0)
        duration = None
        if step.started_at is not None:
            ended = parse_iso(step.ended_at) if step.ended_at else time.time()
            duration = max(0, int((ended - parse_iso(step.started_at)) * 1000))
        return ResultProgress(
            turn_count=step.turn_count,
            tool_count=step.tool_count,
            output_bytes=step.output_bytes,
            output_truncated=step.output_truncated,
            duration_ms=duration,
            recent_output=list(step.recent_output),
        )

    def _settle(self, status: Status) -> dict[str, object]:
        assert self.end is not None
        verdict, outcome = self.end
        step = status.steps[0]
        if step.status == StepState.RUNNING:
            step.status = StepState(verdict.state.value)
        step.exit_code = verdict.exit_code
        step.signal = outcome.signal
        step.ended_at = now_iso()
        status.error = verdict.error
        return {"exitCode": verdict.exit_code}

    def _unwritten(self, what: str, path: Path) -> None:
        """The end the runner could not write, in ``runner.log`` for the repair to keep."""
        from pisub.protocol.codec import encode
        from pisub.protocol.result import UNWRITTEN_END, UnwrittenEnd

        assert self.end is not None
        verdict, outcome = self.end
        end = UnwrittenEnd(
            state=verdict.state.value,
            exit_code=verdict.exit_code,
            signal=outcome.signal,
            path=str(path),
            error=self.trouble.last_error.get(what, "unknown error"),
        )
        note(UNWRITTEN_END + encode(end).decode("utf-8", "replace"))


def make_child(manifest: Manifest, paths: RunPaths, hooks: ChildHooks) -> Child:
    """The child adapter for the manifest's runner kind."""
    env = child_env(os.environ, manifest, paths.root)
    if manifest.agent.runner == "pi":  # (imported for a pi child only: an external CLI never needs it)
        from pisub.children.pi.rpc import PiChild

        return PiChild(0, hooks, manifest, paths, env)
    if manifest.agent.runner != "external-cli":
        raise KeyError(manifest.agent.runner)
    from pisub.children.external_cli import ExternalCliChild

    return ExternalCliChild(0, hooks, manifest, paths, env)


def _untaken_reasons() -> tuple[str, ...]:
    """The reasons a pi child gives for a steer it dropped at an interrupt: the run may keep
    those for its next resume."""
    from pisub.children.pi.rpc import INTERRUPTED_REASON
    from pisub.children.pi.steers import CLEARED_REASON

    return (CLEARED_REASON, INTERRUPTED_REASON)
