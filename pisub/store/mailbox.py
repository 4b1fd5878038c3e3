"""The control inbox and outbox of a run, as files (Maildir-style).

Writers create a request in ``inbox/tmp/`` and publish it as ``inbox/new/<name>.json``.
The runner claims a request into ``inbox/cur/<key>.json`` and answers it with exactly one
receipt, ``outbox/<id>.json``, replaced atomically as the request advances. Invalid requests
end in ``inbox/rejected/<id>.json`` beside ``<id>.reason``. When the run finishes, the runner
writes the tombstone ``inbox/closed`` and answers whatever is left.

Every entry of ``new/``, ``cur/``, ``rejected/`` and ``outbox/`` may be anything — a directory,
a symlink, a FIFO, a socket, 0 bytes, huge, unreadable, another user's, a 255-byte or
undecodable name — and none of them may stop the runner or a reader, or cost a request its
receipt: each function here either handles such an entry or raises only
:class:`~pisub.errors.PisubError`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from pisub.core import fsio
from pisub.core.fsio import (
    SymlinkedDir,
    atomic_write,
    file_kind,
    load_json,
    private_mkdir,
    publish_new,
    read_bytes,
)
from pisub.errors import InboxClosed, InvalidInput, PisubError, ProtocolError, storage_error
from pisub.protocol.codec import encode, encode_pretty, now_iso
from pisub.protocol.control import (
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    REQUEST_ID_RE,
    FollowUp,
    Receipt,
    ReceiptState,
    RecoveryClaim,
    Request,
    Steer,
    Target,
    advance,
    decode_request,
    owed,
    request_type,
)
from pisub.store.paths import ANSWERED_MARKER, RunPaths
from pisub.termsafe import printable

FINISHED_REASON = "the run finished before the request was consumed"

_INVALID_KEY_RE = re.compile(r"invalid-[0-9a-f]{16}")
"""Keys of files whose name is not a valid request id (reserved: such a name is itself invalid)."""

UNCLAIMABLE_ERRNOS = frozenset({errno.EXDEV, errno.EBUSY, errno.EINVAL, errno.EMLINK, errno.ENOTEMPTY})
"""Errors that say an entry of ``inbox/new`` itself can never be moved (a mount point, ...):
it is answered ``rejected`` once and left where it is. Any other failure to claim (a full
disk, a permission or read-only change, an I/O error) is about the folder or the disk, not
the entry: the claim is retried later."""


def inbox_dir(paths: RunPaths, box: str) -> Path:
    return paths.box(box)


def receipt_path(paths: RunPaths, request_id: str) -> Path:
    return paths.receipt(request_id)


def new_key(name: str) -> str:
    """The key of a file published as ``inbox/new/<name>``: its name without ``.json`` when that
    is a valid request id, else ``invalid-<16 hex of SHA-256 of the name>``. The key names the
    file once claimed and, unless its content carries an ``id``, its receipt."""
    stem = name[: -len(".json")] if name.endswith(".json") else name
    if REQUEST_ID_RE.fullmatch(stem) and not _INVALID_KEY_RE.fullmatch(stem):
        return stem
    import hashlib

    return "invalid-" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def claimed_key(name: str) -> str:
    """The key of a file in ``cur/`` or ``rejected/``, named ``<key>.json`` or ``<key>~<hex>.json``
    (anything else found there — put by hand — is keyed like an invalid name)."""
    stem = name[: -len(".json")] if name.endswith(".json") else name
    key = stem.split("~", 1)[0]
    if REQUEST_ID_RE.fullmatch(key):
        return key
    import hashlib

    return "invalid-" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _unique(directory: Path, key: str) -> Path:
    return directory / f"{key}~{os.urandom(3).hex()}.json"


def _shown(name: str, limit: int = 80) -> str:
    text = printable(repr(name))
    return text if len(text) <= limit else text[: limit - 1] + "…"


_sequence = itertools.count()
_last_ms = 0


def new_request_id() -> str:
    """A unique id that sorts in write order for one writer: ``<ms>-<pid>-<seq>-<random>``.

    The milliseconds never go back within a process, so a backward clock step cannot reorder
    one writer's requests (across writers the order is the wall clock's, best effort).
    """
    global _last_ms
    _last_ms = max(_last_ms, time.time_ns() // 1_000_000)
    return f"{_last_ms:013d}-{os.getpid()}-{next(_sequence):06d}-{os.urandom(2).hex()}"


def recovery_claim(paths: RunPaths) -> str | None:
    """The request id named by the run's pause-and-revive claim, if a readable one exists."""
    try:
        claim_ = load_json(paths.recovery_claim, RecoveryClaim, limit=4096)
    except (FileNotFoundError, ProtocolError):
        return None
    return claim_.request_id


