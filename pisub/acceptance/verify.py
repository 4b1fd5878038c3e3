"""``verify`` commands: run by the runner on the host after the child ended, in the child's
working tree, each with its own timeout and its output kept (capped) as evidence — and
memoized per tree state, so an unchanged tree never runs a command twice.

The cache key is the SHA-256 of the command, the tree (a digest of the files ``HEAD`` tracks and
the untracked ones the tree's ``.gitignore`` files do not ignore: see :func:`_tree`) and the
values of the environment variables the config allows (their names only are ever written
down). A result is kept only when the tree is the same after the command as before. The cache
lives in ``<home>/cache/verify/`` and is shared by every run of the same repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pisub.core.fsio import atomic_write, load_json, private_mkdir
from pisub.errors import PisubError
from pisub.protocol.acceptance import Check, Outcome, VerifyCommand
from pisub.protocol.cache import VerifyCacheEntry as Cached
from pisub.protocol.codec import encode_pretty

DEFAULT_TIMEOUT_S = 600.0
KEEP_BYTES = 32 * 1024
"""Bytes of a command's output kept from its start and from its end."""


@dataclass
class Place:
    """Where commands run and what their results are keyed by."""

    cwd: Path
    tree: str | None
    """The tree's id (None: not a git tree, nothing is cached)."""
    env_hash: str


def place(cwd: Path, allowed_env: list[str], env: dict[str, str] | None = None) -> Place:
    """The working tree ``cwd`` as the cache sees it now."""
    env = dict(os.environ) if env is None else env
    values = json.dumps([[name, env.get(name)] for name in sorted(set(allowed_env))])
    return Place(cwd=cwd, tree=_tree(cwd), env_hash=hashlib.sha256(values.encode()).hexdigest())


def _tree(cwd: Path) -> str | None:
    """The tree's digest, or None (nothing cached) outside git or when it holds a nested
    repository or submodule, whose files the digest does not cover.

    Which files count is asked of git with a fresh index read from ``HEAD`` — never the
    child's index, whose ``assume-unchanged`` / ``skip-worktree`` flags it controls — and of
    the tree's own ``.gitignore`` files only (not ``.git/info/exclude`` or a global excludes
    file, which the child could also write); their contents are hashed here, without git's
    filters (a ``clean`` filter in ``.git/config`` could make any content look unchanged)."""
    import tempfile

    from pisub.worktrees.git import git_out, run_git
    from pisub.worktrees.repo import repo_root

    try:
        top = repo_root(cwd)
        inside = os.path.relpath(os.path.realpath(cwd), os.path.realpath(top))
        with tempfile.TemporaryDirectory(prefix="pisub-verify-") as tmp:
            env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
            has_head = run_git(top, ["rev-parse", "--verify", "-q", "HEAD"], what="find HEAD", check=False).ok
            run_git(top, ["read-tree", "HEAD" if has_head else "--empty"], what="read HEAD", env=env)
            stages = git_out(top, ["ls-files", "-z", "-s"], what="list the tracked files", env=env)
            others = git_out(
                top,
                ["ls-files", "-z", "--others", "--exclude-per-directory=.gitignore"],
                what="list the new files",
                env=env,
            )
    except PisubError:
        return None
    names: set[bytes] = set()
    for entry in stages.split(b"\0"):
        if entry.startswith(b"160000 "):
            return None  # a submodule
        if entry:
            names.add(entry.split(b"\t", 1)[1])
    for name in others.split(b"\0"):
        if name.endswith(b"/"):
            return None  # a nested repository
        if name:
            names.add(name)
    digest = _digest(top, sorted(names))
    return None if digest is None else f"{digest}:{inside}"


def _digest(top: Path, names: list[bytes]) -> str | None:
    """SHA-256 over each file's name, kind, executable bit and content (a symlink's target);
    None when one is a directory (a nested repository git did not mark)."""
    import stat

    total = hashlib.sha256()
    root = os.fsencode(top)
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                part = b"l" + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                part = b"f" + (b"x" if st.st_mode & 0o100 else b"-") + _file_sha(path)
            elif stat.S_ISDIR(st.st_mode):
                return None
            else:
                part = b"o%o" % stat.S_IFMT(st.st_mode)
        except FileNotFoundError:
            part = b"-"  # deleted
        except OSError:
            return None
        total.update(b"%d:%s%d:%s" % (len(name), name, len(part), part))
    return total.hexdigest()


def _file_sha(path: bytes) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        sha = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            sha.update(chunk)
        return sha.hexdigest().encode()
    finally:
        os.close(fd)


def key_of(command: VerifyCommand, where: Place) -> str | None:
    if where.tree is None:
        return None
    raw = json.dumps([command.command, command.timeout_ms, where.tree, where.env_hash])
    return hashlib.sha256(raw.encode()).hexdigest()


