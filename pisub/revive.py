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
import time
from pathlib import Path

from pisub.client import Run, resume
from pisub.errors import PisubError
from pisub.fsio import create_exclusive, private_mkdir
from pisub.mailbox import InboxClosed, make_receipt, write_receipt
from pisub.protocol.codec import encode, now_iso, parse_iso
from pisub.protocol.control import Receipt, ReceiptState
from pisub.protocol.status import RunState

PAUSE_TIMEOUT_S = 15.0


def claim_path(run: Run) -> Path:
    return run.dir / "recovery" / "claim.json"


def revive(run: Run, request_id: str, message: str) -> Receipt | None:
    """Recover a steer that was not accepted; the request's receipt afterwards.

    Returns None when another process already holds the recovery claim.
    """
    private_mkdir(claim_path(run).parent)
    try:
        create_exclusive(
            claim_path(run), encode({"requestId": request_id, "pid": os.getpid(), "at": now_iso()})
        )
    except FileExistsError:
        return None
    receipt = run.receipt(request_id)
    if receipt is not None and receipt.state in (ReceiptState.QUEUED, ReceiptState.DELIVERED):
        os.unlink(claim_path(run))  # accepted after all: no recovery
        return receipt
    with contextlib.suppress(InboxClosed):
        run.send_interrupt(reason=f"steering recovery for {request_id}", source="steering-recovery")
    status = _wait_paused(run)
    if status is None:
        return _fail(run, request_id, "the run did not pause in time; recovery abandoned (the claim stays)")
    remaining = _remaining_budget(run)
    if remaining is not None and remaining <= 0:
        return _fail(run, request_id, "no runtime budget left to resume the run")
    try:
        replacement = resume(run.id, message, timeout=remaining, home=run.home.root)
    except PisubError as exc:
        return _fail(run, request_id, f"could not resume the run: {exc.message}")
    final = run.receipt(request_id) or make_receipt(run.id, request_id, "steer", ReceiptState.PENDING)
    final.state = ReceiptState.RECOVERED
    final.delivery_status = "delivered"
    final.reason = f"delivered to replacement run {replacement.id}"
    final.replacement_run_id = replacement.id
    final.updated_at = now_iso()
    for target in final.targets:
        target.state = ReceiptState.RECOVERED
        target.reason = final.reason
    write_receipt(run.paths, final)
    return final


def _wait_paused(run: Run) -> RunState | None:
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while time.monotonic() < deadline:
        status = run.status()
        if status.state == RunState.PAUSED and status.ended_at:
            return status.state
        if status.state.is_terminal:
            return None
        time.sleep(0.05)
    return None


def _remaining_budget(run: Run) -> float | None:
    manifest, status = run.manifest(), run.status()
    if manifest.limits.timeout is None:
        return None
    used = parse_iso(status.ended_at or now_iso()) - parse_iso(status.started_at)
    return manifest.limits.timeout - used


def _fail(run: Run, request_id: str, reason: str) -> Receipt:
    receipt = run.receipt(request_id) or make_receipt(run.id, request_id, "steer", ReceiptState.PENDING)
    if receipt.state.is_final:
        return receipt
    receipt.state = ReceiptState.FAILED
    receipt.delivery_status = "queued"
    receipt.reason = reason
    receipt.updated_at = now_iso()
    write_receipt(run.paths, receipt)
    return receipt
