"""The backend seam: one small interface for "where a runner lives".

A backend starts a run's runner (:meth:`Backend.start`), rings it when a control request was
written (:meth:`Backend.ring`: a doorbell, for runners that cannot watch the inbox with
inotify), cancels it as a backstop (:meth:`Backend.cancel`: only after an inbox ``stop`` got no
receipt in time), asks the engine about many runs at once (:meth:`Backend.observe`: one query
per command, never one process per run), and says whether a run's runner lives
(:meth:`Backend.liveness`). Every reader's repair asks :meth:`Backend.liveness` first and
repairs only on :attr:`Liveness.DEAD`, which a backend returns only with proof.

Every implementation passes ``tests/contract/test_backend_contract.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from pisub.protocol.placement import BackendName, Placement, PlacementRequest
from pisub.protocol.status import Status
from pisub.store.paths import RunPaths


class Liveness(StrEnum):
    ALIVE = "alive"
    """The runner lives, or may still start (a queued job)."""
    DEAD = "dead"
    """Proven: the runner is gone and can write nothing more; a reader may repair the run."""
    UNKNOWN = "unknown"
    """No proof either way (another host, the engine unreachable, a lease not yet expired):
    a reader reports what the files say and repairs nothing."""


class EngineState(StrEnum):
    """What the engine says of a job, reduced to what pisub acts on."""

    QUEUED = "queued"
    RUNNING = "running"
    ENDING = "ending"
    """Its processes are being ended (Slurm ``COMPLETING``)."""
    ENDED = "ended"
    """Terminal (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...)."""
    GONE = "gone"
    """The engine no longer knows the job (ended and forgotten, or never accepted)."""
    UNKNOWN = "unknown"
    """The engine could not be asked."""

    @property
    def is_terminal(self) -> bool:
        return self in (EngineState.ENDED, EngineState.GONE)


class Backend(Protocol):
    """Where a runner lives. Implementations: :class:`~pisub.backends.local.LocalBackend`,
    :class:`~pisub.backends.slurm.SlurmBackend`."""

    name: BackendName

    def start(self, paths: RunPaths, lock_fd: int, request: PlacementRequest) -> None:
        """Start the runner of the run at ``paths`` (complete, ``starting``, its placement
        written). ``lock_fd`` holds ``runner.lock`` (the caller closes it afterwards). Returns once
        the runner committed its startup (``local``) or the engine accepted the job (``slurm``,
        whose placement then names the job).

        Raises:
            LaunchFailed: the runner could not start, or the engine refused the job.
        """

    def ring(self, placement: Placement) -> None:
        """Tell the runner a control request is waiting (best effort; never raises)."""

    def cancel(self, placement: Placement) -> bool:
        """End the runner through the engine (a backstop); whether the engine accepted it."""

    def observe(self, placements: Sequence[Placement]) -> dict[str, EngineState]:
        """The engine's state of each placement's job, by job id, in one query."""

    def liveness(self, paths: RunPaths, status: Status, placement: Placement) -> Liveness:
        """Whether the runner of a non-terminal run lives (``DEAD`` only with proof)."""
