"""Run modes: what a detached runner runs once it has detached.

A run mode is built from the run's paths, its manifest and the launcher's ``report`` callback,
and :meth:`RunMode.run` runs the run to its end and returns the runner's exit code. Every mode
keeps the same promises, held by ``tests/integration/test_run_mode_contract.py``: it commits
its startup (``running``, with its pid) before it answers the launcher; it answers every
control request with exactly one receipt; it writes ``result.json`` before the terminal
status; it leaves no process of its own behind; and a reader can repair its run if it dies.

Modes: :class:`~pisub.runner.supervise.Supervisor` (one child process) and
:class:`~pisub.runner.coordinator.Coordinator` (a workflow's child runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pisub.protocol.manifest import Manifest
from pisub.store.paths import RunPaths

Report = Callable[[dict[str, object]], None]


class RunMode(Protocol):
    def run(self) -> int:
        """Run the run to its end; the runner's exit code (0: its final files are written)."""


def mode_for(paths: RunPaths, manifest: Manifest, report: Report) -> RunMode:
    """The mode the manifest asks for."""
    if manifest.workflow is not None:
        from pisub.runner.coordinator import Coordinator

        return Coordinator(paths, manifest, report)
    from pisub.runner.supervise import Supervisor

    return Supervisor(paths, manifest, report)
