"""A workflow's ``runs.host`` steps: the permit checked, each command journaled before it runs
and once it ends, run in a worker thread of its own (never on the script's loop or the
coordinator's), shown in ``status.hostSteps`` and the events, and ended with the workflow.

A resumed workflow answers a key whose end is journaled from the journal (the command never
runs again); a command its coordinator died under is run once more (recorded), a second time
not (``spec/resources.md``).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pisub.core.redact import redact
from pisub.errors import HostCommandFailed, InvalidInput, storage_error
from pisub.protocol.codec import now_iso
from pisub.protocol.host import HostParams, HostReason, HostResult, HostState
from pisub.protocol.status import HostStepStatus
from pisub.workflow.calls import check_key, fingerprint
from pisub.workflow.entries import ChildTable
from pisub.workflow.futures import ChildFuture, call_soon
from pisub.workflow.host import Outcome, check_params, result_json, run_host

RAW_SCRIPT = (
    'runs.host is only available to named workflow resources (workflow: "run-ci"); '
    "a raw script has no host commands"
)


def host_fingerprint(params: HostParams) -> str:
    """The identity of a host call's parameters (apart from any child's: ``host:`` first)."""
    return "host:" + fingerprint(params)


@dataclass
class _Step:
    key: str
    fingerprint: str
    params: HostParams
    row: HostStepStatus
    outcome: Outcome | None = None
    settled: bool = False
    """Its end is posted to the control loop (so shown before anything its answer leads to)."""
    futures: list[tuple[ChildFuture, asyncio.AbstractEventLoop]] = field(default_factory=list)


class HostSteps:
    """The ``runs.host`` steps of one workflow run."""

    def __init__(self, table: ChildTable) -> None:
        self.table = table
        self.rows: list[HostStepStatus] = []
        """``status.hostSteps`` (the coordinator shows this very list)."""
        self.steps: dict[str, _Step] = {}
        self.calls = table.replayed.host_calls
        """Commands started, by this run and the earlier runs of the workflow."""
        self._lock = threading.Lock()
        self._running = 0

    def known(self, key: str) -> bool:
        """``key`` is a host key (of this run, or of the workflow's journal)."""
        with self._lock:
            return key in self.steps or key in self.table.replayed.host

    def busy(self) -> bool:
        """A host command is still running."""
        with self._lock:
            return self._running > 0

    def call(self, key: str, params: Any) -> ChildFuture:
        """``runs.host(key, params)``: a future of the result's JSON (see the module).

        Raises:
            InvalidInput: a raw script, a bad key or parameter, a key or command the permit does
                not list, a key of ``runs.run`` or used with other parameters, the calls used up.
        """
        where = f"runs.host({key!r:.80})"
        permit = self.table.spec.permit
        if permit is None:
            raise InvalidInput(RAW_SCRIPT)
        check_key(key, "runs.host")
        checked = check_params(params, where)
        if permit.keys and key not in permit.keys:
            allowed = ", ".join(permit.keys)
            raise InvalidInput(f"{where}: the key is not permitted by this resource (its keys: {allowed})")
        if checked.command not in permit.commands:
            allowed = "; ".join(permit.commands) or "none"
            raise InvalidInput(
                f"{where}: the command is not permitted by this resource (its commands: {allowed})"
            )
        with self.table.lock:
            if key in self.table.by_key or key in self.table.replayed.keys:
                raise InvalidInput(
                    f"{where}: {key!r} is a runs.run key (runs.run and runs.host share one key namespace)"
                )
        loop = asyncio.get_running_loop()
        future = ChildFuture(loop=loop)
        future.label = f"runs.host({key!r})"
        fp = host_fingerprint(checked)
        with self._lock:
            step = self.steps.get(key)
            if step is not None:
                if step.fingerprint != fp:
                    raise InvalidInput(
                        f"{where}: Duplicate workflow key {key!r} with incompatible launch params: "
                        "it was already used with other parameters"
                    )
            else:
                step = self._new_step(key, fp, checked, where)
            step.futures.append((future, loop))
            # Answered here once its end is posted (from the journal, at once, or already run);
            # else by its thread, after it posted the end: the row is shown before the script
            # can go on (and end the workflow) on the answer.
            outcome = step.outcome if step.settled else None
        with self.table.lock:
            self.table.tracked.append(future)
        if outcome is not None:
            _resolve(future, outcome)
        return future

    def _new_step(self, key: str, fp: str, params: HostParams, where: str) -> _Step:
        """Register ``key`` (the lock held): answered from the journal, or started."""
        record = self.table.replayed.host.get(key)
        if record is not None and record.fingerprint != fp:
            raise InvalidInput(
                f"{where}: key {key!r} ran in this workflow's earlier run with other parameters; "
                "a resumed workflow must call each key the same way"
            )
        row = HostStepStatus(
            key=key,
            state=HostState.RUNNING.value,
            command=redact(params.command[:200]),
            role=params.role,
            started_at=now_iso(),
        )
        step = _Step(key, fp, params, row)
        settled = record.settled if record is not None else None
        if settled is not None:
            step.outcome = Outcome(settled.result, settled.state, settled.reason, settled.error)
            row.replayed = True
            self._register(step)
            self._show_end(step, replayed=True)
            step.settled = True
            return step
        rerun = record is not None and record.open_starts > 0
        if record is not None and record.open_starts >= 2:
            message = f"{where}: its coordinator died twice while it ran; not run a third time"
            step.outcome = Outcome(
                HostResult(key=key, ok=False), HostState.ERROR, HostReason.INTERRUPTED, message
            )
            self._register(step)
            self._journal_end(step)
            self._show_end(step, replayed=False)
            step.settled = True
            return step
        if self.table.ending is not None:
            step.outcome = Outcome(
                HostResult(key=key, ok=False),
                HostState.CANCELLED,
                HostReason.CANCELLED,
                f"{where}: not started: the workflow is ending",
            )
            self._register(step)
            self._show_end(step, replayed=False)
            step.settled = True
            return step
        assert self.table.spec.permit is not None
        if self.calls >= self.table.spec.permit.max_calls:
            raise InvalidInput(
                f"{where}: at most {self.table.spec.permit.max_calls} host commands per workflow "
                "(its earlier runs count)"
            )
        try:
            self.table.journal.host_started(key, fp)
        except OSError as exc:  # not journaled: not run (a resume could not know it ran)
            raise storage_error(exc, "journal the host step in", self.table.journal.path) from None
        self.calls += 1
        self._running += 1
        self._register(step)
        self.table.host.post(lambda: self._show_start(step, rerun))
        threading.Thread(target=self._work, args=(step,), name=f"host-{key}", daemon=True).start()
        return step

    def _register(self, step: _Step) -> None:
        self.steps[step.key] = step
        self.table.host.post(lambda: self.rows.append(step.row))

    def _show_start(self, step: _Step, rerun: bool) -> None:
        # rerun: its coordinator died while it ran, so it runs once more
        self.table.host.event(
            "workflow.host_started",
            key=step.key,
            command=step.row.command,
            role=step.params.role,
            rerun=rerun,
        )
        self.table.host.commit()

    def _work(self, step: _Step) -> None:
        run_id = self.table.manifest.run_id
        try:
            outcome = run_host(
                step.key,
                step.params,
                cwd=Path(self.table.manifest.cwd),
                log=self.table.home.run(run_id).host_dir / f"{step.key}.log",
                should_stop=lambda: self.table.ending is not None,
                home=self.table.home,
            )
        except Exception as exc:  # never lose the step: it fails with the reason
            outcome = Outcome(
                HostResult(key=step.key, ok=False),
                HostState.ERROR,
                HostReason.START,
                f"runs.host({step.key!r}): {type(exc).__name__}: {exc}",
            )
        step.outcome = outcome
        self._journal_end(step)
        self._show_end(step, replayed=False)
        with self._lock:
            self._running -= 1
            step.settled = True
            futures = list(step.futures)
        for future, loop in futures:
            call_soon(loop, _resolve, future, outcome)

    def _journal_end(self, step: _Step) -> None:
        outcome = step.outcome
        assert outcome is not None
        try:
            self.table.journal.host_ended(
                step.key,
                step.fingerprint,
                outcome.result,
                outcome.state,
                outcome.reason,
                outcome.error,
                settled=outcome.state is not HostState.CANCELLED,
            )
        except (OSError, ValueError) as exc:
            trouble = OSError(0, str(exc))
            self.table.host.post(lambda: self.table.host.trouble("journal a host step's end", trouble))

    def _show_end(self, step: _Step, *, replayed: bool) -> None:
        outcome = step.outcome
        assert outcome is not None
        row = step.row

        def show() -> None:
            row.state = outcome.state.value
            row.reason_code = outcome.reason.value if outcome.reason is not None else None
            row.exit_code = outcome.result.exit_code
            row.report_path = outcome.result.report_path
            row.log_path = outcome.result.log_path
            row.ended_at = now_iso()
            kind = "workflow.host_replayed" if replayed else "workflow.host_ended"
            self.table.host.event(
                kind,
                key=step.key,
                state=row.state,
                reasonCode=row.reason_code,
                exitCode=row.exit_code,
                durationMs=outcome.result.duration_ms,
                reportPath=row.report_path,
            )
            self.table.host.commit()

        self.table.host.post(show)


def _resolve(future: ChildFuture, outcome: Outcome) -> None:
    if future.done():
        return
    if outcome.state is HostState.DONE:
        future.set_result(result_json(outcome.result))
    else:
        future.set_exception(HostCommandFailed(outcome.error or f"runs.host: {outcome.state.value}"))
