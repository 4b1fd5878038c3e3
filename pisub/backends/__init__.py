"""Where a runner lives: the backend seam (:mod:`pisub.backends.base`), today's detached local
process (:mod:`pisub.backends.local`) and Slurm batch jobs (:mod:`pisub.backends.slurm`).

Readers ask :func:`liveness` before any repair: the run's ``placement.json`` names the backend
that can tell whether its runner lives.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: ``pisub run`` starts its warm runner before importing it)

if TYPE_CHECKING:
    from typing import Any

    from pisub.backends.base import Backend, EngineState, Liveness
    from pisub.protocol.placement import BackendName, Placement
    from pisub.protocol.status import Status
    from pisub.store.paths import RunPaths

__all__ = ["Backend", "EngineState", "Liveness", "backend_for", "liveness", "prime"]

_BASE = frozenset({"Backend", "EngineState", "Liveness"})


def __getattr__(name: str) -> Any:
    """The seam's types, imported on first use: a launcher that only starts a warm runner
    (:mod:`pisub.backends.warm`, the first thing ``pisub run`` does) pays for none of the
    protocol records behind them."""
    if name in _BASE:
        from pisub.backends import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_for(name: BackendName) -> Backend:
    """The backend called ``name``."""
    from pisub.protocol.placement import BackendName

    if name == BackendName.SLURM:
        from pisub.backends.slurm import SlurmBackend

        return SlurmBackend()
    from pisub.backends.local import LocalBackend

    return LocalBackend()


def liveness(paths: RunPaths, status: Status, placement: Placement | None = None) -> Liveness:
    """Whether the runner of a run that is not terminal lives, by the backend that placed it
    (its ``placement.json``; an unreadable one is ``unknown``: no repair on a guess)."""
    from pisub.backends.base import Liveness
    from pisub.errors import ProtocolError
    from pisub.store.runs import load_placement

    if placement is None:
        try:
            placement = load_placement(paths)
        except ProtocolError:
            return Liveness.UNKNOWN
    return backend_for(placement.backend).liveness(paths, status, placement)


def prime(runs: list[RunPaths]) -> None:
    """Ask each engine about all of ``runs`` at once (one query per backend), so that the
    liveness checks that follow reuse the answer instead of asking once per run."""
    from collections import defaultdict

    from pisub.errors import ProtocolError
    from pisub.protocol.placement import BackendName
    from pisub.store.runs import load_placement

    placed: dict[BackendName, list[Placement]] = defaultdict(list)
    for paths in runs:
        try:
            placement = load_placement(paths)
        except ProtocolError:
            continue
        if placement.backend != BackendName.LOCAL:
            placed[placement.backend].append(placement)
    for name, placements in placed.items():
        backend_for(name).observe(placements)
