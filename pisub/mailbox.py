"""The control inbox and outbox of a run, as files (Maildir-style).

Writers create a request in ``inbox/tmp/`` and rename it into ``inbox/new/<name>.json``.
The runner claims a request by renaming it into ``inbox/cur/`` and answers it with exactly
one receipt, ``outbox/<id>.json``, replaced atomically as the request advances. Invalid
requests end in ``inbox/rejected/`` beside a ``<name>.reason`` file. When the run
finishes, the runner writes the tombstone ``inbox/closed`` and answers whatever is left.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import stat
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pisub.errors import InvalidInput, PisubError
from pisub.fsio import atomic_write, fsync_dir, read_bytes
from pisub.paths import RunPaths
from pisub.protocol.codec import decode, encode, encode_pretty, now_iso
from pisub.protocol.control import (
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    REQUEST_ID_RE,
    FollowUp,
    Receipt,
    ReceiptState,
    Request,
    Steer,
    Target,
    decode_request,
    request_type,
)

CLOSED = "closed"
"""The tombstone in ``inbox/``: the runner no longer consumes requests."""

FINISHED_REASON = "the run finished before the request was consumed"


def inbox_dir(paths: RunPaths, box: str) -> Path:
    return paths.inbox / box


def receipt_path(paths: RunPaths, request_id: str) -> Path:
    return paths.outbox / f"{request_id}.json"


_sequence = itertools.count()


def new_request_id() -> str:
    """A unique id that sorts in write order for one writer: ``<ms>-<pid>-<seq>-<random>``."""
    return f"{time.time_ns() // 1_000_000:013d}-{os.getpid()}-{next(_sequence):06d}-{os.urandom(2).hex()}"


def recovery_claim(paths: RunPaths) -> str | None:
    """The request id named by the run's pause-and-revive claim, if one exists."""
    import json

    try:
        data = json.loads(read_bytes(paths.root / "recovery" / "claim.json", limit=4096))
    except (FileNotFoundError, ValueError):
        return None
    rid = data.get("requestId") if isinstance(data, dict) else None
    return rid if isinstance(rid, str) else None


def is_closed(paths: RunPaths) -> bool:
    return (paths.inbox / CLOSED).exists()


def close_inbox(paths: RunPaths, state: str) -> None:
    """Write the tombstone (runner only)."""
    atomic_write(paths.inbox / CLOSED, f"{now_iso()} {state}\n".encode())


def read_receipt(paths: RunPaths, request_id: str) -> Receipt | None:
    """The receipt of ``request_id``, or None while there is none."""
    try:
        data = read_bytes(receipt_path(paths, request_id), limit=MAX_REQUEST_BYTES)
    except FileNotFoundError:
        return None
    return decode(data, Receipt, f"receipt {request_id}")


def encode_receipt(receipt: Receipt) -> bytes:
    return encode_pretty(receipt)


def write_receipt(paths: RunPaths, receipt: Receipt) -> None:
    """Replace a receipt atomically and durably (fsync file and directory)."""
    atomic_write(receipt_path(paths, receipt.request_id), encode_receipt(receipt))


def make_receipt(
    run_id: str,
    request_id: str,
    type_: str,
    state: ReceiptState,
    *,
    reason: str | None = None,
    targets: list[Target] | None = None,
) -> Receipt:
    now = now_iso()
    return Receipt(
        v=1,
        request_id=request_id,
        run_id=run_id,
        type=type_,
        state=state,
        delivery_status=delivery_status(state),
        targets=targets or [],
        reason=reason,
        created_at=now,
        updated_at=now,
    )


def delivery_status(state: ReceiptState) -> Literal["delivered", "queued"]:
    return "delivered" if state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED) else "queued"


# -- the writer's side -----------------------------------------------------------------


class InboxClosed(PisubError):
    """The run no longer takes requests."""

    code = "RUN_CLOSED"


