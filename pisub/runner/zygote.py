"""The zygote: a fork server of warm runners (what it is for, and the launcher's side:
:mod:`pisub.backends.zygote`). ``python -m pisub.runner.zygote FD``: imports what a runner
imports, says ``ready`` on ``FD``, then forks a warm runner per ``fork`` request until the
launcher's end of ``FD`` closes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

from pisub.backends.warm import passed_fds

EXTRA_PRELOAD = (
    "pisub.runner.__main__",
    "pisub.runner.shell",
    "pisub.runner.lifecycle",
    "pisub.runner.recorder",
    "pisub.runner.tree",
    "pisub.runner.heartbeat",
    "pisub.runner.deadlines",
    "pisub.runner.ending",
    "pisub.core.fsio",
    "pisub.core.locks",
    "pisub.store.paths",
    "pisub.store.leases",
    "pisub.store.events",
    "pisub.protocol.status",
    "pisub.protocol.manifest",
    "pisub.protocol.result",
    "pisub.protocol.control",
    "pisub.store.results",
    "pisub.core.inotify",
    "pisub.acceptance.report",
    "pisub.acceptance.evidence",
    "atexit",
)
"""Imported beside :data:`pisub.backends.warm.PRELOAD` (a missing one is skipped): the zygote
imports once what each fork would otherwise import after its hand-off."""


MAX_FD = 1 << 20
"""Above any descriptor the zygote may have inherited (``close_range`` makes it one call)."""


# -- the zygote's side ---------------------------------------------------------------------------


def preload() -> None:
    """Import what a runner imports up to its startup commit, then keep those objects out of
    the garbage collector's passes (a pass would write to every page and unshare it)."""
    import gc
    import importlib

    from pisub.protocol.msgspec_lean import import_msgspec

    import_msgspec()
    from pisub.backends import warm

    for name in (*warm.PRELOAD, *EXTRA_PRELOAD):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _type_info()
    gc.collect()
    gc.freeze()


def _type_info() -> None:
    """Build msgspec's type information of every protocol struct imported (msgspec builds it
    on a struct's first decode, in every process again: some 10-40 ms of a runner's start)."""
    import msgspec

    for name, module in list(sys.modules.items()):
        if not name.startswith("pisub.") or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and issubclass(value, msgspec.Struct) and value.__module__ == name:
                with contextlib.suppress(Exception):  # a generic or odd struct: built when used
                    msgspec.json.Decoder(value)


def serve(fd: int) -> int:
    """Fork a warm runner per request on ``fd`` until its other end closes."""
    # Nothing its launcher left inheritable goes on to the runners (promise 3: a runner
    # inherits no descriptor but its lock and its answer's).
    os.closerange(3, fd)
    os.closerange(fd + 1, MAX_FD)
    preload()
    sock = socket.socket(fileno=fd)
    sock.sendall(b"ready")
    while True:
        try:
            data, ancdata, _flags, _addr = sock.recvmsg(64, socket.CMSG_SPACE(4))
        except InterruptedError:
            continue
        except OSError:
            return 0
        passed = passed_fds(ancdata)
        if not data or data != b"fork" or len(passed) != 1:
            for extra in passed:
                with contextlib.suppress(OSError):
                    os.close(extra)
            return 0  # the launcher is gone (or spoke nonsense): nothing more to fork
        warm_fd = passed[0]
        try:
            pid = os.fork()
        except OSError:
            os.close(warm_fd)
            sock.sendall(b"no")
            continue
        if pid == 0:
            _become_warm(sock, warm_fd)
        os.close(warm_fd)
        sock.sendall(b"pid %d" % pid)
        _reap()  # the forks before it (each forks its runner and exits at once)


def _reap() -> None:
    """Collect the forks that have exited, without waiting for any."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_warm(sock: socket.socket, warm_fd: int) -> None:
    """In the fork: a session of its own, then on as a spawned warm runner; never returns."""
    code = 1
    try:
        sock.close()
        os.setsid()
        from pisub.runner.__main__ import exit_now, main

        exit_now(main(["--warm-fd", str(warm_fd)]))
    finally:
        os._exit(code)


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(serve(int(sys.argv[1])))