def is_closed(paths: RunPaths) -> bool:
    """Whether the tombstone is there (False when ``inbox`` cannot be reached without following
    a symlink: whatever then tries to write there is refused)."""
    try:
        return fsio.lexists(paths.inbox_closed)
    except OSError:
        return False


def close_inbox(paths: RunPaths, state: str) -> None:
    """Write the tombstone (runner, or the repair of a dead one)."""
    atomic_write(paths.inbox_closed, f"{now_iso()} {state}\n".encode())


def read_receipt(paths: RunPaths, request_id: str) -> Receipt | None:
    """The receipt of ``request_id``, or None while there is none.

    Raises:
        ProtocolError: the receipt exists but cannot be read or decoded.
    """
    try:
        return load_json(receipt_path(paths, request_id), Receipt, limit=MAX_REQUEST_BYTES)
    except FileNotFoundError:
        return None


def read_receipt_or_quarantine(paths: RunPaths, request_id: str) -> Receipt | None:
    """:func:`read_receipt`, where an entry in the receipt's place that is not a readable
    receipt (a directory, symlink, FIFO, garbage) is moved to ``quarantine/`` — it was never
    pisub's answer, and the request is then answered as if it had none."""
    try:
        return read_receipt(paths, request_id)
    except ProtocolError as exc:
        quarantine(paths, receipt_path(paths, request_id), f"not a readable receipt: {exc}")
        return None


def read_receipt_safe(paths: RunPaths, request_id: str) -> Receipt | None:
    """:func:`read_receipt`, with an unreadable receipt taken as none."""
    try:
        return read_receipt(paths, request_id)
    except PisubError:
        return None


def encode_receipt(receipt: Receipt) -> bytes:
    """A receipt as written for readers (its reasons redacted)."""
    from pisub.core.redact import scrub

    return encode_pretty(scrub(receipt))


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
        delivery_status=state.delivery_status,
        targets=targets or [],
        reason=reason,
        created_at=now,
        updated_at=now,
    )


def rejected_receipt(run_id: str, request_id: str, reason: str | None) -> Receipt:
    """The final answer to a request that is not valid (its type may be unknown)."""
    return make_receipt(run_id, request_id, "unknown", ReceiptState.REJECTED, reason=reason)


# -- the writer's side -----------------------------------------------------------------


def write_request(paths: RunPaths, request: Request) -> str:
    """Publish ``request`` into the inbox; its id (``request.id`` or a fresh one).

    If the inbox is closed before the write, nothing is written and :class:`InboxClosed`
    is raised. If it closes right after, the request is withdrawn when the runner has not
    claimed it (and :class:`InboxClosed` raised); otherwise the runner answers it.

    Raises:
        InvalidInput: the id is already waiting or was already used.
        StorageError: the request could not be written (nothing is left behind).
    """
    if request.id is None:
        request.id = new_request_id()
    rid = request.id
    if is_closed(paths):
        raise InboxClosed(f"run {paths.run_id} has finished; it takes no more requests")
    final = inbox_dir(paths, "new") / f"{rid}.json"
    try:
        used = fsio.lexists(receipt_path(paths, rid))
    except OSError as exc:
        raise storage_error(exc, "check the outbox of", paths.root) from exc
    if used:
        raise InvalidInput(f"request id {rid!r} was already used in run {paths.run_id}")
    try:
        # link, not rename: publishing never replaces an unclaimed request of the same name
        publish_new(inbox_dir(paths, "tmp"), final, encode(request))
    except FileExistsError:
        raise InvalidInput(f"request id {rid!r} is already waiting in run {paths.run_id}") from None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            _no_inbox(paths)
        raise storage_error(exc, "write the request into", final.parent) from exc
    if is_closed(paths) and withdraw(final):
        raise InboxClosed(f"run {paths.run_id} finished while the request was written; it was withdrawn")
    return rid


