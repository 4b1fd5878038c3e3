"""Briefs: follow-ups for a finished pi run, delivered by its next resume.

``pisub follow-up`` on a finished run stores ``<run>/briefs/<id>.json`` (at most
:data:`MAX_BRIEFS`, oldest first) and answers with a ``scheduled`` receipt in the run's
outbox. The runner of the next resume, holding the session's lease, prepends them to its
first prompt, moves them to ``briefs/delivered/`` and marks their receipts ``delivered``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pisub.core.fsio import atomic_write, listdir, load_json, private_mkdir, rename
from pisub.errors import InvalidInput, ProtocolError, storage_error
from pisub.protocol.codec import encode_pretty, now_iso
from pisub.protocol.control import Receipt, ReceiptState, advance
from pisub.protocol.lease import Brief
from pisub.protocol.status import Status
from pisub.store.leases import unleased
from pisub.store.mailbox import make_receipt, new_request_id, quarantine, read_receipt_safe, write_receipt
from pisub.store.paths import RunPaths

MAX_BRIEFS = 20
MAX_BRIEF_FILE = 512 * 1024


def pending_briefs(paths: RunPaths) -> list[Brief]:
    """Briefs waiting for the next resume, oldest first. An entry that is not a readable brief
    (a directory, symlink, FIFO, garbage) is moved to ``quarantine/`` with its reason."""
    directory = paths.briefs
    try:
        names = sorted(n for n in listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(exc, "list", directory) from exc
    briefs = []
    for name in names:
        try:
            brief = load_json(directory / name, Brief, limit=MAX_BRIEF_FILE)
        except FileNotFoundError:
            continue
        except ProtocolError as exc:
            quarantine(paths, directory / name, f"unreadable brief: {exc}")
            continue
        if brief.id != name[: -len(".json")]:
            quarantine(paths, directory / name, f"brief id {brief.id!r} does not match its file name")
            continue
        briefs.append(brief)
    return briefs


def add_brief(paths: RunPaths, leases_dir: Path, session_file: str, run_id: str, message: str) -> Receipt:
    """Store a brief for the next resume; its ``scheduled`` receipt.

    Raises:
        InvalidInput: the message is blank or the run already holds 20 briefs.
        LeaseHeld: a live run drives the session right now (steer that run instead).
    """
    if not message.strip():
        raise InvalidInput("the message is blank")
    with unleased(leases_dir, session_file) as generation:
        if len(pending_briefs(paths)) >= MAX_BRIEFS:
            raise InvalidInput(f"run {run_id} already holds {MAX_BRIEFS} briefs; resume it first")
        directory = paths.briefs
        private_mkdir(directory)
        rid = new_request_id()
        brief = Brief(v=1, id=rid, message=message, created_at=now_iso(), generation=generation)
        atomic_write(directory / f"{rid}.json", encode_pretty(brief))
        receipt = make_receipt(
            run_id, rid, "follow_up", ReceiptState.SCHEDULED, reason="stored as a brief for the next resume"
        )
        write_receipt(paths, receipt)
        return receipt


BRIEFS_ONLY_TASK = "Carry on with the follow-ups above."
"""The task of a resume given no message (``pisub resume RUN``): the briefs are the next turn."""


CARRIED_REASON = "carried to the next resume"
"""The start of the reason of a steer kept as a brief when its run ended before pi took it."""


def carry_brief(paths: RunPaths, request_id: str, message: str, generation: int) -> str | None:
    """Keep an undelivered steer of a run that is ending as a brief for its next resume (the
    caller, the run's runner, holds the session's lease, fenced); None when kept, else why not.

    Raises:
        StorageError: the brief could not be written.
    """
    if len(pending_briefs(paths)) >= MAX_BRIEFS:
        return f"the run already holds {MAX_BRIEFS} briefs"
    directory = paths.briefs
    private_mkdir(directory)
    brief = Brief(v=1, id=request_id, message=message, created_at=now_iso(), generation=generation)
    atomic_write(directory / f"{request_id}.json", encode_pretty(brief))
    return None


def with_carried_answers(paths: RunPaths, status: Status) -> Status:
    """An ended run's status as its receipts tell of the steers it carried to the next resume:
    each the resume took (its receipt final) is shown as its receipt says — its ledger entry
    ``delivered`` with ``replacementRunId``, counted under ``delivered`` (or ``failed``) rather
    than ``carried``. ``status.json`` is not rewritten (only a run's runner writes it, and it has
    ended): the resume answers the receipt, and readers read it (spec/protocol.md "Closing")."""
    ledger = status.steering
    if not ledger.carried:
        return status
    for entry in ledger.recent:
        if entry.state is not ReceiptState.SCHEDULED:
            continue
        receipt = read_receipt_safe(paths, entry.id)
        if receipt is None or not receipt.state.is_final:
            continue
        entry.state = receipt.state
        entry.updated_at = receipt.updated_at
        entry.replacement_run_id = receipt.replacement_run_id
        ledger.carried = max(0, ledger.carried - 1)
        if receipt.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
            ledger.delivered += 1
        else:
            ledger.failed += 1
    return status


def compose(briefs: list[Brief], message: str) -> str:
    """The first prompt of a resume: the briefs, oldest first, then the message."""
    if not briefs:
        return message
    lines = ["Follow-ups that were queued for you while you were away:"]
    lines += [f"{n}. {b.message}" for n, b in enumerate(briefs, start=1)]
    return "\n".join(lines) + "\n\n" + message


def mark_delivered(paths: RunPaths, briefs: list[Brief], replacement_run_id: str) -> None:
    """Move delivered briefs aside and mark their receipts (caller holds the lease, fenced)."""
    if not briefs:
        return
    delivered = paths.briefs_delivered
    private_mkdir(delivered)
    for brief in briefs:
        with contextlib.suppress(FileNotFoundError):
            rename(paths.briefs / f"{brief.id}.json", delivered / f"{brief.id}.json")
        receipt = read_receipt_safe(paths, brief.id)
        if receipt is None or not advance(
            receipt, ReceiptState.DELIVERED, f"delivered with resume {replacement_run_id}"
        ):
            continue
        receipt.replacement_run_id = replacement_run_id
        write_receipt(paths, receipt)
