"""A workflow script's stdout and stderr: kept to a cap in ``script.log``, never in ``runner.log``.

The script runs inside the coordinator's process, so whatever it prints — ``print``, a write
to descriptor 1 or 2, a process it starts — lands on the process's descriptors 1 and 2. Those
are turned into one pipe, read by a thread of its own into a :class:`~pisub.store.output.StreamSink`
capped like a child's output (the run's ``outputCap``): the first ``cap`` bytes are kept in
``script.log``, the rest counted and dropped, and the workflow says so in a
``workflow.script_output_capped`` event. The runner's own lines go on to ``runner.log``
through a copy of the old descriptor 2 (:func:`pisub.runner.recorder.use_log_fd`), so a script
can never crowd out the tail a crash repair reads there.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable
from pathlib import Path

from pisub.runner.recorder import use_log_fd
from pisub.store.output import StreamSink

CHUNK = 64 * 1024

Capped = Callable[[int], None]
"""Called (from the reader thread) once, when the cap is first reached, with the cap."""


class ScriptOutput:
    """Descriptors 1 and 2 of this process, read into ``path`` up to ``cap`` bytes."""

    def __init__(self, path: Path, cap: int, capped: Capped) -> None:
        self.sink = StreamSink(path, cap, tail_size=0)
        self.capped = capped
        self._lock = threading.Lock()
        self._read_fd = -1
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """From now on descriptors 1 and 2 (and what inherits them) feed the sink.

        Raises:
            OSError: the pipe cannot be made (nothing was changed).
        """
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        own_log = os.dup(2)  # runner.log, for the runner's own lines (close-on-exec)
        use_log_fd(own_log)
        for std in (1, 2):
            os.dup2(write_fd, std)  # inheritable: what the script starts writes here too
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._read_fd = read_fd
        self._thread = threading.Thread(target=self._pump, name="script-output", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.sink.total - self.sink.written

    def flush(self) -> None:
        """Take in everything written so far (what is in the pipe now)."""
        self._read_available()

    def close(self) -> None:
        """The workflow is over: what is in the pipe is taken in, and whatever is still printed
        (a script thread that ignored its cancel, a process it left) goes to /dev/null, so the
        runner's exit never waits on a full pipe."""
        self._read_available()
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            for std in (1, 2):
                os.dup2(null, std)
            os.close(null)

    def _pump(self) -> None:
        while True:
            try:
                select.select([self._read_fd], [], [], 1.0)
            except (OSError, ValueError):
                return
            if not self._read_available():
                return

    def _read_available(self) -> bool:
        """Read until the pipe is empty; False at its end (every writer gone)."""
        if self._read_fd < 0:
            return False
        with self._lock:
            while True:
                try:
                    data = os.read(self._read_fd, CHUNK)
                except BlockingIOError:
                    return True
                except OSError:
                    return False
                if not data:
                    return False
                if self.sink.feed(data):
                    with contextlib.suppress(Exception):
                        self.capped(self.sink.cap)