def run_checks(
    commands: list[VerifyCommand],
    where: Place,
    cache_dir: Path,
    log_dir: Path,
    env: dict[str, str],
    not_before: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[Check]:
    """Every command's check, in order (each runs even when an earlier one failed). A cache
    entry changed at or after ``not_before`` (when the child started: the child could have
    written it) is not trusted. ``should_stop`` is asked while a command runs: true ends it
    (and skips the rest)."""
    checks = []
    for command in commands:
        if should_stop():
            checks.append(Check(id=command.id, kind="verify", outcome=Outcome.SKIPPED, reason="stopped"))
            continue
        checks.append(_check(command, where, cache_dir, log_dir, env, not_before, should_stop))
    return checks


def _check(
    command: VerifyCommand,
    where: Place,
    cache_dir: Path,
    log_dir: Path,
    env: dict[str, str],
    not_before: float | None,
    should_stop: Callable[[], bool],
) -> Check:
    key = key_of(command, where)
    if key is not None:
        hit = _cached(cache_dir, key, not_before)
        if hit is not None:
            return Check(
                id=command.id,
                kind="verify",
                outcome=hit.outcome,
                reason=hit.reason,
                exit_code=hit.exit_code,
                cache="hit",
                key=key,
            )
    check = _run(command, where.cwd, log_dir, env, should_stop)
    check.cache = "off" if key is None else "miss"
    check.key = key
    if key is not None and _tree(where.cwd) != where.tree:
        return check  # the tree changed while it ran: the result is not that tree's
    if key is not None and check.exit_code is not None and check.exit_code != 124:  # a timeout: not kept
        from pisub.protocol.codec import now_iso

        record = Cached(exit_code=check.exit_code, outcome=check.outcome, reason=check.reason, at=now_iso())
        try:
            private_mkdir(cache_dir.parent)
            private_mkdir(cache_dir)
            atomic_write(cache_dir / f"{key}.json", encode_pretty(record))
        except OSError:
            pass  # no cache this time: the command ran, its result stands
    return check


def _cached(cache_dir: Path, key: str, not_before: float | None) -> Cached | None:
    """A trusted cache entry: a regular file of this user's in a real directory, not changed
    since the child started, whose outcome agrees with its exit code."""
    import stat

    from pisub.worktrees.records import is_plain_dir

    path = cache_dir / f"{key}.json"
    if not is_plain_dir(cache_dir):
        return None
    try:
        st = os.lstat(path)
        entry = load_json(path, Cached, limit=64 * 1024)
    except (OSError, PisubError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    if not_before is not None and st.st_ctime >= not_before:
        return None  # written while the child ran: it could have forged it
    if (entry.exit_code == 0) != (entry.outcome is Outcome.PASSED) or entry.exit_code == 124:
        return None  # inconsistent, or a timeout (never kept)
    return entry


def _run(
    command: VerifyCommand, cwd: Path, log_dir: Path, env: dict[str, str], should_stop: Callable[[], bool]
) -> Check:
    try:
        argv = shlex.split(command.command)
    except ValueError as exc:
        return Check(
            id=command.id, kind="verify", outcome=Outcome.FAILED, reason=f"cannot split the command: {exc}"
        )
    if not argv:
        return Check(id=command.id, kind="verify", outcome=Outcome.FAILED, reason="the command is empty")
    timeout = command.timeout_ms / 1000 if command.timeout_ms is not None else DEFAULT_TIMEOUT_S
    log = log_dir / f"{command.id}.log"
    try:
        private_mkdir(log_dir)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return Check(
            id=command.id, kind="verify", outcome=Outcome.FAILED, reason=f"cannot write its log: {exc}"
        )
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(fd)
        return Check(
            id=command.id,
            kind="verify",
            outcome=Outcome.FAILED,
            reason=f"cannot start {argv[0]!r}: {exc.strerror or exc}",
        )
    os.close(fd)
    deadline = time.monotonic() + timeout
    code = _wait(proc, deadline, should_stop)
    if code is None or code == STOPPED:
        _kill(proc)
        _cap(log)
        if code == STOPPED:
            return Check(
                id=command.id, kind="verify", outcome=Outcome.SKIPPED, reason="stopped", output=str(log)
            )
        return Check(
            id=command.id,
            kind="verify",
            outcome=Outcome.FAILED,
            reason=f"timed out after {timeout:g}s",
            exit_code=124,
            output=str(log),
        )
    _cap(log)
    outcome = Outcome.PASSED if code == 0 else Outcome.FAILED
    reason = None if code == 0 else f"exited with code {code}"
    return Check(
        id=command.id, kind="verify", outcome=outcome, reason=reason, exit_code=code, output=str(log)
    )


STOPPED = -(2**31)
STOP_POLL_S = 0.2


def _wait(proc: subprocess.Popen[bytes], deadline: float, should_stop: Callable[[], bool]) -> int | None:
    """The exit code; None past ``deadline``; :data:`STOPPED` when ``should_stop`` said so."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            return proc.wait(timeout=min(STOP_POLL_S, left))
        except subprocess.TimeoutExpired:
            if should_stop():
                return STOPPED


def _kill(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=3)
            break
        except subprocess.TimeoutExpired:
            continue


def _cap(log: Path) -> None:
    """Keep the first and last :data:`KEEP_BYTES` of a long log."""
    try:
        size = log.stat().st_size
        if size <= 2 * KEEP_BYTES:
            return
        with open(log, "rb") as fh:
            head = fh.read(KEEP_BYTES)
            fh.seek(size - KEEP_BYTES)
            tail = fh.read()
        marker = f"\n[... {size - 2 * KEEP_BYTES} bytes not kept ...]\n".encode()
        atomic_write(log, head + marker + tail)
    except OSError:
        return