def write_request(paths: RunPaths, request: Request) -> str:
    """Publish ``request`` into the inbox; its id (``request.id`` or a fresh one).

    If the inbox is closed before the write, nothing is written and :class:`InboxClosed`
    is raised. If it closes right after, the request is withdrawn when the runner has not
    claimed it (and :class:`InboxClosed` raised); otherwise the runner answers it.
    """
    if request.id is None:
        request.id = new_request_id()
    rid = request.id
    if is_closed(paths):
        raise InboxClosed(f"run {paths.run_id} has finished; it takes no more requests")
    tmp = inbox_dir(paths, "tmp") / f"{rid}.{os.urandom(4).hex()}.tmp"
    final = inbox_dir(paths, "new") / f"{rid}.json"
    if receipt_path(paths, rid).exists():
        raise InvalidInput(f"request id {rid!r} was already used in run {paths.run_id}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, encode(request))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        # link, not rename: publishing never replaces an unclaimed request of the same name
        os.link(tmp, final)
    except FileExistsError:
        raise InvalidInput(f"request id {rid!r} is already waiting in run {paths.run_id}") from None
    finally:
        os.unlink(tmp)
    fsync_dir(final.parent)
    if is_closed(paths) and _withdraw(final):
        raise InboxClosed(f"run {paths.run_id} finished while the request was written; it was withdrawn")
    return rid


def _withdraw(path: Path) -> bool:
    """Take an unclaimed request back; False when the runner already claimed it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


# -- the reader's side (runner and repair) -----------------------------------------------


@dataclass
class Parsed:
    """A request file as read: its id (if one can be read) and the request or what is wrong."""

    name: str
    request_id: str
    request: Request | None
    error: str | None


def receipt_name_for(name: str) -> str:
    """The id used for a file's receipt when it has no readable id of its own."""
    stem = name[: -len(".json")] if name.endswith(".json") else name
    if REQUEST_ID_RE.fullmatch(stem):
        return stem
    return "invalid-" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def parse_request_file(path: Path, name: str | None = None) -> Parsed:
    """Read and validate one claimed request file (never raises for a bad file).

    ``name`` is the name it was published under in ``new/`` (default: its own).
    """
    name = name or path.name
    fallback = receipt_name_for(name)
    if fallback != name[: -len(".json")]:
        return Parsed(name, fallback, None, f"file name {name!r} is not a valid request id")
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            return Parsed(name, fallback, None, "not a regular file (symlinks are not followed)")
        if st.st_uid != os.getuid():
            return Parsed(name, fallback, None, f"owned by uid {st.st_uid}, not by the run's owner")
        if st.st_size > MAX_REQUEST_BYTES:
            return Parsed(name, fallback, None, f"file is larger than {MAX_REQUEST_BYTES} bytes")
        data = read_bytes(path, limit=MAX_REQUEST_BYTES)
    except OSError as exc:
        return Parsed(name, fallback, None, f"cannot read: {exc.strerror or exc}")
    try:
        request = decode_request(data)
    except PisubError as exc:
        return Parsed(name, _id_hint(data) or fallback, None, str(exc))
    if request.id is None:
        request.id = fallback
    problem = _check(request)
    return Parsed(name, request.id, None if problem else request, problem)


def _id_hint(data: bytes) -> str | None:
    """The ``id`` of an invalid request, when one can still be read."""
    import json

    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) and REQUEST_ID_RE.fullmatch(rid) else None


def _check(request: Request) -> str | None:
    if isinstance(request, Steer | FollowUp):
        if not request.message.strip():
            return "`message` is blank - at `$.message`"
        if len(request.message.encode("utf-8")) > MAX_MESSAGE_BYTES:
            return f"`message` is larger than {MAX_MESSAGE_BYTES} bytes - at `$.message`"
    return None


def reject_file(paths: RunPaths, src: Path, reason: str, name: str | None = None) -> None:
    """Move a bad request to ``inbox/rejected/<name>`` with a ``.reason`` file beside it."""
    rejected = inbox_dir(paths, "rejected")
    dest = rejected / (name or src.name)
    if dest.exists():
        dest = rejected / f"{src.name}.{os.urandom(3).hex()}"
    with contextlib.suppress(FileNotFoundError):
        os.rename(src, dest)
    atomic_write(dest.with_name(dest.name + ".reason"), (reason + "\n").encode(), durable=False)


def claim(paths: RunPaths, name: str) -> Path | None:
    """Claim ``inbox/new/<name>`` into ``inbox/cur/``; the claimed path, or None if it is gone.

    A claim is ``link`` into ``cur/`` then ``unlink`` from ``new/``: whoever removes the
    ``new/`` entry wins, so a writer withdrawing its request (by unlinking it) and the runner
    never both own it. Unlike a rename, this makes no "moved from" event in the watched
    ``new/`` folder, so the runner is not woken by its own claims.
    """
    src, dst = inbox_dir(paths, "new") / name, inbox_dir(paths, "cur") / name
    try:
        os.link(src, dst)
    except FileNotFoundError:
        return None
    except FileExistsError:
        # A claim interrupted between link and unlink, or a name published again after its
        # first request was claimed: keep the new file under a name of its own.
        try:
            if os.path.samefile(src, dst):
                os.unlink(src)
                return dst
        except FileNotFoundError:
            return None
        dst = dst.with_name(f"{name}.{os.urandom(3).hex()}")
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return None
        return dst
    try:
        os.unlink(src)
    except FileNotFoundError:  # withdrawn by its writer in the meantime: not ours
        os.unlink(dst)
        return None
    return dst


def pending_files(paths: RunPaths, box: str) -> list[str]:
    """Request file names waiting in ``inbox/<box>/``, in name order."""
    try:
        names = os.listdir(inbox_dir(paths, box))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".json"))