def _no_inbox(paths: RunPaths) -> None:
    """A run folder without its inbox is a broken run, answered as ``pisub status`` answers it
    (an empty folder: its ``status.json`` does not exist, ``RUN_NOT_FOUND``), not as a storage
    failure; returns when the folder's status reads and only the inbox is missing."""
    from pisub.store.runs import load_status

    load_status(paths)
    if not os.path.lexists(inbox_dir(paths, "new")):
        raise ProtocolError(
            f"{paths.root} has no inbox: the run folder is incomplete (damaged or partly copied) "
            "and cannot take requests"
        )


def withdraw(path: Path) -> bool:
    """Take an unclaimed request back; False when the runner already claimed it."""
    try:
        fsio.unlink(path)
    except FileNotFoundError:
        return False
    return True


# -- the reader's side (runner and repair) -----------------------------------------------


class Parsed(NamedTuple):
    """A request file as read: its id (if one can be read) and the request or what is wrong.
    (No dataclasses in this module: they import ``inspect``, some 8 ms of a command that reads
    a run and otherwise imports neither.)"""

    name: str
    request_id: str
    request: Request | None
    error: str | None


def run_owner(paths: RunPaths) -> int:
    """The uid that owns the run (its directory); requests owned by it or by root are accepted."""
    try:
        return fsio.lstat(paths.root).st_uid
    except OSError:
        return os.getuid()


def parse_request_file(
    path: Path, key: str | None = None, published_as: str | None = None, owner: int | None = None
) -> Parsed:
    """Read and validate one claimed request file (never raises for a bad file).

    ``key`` is the file's key (default: from its own name as if published in ``new/``);
    ``published_as`` the name it had in ``new/``, for messages. A file owned by another uid
    than ``owner`` (default: ours) or root is rejected.
    """
    name = published_as or path.name
    key = key or new_key(name)

    def bad(why: str, request_id: str = key) -> Parsed:
        return Parsed(name, request_id, None, why)

    if _INVALID_KEY_RE.fullmatch(key):
        shown = f"file name {_shown(name)}" if published_as or key == new_key(path.name) else "its file name"
        return bad(f"{shown} is not a valid request id (expected {REQUEST_ID_RE.pattern}.json)")
    owner = os.getuid() if owner is None else owner
    try:
        st = fsio.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return bad(f"not a regular file ({file_kind(st.st_mode)}; symlinks are not followed)")
        if st.st_uid not in (owner, 0):
            return bad(f"owned by uid {st.st_uid}, not by the run's owner (uid {owner}) or root")
        if st.st_size > MAX_REQUEST_BYTES:
            return bad(f"file is larger than {MAX_REQUEST_BYTES} bytes")
        data = read_bytes(path, limit=MAX_REQUEST_BYTES)
    except OSError as exc:
        return bad(f"cannot read: {exc.strerror or exc}")
    if len(data) > MAX_REQUEST_BYTES:
        return bad(f"file is larger than {MAX_REQUEST_BYTES} bytes")
    try:
        request = decode_request(data)
    except PisubError as exc:
        return bad(str(exc), _id_hint(data) or key)
    if request.id is not None and _INVALID_KEY_RE.fullmatch(request.id):
        # Reserved for files with invalid names: answered under this file's own key, so it
        # cannot take another file's receipt.
        return bad(
            f"`id` {request.id!r} is reserved (invalid-<hex> keys files with invalid names) - at `$.id`"
        )
    if request.id is None:
        request.id = key
    problem = _check(request)
    return Parsed(name, request.id, None if problem else request, problem)


def _id_hint(data: bytes) -> str | None:
    """The ``id`` of an invalid request, when one can still be read — given once: of an ``id``
    given twice neither can be trusted (the file is answered under its own name's key)."""
    from pisub.protocol.json_words import given_twice, read_loosely

    obj = read_loosely(data)
    rid = obj.get("id") if isinstance(obj, dict) and "id" not in given_twice(obj) else None
    if isinstance(rid, str) and REQUEST_ID_RE.fullmatch(rid) and not _INVALID_KEY_RE.fullmatch(rid):
        return rid
    return None


def _check(request: Request) -> str | None:
    if isinstance(request, Steer | FollowUp) and len(request.message.encode("utf-8", "surrogatepass")) > (
        MAX_MESSAGE_BYTES
    ):
        return f"`message` is larger than {MAX_MESSAGE_BYTES} bytes - at `$.message`"
    return None


