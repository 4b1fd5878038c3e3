"""The life of an isolated worktree: allocate → capture (any number of times) → apply or
discard. A writer's work is never lost: the ownership record exists before the worktree, a
capture saves the work twice (a patch file proved to reproduce it, and the commit
``refs/pisub/<run_id>``) before the record says ``captured``, and applying checks first and
changes nothing when any file conflicts.

State changes of records under one root are serialized by a lock on the root directory.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from msgspec.structs import replace

from pisub.core.fsio import atomic_write, open_regular, private_mkdir, read_bytes
from pisub.core.locks import exclusive
from pisub.errors import InvalidInput, WorktreeError, storage_error
from pisub.protocol.codec import now_iso
from pisub.protocol.workflow import KEY_RE
from pisub.protocol.worktree import (
    MAX_LISTED_PATHS,
    ApplyMode,
    ApplyReport,
    Conflict,
    PatchInfo,
    WorktreeRecord,
    WorktreeState,
)
from pisub.store.paths import is_run_id
from pisub.termsafe import printable
from pisub.worktrees.git import IDENTITY_ENV, git_out, run_git
from pisub.worktrees.patches import (
    apply_patch,
    changed_files,
    choose_mode,
    ignored_present,
    staged_patch,
    submodule_work,
    verify_reproduces,
)
from pisub.worktrees.records import (
    expected_branch,
    load_owned,
    private_problem,
    publish_record,
    record_path,
    save_record,
)
from pisub.worktrees.repo import (
    check_branch_name,
    is_worktree_top,
    preflight,
    ref_exists,
    repo_root,
    resolve_base,
)

LOCK_TIMEOUT_S = 300.0
"""Longest wait for another capture, apply, discard or cleanup under the same root."""

PATCH_LIMIT = 1 << 32
"""Largest patch file read back (4 GiB)."""


def _show(path: Path | str) -> str:
    return printable(os.fspath(path), one_line=True)


def branch_name(run_id: str, key: str) -> str:
    """The branch of a run's worktree: ``pisub/<run_id[:8]>/<key>``."""
    return expected_branch(run_id, key)


def capture_ref(run_id: str) -> str:
    """The ref that keeps a run's captured work: ``refs/pisub/<run_id>``."""
    return f"refs/pisub/{run_id}"


@contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """Hold the lock of the worktree root ``root`` (the directory itself; no file is made).

    Raises:
        InvalidInput: ``root`` is not a directory.
        LockBusy: another state change held it for :data:`LOCK_TIMEOUT_S`.
    """
    if root.is_symlink() or not root.is_dir():
        raise InvalidInput(f"no worktree root at {_show(root)} (a directory of worktree records)")
    with exclusive(root, LOCK_TIMEOUT_S, directory=True):
        yield


def _json_safe(path: Path, what: str) -> Path:
    """``path`` if it can be written into a JSON record (valid UTF-8).

    Raises:
        InvalidInput: it holds bytes that are not UTF-8.
    """
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"the {what} {_show(path)} is not valid UTF-8; use another path") from None
    return path


def _check_ids(run_id: str, key: str) -> None:
    if not is_run_id(run_id):
        raise InvalidInput(f"not a run id: {run_id[:100]!r} (expected a lower-case UUID)")
    if not KEY_RE.fullmatch(key):
        raise InvalidInput(f"not a child key: {key[:100]!r} (letters, digits, '.', '_', '-'; up to 128)")


def _prepare_root(root: Path, repo: Path) -> Path:
    """Create the worktree root (0700, missing parents too) and return its real path.

    Raises:
        InvalidInput: it is inside the repository (the worktrees would make it dirty).
        StorageError: it cannot be created, or a symlink or a file stands there.
    """
    wanted = Path(os.path.realpath(os.path.abspath(root)))
    real_repo = Path(os.path.realpath(repo))
    if wanted == real_repo or real_repo in wanted.parents:
        raise InvalidInput(
            f"the worktree root {_show(root)} is inside the repository {_show(repo)}; "
            "choose a directory outside it"
        )
    absolute = Path(os.path.abspath(root))
    missing = [path for path in (absolute, *absolute.parents) if not os.path.lexists(path)]
    try:
        for path in reversed(missing):
            private_mkdir(path)
        private_mkdir(absolute)  # refuses a symlink or a file standing there
    except OSError as exc:
        raise storage_error(exc, "create the worktree root", root) from exc
    problem = private_problem(absolute, "worktree root")
    if problem is not None:
        raise InvalidInput(f"{_show(absolute)}: {problem}; use a directory of your own (chmod 700)")
    return _json_safe(Path(os.path.realpath(root)), "worktree root")


