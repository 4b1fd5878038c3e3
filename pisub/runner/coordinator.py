"""The workflow run mode: a detached coordinator that starts many child runs.

One thread runs the control loop (like a single run's supervisor: one selector over the signal
pipe, the inbox watch, the children's inotify descriptor and a wake-up pipe); the workflow's
``main`` runs in a thread of its own (:mod:`pisub.workflow.script`), child runners are started
by launch threads (one per start under way, up to the workflow's concurrency). Every child is a
real run (:mod:`pisub.runs.launch`) with its own runner; the coordinator journals each start
before it creates the run and each end once it has the result (:mod:`pisub.store.journal`; the
starts, ends and creations found in one turn of the loop share one fsync), mirrors the
children's progress into its ``steps[]``, forwards control requests to them, and writes the
workflow's result when ``main`` has returned and every child has ended.

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
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pisub.core.redact import redact
from pisub.errors import PisubError
from pisub.protocol.budget import UsageTotals
from pisub.protocol.codec import encode, now_iso
from pisub.protocol.control import Interrupt, ReceiptState, Request, Stop
from pisub.protocol.env import ENV_RUN_DIR
from pisub.protocol.manifest import Manifest
from pisub.protocol.result import Details, ErrorCode, ErrorInfo, Result, TextContent
from pisub.protocol.status import RunState
from pisub.protocol.workflow import Shape
from pisub.runner.lifecycle import drain
from pisub.runner.recorder import note
from pisub.runner.shell import Report, RunShell
from pisub.runner.tree import ProcessTree
from pisub.store.journal import Journal, replay
from pisub.store.lineage import markers
from pisub.store.paths import RunPaths
from pisub.store.results import cut_result_text
from pisub.store.spawn_budget import SpawnBudget
from pisub.workflow.children import ChildRuns
from pisub.workflow.forwarding import Forwarded
from pisub.workflow.lost_keys import recover_lost_keys

if TYPE_CHECKING:
    from pisub.protocol.status import Status
    from pisub.runner.script_output import ScriptOutput
    from pisub.runner.workflow_dispatch import WorkflowDispatcher
    from pisub.store.shared_state import StateNamespace
    from pisub.workflow.script import ScriptThread

STOP_WAIT_S = 60.0
"""How long the coordinator waits for its children to end after it asked them to stop."""

MAX_ERROR_CHARS = 8000
"""The longest error message a workflow records (a script may raise a huge one)."""

SCRIPT_GRACE_S = 5.0
"""How long a cancelled script may take to return once its children have ended."""


class Ending(enum.Enum):
    """Why the workflow ends (the first one decides)."""

    RETURNED = "returned"
    STOP = "stop"
    SIGNAL = "signal"
    TIMEOUT = "timeout"
    FAILED = "failed"
    """The script raised, did not load, or left calls un-awaited."""
    INTERRUPT = "interrupt"


class Coordinator(RunShell["WorkflowDispatcher"]):
    """Runs one workflow run to its end."""

    LEASED = "journal's lease"
    OPEN_AT_END = "the workflow ended before the request was answered"

    def __init__(
        self, paths: RunPaths, manifest: Manifest, report: Report, *, tree: ProcessTree | None = None
    ) -> None:
        super().__init__(paths, manifest, report, tree)
        assert manifest.workflow is not None
        self.spec = manifest.workflow
        self.home = paths.home
        self.children: ChildRuns | None = None
        self.posted: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self.wake_r, selectors.EVENT_READ, lambda _mask: drain(self.wake_r))
        self.script: ScriptThread | None = None
        self.script_result: tuple[Any, BaseException | None] | None = None
        self.ending: Ending | None = None
        self.end_error: ErrorInfo | None = None
        self.end_text: str | None = None
        """The whole failure's text (``end_error`` holds its first :data:`MAX_ERROR_CHARS`): the
        result's text, cut as a result's text is."""
        self.return_text = ""
        self.ending_since: float | None = None
        self.children_ended_at: float | None = None
        self.replay_skipped = 0
        """Journal lines the replay could not read (an event once the run started)."""
        self.script_output: ScriptOutput | None = None
        self.state_store: StateNamespace | None = None
        """What the script's ``state`` reads and writes (None: it has no ``state``)."""

    # == the run (the shell's hooks) ========================================================
    def run(self) -> int:
        """Coordinate the workflow to its end; the runner's exit code."""
        try:
            return super().run()
        finally:
            if self.script_output is not None:
                self.script_output.close()

    def _abandon(self) -> None:
        note("the coordinator is failing: asking its children to stop")
        if self.children is not None:
            with contextlib.suppress(Exception):
                self.children.end_all(Stop)

    def _begin(self) -> None:
        self._capture_script_output()
        self._start_script()

    def _prepare(self, status: Status) -> bool:
        from pisub.errors import LeaseHeld

        try:
            self._take_lease(self.spec.journal)
            replayed = replay(Path(self.spec.journal))
            recover_lost_keys(self.home, self.spec.journal, replayed)
            journal = Journal(Path(self.spec.journal))
            journal.owned_by(self.manifest.run_id)
        except (LeaseHeld, PisubError, OSError) as exc:
            self._fail_startup(f"cannot take over the workflow's journal: {exc}")
            return False
        try:
            self._create_usage_budget()
        except (PisubError, OSError) as exc:
            self._fail_startup(f"cannot set the usage budget: {exc}")
            return False
        try:  # before anything runs: every run started inside the tree from now on is charged
            SpawnBudget(self.home.budgets, self.spec.budget, self.spec.max_spawns).ensure()
        except PisubError as exc:
            self._fail_startup(f"cannot set the spawn budget: {exc.message}")
            return False
        try:
            self.state_store = self._state_store()
        except (PisubError, OSError) as exc:
            self._fail_startup(f"cannot open the workflow's state: {exc}")
            return False
        self.children = ChildRuns(self, self.home, self.manifest, status.steps, journal, replayed)
        status.host_steps = self.children.hosts.rows  # runs.host's rows (spec/resources.md)
        self.children.prestart_zygote()  # its imports overlap the rest of this start
        if self.children.watch.fd is not None:
            self.sel.register(self.children.watch.fd, selectors.EVENT_READ, lambda _mask: None)
        self.replay_skipped = replayed.skipped
        return True

    def _start(self) -> bool:
        assert self.lease is not None
        # The script runs in this process: what it starts (a process, pisub.launch) carries this
        # run's markers, like any run's child — a run it launches is this run's child run.
        os.environ.update(
            markers(
                self.manifest.run_id, self.manifest.root_run_id, self.manifest.depth, self.manifest.max_depth
            )
        )
        os.environ[ENV_RUN_DIR] = str(self.paths.root)
        self.event("run.started", pid=os.getpid())
        self.event("lease.acquired", generation=self.lease.generation, journal=self.spec.journal)
        if self.replay_skipped:
            self.event("workflow.journal_skipped", lines=self.replay_skipped)
        return True

    def _state_store(self) -> StateNamespace | None:
        """The script's ``state``: the ``--state-ns`` namespace when given, else its mission's
        (``spec/missions.md``), else none (``mission: false``)."""
        from pisub.store.shared_state import StateNamespace

        if self.spec.state_ns is not None:
            return StateNamespace(self.home.state, self.spec.state_ns)
        if self.spec.mission_id is not None and self.spec.mission_project is not None:
            from pisub.store.missions import MissionStore

            return MissionStore(self.home, self.spec.mission_project).state(self.spec.mission_id)
        return None

    def _create_usage_budget(self) -> None:
        """A top-level workflow's usage budget, with the per-child estimate of the config."""
        if self.spec.usage_budget is None:
            return
        from pisub import defaults
        from pisub.store.config import load_config
        from pisub.store.usage_budget import UsageBudget

        configured = load_config(self.home.root).budgets
        UsageBudget(self.home.budgets, self.spec.budget).create(
            self.spec.usage_budget,
            configured.usage_estimate_tokens or defaults.USAGE_ESTIMATE_TOKENS,
            configured.usage_estimate_cost_usd or defaults.USAGE_ESTIMATE_COST_USD,
        )

    def _write_failed_start(self, message: str) -> None:
        self.end_error = ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message)
        self.ending = Ending.FAILED
        self._write_end()

    def _dispatcher_class(self) -> type[WorkflowDispatcher]:
        from pisub.runner.workflow_dispatch import WorkflowDispatcher

        return WorkflowDispatcher

    def _capture_script_output(self) -> None:
        """The script's prints go to ``script.log``, capped, from now on (never to runner.log)."""
        from pisub.runner.script_output import ScriptOutput

        output = ScriptOutput(self.paths.script_log, self.limits.output_cap, self._script_output_capped)
        try:
            output.start()
        except OSError as exc:
            self.trouble("capture the script's output", exc)
            return
        self.script_output = output

    def _script_output_capped(self, cap: int) -> None:
        """From the output's reader thread: the cap was reached (said once, on the loop)."""
        path = str(self.paths.script_log)
        self.post(lambda: self.event("workflow.script_output_capped", cap=cap, path=path))

    def _report_script_output(self) -> None:
        """What the script printed past the cap: counted in one event before the result."""
        output = self.script_output
        if output is None:
            return
        output.flush()
        if output.dropped:
            self.event(
                "workflow.script_output_dropped",
                cap=output.sink.cap,
                kept=output.sink.written,
                dropped=output.dropped,
                path=str(self.paths.script_log),
            )

    def _start_script(self) -> None:
        from pisub.workflow.api import Runs, State
        from pisub.workflow.script import MainFn, ScriptThread

        state = State(self.state_store) if self.state_store is not None else None
        assert self.children is not None
        runs = Runs(self.children)
        spec, script, name = self.spec, self._script_copy, self._script_name

        def load() -> MainFn:
            if spec.shape == Shape.WORKFLOW:
                from pisub.workflow.languages import replay_seed, runtime

                return runtime(spec.language).load(script, name, replay_seed(spec.journal))
            from pisub.workflow.shapes import shape_main

            return shape_main(spec)

        self.script = ScriptThread(load, (runs, state, dict(self.spec.args)), self._script_done)
        self.event("workflow.started", shape=self.spec.shape.value)
        self.script.start()

    def _script_done(self, value: Any, error: BaseException | None) -> None:
        """Called from the script's thread."""
        self.post(lambda: self._script_finished(value, error))

    @property
    def _script_copy(self) -> Path:
        """The run's copy of its script (``workflow.py`` or ``workflow.js``)."""
        return self.paths.root / self.spec.language.copy_name

    @property
    def _script_name(self) -> str:
        """The script's own file name in messages (``workflowScript`` for an inline script)."""
        if self.spec.script == "-":
            return "workflowScript"
        return Path(self.spec.script).name if self.spec.script else self.spec.language.copy_name

    # == the loop ======================================================================
    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the control loop (from any thread)."""
        self.posted.put(fn)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.wake_w, b"w")

    def _tend(self, now: float) -> bool:
        # What the children's threads posted and what the checks found are recorded as one
        # batch: the journal's fsync once for every end and creation among them (not per child).
        with self.children.batch() if self.children is not None else contextlib.nullcontext():
            self._run_posted()
            self._check_limits(now)
            self._tend_children(now)
        self._scan_inbox(now)
        return self._done(now)

    def _run_posted(self) -> None:
        while True:
            try:
                fn = self.posted.get_nowait()
            except queue.Empty:
                return
            fn()

    def _due(self, now: float) -> list[float]:
        due = []
        if self.children is not None:
            due.append(self.children.next_poll - now)
        if self.limits.timeout is not None and self.ending is None:
            due.append(self.started + self.limits.timeout - now)
        if self.ending_since is not None:
            due.append(0.2)
        return due

    def _check_limits(self, now: float) -> None:
        if self.signalled is not None and self.ending is None:
            self._end(Ending.SIGNAL, f"Workflow stopped: the runner received signal {self.signalled}.")
        timeout = self.limits.timeout
        if timeout is not None and self.ending is None and now >= self.started + timeout:
            self._end(Ending.TIMEOUT, f"Workflow exceeded maximum runtime after {timeout:g}s.")

    def _tend_children(self, now: float) -> None:
        if self.children is not None:
            if self.ending is None:
                self.children.launch_waiting()
            self.children.check(now)

    def _done(self, now: float) -> bool:
        """Whether the workflow may finish: it is ending, its children have ended (or did not
        end in time after it asked them to), and ``main`` has returned (or ignored its cancel
        for :data:`SCRIPT_GRACE_S`)."""
        if self.ending is None or self.ending_since is None:
            return False
        if self.children is not None and (self.children.active() or self.children.hosts.busy()):
            if now - self.ending_since <= STOP_WAIT_S:
                return False
            self.children.give_up("the child did not end in time after the workflow asked it to")
        if self.script_result is not None:
            return True
        if self.children_ended_at is None:
            self.children_ended_at = now
        return now - self.children_ended_at > SCRIPT_GRACE_S

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
            self.end_error = ErrorInfo(
                code=code, message=redact(message[: MAX_ERROR_CHARS * 4])[:MAX_ERROR_CHARS]
            )
            self.end_text = message
        self.event("workflow.ending", reason=why.name.lower(), message=message)
        if why is not Ending.RETURNED and self.script is not None:
            self.script.cancel()
        if self.children is not None:
            self.children.end_all(Interrupt if why is Ending.INTERRUPT else Stop)
            if why in (Ending.RETURNED, Ending.STOP, Ending.SIGNAL, Ending.TIMEOUT):
                self.children.stop_orphans()

    def _script_finished(self, value: Any, error: BaseException | None) -> None:
        self.script_result = (value, error)
        if self.ending is not None:
            return
        if error is not None:
            from pisub.errors import WorkflowFailed
            from pisub.workflow.script import describe

            if isinstance(error, WorkflowFailed):
                self.return_text = error.text if isinstance(error.text, str) else ""
                self._end(Ending.FAILED, error.message, getattr(error, "origin", None))
            elif isinstance(error, asyncio.CancelledError):
                self._end(Ending.FAILED, "the workflow's main was cancelled")
            else:
                where = describe(error, self._script_copy, self._script_name)
                # A pisub error the script let through keeps its code (RUN_FANOUT_LIMIT, ...).
                code = error.code if isinstance(error, PisubError) else None
                self._end(Ending.FAILED, f"the workflow failed: {where}", code)
            return
        leftovers = self.children.leftovers() if self.children is not None else []
        if leftovers:
            self._end(Ending.FAILED, "main returned before these calls were awaited: " + ", ".join(leftovers))
            return
        try:
            self.return_text = _returned_text(value)
        except PisubError as exc:
            self._end(Ending.FAILED, f"main returned a value that is not JSON: {exc.message}")
            return
        never_ran = self.children.never_ran() if self.children is not None else []
        if never_ran:  # its result would hold a child that did not run: never complete
            self._end(
                Ending.FAILED,
                f"these children never started (their launch did not get to their start): "
                f"{', '.join(never_ran)}; `pisub resume {self.manifest.run_id}` starts them",
            )
            return
        self._end(Ending.RETURNED)

    def _conclude(self) -> RunState:
        if self.children is not None:
            self.children.dismiss_zygote()
        self._dismiss_spares()
        with contextlib.suppress(Exception):
            self._end_leftovers()  # anything the script itself started
        state = self._final_state()
        note(f"the workflow ends {state.value}" + (f": {self.end_error.message}" if self.end_error else ""))
        self._report_script_output()
        return state

    def _end_leftovers(self) -> None:
        """End what is left below the coordinator (TERM, grace, KILL), but not its children's
        runners: they were re-parented to it (its subreaper) and, once their child has ended,
        are only exiting. One that is exiting no longer shows what run it is (its environment
        and working directory are gone from /proc), so it is recognised by the pid its run's
        terminal status names (or by the kernel's exiting flag), and not waited for: the
        workflow's end goes on beside it (it ended its own child's tree before that status)."""
        from pisub.core.procs import kill_all
        from pisub.runner.tree import Subreaper

        tree = self.tree
        if not isinstance(tree, Subreaper) or self.children is None:
            tree.end_leftovers(None, self.limits.grace)
            return
        tree.reap(None)  # the runners that have exited already
        strays = tree.strays(spare=self.children.ended_runners())
        if strays:
            kill_all(strays, grace=self.limits.grace)
        tree.reap(None)

    @staticmethod
    def _dismiss_spares() -> None:
        """The warm runner kept for a next child start goes now (no child starts any more),
        rather than as a leftover ended with the rest."""
        from pisub.backends import warm

        with contextlib.suppress(Exception):
            warm.dismiss_all()

    def _final_state(self) -> RunState:
        return {
            Ending.RETURNED: RunState.COMPLETE,
            Ending.STOP: RunState.STOPPED,
            Ending.SIGNAL: RunState.STOPPED,
            Ending.INTERRUPT: RunState.PAUSED,
        }.get(Ending.FAILED if self.ending is None else self.ending, RunState.FAILED)

    def _result(self) -> Result:
        state = self._final_state()
        if state is RunState.STOPPED and self.end_error is None:
            self.end_error = ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message="Workflow stopped by request.")
        singles = self.children.results() if self.children is not None else []
        if self.children is not None:
            self.children.close()  # nothing of the workflow runs any more
        error = self.end_error
        if state is RunState.COMPLETE:
            text = self.return_text
        elif error is not None:
            text = f"{error.code}: {self.end_text if self.end_text is not None else error.message}"
            if self.return_text:
                text += "\n\n" + self.return_text
        else:
            text = f"Workflow {state.value}."
        text, cut = cut_result_text(text, self.paths.result_text, self.limits.output_cap)
        if state is RunState.COMPLETE and error is None:
            error = cut  # the text was cut (SUBAGENT_OUTPUT_TRUNCATED), as a single run's output
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

    def _settle(self, status: Status) -> dict[str, object]:
        status.error = self.end_error
        return {}

    # == control (called by the dispatcher, on the loop) ======================================
    def route(self, child: int | None) -> list[int] | str:
        if self.children is None:
            return "the workflow has no children"
        return self.children.route(child)

    def forward(self, index: int, request_id: str, request: Request) -> Forwarded:
        assert self.children is not None
        return self.children.forward(index, request_id, request)

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

    # == bookkeeping ===================================================================
    def receipt_moved(self, request_id: str, index: int, state: ReceiptState, reason: str | None) -> None:
        if self.dispatcher is not None:
            self.dispatcher.update_target(request_id, index, state, reason)

    def usage(self, totals: UsageTotals) -> None:
        if self.recorder is None:
            return
        before = self.recorder.status.usage
        self.recorder.status.usage = totals
        for flag, event in (
            ("soft_reached", "budget.usage_soft_reached"),
            ("hard_reached", "budget.usage_spent"),
        ):
            if getattr(totals, flag) and not (before is not None and getattr(before, flag)):
                self.event(event, tokens=totals.tokens, costUsd=totals.cost_usd)


def _returned_text(value: Any) -> str:
    """What ``main`` returned, as the result's text: a string as it is, anything else as JSON —
    whole, of any size: the result shows its head, ``result.txt`` keeps it
    (:func:`~pisub.store.results.cut_result_text`).

    Raises:
        InvalidInput: it is not JSON.
    """
    from pisub.store.shared_state import plain_json

    if isinstance(value, str):
        return value
    return encode(plain_json(value, "the value")).decode("utf-8")
