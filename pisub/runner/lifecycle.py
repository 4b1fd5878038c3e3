"""What every run mode does the same way at the edges of a run: taking signals, the startup
commit's facts, and retrying the final writes while the disk is full."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from collections.abc import Callable

from pisub.core.procs import boot_id, host_name, start_ticks, start_time
from pisub.errors import PisubError, StorageError
from pisub.protocol.manifest import Manifest
from pisub.protocol.placement import BackendName
from pisub.protocol.status import RunState, Status
from pisub.runner.recorder import WriteTrouble, note

FINAL_WRITE_S = 30.0
"""How long a runner keeps retrying its final writes (full disk) before it exits and leaves
the run to a reader's repair."""


RETRY_S = 1.0
"""How soon unpublished receipts are retried."""


def take_signals(
    sel: selectors.BaseSelector,
    on_signal: Callable[[int, object], None],
    on_doorbell: Callable[[int, object], None] | None = None,
) -> None:
    """SIGTERM and SIGINT call ``on_signal`` and wake ``sel``; SIGUSR1 (the doorbell: a control
    request is waiting) calls ``on_doorbell`` and wakes ``sel``; SIGHUP is ignored — by a no-op
    handler, not SIG_IGN: handlers reset to the default on exec, so a child does not inherit an
    ignored SIGHUP."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    sel.register(wake_r, selectors.EVENT_READ, lambda _mask: drain(wake_r))
    signal.signal(signal.SIGHUP, _ignore)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGUSR1, on_doorbell or _ignore)


def placed_by_engine(manifest: Manifest) -> bool:
    """Whether an engine (Slurm) placed the runner: its run directory is on shared storage."""
    return manifest.placement is not None and manifest.placement.backend != BackendName.LOCAL


def mark_running(status: Status) -> Status:
    """``status`` as the startup commit writes it: ``running``, with this process's identity."""
    status.state = RunState.RUNNING
    status.pid = os.getpid()
    status.pid_start_time = start_time(os.getpid())
    status.pid_start_ticks = start_ticks(os.getpid())
    status.boot_id = boot_id()
    status.host = host_name()  # the node an engine placed the runner on
    return status


def persist(trouble: WriteTrouble, what: str, write: Callable[[], object], deadline: float) -> bool:
    """Run ``write`` until it stops failing (a full disk may free up), at most until
    ``deadline``; whether it succeeded."""
    delay = 0.05
    while True:
        try:
            write()
            return True
        except (OSError, PisubError) as exc:
            errno_ = exc.errno if isinstance(exc, OSError | StorageError) else None
            trouble(what, exc if isinstance(exc, OSError) else OSError(errno_ or 0, str(exc)))
            if time.monotonic() + delay > deadline:
                note(f"gave up trying to {what}; a reader will repair the run when it can write")
                return False
        time.sleep(delay)  # a retry back-off while the disk is full, not a wait for an event
        delay = min(delay * 2, 2.0)


def drain(fd: int) -> None:
    """Read a non-blocking wake-up pipe empty."""
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass


def _ignore(_signum: int, _frame: object) -> None:
    return None