def allocate(repo: Path, *, base_ref: str | None, run_id: str, key: str, root: Path) -> WorktreeRecord:
    """Create the worktree ``<root>/<run_id>`` on the new branch ``pisub/<run_id[:8]>/<key>``
    at the commit ``base_ref`` names now (``HEAD`` when None). The repository must be clean;
    the ownership record ``<root>/<run_id>.json`` is written before the worktree is created.

    Raises:
        InvalidInput: a bad run id, key or ref; not a repository; uncommitted changes; the root
            is inside the repository; this run already has a worktree.
        WorktreeError: git failed (the record is removed again when no worktree was made).
        StorageError: the root or the record cannot be written.
    """
    _check_ids(run_id, key)
    top = _json_safe(preflight(repo), "repository")
    base = resolve_base(top, base_ref)
    branch = branch_name(run_id, key)
    check_branch_name(top, branch)
    real_root = _prepare_root(root, top)
    path = real_root / run_id
    if os.path.lexists(path):
        raise InvalidInput(f"{_show(path)} already exists: this run already has a worktree")
    now = now_iso()
    record = WorktreeRecord(
        run_id=run_id,
        key=key,
        repo=os.fspath(top),
        path=os.fspath(path),
        branch=branch,
        base_ref=base_ref,
        base_commit=base,
        state=WorktreeState.ALLOCATED,
        created_at=now,
        updated_at=now,
    )
    rec_path = record_path(real_root, run_id)
    # One `git worktree add` at a time per root (git's own bookkeeping of worktrees races).
    with root_lock(real_root):
        publish_record(rec_path, record)
        _add_worktree(top, path, branch, base, rec_path)
    return record


def _add_worktree(repo: Path, path: Path, branch: str, base: str, rec_path: Path) -> None:
    """``git worktree add -b <branch> <path> <base>``; on failure the record is removed again
    unless something was left at ``path`` (then cleanup reports it)."""
    args = ["worktree", "add", "--quiet", "--no-track", "-b", branch]
    args += ["--end-of-options", os.fspath(path), base]
    try:
        run_git(repo, args, what="create the worktree", fix="free the branch name or path and retry")
    except BaseException:
        if not os.path.lexists(path):
            rec_path.unlink(missing_ok=True)
        raise


def _require_state(record: WorktreeRecord, allowed: set[WorktreeState], action: str) -> None:
    if record.state not in allowed:
        raise InvalidInput(f"cannot {action} the worktree of run {record.run_id}: it is {record.state.value}")


def _open_worktree(record: WorktreeRecord) -> Path:
    """The record's worktree directory, once it is known to be the top of a work tree.

    Raises:
        WorktreeError: it is gone or is not a worktree any more.
    """
    path = Path(record.path)
    if not is_worktree_top(path):
        raise WorktreeError(
            f"the worktree {_show(path)} of run {record.run_id} is missing or is not a git worktree; "
            "its last capture (if any) is in the patch file and refs/pisub/"
        )
    return path


def capture(record_path: Path, patch_path: Path) -> WorktreeRecord:
    """Save everything the worktree holds now (tracked and untracked, not ignored) as a patch
    against its base commit: staged with ``git add -A``, diffed exactly, proved to reproduce
    the staged tree, written to ``patch_path`` (0600, atomic), committed as
    ``refs/pisub/<run_id>``; then the record says ``captured``. Capturing again captures the
    current state; no change is a valid 0-byte patch.

    Raises:
        InvalidInput: no record (or a forged one); it is applied or discarded; ``patch_path`` is
            inside the worktree or directly in the root.
        WorktreeError: git failed, the patch does not reproduce the work, or the worktree holds
            work of a submodule (moved, or files in its directory), which no patch carries
            (nothing was saved in each case).
        StorageError: the patch or the record cannot be written.
    """
    with root_lock(record_path.parent):
        record = load_owned(record_path)
        _require_state(record, {WorktreeState.ALLOCATED, WorktreeState.CAPTURED}, "capture")
        worktree = _open_worktree(record)
        target = _patch_target(patch_path, worktree, record_path.parent)
        run_git(worktree, ["add", "-A"], what="stage the worktree's changes")
        tree = git_out(worktree, ["write-tree"], what="record the staged tree").decode("ascii", "replace")
        inner = submodule_work(worktree, record.base_commit)
        if inner is not None:
            raise WorktreeError(
                f"cannot capture the worktree of run {record.run_id}: {inner}, and a patch carries no "
                "other repository's work; nothing was saved and the worktree is kept: commit and "
                "push that work in the submodule yourself, or discard the worktree"
            )
        patch = staged_patch(worktree, record.base_commit)
        verify_reproduces(worktree, record.base_commit, patch, tree)
        info = _patch_info(worktree, record.base_commit, target, patch)
        _write_patch(target, patch)
        commit = _commit_capture(worktree, record, tree)
        now = now_iso()
        record = replace(
            record,
            state=WorktreeState.CAPTURED,
            patch=info,
            ref=capture_ref(record.run_id),
            capture_commit=commit,
            captured_at=now,
            updated_at=now,
        )
        save_record(record_path, record)
        return record


