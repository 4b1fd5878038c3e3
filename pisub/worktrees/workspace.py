"""The workspace seam: where a child works — in place (the directory it was given) or in a git
worktree of its own (:class:`GitWorktree`: its work captured at its end as a patch and a
commit, so that nothing it writes is ever lost).

A child's workspace is asked three things: before anything of its batch is created, whether the
child can work there (:meth:`Workspace.check`); when it is about to start, to place it
(:meth:`Workspace.prepare`: the manifest whose ``cwd`` is where the child works); and, by its
runner once nothing of the child runs, to save what it left (:meth:`Workspace.capture`). The
children choose the workspace by the call's isolation (:func:`workspace`); the runner finds it
in the manifest (:func:`workspace_of`: ``worktree`` names a git worktree).

What outlives a run is not the child's to remove: ``pisub worktree apply``, ``discard`` and
``cleanup`` judge worktrees after their runs (:mod:`pisub.worktrees.cleanup`).

Every implementation passes ``tests/contract/test_workspace_contract.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import msgspec

from pisub.protocol.fields import Isolation
from pisub.protocol.manifest import Manifest
from pisub.protocol.worktree import WorktreeLink, WorktreeRecord
from pisub.store.paths import Home


class Workspace(Protocol):
    """Where a child works. Implementations: :class:`InPlace`, :class:`GitWorktree`."""

    isolation: Isolation

    def check(self, cwd: Path, key: str, base_ref: str | None) -> None:
        """Whether the child keyed ``key`` can work from ``cwd`` (an existing directory) on the
        base ``base_ref``; nothing is created.

        Raises:
            InvalidInput: naming what is wrong (isolation is never dropped silently).
        """

    def prepare(self, home: Home, manifest: Manifest, key: str, base_ref: str | None) -> Manifest:
        """``manifest`` placed for its child about to start: the same launch request but for
        its ``cwd``, the directory the child works in (the same place inside its tree as
        ``manifest.cwd``), created now when needed (what can change since :meth:`check` checked
        again), and what the runner needs to find it again (:func:`workspace_of`). A run id
        prepared before gets its place back as it is
        (a resumed workflow re-creating a journaled child). ``manifest`` is not changed.

        Raises:
            InvalidInput, WorktreeError, StorageError: nothing was placed, so no child.
        """

    def capture(self, manifest: Manifest, patch: Path) -> WorktreeRecord | None:
        """Save what the child of ``manifest`` (prepared here; nothing of it runs any more)
        left, where it outlives the workspace: None when it is already there (in place), else
        the record of the capture (the patch at ``patch``, the commit ``refs/pisub/<run id>``).
        Capturing again captures the state of now. The files the child left are not changed.

        Raises:
            PisubError: nothing was saved; the work stays where the child left it.
        """


class InPlace:
    """The child works in the directory it was given; what it writes stays there."""

    isolation = Isolation.NONE

    def check(self, cwd: Path, key: str, base_ref: str | None) -> None:
        pass

    def prepare(self, home: Home, manifest: Manifest, key: str, base_ref: str | None) -> Manifest:
        return msgspec.structs.replace(manifest)

    def capture(self, manifest: Manifest, patch: Path) -> WorktreeRecord | None:
        return None


class GitWorktree:
    """The child works in a new ``git worktree`` of its cwd's repository, on the branch
    ``pisub/<run8>/<key>`` at ``base_ref`` (``HEAD`` when None), under the worktree root of
    ``home`` (:mod:`pisub.worktrees.isolation`); its ownership record is written first."""

    isolation = Isolation.WORKTREE

    def check(self, cwd: Path, key: str, base_ref: str | None) -> None:
        from pisub.worktrees.repo import check_source

        check_source(cwd, base_ref, key)

    def prepare(self, home: Home, manifest: Manifest, key: str, base_ref: str | None) -> Manifest:
        from pisub.worktrees.isolation import allocate
        from pisub.worktrees.records import check_root, load_record, record_path
        from pisub.worktrees.repo import repo_root

        cwd = Path(manifest.cwd)
        repo = repo_root(cwd)
        root = check_root(home.worktrees, home.root, repo)
        existing = record_path(root, manifest.run_id)
        if existing.is_file():
            record = load_record(existing)
        else:  # allocate checks the repository clean again, now
            record = allocate(repo, base_ref=base_ref, run_id=manifest.run_id, key=key, root=root)
            existing = record_path(Path(record.path).parent, manifest.run_id)
        inside = Path(os.path.realpath(cwd)).relative_to(os.path.realpath(repo))
        placed = msgspec.structs.replace(manifest, cwd=str(Path(record.path) / inside))
        placed.worktree = WorktreeLink(
            record=str(existing),
            path=record.path,
            repo=record.repo,
            base_commit=record.base_commit,
            branch=record.branch,
        )
        return placed

    def capture(self, manifest: Manifest, patch: Path) -> WorktreeRecord | None:
        from pisub.worktrees.isolation import capture

        assert manifest.worktree is not None, "a worktree's capture needs a prepared manifest"
        return capture(Path(manifest.worktree.record), patch)


def workspace(isolation: Isolation) -> Workspace:
    """The workspace of a child called with ``isolation``."""
    return GitWorktree() if isolation is Isolation.WORKTREE else InPlace()


def workspace_of(manifest: Manifest) -> Workspace:
    """The workspace a run was prepared in, as its manifest says."""
    return workspace(Isolation.WORKTREE if manifest.worktree is not None else Isolation.NONE)