def reject_file(paths: RunPaths, src: Path, reason: str, request_id: str) -> bool:
    """Move a bad (or duplicate) request to ``inbox/rejected/<id>.json`` (``<id>~<hex>.json``
    when taken) with its reason in ``<id>.reason`` beside it. Best effort: the request's
    receipt is what counts; whether the file was moved."""
    rejected = inbox_dir(paths, "rejected")
    dest = rejected / f"{request_id}.json"
    try:
        if fsio.lexists(dest):
            dest = _unique(rejected, request_id)
        fsio.rename(src, dest)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        atomic_write(dest.with_suffix(".reason"), (printable(reason) + "\n").encode(), durable=False)
    return True


def claim(paths: RunPaths, name: str) -> Path | None:
    """Claim ``inbox/new/<name>`` into ``inbox/cur/<key>.json``; the claimed path, or None if it is gone.

    A claim is ``link`` into ``cur/`` then ``unlink`` from ``new/``: whoever removes the
    ``new/`` entry wins, so a writer withdrawing its request (by unlinking it) and the runner
    never both own it. Unlike a rename, this makes no "moved from" event in the watched
    ``new/`` folder, so the runner is not woken by its own claims. What cannot be hard-linked
    (a directory; another user's file under ``fs.protected_hardlinks``) is renamed instead,
    which has the same "whoever removes it owns it" rule.

    Raises:
        OSError: the entry can be neither linked nor renamed (see :data:`UNCLAIMABLE_ERRNOS`
            for the errors that will never pass).
    """
    key = new_key(name)
    src, dst = inbox_dir(paths, "new") / name, inbox_dir(paths, "cur") / f"{key}.json"
    try:
        fsio.rename(src, dst, link=True)
    except SymlinkedDir:
        raise
    except FileNotFoundError:
        return None
    except FileExistsError:
        # A claim interrupted between link and unlink, or a name published again after its
        # first request was claimed: keep the new file under a name of its own.
        try:
            a, b = fsio.lstat(src), fsio.lstat(dst)
        except FileNotFoundError:
            return None
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return dst if _unlink_claimed(src, None) else None
        return _claim_by_rename(src, _unique(dst.parent, key))
    except OSError:
        return _claim_by_rename(src, _unique(dst.parent, key))
    return dst if _unlink_claimed(src, dst) else None


def _unlink_claimed(src: Path, dst: Path | None) -> bool:
    try:
        fsio.unlink(src)
    except FileNotFoundError:  # withdrawn by its writer in the meantime: not ours
        if dst is not None:
            with contextlib.suppress(OSError):
                fsio.unlink(dst)
        return False
    return True


def _claim_by_rename(src: Path, dst: Path) -> Path | None:
    try:
        fsio.rename(src, dst)
    except FileNotFoundError:
        return None
    return dst


def pending_files(paths: RunPaths, box: str) -> list[str]:
    """Names ending in ``.json`` in ``inbox/<box>/``, in name order.

    Raises:
        StorageError: the folder exists but cannot be listed.
    """
    return _list_json(inbox_dir(paths, box))


def _list_json(directory: Path) -> list[str]:
    try:
        names = fsio.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(exc, "list", directory) from exc
    return sorted(n for n in names if n.endswith(".json"))


def quarantine(paths: RunPaths, path: Path, reason: str) -> Path | None:
    """Move a bad file out of the way into ``<run>/quarantine/`` with ``<name>.reason`` beside
    it, so that no later reader trips over it; where it went (None if it could not be moved)."""
    return fsio.quarantine(path, paths.quarantine, f"{path.parent.name}-{printable(path.name)[:80]}", reason)


def replace_symlinked_dirs(paths: RunPaths) -> list[str]:
    """Quarantine a symlink planted in place of one of the run's control folders (``inbox``,
    ``inbox/<box>``, ``outbox``, never followed) and create the real, empty folder again, so
    requests keep getting their receipts; a line saying what was replaced, per folder."""
    replaced: list[str] = []
    remade: set[Path] = set()
    for directory in paths.control_dirs():
        if directory.parent in remade:  # inside a folder made again: made again too
            with contextlib.suppress(OSError):
                private_mkdir(directory)
                remade.add(directory)
            continue
        try:
            if not stat.S_ISLNK(fsio.lstat(directory).st_mode):
                continue
        except OSError:
            continue
        if quarantine(paths, directory, "a symlink stood in place of a run folder (never followed)") is None:
            continue
        with contextlib.suppress(OSError):
            private_mkdir(directory)
            remade.add(directory)
        replaced.append(f"{printable(str(directory))}: a symlink stood there; quarantined, folder made again")
    return replaced


