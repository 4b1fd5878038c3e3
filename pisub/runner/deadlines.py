"""One child's deadlines under its run's limits, and what each does when it passes.

The single-run mode (:class:`~pisub.runner.supervise.Supervisor`) waits for the nearest of them:
the runtime and idle timeouts, a tool call past its timeout, an output flood, a signal, the
checkpoint steer before the runtime deadline, the confirmation of an abort, KILL after the TERM's
grace, the drain of the pipes after the child exited. Ending the child is one move: TERM to its
group, then KILL after the grace period; the causes are kept for the verdict
(:func:`pisub.runner.ending.judge`).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from pisub import defaults
from pisub.children.base import Child
from pisub.protocol.manifest import Manifest
from pisub.runner.ending import EndCause
from pisub.runner.recorder import note
from pisub.store.paths import RunPaths

ABORT_CONFIRM_S = 3.0
"""How long pi has to end its work after an abort before it is TERMed."""

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


class Deadlines:
    """The deadlines of one started child (built with it); the supervisor's loop waits for
    the nearest (:meth:`due`) and acts on those that passed (:meth:`check`)."""

    def __init__(
        self, child: Child, manifest: Manifest, paths: RunPaths, started: float, event: Callable[..., None]
    ) -> None:
        self.child = child
        self.limits = manifest.limits
        self.pi = manifest.agent.runner == "pi"
        self.paths = paths
        self.started = started
        self.event = event
        self.last_activity = started
        self.output_total = 0
        self.causes: set[EndCause] = set()
        """Why the child is being ended (the smallest wins the verdict)."""
        self.terminating = False
        self.kill_at: float | None = None
        self.abort_deadline: float | None = None
        self.exited_at: float | None = None
        self.tool_timed_out: tuple[str, float] | None = None
        self.budget_soft_sent = False
        self.budget_hard_noted = False
        self.checkpoint_armed = self.pi and manifest.limits.checkpoint_before_deadline is not None

    def abort_sent(self) -> None:
        """The child was asked to abort its work: it has :data:`ABORT_CONFIRM_S` before it is
        ended (a second interrupt does not postpone the escalation)."""
        if self.abort_deadline is None:
            self.abort_deadline = time.monotonic() + ABORT_CONFIRM_S

    def due(self, signalled: int | None) -> dict[Deadline, float]:
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
            tool = self.tool_deadline()
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
        if signalled is not None:
            due[Deadline.SIGNAL] = 0.0
        if self.output_total > lim.output_hard_cap:
            due[Deadline.OUTPUT] = 0.0
        if self.abort_deadline is not None:
            due[Deadline.INTERRUPT] = self.abort_deadline
        if self.kill_at is not None:
            due[Deadline.KILL] = self.kill_at
        return due

    def check(self, now: float, signalled: int | None) -> None:
        """Act on every deadline that has passed."""
        for deadline, when in sorted(self.due(signalled).items(), key=lambda item: item[1]):
            if when > now:
                continue
            if deadline is Deadline.KILL:
                self.event("child.killed", 0, reasons=sorted(c.label for c in self.causes))
                self.child.kill()
                self.kill_at = None
            elif deadline is Deadline.INTERRUPT:
                self.abort_deadline = None
                self.end(EndCause.INTERRUPT)
            elif deadline is Deadline.TOOL:
                found = self.tool_deadline()
                if found is not None and found[0] <= now:
                    self.tool_timed_out = (found[1], found[2])
                    self.end(EndCause.TOOL)
            elif deadline is Deadline.CHECKPOINT:
                self.checkpoint_armed = False
                self._checkpoint(now)
            elif deadline is not Deadline.DRAIN:
                self.end(EndCause[deadline.name])

    def tool_deadline(self) -> tuple[float, str, float] | None:
        """The earliest end a running tool call may have (monotonic), its tool and its timeout:
        the run's tool timeout for every tool but the exempt ones, else the fast built-in
        tools' default. Never later than the run's own deadline matters: both apply."""
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

    def watch_tool_budget(self, calls: int) -> None:
        """At the soft limit, nudge the child once with an ordinary steer request (so it has a
        receipt); past the hard limit, note once that pi now blocks the budget's tools."""
        budget = self.limits.tool_budget
        if budget is None or not self.pi:
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

    def end(self, cause: EndCause) -> None:
        """End the child with TERM (to its group), then KILL after the grace period."""
        if cause in self.causes and self.terminating:
            return
        self.causes.add(cause)
        if self.terminating:
            return
        self.terminating = True
        self.event("child.ending", 0, reason=cause.label)
        self.child.terminate()
        self.kill_at = time.monotonic() + self.limits.grace

    # -- the end --------------------------------------------------------------------
