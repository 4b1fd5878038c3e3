"""Mission stores: ``<home>/missions/<project key>/`` per repository (``spec/missions.md``).

The interface the workflow launch uses (stub for issue 28: the missions helper implements it;
the names and signatures below are fixed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pisub.protocol.mission import Mission, MissionStatus
from pisub.store.paths import Home
from pisub.store.shared_state import StateNamespace


def project_key(cwd: Path) -> str:
    """The key of ``cwd``'s project: 20 hex digits of the sha256 of the realpath of its git
    common dir (so a worktree or a subdirectory finds the same store), else of ``cwd``'s
    realpath."""
    raise NotImplementedError


class MissionStore:
    """One project's missions; every write under the mission's lock, atomic, 0600."""

    def __init__(self, home: Home, project: str) -> None:
        self.home = home
        self.project = project
        self.dir = home.missions / project

    def create(
        self,
        *,
        title: str,
        cwd: Path,
        objective: str | None = None,
        goal: bool = False,
        budget_tokens: int | None = None,
        labels: Sequence[str] = (),
        status: MissionStatus = MissionStatus.PLANNED,
        owner_session: str | None = None,
    ) -> Mission:
        """A new mission (checked: title one printable line)."""
        raise NotImplementedError

    def get(self, mission_id: str) -> Mission:
        """Raises MissionNotFound."""
        raise NotImplementedError

    def attach_run(self, mission_id: str, run_id: str, mode: str) -> Mission:
        """Link run ``run_id`` (``mode``: workflow, run, ...) to the mission; idempotent.
        Raises MissionNotFound; InvalidInput for a closed mission."""
        raise NotImplementedError

    def state(self, mission_id: str) -> StateNamespace:
        """The mission's shared ``state`` (the same 256 KiB rules as ``--state-ns``)."""
        raise NotImplementedError
