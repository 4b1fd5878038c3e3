"""The runner's heartbeat lease on its run directory, and its self-fencing (Slurm runs).

A thread rewrites ``heartbeat.json`` every ``ttl / 4`` seconds (the file server stamps its
mtime). Before each renewal it reads the file back: a generation not its own (a repairer took
the run over) **fences** the runner at once. So does a renewal that has not succeeded for
``ttl / 2`` seconds by this node's monotonic clock — well before a reader could see the lease
expire (``ttl`` by the file server's clock). Fencing means: write nothing more, end every process
of the run (SIGKILL), and exit :data:`FENCED_EXIT`. A run whose runner fenced itself is then
repaired by a reader (the engine says its job ended and the lease expired).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from pisub.core.procs import host_name, marked_processes
from pisub.errors import ProtocolError
from pisub.protocol.placement import Heartbeat
from pisub.store import fencing
from pisub.store.paths import RunPaths
from pisub.store.runs import load_heartbeat, write_heartbeat

FENCED_EXIT = 75
"""The runner's exit code after it fenced itself."""


class HeartbeatKeeper:
    """Keeps the runner's lease alive from a daemon thread (see the module)."""

    def __init__(self, paths: RunPaths, ttl: float) -> None:
        self.paths = paths
        self.ttl = ttl
        self.generation = 1
        self.last_renewed = time.monotonic()
        self._stop = threading.Event()

    def start(self) -> None:
        """Write the first heartbeat (raises OSError when it cannot) and keep renewing it."""
        try:
            found = load_heartbeat(self.paths)
        except ProtocolError:
            found = None
        self.generation = found[0].generation + 1 if found is not None else 1
        self._write()
        threading.Thread(target=self._keep, name="pisub-heartbeat", daemon=True).start()
        fencing.install(self.gate)

    def stop(self) -> None:
        self._stop.set()
        fencing.install(None)

    def gate(self) -> None:
        """Before a write: fence when the lease may have lapsed (no renewal for ``ttl / 2``, for
        instance after the process was paused)."""
        if time.monotonic() - self.last_renewed > self.ttl / 2:
            self.fence("the heartbeat lease may have lapsed (no renewal for ttl/2)")

    def _write(self) -> None:
        beat = Heartbeat(
            v=1, generation=self.generation, owner="runner", ttl=self.ttl, pid=os.getpid(), host=host_name()
        )
        write_heartbeat(self.paths, beat)
        self.last_renewed = time.monotonic()

    def _keep(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            self.gate()  # first: after a pause, never renew a lease a repairer may already hold
            try:
                found = load_heartbeat(self.paths)
                if found is None or found[0].generation != self.generation or found[0].owner != "runner":
                    self.fence("the run's heartbeat lease was taken over")
                self._write()
            except (OSError, ProtocolError):
                pass  # the next round fences once no renewal succeeded for ttl / 2

    def fence(self, why: str) -> None:
        """Write nothing more: end the run's processes and exit at once."""
        if self._stop.is_set():
            return
        from pisub.runner.recorder import log_fd

        with contextlib.suppress(OSError):
            os.write(log_fd(), f"pisub runner: fenced: {why}\n".encode())
        for pid in marked_processes(self.paths.run_id):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(FENCED_EXIT)
