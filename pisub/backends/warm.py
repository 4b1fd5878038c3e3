"""Warm runners: a runner process started *before* its run exists, handed the run when it does.

A cold launch starts a fresh Python for the runner only after the manifest is written, so the
launcher waits for that interpreter's start-up and imports (most of a launch's time). A warm
runner is started at the beginning of a launch (the CLI does it before it even imports its
argument parser), imports what a runner needs while the launcher checks the agent and writes
the manifest, and then waits on a Unix socket for the **handoff**: one message naming the run
directory and carrying the launcher's environment, with ``runner.lock`` and ``runner.log`` as
passed descriptors. It acknowledges at once (``{"got": true}``), waits for the launcher's
``{"go": true}``, becomes the run's runner, and answers on the same socket exactly as a cold
runner answers on its readiness pipe.

Every failure falls back to a cold start: a warm runner that is gone, or that closes the
socket before its acknowledgement, has done nothing with the run (the launcher still holds
``runner.lock``). A warm runner nobody hands a run to exits when the socket closes (its
launcher exited) or after :data:`IDLE_S` seconds.

A process that launches runs through the API keeps one warm **spare** for its next launch
(``PISUB_WARM=0`` turns warm runners off; ``PISUB_WARM=1`` keeps them, but no spare).
"""

from __future__ import annotations

import _socket  # (not socket's wrapper: its enums and selectors are ~3 ms before the spawn)
import _thread
import os
import select
import sys

IDLE_S = 60.0
"""How long a warm runner waits for its run before it exits."""

ENV_WARM = "PISUB_WARM"
"""``0``: no warm runners (every launch starts its runner cold); ``1``: warm, no spares."""

_MAX_MESSAGE = 1 << 20
GOT = b'{"got": true}'
"""The warm runner's acknowledgement of a handoff."""
GO = b'{"go": true}'
"""The launcher's answer to it: only now may the warm runner act on the run. A launcher that
gave up waiting for the acknowledgement closes the socket instead, so a late acknowledgement
can never make a second runner of a run that has meanwhile been started cold."""
GO_WAIT_S = 30.0
_lock = _thread.allocate_lock()  # (not threading's: a launch starts its warm runner before importing it)
_pool: list[Warm] = []
_spares = True


class Warm:
    """A started warm runner, owned by the process that started it."""

    __slots__ = ("owner", "pid", "sock")

    def __init__(self, pid: int, sock: _socket.socket, owner: int) -> None:
        self.pid = pid
        """The process ``posix_spawn`` started (the session leader; it forks the runner and exits)."""
        self.sock = sock
        self.owner = owner
        """The pid of the launcher that started it (a forked copy of the launcher leaves it be)."""

    def alive(self) -> bool:
        """Not known to be gone: its end of the socket is still open."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable  # it never writes before the handoff: readable means closed

    def discard(self) -> None:
        import contextlib  # (here and below: not before the spawn)

        with contextlib.suppress(OSError):
            self.sock.close()
        self.reap()

    def dismiss(self) -> None:
        """End it now (it was never handed a run) rather than when it sees the socket close,
        and wait (briefly) until it is gone: a command that did not launch leaves no process."""
        if self.alive():  # its process group still exists, so the id is still its own
            import contextlib
            import signal

            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
                _wait_closed(self.sock, DISMISS_WAIT_S)
        self.discard()

    def reap(self) -> None:
        """Collect the session leader (it exits as soon as it has forked the runner)."""
        import contextlib

        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, 0)


DISMISS_WAIT_S = 2.0
"""How long :meth:`Warm.dismiss` waits for a killed warm runner to be gone."""


def _wait_closed(sock: _socket.socket, timeout: float) -> None:
    """Wait until the other end of ``sock`` is closed (a killed process's descriptors close
    after its memory is released: it no longer shows a command line or environment), at most
    ``timeout`` seconds. Nothing else comes from a warm runner that was never handed a run."""
    import time

    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            readable, _, _ = select.select([sock], [], [], left)
            if not readable or not sock.recv(64):
                return
        except OSError:
            return


def enabled() -> bool:
    return os.environ.get(ENV_WARM, "") != "0"


def spares() -> bool:
    return _spares and os.environ.get(ENV_WARM, "") not in ("0", "1")


def configure(*, spares: bool) -> None:
    """``spares=False``: this process launches once (the command line), keep no spare."""
    global _spares
    _spares = spares


def prestart() -> None:
    """Start a warm runner for this process's next launch, unless one is waiting (best effort:
    any failure leaves the next launch cold)."""
    if not enabled():
        return
    with _lock:
        _forget_foreign()
        if _pool:
            return
        warm = _start()
        if warm is not None:
            _pool.append(warm)
            _dismiss_at_exit()


_registered = False


def _dismiss_at_exit() -> None:
    global _registered
    if not _registered:
        import atexit

        atexit.register(dismiss_all)
        _registered = True


def dismiss_all() -> None:
    """End this process's unused warm runners (at exit: nothing is left behind)."""
    with _lock:
        _forget_foreign()
        while _pool:
            _pool.pop().dismiss()