def _patch_target(patch_path: Path, worktree: Path, root: Path) -> Path:
    """The absolute patch path, once it is neither inside the worktree (the next capture would
    stage it) nor directly in the worktree root (whose entries are records and worktrees).

    Raises:
        InvalidInput: it is.
    """
    target = _json_safe(Path(os.path.abspath(patch_path)), "patch path")
    real = Path(os.path.realpath(target))
    real_worktree = Path(os.path.realpath(worktree))
    if real == real_worktree or real_worktree in real.parents:
        raise InvalidInput(f"the patch path {_show(target)} is inside the worktree; choose one outside it")
    if real.parent == Path(os.path.realpath(root)):
        raise InvalidInput(
            f"the patch path {_show(target)} is in the worktree root (records and worktrees only); "
            "choose another directory"
        )
    return target


def _patch_info(worktree: Path, base: str, target: Path, patch: bytes) -> PatchInfo:
    files = changed_files(worktree, base)
    ignored = ignored_present(worktree)
    return PatchInfo(
        path=os.fspath(target),
        sha256=hashlib.sha256(patch).hexdigest(),
        size=len(patch),
        files=files[:MAX_LISTED_PATHS],
        files_omitted=max(0, len(files) - MAX_LISTED_PATHS),
        ignored_changed=ignored[:MAX_LISTED_PATHS],
        ignored_omitted=max(0, len(ignored) - MAX_LISTED_PATHS),
    )


def _write_patch(target: Path, patch: bytes) -> None:
    try:
        if not target.parent.exists():
            private_mkdir(target.parent)
        atomic_write(target, patch)
    except OSError as exc:
        raise storage_error(exc, "write the patch", target) from exc


def _commit_capture(worktree: Path, record: WorktreeRecord, tree: str) -> str:
    """Commit ``tree`` on the base commit with pisub's identity and point
    ``refs/pisub/<run_id>`` at it (the work survives the worktree's removal)."""
    message = f"pisub capture {record.run_id}\n\nkey: {record.key}\nbase: {record.base_commit}\n"
    args = ["commit-tree", "--no-gpg-sign", "-p", record.base_commit, "-m", message, "--end-of-options", tree]
    commit = git_out(worktree, args, what="commit the capture", env=IDENTITY_ENV).decode("ascii", "replace")
    update = ["update-ref", "-m", "pisub capture", capture_ref(record.run_id), commit]
    run_git(worktree, update, what="save the capture ref")
    return commit


def _read_patch(record: WorktreeRecord) -> bytes:
    """The captured patch, once its size and sha256 match the record.

    Raises:
        WorktreeError: it is missing, unreadable or changed since the capture.
    """
    info = record.patch
    if info is None:
        raise WorktreeError(f"run {record.run_id} has no captured patch; capture it first")
    try:
        data = read_bytes(info.path, limit=PATCH_LIMIT)
    except OSError as exc:
        raise WorktreeError(
            f"cannot read the patch {_show(info.path)} of run {record.run_id}: {exc.strerror or exc}; "
            "capture it again"
        ) from exc
    if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
        raise WorktreeError(
            f"the patch {_show(info.path)} of run {record.run_id} changed since it was captured; "
            "capture it again"
        )
    return data


def patch_mismatch(record: WorktreeRecord) -> str | None:
    """Why the stored patch file is not what the record says was captured (its size or sha256
    differ, it is gone, unreadable, or not a regular file), hashed again now; None when it is,
    or when nothing was captured. Never follows a symlink; reads in chunks.
    """
    info = record.patch
    if info is None:
        return None
    where = _show(info.path)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(open_regular(info.path), "rb") as fh:
            while size <= info.size and (chunk := fh.read(1 << 20)):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        return f"its patch {where} cannot be read ({exc.strerror or exc})"
    if size != info.size or digest.hexdigest() != info.sha256:
        return f"its patch {where} is not the one captured (sha256 or size differ from the record)"
    return None


