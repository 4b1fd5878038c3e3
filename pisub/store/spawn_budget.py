"""The spawn budget of a tree of runs: at most N runs started inside one root run's tree.

``<home>/budgets/<root run id>/`` holds ``limit`` (written once, by the first workflow of the
tree, when it starts) and one empty file per claimed start in ``claims/``. A workflow's child is
claimed by its workflow when its batch is admitted, named by a hash of the workflow's journal and
the child's key, so the same child claimed again (a resumed workflow calling it again) costs
nothing. Every other run started inside the tree (``pisub run`` / ``pisub.launch`` from a child
process or a script, a resume, a nested workflow, a review) is claimed by the launcher as it
starts, named ``run-<run id>`` (:func:`charge_run`): each run is charged exactly once, by
whoever started it. Claims are never refunded. A batch is claimed whole or not at all, under
a ``flock`` on the budget directory: a batch that does not fit claims nothing
(:class:`FanoutLimit`, ``RUN_FANOUT_LIMIT``). A tree no workflow ever ran in has no ``limit``:
its runs are bounded by the depth limit only.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from pisub.core.fsio import atomic_write, fsync_dir, in_dir, listdir, private_mkdir, read_bytes
from pisub.core.locks import exclusive
from pisub.errors import PisubError, storage_error


class FanoutLimit(PisubError):
    """A batch of child starts does not fit in what is left of the root run's spawn budget."""

    code = "RUN_FANOUT_LIMIT"


def claim_name(journal: str, key: str) -> str:
    return hashlib.sha256(f"{journal}\0{key}".encode("utf-8", "surrogateescape")).hexdigest()[:40]


class SpawnBudget:
    """One root run's budget."""

    def __init__(self, budgets: Path, budget_id: str, limit: int) -> None:
        self.dir = budgets / budget_id
        self.claims = self.dir / "claims"
        self.wanted_limit = limit

    def ensure(self) -> None:
        """The budget exists, with its limit (the first workflow's): from now on every run
        started inside the tree is charged to it.

        Raises:
            StorageError: the budget cannot be read or written.
        """
        try:
            self._make_dirs()
            with exclusive(self.dir, directory=True):
                self._limit()
        except OSError as exc:
            raise storage_error(exc, "create the spawn budget in", self.dir) from exc

    def claim(self, journal: str, keys: Iterable[str]) -> None:
        """Claim one start for each of ``keys`` (already claimed ones are free), all or none.

        Raises:
            FanoutLimit: the batch does not fit; nothing was claimed.
            StorageError: the budget cannot be read or written.
        """
        names = [claim_name(journal, key) for key in keys]
        try:
            self._make_dirs()
            with exclusive(self.dir, directory=True):
                self._claim(names, self._limit(), "children", "no children of this batch were started")
        except OSError as exc:
            raise storage_error(exc, "claim spawns in", self.dir) from exc

    def _make_dirs(self) -> None:
        private_mkdir(self.dir.parent)
        private_mkdir(self.dir)
        private_mkdir(self.claims)

    def _claim(self, names: list[str], limit: int, what: str, nothing: str) -> None:
        """Create the claims of ``names`` not made yet, all or none (under the lock)."""
        have = set(listdir(self.claims))
        new = [name for name in dict.fromkeys(names) if name not in have]
        if len(have) + len(new) > limit:
            left = max(0, limit - len(have))
            raise FanoutLimit(
                f"starting {len(new)} more {what} would exceed the spawn budget of this "
                f"tree of runs ({limit} starts, {left} left); {nothing} "
                "(raise it with --max-spawns at the top-level workflow)"
            )
        with in_dir(self.claims) as claims:
            for name in new:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                os.close(os.open(name, flags, 0o600, dir_fd=claims))
        if new:
            fsync_dir(self.claims)

    def used(self) -> int:
        try:
            return len(listdir(self.claims))
        except FileNotFoundError:
            return 0

    def _limit(self) -> int:
        """The tree's limit: the first workflow's, written once."""
        path = self.dir / "limit"
        try:
            text = read_bytes(path, limit=64).decode("ascii", "replace").strip()
            if text.isdigit():
                return int(text)
        except FileNotFoundError:
            atomic_write(path, f"{self.wanted_limit}\n".encode())
            return self.wanted_limit
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EINVAL):  # a symlink, a FIFO, a directory...
                raise
        return self.wanted_limit  # garbage in place of the limit: the caller's


def charge_run(budgets: Path, root_run_id: str, run_id: str) -> None:
    """Charge the start of run ``run_id`` inside the tree of ``root_run_id`` to the tree's spawn
    budget, before anything of the run is created (a tree without a budget: nothing to do). The
    one place every launch that is not a workflow's own child passes (:func:`pisub.runs.launch.start_run`).

    Raises:
        FanoutLimit: the tree's budget is used up; the run must not start.
        StorageError: the budget cannot be read or written.
    """
    from pisub.protocol.workflow import DEFAULT_MAX_SPAWNS

    budget = SpawnBudget(budgets, root_run_id, DEFAULT_MAX_SPAWNS)
    try:
        if not os.path.lexists(budget.dir / "limit"):
            return  # no workflow ever ran in this tree: no spawn budget
        budget._make_dirs()
        with exclusive(budget.dir, directory=True):
            budget._claim([f"run-{run_id}"], budget._limit(), "runs", "this run was not started")
    except OSError as exc:
        raise storage_error(exc, "claim a spawn in", budget.dir) from exc