def offer(warm: Warm) -> None:
    """Put a warm runner made elsewhere (a fork of a workflow's zygote,
    :mod:`pisub.runner.zygote`) in this process's pool, for its next launch."""
    with _lock:
        _pool.append(warm)
        _dismiss_at_exit()


def take() -> Warm | None:
    """A live warm runner of this process, taken out of the pool."""
    with _lock:
        _forget_foreign()
        while _pool:
            warm = _pool.pop()
            if warm.alive():
                return warm
            warm.discard()
    return None


def refill() -> None:
    """Keep a spare warm runner for the next launch (when spares are on)."""
    if spares():
        prestart()


BACK_TO_BACK_S = 0.2
"""A launch that starts within this long of the previous one's end is back to back."""
_last_launched = float("-inf")


def launched() -> None:
    """A launch has ended (its runner committed): note when, and keep a spare."""
    global _last_launched
    import time

    _last_launched = time.monotonic()
    refill()


def refill_back_to_back() -> None:
    """At a handoff (the launcher now only waits for the runner's commit): when this launch
    came back to back after the previous one, start the next launch's spare now rather than
    after the commit — back to back, a spare started after the commit was still importing when
    the next launch handed it its run, no faster than a cold start. A launch that came alone
    (the first in a process, or one after a pause) leaves its runner the machine: its spare
    starts after the commit (:func:`launched`), where it has time to get ready."""
    import time

    if time.monotonic() - _last_launched < BACK_TO_BACK_S:
        refill()


def _forget_foreign() -> None:
    """Drop warm runners a parent of this (forked) process started: they are not ours to use."""
    mine = os.getpid()
    _pool[:] = [warm for warm in _pool if warm.owner == mine]


_RUN_MARKERS = ("PISUB_RUN_ID", "PISUB_RUN_DIR", "PISUB_ROOT_RUN_ID", "PISUB_DEPTH", "PISUB_RUNNER")
""":data:`pisub.protocol.env.RUN_MARKERS` (a test holds them equal), spelt out: the launcher starts
its warm runner before it imports the protocol (or :mod:`typing`, which it imports)."""


def _start() -> Warm | None:
    spawned = spawn_with_socket(["pisub.runner", "--warm-fd", str(SOCKET_FD)])
    if spawned is None:
        return None
    return Warm(pid=spawned[0], sock=spawned[1], owner=os.getpid())


SOCKET_FD = 3
"""Where a process :func:`spawn_with_socket` starts finds its end of the socket pair."""