def answer_leftovers(
    paths: RunPaths, run_id: str, reason: str, reasons: Mapping[str, str] | None = None
) -> Counter[str]:
    """Answer every request of a run whose runner is gone; how many got which answer.

    Requests still in ``new/`` are claimed and answered ``failed`` (or ``rejected``); claimed
    requests without a receipt, and receipts left open (``pending``, ``queued``), become
    ``failed`` with ``reason`` (or the one ``reasons`` gives for their id); a rejected file
    without a receipt gets its ``rejected`` one; an unreadable entry of the outbox is
    quarantined. Safe to repeat: a reader that dies halfway leaves work that the next one
    finishes.

    Raises:
        OSError: a receipt could not be written (the next reader retries).
        StorageError: a folder cannot be listed.
    """
    return _Settler(paths, run_id, reason, dict(reasons or {})).run()


class _Settler:
    """One pass of :func:`answer_leftovers` over a run's inbox and outbox."""

    def __init__(self, paths: RunPaths, run_id: str, reason: str, reasons: dict[str, str]) -> None:
        self.paths = paths
        self.run_id = run_id
        self.reason = reason
        self.reasons = reasons
        self.counts: Counter[str] = Counter()
        self.owner = run_owner(self.paths)
        self.recovering = recovery_claim(self.paths)  # read once, not once per request

    def run(self) -> Counter[str]:
        paths = self.paths
        for name in pending_files(paths, "new"):
            try:
                claimed = claim(paths, name)
            except OSError as exc:
                if exc.errno not in UNCLAIMABLE_ERRNOS:
                    raise
                self.counts["rejected"] += answer_unclaimable(paths, self.run_id, name, exc)
                continue
            if claimed is not None:
                self.counts["claimed"] += 1
                self.answer_claimed(claimed, published_as=name)
        for name in pending_files(paths, "cur"):
            self.answer_claimed(inbox_dir(paths, "cur") / name)
        for name in pending_files(paths, "rejected"):
            self.counts["rejected"] += _answer_rejected(paths, self.run_id, name)
        for name in _list_json(paths.outbox):
            try:
                receipt = load_json(paths.outbox / name, Receipt, limit=MAX_REQUEST_BYTES)
            except FileNotFoundError:
                continue
            except ProtocolError as exc:
                quarantine(paths, paths.outbox / name, f"unreadable receipt: {exc}")
                continue
            self.counts["failed"] += self.fail_if_open(receipt.request_id, None, receipt)
        return self.counts

    def answer_claimed(self, path: Path, *, published_as: str | None = None) -> None:
        """Answer one claimed request file unless it already has its answer (``published_as``:
        freshly claimed from ``new/`` under that name)."""
        parsed = parse_request_file(path, claimed_key(path.name), published_as, self.owner)
        rid = parsed.request_id
        existing = read_receipt_or_quarantine(self.paths, rid)
        if parsed.request is None:
            if existing is None:
                # The receipt first: a crash before the move leaves a claimed file with a final
                # receipt, which the next reader skips.
                write_receipt(self.paths, rejected_receipt(self.run_id, rid, parsed.error))
                self.counts["rejected"] += 1
            reject_file(self.paths, path, parsed.error or "invalid", rid)
            return
        if published_as is not None and existing is not None:
            reject_file(self.paths, path, f"duplicate request id {rid!r}: it was already used", rid)
            return
        self.counts["failed"] += self.fail_if_open(rid, request_type(parsed.request), existing)

    def fail_if_open(self, request_id: str, type_: str | None, receipt: Receipt | None) -> int:
        """Fail a request whose ``receipt`` (as already read) is missing or open; 0 or 1."""
        if request_id == self.recovering:
            return 0  # pause-and-revive owns it: the recovering process writes its answer
        if receipt is not None and not owed(receipt):
            return 0
        reason = self.reasons.get(request_id, self.reason)
        if receipt is None:
            if type_ is None:
                return 0
            receipt = make_receipt(self.run_id, request_id, type_, ReceiptState.FAILED, reason=reason)
        else:
            advance(receipt, ReceiptState.FAILED, reason)
        write_receipt(self.paths, receipt)
        return 1


