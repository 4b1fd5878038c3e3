"""The spawn budget of a tree of runs: at most N child starts by the workflows of one root run.

``<home>/budgets/<root run id>/`` holds ``limit`` (written once, by the first workflow of the
tree) and one empty file per claimed start in ``claims/``, named by a hash of the workflow's
journal and the child's key, so the same child claimed again (a resumed workflow calling it
again) costs nothing. Claims are never refunded. A batch is claimed whole or not at all, under
a ``flock`` on the budget directory: a batch that does not fit claims nothing
(:class:`FanoutLimit`, ``RUN_FANOUT_LIMIT``).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from pisub.errors import PisubError, storage_error
from pisub.fsio import atomic_write, fsync_dir, private_mkdir, read_bytes
from pisub.locks import exclusive


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

    def claim(self, journal: str, keys: Iterable[str]) -> None:
        """Claim one start for each of ``keys`` (already claimed ones are free), all or none.

        Raises:
            FanoutLimit: the batch does not fit; nothing was claimed.
            StorageError: the budget cannot be read or written.
        """
        names = {claim_name(journal, key): key for key in keys}
        try:
            private_mkdir(self.dir.parent)
            private_mkdir(self.dir)
            private_mkdir(self.claims)
            with exclusive(self.dir, directory=True):
                limit = self._limit()
                have = set(os.listdir(self.claims))
                new = [name for name in names if name not in have]
                if len(have) + len(new) > limit:
                    left = max(0, limit - len(have))
                    raise FanoutLimit(
                        f"starting {len(new)} more children would exceed the spawn budget of this "
                        f"tree of runs ({limit} starts, {left} left); no children of this batch "
                        "were started (raise it with --max-spawns at the top-level workflow)"
                    )
                for name in new:
                    fd = os.open(
                        self.claims / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
                    )
                    os.close(fd)
                if new:
                    fsync_dir(self.claims)
        except OSError as exc:
            raise storage_error(exc, "claim spawns in", self.dir) from exc

    def used(self) -> int:
        try:
            return len(os.listdir(self.claims))
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
