"""What both kinds of process child share: a process in its own session and process group, its
pipes watched through the runner's selector, its exit seen through a pidfd, and signals to the
whole group (:class:`ProcessChild`), plus non-blocking writes to its stdin (:class:`PipeWriter`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import signal
import subprocess
from abc import ABC, abstractmethod
from typing import IO

from pisub.children.base import ChildHooks, ChildOutcome, Progress
from pisub.store.output import StreamSink


class PipeWriter:
    """Non-blocking writes to a child's stdin through the runner's selector."""

    def __init__(self, stream: IO[bytes], sel: selectors.BaseSelector) -> None:
        self.stream = stream
        self.sel = sel
        self.fd = stream.fileno()
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._pending = bytearray()
        self._close_when_drained = False
        self._registered = False
        self.closed = False

    def write(self, data: bytes) -> None:
        """Queue ``data``; it is written as the pipe accepts it."""
        if self.closed or self._close_when_drained:
            return
        self._pending += data
        self._flush()

    def close(self) -> None:
        """Close the pipe once everything queued is written."""
        self._close_when_drained = True
        self._flush()

    def abort(self) -> None:
        """Close the pipe now, dropping anything not yet written."""
        self._pending.clear()
        self._do_close()

    def _flush(self, _mask: int = 0) -> None:
        while self._pending and not self.closed:
            try:
                written = os.write(self.fd, self._pending[: 1 << 16])
            except BlockingIOError:
                break
            except (BrokenPipeError, ConnectionResetError):
                self._pending.clear()
                self._do_close()
                return
            del self._pending[:written]
        if self._pending and not self._registered:
            self.sel.register(self.fd, selectors.EVENT_WRITE, self._flush)
            self._registered = True
        elif not self._pending:
            self._unregister()
            if self._close_when_drained:
                self._do_close()

    def _unregister(self) -> None:
        if self._registered:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.fd)
            self._registered = False

    def _do_close(self) -> None:
        self._unregister()
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.stream.close()


class ProcessChild(ABC):
    """A supervised child process (implements :class:`~pisub.children.base.Child`)."""

    def __init__(self, index: int, hooks: ChildHooks) -> None:
        self.index = index
        self.hooks = hooks
        self.proc: subprocess.Popen[bytes] | None = None
        self.progress = Progress()
        self.session_file: str | None = None
        self._pidfd: int | None = None
        self._pidfd_sel: selectors.BaseSelector | None = None
        self._sel: selectors.BaseSelector | None = None
        self._open_streams = 0
        self.sinks: tuple[StreamSink, ...] = ()
        """The child's logs, closed with it."""

    # -- control ------------------------------------------------------------------
    def steer(self, request_id: str, message: str, behavior: str) -> str | None:
        """Deliver ``message`` (``behavior``: ``steer`` or ``followUp``); None when accepted for
        delivery (progress comes through :meth:`ChildHooks.steer_update`), else why not."""
        return f"steering is not supported by the {self.kind} runner"

    def abort(self) -> bool:
        """Abort the current work gracefully; False when the runner must signal instead."""
        return False

    kind = "external-cli"

    # -- lifecycle -------------------------------------------------------------
    @abstractmethod
    def start(self) -> None:
        """Start the process (in its own process group). Raises OSError on failure."""

    @abstractmethod
    def outcome(self) -> ChildOutcome:
        """Describe how the child ended; called once it has exited and been drained."""

    def spawn(self, argv: list[str], *, cwd: str, env: dict[str, str], umask: int) -> None:
        """Start ``argv`` (never through a shell) with three pipes, in a session and process
        group of its own, with no inherited descriptor and the caller's umask."""
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            umask=umask,
        )

    def read_chunk(self, stream: IO[bytes] | None, size: int = 64 * 1024) -> bytes | None:
        """Read what ``stream`` has; None when nothing is ready yet, b"" at EOF (then unwatched)."""
        assert stream is not None
        try:
            data = os.read(stream.fileno(), size)
        except BlockingIOError:
            return None
        if not data:
            self.close_stream(stream)
        return data

    def close_stream(self, stream: IO[bytes]) -> None:
        """Stop watching a stream that reached EOF."""
        if self._sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(stream)
        self._open_streams -= 1

    def register(self, sel: selectors.BaseSelector) -> None:
        """Register every fd the runner should watch; ``key.data`` is a :data:`Callback`."""
        self._sel = sel
        assert self.proc is not None
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        if self._pidfd is not None:
            sel.register(self._pidfd, selectors.EVENT_READ, self._on_exit)
            self._pidfd_sel = sel

    def _on_exit(self, _mask: int) -> None:
        # A pidfd stays readable once the process has exited: stop watching it, or the
        # selector spins while descendants still hold the child's pipes.
        if self.poll() is not None and self._pidfd is not None and self._pidfd_sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._pidfd_sel.unregister(self._pidfd)
            self._pidfd_sel = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        """The return code once the process has exited (it is reaped here), else None."""
        return self.proc.poll() if self.proc else None

    @property
    def streams_open(self) -> bool:
        return self._open_streams > 0

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group."""
        if self.proc is None or (self.proc.returncode is not None and not self.streams_open):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def terminate(self) -> None:
        """Ask the child to end (TERM to its group); the runner escalates to KILL."""
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def exit_status(self) -> tuple[int, int | None]:
        """``(return code, signal)`` of the ended process (the signal that ended it, or None)."""
        assert self.proc is not None and self.proc.returncode is not None
        rc = self.proc.returncode
        return rc, (-rc if rc < 0 else None)

    def close(self, sel: selectors.BaseSelector) -> None:
        """Release the child's fds: its pidfd, its three pipes and its logs."""
        if self._pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(stream)
                    with contextlib.suppress(OSError):
                        stream.close()
        for sink in self.sinks:
            sink.close()