def spawn_with_socket(module_argv: list[str]) -> tuple[int, _socket.socket] | None:
    """Start ``python -P -m MODULE_ARGV…`` in a session of its own (stdin, stdout and stderr on
    ``/dev/null``; the environment without a run's markers) holding one end of a fresh
    ``SOCK_SEQPACKET`` pair on :data:`SOCKET_FD`; its pid and the other end (None: it could not
    be started). ``-P``: the launcher's working directory is not put on the new process's path
    (``-m`` would, and a ``pisub`` folder there — another checkout, an older version — would be
    imported instead of this pisub)."""
    try:
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    except OSError:
        return None
    env = {k: v for k, v in os.environ.items() if k not in _RUN_MARKERS}  # (store.paths' without_markers)
    argv = [sys.executable, "-P", "-m", *module_argv]
    actions: list[tuple[object, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    source = theirs.fileno()
    spare = -1
    try:
        if source == SOCKET_FD:  # dup2(3, 3) would leave it close-on-exec
            spare = os.dup(source)
            source = spare
        actions.append((os.POSIX_SPAWN_DUP2, source, SOCKET_FD))
        pid = os.posix_spawn(sys.executable, argv, env, file_actions=actions, setsid=True)
    except OSError:
        ours.close()
        return None
    finally:
        theirs.close()
        if spare >= 0:
            os.close(spare)
    return pid, ours


class WarmGone(Exception):
    """The warm runner did not take the run; the launcher starts a cold one."""


def hand_off(warm: Warm, run_dir: str, env: dict[str, str], lock_fd: int, log_fd: int) -> int:
    """Give the run to ``warm``: the socket's descriptor to read its answer on, once it has
    acknowledged (the caller owns and closes it).

    Raises:
        WarmGone: it is gone or refused before its acknowledgement (nothing was done).
    """
    import array
    import json

    body = json.dumps({"run_dir": run_dir, "env": dict(map(_latin, env.items()))}).encode()
    fds = array.array("i", [lock_fd, log_fd])
    # Every way out before GO ends the warm runner (it has done nothing with the run): one that
    # is only slow (stopped, swapped out) must not outlive its launcher.
    if len(body) > _MAX_MESSAGE:
        warm.dismiss()
        raise WarmGone("the handoff is too large")
    try:
        warm.sock.sendmsg([body], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        ack = _receive(warm.sock, timeout=10.0)
    except OSError as exc:
        warm.dismiss()
        raise WarmGone(str(exc)) from None
    if ack != GOT:
        warm.dismiss()  # it proceeds only on GO
        raise WarmGone("no acknowledgement")
    try:
        warm.sock.send(GO)
    except OSError as exc:
        warm.dismiss()
        raise WarmGone(str(exc)) from None
    warm.reap()
    return warm.sock.detach()


def _latin(item: tuple[str, str]) -> tuple[str, str]:
    """An environment entry as latin-1 text of its bytes (lossless, undecodable bytes too)."""
    key, value = item
    return _as_latin(key), _as_latin(value)


def _as_latin(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


def _receive(sock: _socket.socket, timeout: float) -> bytes:
    ready, _, _ = select.select([sock], [], [], timeout)
    if not ready:
        raise OSError("the warm runner did not acknowledge")
    return sock.recv(64)


# -- the runner's side ---------------------------------------------------------------------------

PRELOAD = (
    "pisub.store.runs",
    "pisub.core.procs",
    "pisub.runner.modes",
    "pisub.runner.supervise",
    "pisub.children.external_cli",
    "pisub.runner.inbox",
    "pisub.runner.dispatch",
    "pisub.store.mailbox",
    "pisub.children.pi.rpc",
    "pisub.store.leases",
    "pisub.store.briefs",
)
"""What a supervising runner imports on its way to its startup commit, what every run needs
first (a workflow's coordinator imports the rest after the handoff)."""

PRELOAD_TYPES = (
    "pisub.protocol.manifest:Manifest",
    "pisub.protocol.status:Status",
    "pisub.protocol.placement:Placement",
)
"""The records a runner decodes first: msgspec builds a record's type information on its first
decode, in every process (some 5 ms of a runner's way from the handoff to its startup commit);
a warm runner builds it while it waits, after :data:`PRELOAD` (the zygote builds every one)."""


def preload(fd: int | None = None) -> None:
    """Import :data:`PRELOAD`; with ``fd`` (the handoff socket), stop as soon as something
    arrives on it: a run handed over waits for no import it may not need (it imports what it
    uses itself, as a cold runner does), and a launcher that went away is noticed at once."""
    import importlib

    for name in PRELOAD:
        if fd is not None and _readable(fd):
            return
        importlib.import_module(name)
    import msgspec

    for spec in PRELOAD_TYPES:
        if fd is not None and _readable(fd):
            return
        module, _, name = spec.partition(":")
        msgspec.json.Decoder(getattr(importlib.import_module(module), name))


def _readable(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class Handoff:
    __slots__ = ("env", "lock_fd", "log_fd", "run_dir")

    def __init__(self, run_dir: str, lock_fd: int, log_fd: int, env: dict[bytes, bytes]) -> None:
        self.run_dir = run_dir
        self.lock_fd = lock_fd
        self.log_fd = log_fd
        self.env = env


def await_handoff(fd: int, idle: float = IDLE_S) -> Handoff | None:
    """Wait for the run (None: the launcher went away, or nothing came within ``idle``
    seconds, or the message was not a handoff); acknowledges it."""
    sock = _socket.socket(fileno=fd)
    try:
        ready, _, _ = select.select([sock], [], [], idle)
        if not ready:
            return None
        data, ancdata, _flags, _addr = sock.recvmsg(_MAX_MESSAGE, _socket.CMSG_SPACE(2 * 4))
    except OSError:
        return None
    finally:
        sock.detach()
    fds = passed_fds(ancdata)
    handoff = _parse(data, fds)
    if handoff is None:
        _close_all(fds)
        return None
    if not _confirmed(fd):
        _close_all([handoff.lock_fd, handoff.log_fd])
        return None
    return handoff


def _close_all(fds: list[int]) -> None:
    import contextlib

    for passed in fds:
        with contextlib.suppress(OSError):
            os.close(passed)


def _confirmed(fd: int) -> bool:
    """Acknowledge the handoff and wait for the launcher's GO."""
    try:
        os.write(fd, GOT)
        ready, _, _ = select.select([fd], [], [], GO_WAIT_S)
        return bool(ready) and os.read(fd, 64) == GO
    except OSError:
        return False


def passed_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors an ``SCM_RIGHTS`` message carried (a warm runner's and the zygote's hand-offs)."""
    import array

    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            passed = array.array("i")
            passed.frombytes(payload[: len(payload) - len(payload) % passed.itemsize])
            fds.extend(passed)
    return fds


def _parse(data: bytes, fds: list[int]) -> Handoff | None:
    import json

    try:
        message = json.loads(data)
        run_dir, env = message["run_dir"], message["env"]
        if not isinstance(run_dir, str) or not isinstance(env, dict) or len(fds) != 2:
            return None
        environ = {
            k.encode("latin-1"): v.encode("latin-1")
            for k, v in env.items()
            if isinstance(k, str) and isinstance(v, str)
        }
    except (ValueError, KeyError, TypeError, UnicodeEncodeError):
        return None
    return Handoff(run_dir=run_dir, lock_fd=fds[0], log_fd=fds[1], env=environ)
