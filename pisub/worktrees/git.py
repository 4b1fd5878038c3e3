"""Running git: argv lists (never a shell), a hardened environment, a timeout on every call,
and every failure translated where it enters into one :class:`WorktreeError` line.

User configuration must not change what pisub reads from git: every call runs with
``LC_ALL=C`` (git's messages are parsed), no pager, no prompt, no editor, no inherited
``GIT_*`` variable that points git elsewhere (``GIT_DIR``, ``GIT_INDEX_FILE``, ...) or injects
configuration, hooks off, fsmonitor off, filter drivers off, no external diff or textconv
program, and the configuration that shapes a patch pinned. No program named by a repository's
configuration runs inside a pisub git call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pisub.core.procs import run_bounded
from pisub.errors import WorktreeError
from pisub.termsafe import printable

GIT_TIMEOUT_S = 60.0
"""Longest a single git call may take before its process group is killed."""

STDERR_KEEP = 300
"""Characters of git's message kept in an error line."""

KEPT_GIT_VARS = frozenset(
    {
        "GIT_CONFIG_GLOBAL",
        "GIT_CONFIG_SYSTEM",
        "GIT_CONFIG_NOSYSTEM",
        "GIT_EXEC_PATH",
        "GIT_CEILING_DIRECTORIES",
        "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    }
)
"""The only inherited ``GIT_*`` variables: where configuration and git's helpers live, and
how far repository discovery goes. Every other one (``GIT_DIR``, ``GIT_WORK_TREE``,
``GIT_INDEX_FILE``, ``GIT_OBJECT_DIRECTORY``, ``GIT_CONFIG_PARAMETERS``, ``GIT_EXTERNAL_DIFF``,
the author identity, ...) is dropped."""

HARDENED_ENV = {
    "LC_ALL": "C",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": "true",
    "GIT_OPTIONAL_LOCKS": "0",
}
"""Set on every call. ``GIT_OPTIONAL_LOCKS=0``: reading a checkout's status never rewrites
its index behind its owner's back."""

PINNED_CONFIG = (
    "core.quotepath=off",
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "color.ui=never",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "commit.gpgSign=false",
    "apply.whitespace=nowarn",
    "apply.ignoreWhitespace=no",
    "gc.auto=0",
    "maintenance.auto=false",
)
"""``-c`` settings of every call. Hooks are off: a user's ``post-checkout`` or
``reference-transaction`` hook never runs inside pisub's git calls. Filter drivers are
switched off per call (:func:`filter_drivers`): pisub sees and writes a repository's stored
bytes, and no ``clean``/``smudge``/``process`` program of its configuration ever runs."""

DIFF_FLAGS = (
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--binary",
    "--full-index",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--no-relative",
    "--no-renames",
    "--unified=3",
    "--inter-hunk-context=0",
    "--ignore-submodules=none",
    "--submodule=short",
    "-O/dev/null",
)
"""Flags of every diff that becomes a patch: exact, binary-safe, and deaf to the user's
``diff.*`` settings (``--src-prefix``/``--dst-prefix`` stand in for ``--default-prefix``,
which git < 2.41 lacks)."""

IDENTITY_ENV = {
    "GIT_AUTHOR_NAME": "pisub",
    "GIT_AUTHOR_EMAIL": "pisub@localhost",
    "GIT_COMMITTER_NAME": "pisub",
    "GIT_COMMITTER_EMAIL": "pisub@localhost",
}
"""The identity of pisub's capture commits (no user configuration needed)."""


@dataclass(frozen=True)
class GitResult:
    """A finished git call: exit code and raw output (never decoded here)."""

    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def message(self) -> str:
        """git's complaint as one printable line (its ``fatal:``/``error:`` line when there is
        one), at most :data:`STDERR_KEEP` characters."""
        return git_message(self.stderr or self.stdout, self.returncode)


def git_message(output: bytes, returncode: int) -> str:
    """The most telling line of git's output, one printable line."""
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    telling = [line for line in lines if line.startswith(("fatal:", "error:"))]
    line = (telling or lines or [f"exit code {returncode}"])[0]
    return printable(line, one_line=True)[:STDERR_KEEP]


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git call: ours minus every ``GIT_*`` variable not in
    :data:`KEPT_GIT_VARS`, plus :data:`HARDENED_ENV` and ``extra`` (which may set e.g.
    ``GIT_INDEX_FILE`` on purpose)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("GIT_") or name in KEPT_GIT_VARS
    }
    env.pop("LANGUAGE", None)
    env.update(HARDENED_ENV)
    if extra:
        env.update(extra)
    return env


NO_FILTER_COMMANDS = frozenset(
    {
        "cat-file",
        "check-ref-format",
        "commit-tree",
        "config",
        "for-each-ref",
        "ls-tree",
        "merge-base",
        "rev-list",
        "rev-parse",
        "show-ref",
        "symbolic-ref",
        "update-ref",
    }
)
"""git commands that never read or write a work tree's files, so never run a filter driver
(every other call first switches off the drivers the configuration defines)."""

