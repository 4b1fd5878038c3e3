"""Run pisub as an ordinary user from a test that runs as root.

``scripts/test.sh``, when it runs as root, creates the system user ``pisub-ci``, builds a copy
of the project with a virtualenv that user can execute, and exports:

- ``PISUB_NONROOT_PYTHON``: that virtualenv's interpreter (pisub installed from the copy);
- ``PISUB_NONROOT_USER``: the user (default ``pisub-ci``);
- ``PISUB_NONROOT_TMPDIR``: a world-traversable directory for the tests' own folders
  (default ``/tmp``), so that ``scripts/test.sh`` can clean up after an aborted run.

Root's ``CAP_FOWNER``, ``CAP_DAC_OVERRIDE`` and the exemption from ``protected_hardlinks``
hide real failures: a runner or reader started through :class:`Unprivileged` has none of them.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.agentfile import agent_text

PYTHON_VAR = "PISUB_NONROOT_PYTHON"
USER_VAR = "PISUB_NONROOT_USER"
TMPDIR_VAR = "PISUB_NONROOT_TMPDIR"
DEFAULT_USER = "pisub-ci"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


class NonrootSetupError(Exception):
    """The unprivileged setup is asked for but broken (a CI misconfiguration, not a skip)."""


def unavailable_reason() -> str | None:
    """Why tests cannot run pisub as another user here, or None when they can."""
    if os.geteuid() != 0:
        return (
            "running pisub as another user needs root; this process is already unprivileged "
            f"(uid {os.geteuid()}), so the rest of the suite covers it"
        )
    if not os.environ.get(PYTHON_VAR):
        return (
            f"{PYTHON_VAR} is not set: run scripts/test.sh as root (it builds an unprivileged copy "
            f"of pisub for user {DEFAULT_USER!r}), or set {PYTHON_VAR} to a python with pisub that "
            f"{USER_VAR} (default {DEFAULT_USER!r}) can execute"
        )
    return None


@functools.cache
def _checked_python(python: str, uid: int, gid: int) -> str:
    """``python`` once it is proven to import pisub as ``uid`` (checked once per session)."""
    try:
        proc = subprocess.run(
            [python, "-c", "import pisub, sys; print(sys.prefix)"],
            capture_output=True,
            text=True,
            timeout=60,
            user=uid,
            group=gid,
            extra_groups=[],
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": "/"},
            cwd="/",
            check=False,
        )
    except OSError as exc:
        raise NonrootSetupError(f"uid {uid} cannot execute {PYTHON_VAR}={python}: {exc}") from exc
    if proc.returncode != 0:
        raise NonrootSetupError(
            f"uid {uid} cannot import pisub with {PYTHON_VAR}={python} "
            f"(exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    return python


def _check_traversable(path: Path, uid: int) -> None:
    """Every ancestor of ``path`` must let ``uid`` through (others' x bit, or ``uid`` owns it)."""
    for folder in [path, *path.parents]:
        st = folder.stat()
        if not (st.st_mode & 0o001 or st.st_uid == uid):
            raise NonrootSetupError(
                f"uid {uid} cannot traverse {folder} (mode {st.st_mode & 0o7777:o}, owner {st.st_uid}); "
                f"set {TMPDIR_VAR} to a world-traversable directory"
            )


@dataclass
class Unprivileged:
    """pisub as an ordinary user: its own HOME, TMPDIR and PISUB_HOME, its interpreter."""

    user: str
    uid: int
    gid: int
    python: str
    base: Path
    """Root-owned, 0755: the parent of everything below (world-traversable)."""
    user_home: Path
    """The user's ``HOME`` (0700, the user's): the working directory of its commands."""
    home: Path
    """Its ``PISUB_HOME`` (0700, the user's)."""
    tmp: Path
    """Its ``TMPDIR`` (0700, the user's)."""

    @classmethod
    def create(cls) -> Unprivileged:
        """Folders for one test; raises :class:`NonrootSetupError` when the setup is broken."""
        name = os.environ.get(USER_VAR) or DEFAULT_USER
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise NonrootSetupError(f"user {name!r} ({USER_VAR}) does not exist") from None
        if entry.pw_uid == 0:
            raise NonrootSetupError(f"user {name!r} ({USER_VAR}) is root")
        python = _checked_python(os.environ[PYTHON_VAR], entry.pw_uid, entry.pw_gid)
        parent = Path(os.environ.get(TMPDIR_VAR) or "/tmp")
        _check_traversable(parent, entry.pw_uid)
        base = Path(tempfile.mkdtemp(prefix="nonroot-", dir=parent))
        os.chmod(base, 0o755)
        uid, gid = entry.pw_uid, entry.pw_gid
        self = cls(name, uid, gid, python, base, base / "user", base / "pisub", base / "tmp")
        for folder in (self.user_home, self.home, self.tmp):
            folder.mkdir(mode=0o700)
            self.give(folder)
        return self

    def give(self, path: Path) -> None:
        """Make ``path`` (not followed if a symlink) the user's."""
        os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment for the user: nothing of root's leaks in."""
        env = {
            "PATH": SAFE_PATH,
            "LANG": "C.UTF-8",
            "HOME": str(self.user_home),
            "USER": self.user,
            "LOGNAME": self.user,
            "TMPDIR": str(self.tmp),
            "PISUB_HOME": str(self.home),
        }
        env.update(extra or {})
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the user (no supplementary groups, a clean environment)."""
        return subprocess.run(
            list(argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env=self.env(env),
            cwd=cwd or self.user_home,
            check=False,
        )

    def pisub(
        self, *args: str, timeout: float = 60, check: bool = False, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The pisub CLI (``$PISUB_NONROOT_PYTHON -m pisub ARGS``) as the user."""
        proc = self.run([self.python, "-m", "pisub", *args], timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"pisub {' '.join(args)} as {self.user} exited {proc.returncode}: {proc.stderr}"
            )
        return proc

    def make_agent(
        self,
        name: str,
        *,
        python: str | None = None,
        command: str | None = None,
        args: list[str] | None = None,
        body: str = "",
        **extra: object,
    ) -> Path:
        """Write a user-scope agent into the user's home (as ``make_agent``; ``python`` runs
        with an interpreter the user can execute)."""
        text = agent_text(
            name, interpreter=self.python, python=python, command=command, args=args, body=body, **extra
        )
        agents = self.home / "agents"
        if not agents.exists():
            agents.mkdir(mode=0o700)
            self.give(agents)
        path = agents / f"{name}.md"
        path.write_text(text)
        os.chmod(path, 0o600)
        self.give(path)
        return path

    def remove(self) -> None:
        """Delete every folder of this test (its processes must be ended first)."""
        shutil.rmtree(self.base, ignore_errors=True)