def apply(record_path: Path, into: Path | None = None) -> ApplyReport:
    """Apply the captured patch to the checkout ``into`` (default: the record's repository).

    Checked first, then applied; ``git apply`` is all-or-nothing, so when any file conflicts
    the report names each one (``ok`` false) and nothing is changed. With nothing staged in the
    target the patch goes to its work tree and index (``--index``: a file with unstaged edits
    is a conflict); else to its work tree only, leaving the staged changes alone. On success
    the record says ``applied``.

    Raises:
        InvalidInput: no record (or a forged one); it is not ``captured``; ``into`` is not a work
            tree or is the worktree itself.
        WorktreeError: the patch file is gone or changed, or git failed.
    """
    with root_lock(record_path.parent):
        record = load_owned(record_path)
        _require_state(record, {WorktreeState.CAPTURED}, "apply")
        patch = _read_patch(record)
        target = repo_root(into if into is not None else Path(record.repo))
        if os.path.realpath(target) == os.path.realpath(record.path):
            raise InvalidInput(
                "cannot apply a worktree's patch to the worktree itself; give another checkout"
            )
        mode = choose_mode(target)
        files = record.patch.files if record.patch is not None else []
        report = ApplyReport(ok=True, run_id=record.run_id, target=_show(target), mode=mode, files=files)
        with deferred_signals():  # an interrupt never splits git's writes from the record
            conflicts = _apply_checked(target, patch, mode)
            if conflicts:
                return replace(report, ok=False, conflicts=conflicts)
            now = now_iso()
            applied = replace(
                record,
                state=WorktreeState.APPLIED,
                applied_into=os.fspath(target),
                applied_at=now,
                updated_at=now,
            )
            save_record(record_path, applied)
        return report


DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the ``with`` block (in the main thread; elsewhere
    Python delivers no signal anyway) and deliver the first that came once it ends: a ``git
    apply`` is never killed half-way through its files, nor its record left saying
    ``captured`` for a patch that is in the checkout."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, _frame: came.append(number)) for sig in DEFERRED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if came:
            signal.raise_signal(came[0])


def _apply_checked(target: Path, patch: bytes, mode: ApplyMode) -> list[Conflict]:
    """Check, then apply (a conflict appearing in between is reported the same way)."""
    if not patch:
        return []
    return apply_patch(target, patch, mode, check=True) or apply_patch(target, patch, mode, check=False)


def discard(record_path: Path) -> None:
    """Delete the worktree (``git worktree remove --force``: its uncaptured changes go), its
    branch and ``refs/pisub/<run_id>``; the record says ``discarded``. The patch file, if any,
    is kept. The caller enforces ``--force``. Discarding again repeats what is left to do.

    Raises:
        InvalidInput: no record, or a forged one.
        WorktreeError: git failed (the record keeps its state).
    """
    with root_lock(record_path.parent):
        record = load_owned(record_path)
        remove_worktree(record)
        delete_ref(record, f"refs/heads/{record.branch}")
        delete_ref(record, capture_ref(record.run_id))
        now = now_iso()
        save_record(
            record_path,
            replace(record, state=WorktreeState.DISCARDED, discarded_at=now, updated_at=now),
        )


def remove_worktree(record: WorktreeRecord) -> None:
    """``git worktree remove --force`` the record's worktree (only a directory git knows as a
    worktree of the record's repository), then ``git worktree prune``.

    Raises:
        WorktreeError: git refused (e.g. a locked worktree, or the repository is gone).
    """
    repo = Path(record.repo)
    path = Path(record.path)
    if os.path.lexists(path):
        if path.is_symlink():
            raise WorktreeError(
                f"{_show(path)} is a symlink, not run {record.run_id}'s worktree; remove it by hand"
            )
        fix = "unlock it (git worktree unlock) or remove it by hand"
        run_git(repo, ["worktree", "remove", "--force", os.fspath(path)], what="remove the worktree", fix=fix)
    run_git(repo, ["worktree", "prune"], what="prune worktrees")


def delete_ref(record: WorktreeRecord, ref: str) -> None:
    """Delete ``ref`` from the record's repository when it exists."""
    repo = Path(record.repo)
    if ref_exists(repo, ref):
        run_git(repo, ["update-ref", "-d", ref], what=f"delete {ref}")