NO_DRIVER_FLAGS = ("--no-ext-diff", "--no-textconv")
"""Added to every ``diff``: no ``diff.<driver>.command`` or ``textconv`` program runs."""

_DRIVER_KEYS = r"^filter\..+\.(clean|smudge|process)$"


def git_argv(cwd: Path, args: Sequence[str], drivers: Sequence[str] = ()) -> list[str]:
    """``git --no-pager -C <cwd> -c <pinned>... [-c filter.<d>.clean= ...] <args>``: every
    filter driver in ``drivers`` switched off (no command, not required), and a ``diff``
    deaf to external diff and textconv drivers."""
    argv = ["git", "--no-pager", "-C", os.fspath(cwd)]
    for setting in PINNED_CONFIG:
        argv += ["-c", setting]
    for driver in drivers:
        for key in ("clean", "smudge", "process"):
            argv += ["-c", f"filter.{driver}.{key}="]
        argv += ["-c", f"filter.{driver}.required=false"]
    if args and args[0] == "diff":
        args = [args[0], *NO_DRIVER_FLAGS, *args[1:]]
    return [*argv, *args]


def filter_drivers(
    cwd: Path, what: str = "read the git configuration", timeout: float = GIT_TIMEOUT_S
) -> list[str]:
    """The filter drivers (``filter.<name>.clean``/``smudge``/``process``) the configuration
    seen from ``cwd`` defines: the repository's own ``.git/config`` can name any program, and
    ``.gitattributes`` (which a child writes) decides where it runs. None when git finds none
    or cannot tell (``cwd`` is gone: the real call fails anyway).

    Raises:
        WorktreeError: git is missing or hung (as :func:`run_git`), or a driver's name cannot
            be switched off on a command line (it holds ``=``).
    """
    args = ["config", "--null", "--name-only", "--get-regexp", _DRIVER_KEYS]
    done = _call(git_argv(cwd, args), None, git_env(), timeout, what, "")
    names: list[str] = []
    for key in (done.stdout if done.ok else b"").split(b"\0"):
        name = os.fsdecode(key).partition(".")[2].rpartition(".")[0]
        if not name or name in names:
            continue
        if "=" in name or "\n" in name:
            raise WorktreeError(
                f"the filter driver {printable(name, one_line=True)!r} in the git configuration of "
                f"{printable(os.fspath(cwd), one_line=True)} cannot be switched off; rename it"
            )
        names.append(name)
    return names


def run_git(
    cwd: Path,
    args: Sequence[str],
    *,
    what: str,
    fix: str = "check the repository with git status",
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = GIT_TIMEOUT_S,
    check: bool = True,
) -> GitResult:
    """Run ``git -C cwd args`` in its own process group and return its result.

    ``what`` names the operation for error lines ("create the worktree"), ``fix`` says what to
    do. With ``check`` a non-zero exit is an error; without, the caller reads ``returncode``.

    Raises:
        WorktreeError: git is missing, could not be started, timed out (its whole process group
            is killed), or (with ``check``) exited non-zero.
    """
    drivers = filter_drivers(cwd, what, timeout) if args and args[0] not in NO_FILTER_COMMANDS else []
    result = _call(git_argv(cwd, args, drivers), stdin, git_env(env), timeout, what, fix)
    if check and not result.ok:
        where = printable(os.fspath(cwd), one_line=True)
        raise WorktreeError(f"cannot {what} in {where}: {result.message()}; {fix}")
    return result


def _call(
    argv: list[str], stdin: bytes | None, env: dict[str, str], timeout: float, what: str, fix: str
) -> GitResult:
    """Run ``argv`` in its own process group (:func:`~pisub.core.procs.run_bounded`: a filter
    or helper it started never outlives the call): its result, or an error when it cannot start
    or does not finish within ``timeout`` (its whole group is killed)."""
    try:
        done = run_bounded(argv, timeout=timeout, env=env, stdin=stdin)
    except FileNotFoundError as exc:
        raise WorktreeError(
            f"cannot {what}: git is not installed or not on PATH; install git or fix PATH"
        ) from exc
    except OSError as exc:
        raise WorktreeError(f"cannot {what}: git cannot be run ({exc.strerror or exc}); {fix}") from exc
    if done.timed_out:
        raise WorktreeError(
            f"cannot {what}: git did not finish within {timeout:g}s (killed); "
            "check for a hung filter or a huge repository and retry"
        )
    return GitResult(done.returncode, done.stdout, done.stderr)


def git_out(
    cwd: Path,
    args: Sequence[str],
    *,
    what: str,
    fix: str = "check the repository with git status",
    env: Mapping[str, str] | None = None,
) -> bytes:
    """stdout of a successful call, its trailing newline removed (see :func:`run_git`)."""
    return run_git(cwd, args, what=what, fix=fix, env=env).stdout.removesuffix(b"\n")
