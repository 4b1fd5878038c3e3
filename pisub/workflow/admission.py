"""Admitting a workflow script's calls (from the script's thread): a batch is admitted all or
none — reused keys and journaled results are answered, new children are placed, claimed from
the spawn and usage budgets and queued.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.manifest import Manifest
from pisub.protocol.status import StepState
from pisub.protocol.workflow import ChildCall, ChildResult
from pisub.store.spawn_budget import claim_name
from pisub.workflow import outcomes
from pisub.workflow.calls import fingerprint
from pisub.workflow.entries import ChildEntry, ChildTable, Phase, step_state
from pisub.workflow.launching import Launching
from pisub.workflow.placement import Placement
from pisub.workflow.settling import Settling
from pisub.workflow.stopping import Stopping

if TYPE_CHECKING:
    from pisub.workflow.futures import ChildFuture


@dataclass(eq=False)
class Admission:
    """Admits a workflow script's calls."""

    table: ChildTable
    placement: Placement
    launching: Launching
    settling: Settling
    stopping: Stopping

    def track(self, future: ChildFuture) -> None:
        """Count ``future`` among the script's calls (the leftovers name those never awaited)."""
        with self.table.lock:
            self.table.tracked.append(future)

    def admit(
        self, calls: list[ChildCall], futures: list[ChildFuture], loop: asyncio.AbstractEventLoop, where: str
    ) -> None:
        """Admit a batch of calls (all or none): reused keys and journaled results are answered,
        new children are queued. Called from the script's thread.

        Raises:
            InvalidInput, UnknownAgent, LaunchFailed, UnsupportedPi, DepthExceeded, FanoutLimit:
                nothing of the batch was started.
        """
        self.placement.catalogs.clear()  # agent files are read again for each batch
        with self.table.lock:
            known = {c.key: self.table.by_key.get(c.key or "") for c in calls}
        prepared: list[tuple[ChildCall, str, ChildEntry | None, Any]] = []
        for call in calls:
            assert call.key is not None
            fp = fingerprint(call)
            if self.table.host_keys(call.key):
                raise InvalidInput(
                    f"{where}: {call.key!r} is a runs.host key "
                    "(runs.run and runs.host share one key namespace)"
                )
            existing = known[call.key]
            if existing is not None:
                if existing.fingerprint != fp:
                    raise InvalidInput(
                        f"{where}: Duplicate workflow key {call.key!r} with incompatible launch params: "
                        "it was already used with other parameters (a key names one child)"
                    )
                prepared.append((call, fp, existing, None))
                continue
            prepared.append((call, fp, None, self._prepare(call, fp, where)))
        fresh = [call.key for call, _fp, existing, plan in prepared if existing is None and plan.needs_claim]
        if fresh:
            keys = [k for k in fresh if k is not None]
            names = [claim_name(self.table.spec.journal, k) for k in keys]
            self.table.usage.reserve(names)  # the usage budget first: all or none, like the spawns
            try:
                self.table.budget.claim(self.table.spec.journal, keys)
            except BaseException:
                self.table.usage.release(names)
                raise
        with self.table.lock:
            for (call, fp, existing, plan), future in zip(prepared, futures, strict=True):
                entry = existing if existing is not None else self._register(call, fp, plan)
                self.table.tracked.append(future)
                entry.futures.append((future, loop))
                if entry.result is not None:
                    future.set_result(entry.result)
        self.table.host.post(lambda: None)

    def _prepare(self, call: ChildCall, fp: str, where: str) -> _Plan:
        """How a new key is to be answered: from the journal, by re-attaching, or by a start."""
        assert call.key is not None
        record = self.table.replayed.keys.get(call.key)
        if record is not None and not record.recovered and record.fingerprint != fp:
            raise InvalidInput(
                f"{where}: key {call.key!r} was started by this workflow's earlier run with other "
                "parameters; a resumed workflow must call each key the same way"
            )
        cwd = self.placement.child_cwd(call, where)
        if record is not None and record.settled is not None:
            return _Plan(cwd=cwd, settled=record.settled)
        if record is not None and record.run_id is not None and record.ended is None:
            if self.table.home.run(record.run_id).root.is_dir():
                return _Plan(cwd=cwd, attach=record.run_id)
            if record.created:  # it ran, and its run is gone (pisub gc): never started twice
                why = "the child's run was removed before its end was journaled"
                return _Plan(cwd=cwd, settled=outcomes.failure(call.key, call, why, run_id=record.run_id))
            manifest, seeds = self.placement.plan_start(call, cwd, where, run_id=record.run_id)
            return _Plan(cwd=cwd, manifest=manifest, seeds=seeds, journaled=True)
        manifest, seeds = self.placement.plan_start(call, cwd, where)
        self.placement.preflight(call, cwd, where)
        return _Plan(cwd=cwd, manifest=manifest, seeds=seeds, needs_claim=True)

    def check_same_calls(self, calls: list[ChildCall], where: str, resumed: set[str]) -> None:
        """Each call whose key this workflow already knows (now or from its journal) is the
        same call; for a key in ``resumed`` (its ``resume`` is only known once its predecessor
        ran) every parameter but ``resume`` is compared. Nothing is started.

        Raises:
            InvalidInput: naming the first key called with other parameters.
        """
        for call in calls:
            assert call.key is not None
            with self.table.lock:
                entry = self.table.by_key.get(call.key)
            record = self.table.replayed.keys.get(call.key)
            if entry is not None:
                known_fp, known_resume = entry.fingerprint, entry.call.resume
            elif record is not None and not record.recovered and call.key not in resumed:
                known_fp, known_resume = record.fingerprint, None
            else:
                continue
            same = call if call.key not in resumed else msgspec.structs.replace(call, resume=known_resume)
            if fingerprint(same) != known_fp:
                raise InvalidInput(
                    f"{where}: Duplicate workflow key {call.key!r} with incompatible launch params: "
                    "it was already used with other parameters (a key names one child)"
                )

    def reserve(self, keys: list[str]) -> None:
        """Claim a start from the spawn budget for each of ``keys`` now, all or none (a key
        claimed before costs nothing).

        Raises:
            FanoutLimit: they do not fit; nothing was claimed.
        """
        self.table.budget.claim(self.table.spec.journal, keys)

    def check_agents(self, calls: list[ChildCall], where: str) -> None:
        """Every call's agent exists where its child would run (nothing is started).

        Raises:
            UnknownAgent, InvalidInput: naming ``where`` and the call's key.
        """
        self.placement.catalogs.clear()
        for call in calls:
            try:
                self.placement.catalog(self.placement.child_cwd(call, where)).get(call.agent)
            except PisubError as exc:
                raise type(exc)(f"{where}: {call.key}: {exc.message}") from None

    def _register(self, call: ChildCall, fp: str, plan: _Plan) -> ChildEntry:
        entry = ChildEntry.queued(len(self.table.entries), call, fp, plan.cwd)
        entry.manifest, entry.seeds = plan.manifest, plan.seeds
        early = self.table.unstarted.pop(entry.index, None)  # requests that came before this call
        if early is not None and early.key != entry.key:  # never for a chain's or tasks' order
            why = f"the workflow called {entry.key!r} as child {entry.index}"
            self.table.host.post(partial(self.settling.forwarding.fail_held, entry.index, early.held, why))
            early = None
        step = entry.step
        self.table.entries.append(entry)
        self.table.by_key[entry.key] = entry
        self.table.steps.append(step)
        if plan.settled is not None:
            entry.phase = Phase.ENDED
            entry.result = plan.settled
            entry.run_id = plan.settled.run_id
            step.run_id = entry.run_id
            step.status = step_state(plan.settled.state)
            self.table.host.post(
                lambda: self.table.host.event(
                    "workflow.replayed", entry.index, key=entry.key, runId=entry.run_id
                )
            )
        elif plan.attach is not None:
            entry.run_id = plan.attach
            entry.phase = Phase.RUNNING
            step.run_id = plan.attach
            step.status = StepState.RUNNING
            self.table.by_run[plan.attach] = entry
            self.table.host.post(lambda: self.launching.attached(entry))
        elif plan.skipped:
            pass  # settled by the caller
        elif self.table.ending is not None:
            self.settling.never_started(entry, "the workflow is ending")
        elif early is not None and early.stopped is not None:
            reason = early.stopped or None  # stopped before it was called: it never starts

            def stop() -> None:
                self.stopping.stop_queued(entry, reason)

            self.table.host.post(stop)
        else:
            self.table.waiting.append(entry)
        if early is not None and early.stopped is not None and plan.attach is not None:
            self.table.host.post(lambda: self.stopping.stop_attached(entry, early.stopped or None))
        if early is not None and early.held:
            held = early.held
            self.table.host.post(lambda: self.settling.forwarding.adopt(entry, held))
        return entry

    def skip(self, call: ChildCall, why: str) -> None:
        """Record a call that is never started (a chain's later steps): ``skipped``."""
        assert call.key is not None
        with self.table.lock:  # settled before the loop sees it (what was held for it fails)
            if call.key in self.table.by_key:
                return
            entry = self._register(
                call, fingerprint(call), _Plan(cwd=Path(self.table.manifest.cwd), skipped=True)
            )
            self.settling.settle(
                entry, outcomes.not_started(entry.key, call, "skipped", why), settled=True, journal=False
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
