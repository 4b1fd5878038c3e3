"""A fork server of warm runners, for a workflow's coordinator that starts many children: the
launcher's side (the zygote itself is :mod:`pisub.runner.zygote`).

Each child of a workflow is a run with a runner of its own. Started the ordinary way, each
runner is a fresh interpreter that imports what a runner needs (:mod:`pisub.backends.warm`):
some 0.1 CPU-seconds per child, most of a 64-child fan-out's start on two cores. The
**zygote** pays that once: a process started like a warm runner (``posix_spawn``, a session
of its own, nothing inherited but its socket), which imports everything a runner imports on
its way to its startup commit, freezes its objects out of the garbage collector's reach (so
that its forks share its memory pages), and then, single-threaded, forks one **warm runner**
per request. A fork makes itself a session leader (``setsid``) and goes on exactly as a
spawned warm runner goes on (:func:`pisub.runner.__main__.main` with ``--warm-fd``): it forks
once more (the runner is no session leader), waits for its run on the socket it was handed,
acknowledges, waits for ``go``, and becomes the run's runner. The launcher then hands it the
run through the ordinary warm hand-off (:func:`pisub.backends.local.spawn_runner`): the run is
created, journaled and committed exactly as with any warm runner, and a failure anywhere falls
back to the ordinary start.

The protocol on the zygote's socket (``SOCK_SEQPACKET``): the zygote says ``ready`` once it
has imported; each request is one message ``fork`` carrying one descriptor (the warm runner's
end of a new socket pair), answered ``pid N`` (the new warm runner's session, whose group the
launcher may kill while the warm runner was never handed its run) or ``no`` (the fork failed).
The zygote exits when its launcher's end closes (the launcher ended or died).

A warm runner forked by the zygote is no child of the launcher: when its intermediate exits,
the runner is re-parented to the nearest subreaper — the coordinator, as a cold-started
child's runner is. It survives the coordinator like any runner (``spec/guarantees.md`` §3);
one never handed a run exits when its launcher's end of its socket closes.
"""

from __future__ import annotations

import _socket
import array
import contextlib
import os
import select
import signal
import socket
import threading

READY_WAIT_S = 10.0
"""How long a launcher waits for the zygote's ``ready`` (its imports) before it gives up on it."""

ANSWER_WAIT_S = 5.0
"""How long a launcher waits for the answer to one ``fork``."""


class Zygote:
    """The launcher's side: a started zygote, shared by the launcher's threads."""

    def __init__(self, pid: int, sock: _socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.ready = False
        self.broken = False
        self.reaped = False

    @classmethod
    def start(cls) -> Zygote | None:
        """Start a zygote (None: it could not be started; the launcher starts runners as ever)."""
        from pisub.backends.warm import SOCKET_FD, spawn_with_socket

        spawned = spawn_with_socket(["pisub.runner.zygote", str(SOCKET_FD)])
        return None if spawned is None else cls(*spawned)

    def make(self) -> object | None:
        """A new warm runner (a :class:`pisub.backends.warm.Warm`), or None when the zygote is
        not there (gone, not ready in time, or it could not fork): the caller starts the run's
        runner as ever."""
        from pisub.backends.warm import Warm

        if self.broken or os.getpid() != self.owner:
            return None
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            return None
        try:
            with self.lock:
                if self.broken:
                    raise OSError("the zygote is gone")
                if not self.ready:
                    if _receive(self.sock, READY_WAIT_S) != b"ready":
                        raise OSError("the zygote did not get ready")
                    self.ready = True
                fds = array.array("i", [theirs.fileno()])
                self.sock.sendmsg([b"fork"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                answer = _receive(self.sock, ANSWER_WAIT_S)
        except OSError:
            self._broke()
            ours.close()
            return None
        finally:
            theirs.close()
        if not answer.startswith(b"pid ") or not answer[4:].isdigit():
            if answer != b"no":
                self._broke()
            ours.close()
            return None
        return Warm(pid=int(answer[4:]), sock=ours, owner=self.owner)

    def _broke(self) -> None:
        """Any failure ends the zygote: a late answer must never be read as the next one's."""
        self.broken = True
        self.dismiss()

    def dismiss(self) -> None:
        """End the zygote now and wait for it (the warm runners it forked are not its children:
        each goes on, or exits when its own socket closes)."""
        if os.getpid() != self.owner or self.reaped:
            return  # (once reaped, its pid may be another process's)
        self.broken = True
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, 0)
        self.reaped = True


def _receive(sock: _socket.socket, timeout: float) -> bytes:
    ready, _, _ = select.select([sock], [], [], timeout)
    if not ready:
        raise OSError("no answer from the zygote")
    data = sock.recv(64)
    if not data:
        raise OSError("the zygote is gone")
    return data