def answer_unclaimable(paths: RunPaths, run_id: str, name: str, exc: OSError) -> int:
    """Answer, once, an entry of ``new/`` that can be neither linked nor renamed; 1 if answered now."""
    key = new_key(name)
    if fsio.lexists(receipt_path(paths, key)):
        return 0
    why = f"cannot be claimed: {exc.strerror or exc}"
    write_receipt(paths, rejected_receipt(run_id, key, why))
    return 1


def _answer_rejected(paths: RunPaths, run_id: str, name: str) -> int:
    """A file in ``rejected/`` always has its receipt (written before the move); restore a
    missing one from the ``.reason`` beside it. 1 if one was written."""
    key = claimed_key(name)
    if not REQUEST_ID_RE.fullmatch(key) or fsio.lexists(receipt_path(paths, key)):
        return 0
    try:
        why = read_bytes(inbox_dir(paths, "rejected") / (name[: -len(".json")] + ".reason"), limit=4096)
        reason = why.decode("utf-8", "replace").strip() or "rejected"
    except OSError:
        reason = "rejected (its reason was lost)"
    write_receipt(paths, rejected_receipt(run_id, key, reason))
    return 1


def needs_answers(paths: RunPaths) -> bool:
    """Whether a finished run may hold unanswered requests: the ``answered`` marker is missing,
    or ``inbox/new`` holds a request. Exact (lists the folder); never decided by a clock."""
    try:
        if not fsio.lexists(paths.inbox_answered):
            return True
        return any(name.endswith(".json") for name in fsio.listdir(inbox_dir(paths, "new")))
    except FileNotFoundError:
        return False
    except OSError:
        return True


def inbox_needs_answers(inbox: str) -> bool:
    """:func:`needs_answers` for ``list`` over many runs: two ``stat`` calls when ``inbox/new``
    has not changed since the marker was written (the marker carries ``new``'s mtime, compared
    for equality — never for order, so a clock step costs at most an extra listing)."""
    if quiet_since_answered(inbox):
        return False
    return needs_answers(RunPaths(Path(inbox).parent))


def quiet_since_answered(inbox: str, dir_fd: int | None = None) -> bool:
    """Nothing was published into ``inbox`` (relative to ``dir_fd`` when given) since its
    ``answered`` marker was written: two ``stat`` calls (see :func:`inbox_needs_answers`)."""
    try:
        marker = os.stat(f"{inbox}/{ANSWERED_MARKER}", dir_fd=dir_fd, follow_symlinks=False)
        new = os.stat(f"{inbox}/new", dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return new.st_mtime_ns == marker.st_mtime_ns


def new_mtime(paths: RunPaths) -> int | None:
    """``inbox/new``'s modification time, taken before a final scan (see :func:`mark_answered`)."""
    try:
        return fsio.lstat(inbox_dir(paths, "new")).st_mtime_ns
    except OSError:
        return None


def mark_answered(paths: RunPaths, new_mtime_ns: int | None) -> None:
    """Write the ``answered`` marker carrying ``new``'s mtime as it was before the last scan that
    claimed nothing, so that anything published since makes the two differ."""
    marker = paths.inbox_answered
    atomic_write(marker, b"", durable=False)
    if new_mtime_ns is not None:
        with fsio.in_dir(marker.parent) as fd:
            os.utime(marker.name, ns=(new_mtime_ns, new_mtime_ns), dir_fd=fd, follow_symlinks=False)


def answer_until_quiet(paths: RunPaths, answer: Callable[[], Counter[str]]) -> Counter[str]:
    """Run ``answer`` (which claims from ``new/``) until a pass claims nothing, then write the
    marker with ``new``'s mtime from before that quiet pass."""
    total: Counter[str] = Counter()
    while True:
        before = new_mtime(paths)
        counts = answer()
        total.update(counts)
        if not counts["claimed"]:
            mark_answered(paths, before)
            return total


def settle_closed_inbox(
    paths: RunPaths, run_id: str, reason: str, reasons: Mapping[str, str] | None = None
) -> Counter[str]:
    """Answer what is left in a finished run's inbox (caller holds the run's repair lock);
    ``reasons``: a request's own reason by id, where it differs from ``reason``.

    The marker is removed first and written last, so a reader that dies halfway leaves the
    run marked as needing answers.
    """
    with contextlib.suppress(FileNotFoundError):
        fsio.unlink(paths.inbox_answered)
    return answer_until_quiet(paths, lambda: answer_leftovers(paths, run_id, reason, reasons))
