"""Pause-and-revive: when a plain steer to a running pi child gets no answer in time.

The caller takes a one-time recovery claim (``<run>/recovery/claim.json``, created
exclusively and naming the request), interrupts the run, waits up to
:data:`PAUSE_TIMEOUT_S` for it to reach ``paused``, then resumes its session in a new run
with the steer's text and the remaining runtime budget, and writes the request's final
``recovered`` receipt naming the replacement run. While the claim exists, the finishing
runner leaves that request ``pending`` ("recovery in progress"). If the pause is not
confirmed the claim stays, so a late retry cannot start a second replacement.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pisub.core.fsio import create_exclusive, private_mkdir
from pisub.core.polling import poll
from pisub.errors import PisubError, translating
from pisub.protocol.codec import encode, now_iso, parse_iso
from pisub.protocol.control import Receipt, ReceiptState, RecoveryClaim, advance
from pisub.protocol.status import RunState
from pisub.store.mailbox import InboxClosed, make_receipt, withdraw, write_receipt

if TYPE_CHECKING:
    from pisub.protocol.manifest import Manifest
    from pisub.protocol.status import Status
    from pisub.store.paths import RunPaths


class Run(Protocol):
    """What a revival needs of the run (:class:`pisub.api.client.Run`, which calls this module)."""

    @property
    def id(self) -> str: ...

    @property
    def paths(self) -> RunPaths: ...

    def manifest(self) -> Manifest: ...

    def status(self) -> Status: ...

    def receipt(self, request_id: str) -> Receipt | None: ...

    def send_interrupt(self, *, reason: str | None = None, source: str | None = "pisub") -> str: ...

    def resume(self, message: str, *, timeout: float | None = None) -> Run: ...


PAUSE_TIMEOUT_S = 15.0


def claim_path(run: Run) -> Path:
    return run.paths.recovery_claim


@translating("recover the steer in")
def revive(run: Run, request_id: str, message: str) -> Receipt | None:
    """Recover a steer that was not accepted; the request's receipt afterwards.

    Returns None when another process already holds the recovery claim.
    """
    private_mkdir(claim_path(run).parent)
    try:
        claim = RecoveryClaim(request_id=request_id, pid=os.getpid(), at=now_iso())
        create_exclusive(claim_path(run), encode(claim))
    except FileExistsError:
        return None
    receipt = run.receipt(request_id)
    if receipt is not None and receipt.state in (ReceiptState.QUEUED, ReceiptState.DELIVERED):
        os.unlink(claim_path(run))  # accepted after all: no recovery
        return receipt
    interrupt_id = None
    with contextlib.suppress(InboxClosed):
        interrupt_id = run.send_interrupt(
            reason=f"steering recovery for {request_id}", source="steering-recovery"
        )
    status = _wait_paused(run)
    if status is None:
        return _abandon(run, request_id, interrupt_id)
    remaining = _remaining_budget(run)
    if remaining is not None and remaining <= 0:
        return _fail(run, request_id, "no runtime budget left to resume the run")
    try:
        replacement = run.resume(message, timeout=remaining)
    except PisubError as exc:
        return _fail(run, request_id, f"could not resume the run: {exc.message}")
    final = run.receipt(request_id) or make_receipt(run.id, request_id, "steer", ReceiptState.PENDING)
    if advance(final, ReceiptState.RECOVERED, f"delivered to replacement run {replacement.id}"):
        final.replacement_run_id = replacement.id
        write_receipt(run.paths, final)
    return final


def _abandon(run: Run, request_id: str, interrupt_id: str | None) -> Receipt | None:
    """The run did not pause in time: undo what the recovery started; the steer's receipt."""
    if interrupt_id is not None:
        withdraw(run.paths.inbox / "new" / f"{interrupt_id}.json")  # not paused later, if still unclaimed
    with contextlib.suppress(FileNotFoundError):
        os.unlink(claim_path(run))
    receipt = run.receipt(request_id)
    if receipt is not None and receipt.state.is_open and run.status().state.is_terminal:
        # The runner finished while the claim held this answer back: nobody else will give it.
        return _fail(run, request_id, "the run ended while its steering recovery was abandoned")
    return receipt


def _wait_paused(run: Run) -> RunState | None:
    """``paused`` once the run is paused; None when it ended otherwise or did not pause in time."""

    def settled() -> RunState | bool | None:
        status = run.status()
        if status.state == RunState.PAUSED and status.ended_at:
            return status.state
        return False if status.state.is_terminal else None  # False: ended, but not paused

    got = poll(settled, PAUSE_TIMEOUT_S, interval=0.05)
    return got if isinstance(got, RunState) else None


def _remaining_budget(run: Run) -> float | None:
    manifest, status = run.manifest(), run.status()
    if manifest.limits.timeout is None:
        return None
    used = parse_iso(status.ended_at or now_iso()) - parse_iso(status.started_at)
    return manifest.limits.timeout - used


def _fail(run: Run, request_id: str, reason: str) -> Receipt:
    receipt = run.receipt(request_id) or make_receipt(run.id, request_id, "steer", ReceiptState.PENDING)
    if advance(receipt, ReceiptState.FAILED, reason):
        write_receipt(run.paths, receipt)
    return receipt