def answer_leftovers(paths: RunPaths, run_id: str, reason: str) -> Counter[str]:
    """Answer every request of a run whose runner is gone; how many got which answer.

    Requests still in ``new/`` are claimed and answered ``failed`` (or ``rejected``);
    claimed requests without a final receipt, and receipts left ``pending`` or
    ``queued``, become ``failed`` with ``reason``. Safe to repeat: a reader that dies halfway
    leaves work that the next one finishes.
    """
    counts: Counter[str] = Counter()
    cur = inbox_dir(paths, "cur")
    recovering = recovery_claim(paths)  # read once, not once per request
    for name in pending_files(paths, "new"):
        claimed = claim(paths, name)
        if claimed is None:
            continue
        counts["claimed"] += 1
        _answer_claimed(paths, run_id, claimed, reason, counts, recovering, fresh=True, name=name)
    for name in pending_files(paths, "cur"):
        _answer_claimed(paths, run_id, cur / name, reason, counts, recovering, fresh=False)
    try:
        receipts = os.listdir(paths.outbox)
    except FileNotFoundError:
        receipts = []
    for name in receipts:
        if name.endswith(".json"):
            rid = name[: -len(".json")]
            receipt = read_receipt_safe(paths, rid)
            counts["failed"] += _fail_if_open(paths, run_id, rid, None, reason, recovering, receipt)
    return counts


def _answer_claimed(
    paths: RunPaths,
    run_id: str,
    path: Path,
    reason: str,
    counts: Counter[str],
    recovering: str | None,
    *,
    fresh: bool,
    name: str | None = None,
) -> None:
    """Answer one claimed request file unless it already has its final answer."""
    parsed = parse_request_file(path, name)
    existing = read_receipt_safe(paths, parsed.request_id)
    if parsed.request is None:
        if existing is None:
            # The receipt first: a crash before the move leaves a claimed file with a final
            # receipt, which the next reader skips.
            write_receipt(
                paths,
                make_receipt(
                    run_id, parsed.request_id, "unknown", ReceiptState.REJECTED, reason=parsed.error
                ),
            )
            counts["rejected"] += 1
        reject_file(paths, path, parsed.error or "invalid", parsed.name)
        return
    if fresh and existing is not None and existing.state.is_final:
        reject_file(
            paths, path, f"duplicate request id {parsed.request_id!r}: it was already used", parsed.name
        )
        return
    type_ = request_type(parsed.request)
    counts["failed"] += _fail_if_open(paths, run_id, parsed.request_id, type_, reason, recovering, existing)


ANSWERED = "answered"
"""Marker in ``inbox/``: every request of the finished run has its final answer."""


def mark_answered(paths: RunPaths) -> None:
    atomic_write(paths.inbox / ANSWERED, b"", durable=False)


def needs_answers(paths: RunPaths) -> bool:
    """Whether a finished run may hold unanswered requests (new files, or an interrupted answer).

    Two ``stat`` calls in the common case: ``inbox/new`` has not changed since the marker was
    written (its mtime is older), so nothing arrived after the last answer.
    """
    return inbox_needs_answers(os.fspath(paths.inbox))


def inbox_needs_answers(inbox: str) -> bool:
    """:func:`needs_answers` for an ``inbox`` path given as a string (the fast path of ``list``)."""
    try:
        marker = os.stat(os.path.join(inbox, ANSWERED)).st_mtime_ns
    except FileNotFoundError:
        return True
    new = os.path.join(inbox, "new")
    if os.stat(new).st_mtime_ns < marker:
        return False
    return any(name.endswith(".json") for name in os.listdir(new))


def settle_closed_inbox(paths: RunPaths, run_id: str, reason: str) -> Counter[str]:
    """Answer what is left in a finished run's inbox (caller holds ``repair.lock``).

    The marker is removed first and written last, so a reader that dies halfway leaves the
    run marked as needing answers.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths.inbox / ANSWERED)
    counts = answer_leftovers(paths, run_id, reason)
    mark_answered(paths)
    return counts


def read_receipt_safe(paths: RunPaths, request_id: str) -> Receipt | None:
    try:
        return read_receipt(paths, request_id)
    except PisubError:
        return None


def _fail_if_open(
    paths: RunPaths,
    run_id: str,
    request_id: str,
    type_: str | None,
    reason: str,
    recovering: str | None,
    receipt: Receipt | None,
) -> int:
    """Fail a request whose ``receipt`` (as already read) is missing or not final; 0 or 1."""
    if request_id == recovering:
        return 0  # pause-and-revive owns it: the recovering process writes its answer
    if receipt is not None and receipt.state.is_final:
        return 0
    if receipt is None:
        if type_ is None:
            return 0
        receipt = make_receipt(run_id, request_id, type_, ReceiptState.FAILED, reason=reason)
    else:
        receipt.state = ReceiptState.FAILED
        receipt.delivery_status = "queued"
        receipt.reason = reason
        receipt.updated_at = now_iso()
        for target in receipt.targets:
            if not target.state.is_final:
                target.state = ReceiptState.FAILED
                target.reason = reason
    write_receipt(paths, receipt)
    return 1
