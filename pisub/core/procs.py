"""Process facts and process-tree termination.

Identity of a process is ``(pid, start time)``: a pid alone may have been reused.
A process is *proven dead* when its pid is gone, is a zombie, or belongs to a process
started at another time. psutil is imported lazily (only paths that look at live
processes need it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pisub.protocol.env import ENV_RUN_ID

if TYPE_CHECKING:  # (subprocess and ctypes load where used: a reader of runs needs neither)
    import subprocess

START_TIME_TOLERANCE = 0.015
"""Start times are known to 1/100 s; two values closer than this are the same process."""

MARKER_ENV = ENV_RUN_ID
"""Environment variable set in every child; lets a later process find strays."""


def start_time(pid: int) -> float | None:
    """The start time of ``pid`` in seconds since the epoch, or None when it is gone.

    For people only: it is derived from the boot time, which moves when the wall clock is
    stepped. Identity checks compare :func:`start_ticks`.
    """
    if _HAVE_PROC:  # as psutil computes it (start ticks / ticks per second + boot time), without it
        boot = _boot_time()
        if boot is not None:
            try:
                ticks = start_ticks(pid)
            except OSError:
                ticks = None
            return ticks / _CLOCK_TICKS + boot if ticks is not None else None
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start ticks since boot)`` of ``pid`` from ``/proc/<pid>/stat``; None when gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            data = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data.rsplit(b")", 1)[-1].split()
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (Linux); None when it is gone.

    Unlike a start time in epoch seconds this never moves with the wall clock, so
    ``(pid, start ticks, boot id)`` names one process for good.
    """
    stat = _proc_stat(pid)
    return stat[1] if stat is not None else None


def is_alive(pid: int | None, started: float | None = None, ticks: int | None = None) -> bool:
    """Whether the process ``(pid, start)`` still runs (a zombie counts as dead).

    ``ticks`` (boot-relative start ticks) is compared exactly when given; else ``started``
    (epoch seconds, from records written by older versions) within a tolerance; with neither,
    only the pid and zombie state are checked. A process that cannot be inspected counts as
    alive (fail closed).
    """
    if pid is None or pid <= 0:
        return False
    if _HAVE_PROC:
        try:
            stat = _proc_stat(pid)
        except OSError:
            return True  # cannot inspect (e.g. hidepid): fail closed
        if stat is None:
            return False
        state, proc_ticks = stat
        if state in ("Z", "X", "x"):
            return False
        if ticks is not None:
            return proc_ticks == ticks
        if started is None:
            return True
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        if started is not None and abs(proc.create_time() - started) > START_TIME_TOLERANCE:
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return True


_HAVE_PROC = os.path.exists("/proc/self/stat")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@cache
def _boot_time() -> float | None:
    """The boot time in seconds since the epoch (``btime`` in ``/proc/stat``), or None."""
    try:
        with open("/proc/stat", "rb") as fh:
            for line in fh:
                if line.startswith(b"btime"):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


@cache
def boot_id() -> str | None:
    """The kernel's boot id (Linux), so pids from another boot are known to be stale."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


@cache
def host_name() -> str:
    return os.uname().nodename


def set_child_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); whether it worked."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def environ_value(pid: int, name: str) -> str | None:
    """The value of variable ``name`` in the environment ``pid`` started with (Linux), or None
    (unset, gone, or not readable)."""
    needle = f"{name}=".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read()
    except OSError:
        return None
    for item in env.split(b"\0"):
        if item.startswith(needle):
            return item[len(needle) :].decode("utf-8", "replace")
    return None


def cwd_of(pid: int) -> str | None:
    """The working directory of ``pid`` (Linux), or None (gone, or not readable)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def children_of(pid: int) -> list[int]:
    """The live children of ``pid``."""
    found = _proc_children(pid)
    if found is not None:
        return found
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def _proc_children(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/<pid>/task/*/children`` (each thread's; Linux with
    ``CONFIG_PROC_CHILDREN``): one small read per thread instead of psutil's scan of every
    process's ``stat``. None when the kernel does not offer them ([] when ``pid`` is gone)."""
    try:
        tasks = os.listdir(f"/proc/{int(pid)}/task")
    except FileNotFoundError:
        return []
    except OSError:
        return None
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{int(pid)}/task/{tid}/children", "rb") as fh:
                found += [int(child) for child in fh.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{int(pid)}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None  # no children files in this kernel
        except (OSError, ValueError):
            return None
    return sorted(set(found))  # (zombies included, as psutil lists them)


def marked_processes(run_id: str, *, name: str = MARKER_ENV) -> list[int]:
    """Pids whose environment says ``PISUB_RUN_ID=<run_id>`` (or ``<name>=<run_id>``; Linux
    /proc scan)."""
    needle = f"{name}={run_id}".encode()
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


def kill_all(pids: Iterable[int], *, pgids: Iterable[int] = (), grace: float = 1.0) -> list[int]:
    """TERM the groups and pids, wait up to ``grace``, then KILL what is left.

    Returns the pids that were still alive after the KILL (normally none).
    """
    import psutil

    procs: list[psutil.Process] = []
    for pid in set(pids):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            procs.append(psutil.Process(pid))
    groups = set(pgids)
    for pgid in groups:
        signal_group(pgid, signal.SIGTERM)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.terminate()
    _gone, alive = psutil.wait_procs(procs, timeout=grace)
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.kill()
    _gone, alive = psutil.wait_procs(alive, timeout=1.0)
    return [p.pid for p in alive if _not_zombie(p)]


def _not_zombie(proc: object) -> bool:
    import psutil

    assert isinstance(proc, psutil.Process)
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap_adopted(keep: int | None) -> None:
    """Reap exited children other than ``keep`` (orphans adopted as a subreaper)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0 or info.si_pid == keep:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, os.WNOHANG)


STOP_POLL_S = 0.2
"""How often :func:`run_bounded` asks its ``should_stop`` while a command runs."""


class OutputUnwritable(OSError):
    """:func:`run_bounded` could not open its ``output`` file (the command was not started)."""


class Finished(NamedTuple):
    """What a bounded command did: its exit code (negative: the signal that ended it), its output
    when it went to pipes, and whether it was ended early (``timed_out``, ``stopped``). (Not a
    dataclass: ``dataclasses`` imports ``inspect``, some 8 ms of a command that reads runs.)"""

    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    stopped: bool = False


def run_bounded(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    output: Path | None = None,
    cap: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    grace: float = 0.0,
) -> Finished:
    """Run ``argv`` (no shell) in a session and process group of its own, bounded in time, and
    end the whole group afterwards: nothing it started outlives the call, and it is reaped.

    ``stdin`` is fed to it (else it reads ``/dev/null``). Its stdout and stderr come back in the
    result, or, with ``output``, both go to that file (created or truncated, 0600, never through
    a symlink) — cut to its first and last ``cap`` bytes afterwards when ``cap`` is given. Past
    ``timeout`` seconds, or once ``should_stop()`` says so (asked every :data:`STOP_POLL_S`), the
    group is ended: ``SIGTERM`` and up to ``grace`` seconds for the command to go first when
    ``grace`` is set, then ``SIGKILL``.

    Raises:
        OutputUnwritable: ``output`` cannot be opened. OSError, ValueError: ``argv`` cannot be
            started, or talking to it failed (its group is ended first).
    """
    import subprocess

    fd = _open_output(output) if output is not None else None
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if fd is None else fd,
            stderr=subprocess.PIPE if fd is None else subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if fd is not None:
            os.close(fd)
    try:
        done = _await(proc, stdin, time.monotonic() + timeout, should_stop)
        if done.timed_out or done.stopped:
            end_group(proc, grace)
            out, err = _drain(proc)
            done = Finished(proc.returncode, out, err, done.timed_out, done.stopped)
    except BaseException:
        end_group(proc)
        with contextlib.suppress(OSError, ValueError):
            _drain(proc)
        raise
    end_group(proc)  # nothing it started outlives it
    if output is not None and cap is not None:
        cap_file(output, cap)
    return done


DRAIN_S = 2.0
"""How long what is left in the pipes is read once the group has ended: a process that left
the group (``setsid``) may hold them open for ever."""


def _drain(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """What is left in the pipes of an ended group, read for at most :data:`DRAIN_S`."""
    import subprocess

    try:
        out, err = proc.communicate(timeout=DRAIN_S)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        proc.wait()
        return b"", b""
    return out or b"", err or b""


def _open_output(path: Path) -> int:
    """The output file, opened for writing: a regular file (a FIFO or device would block or
    leak), never through a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise OutputUnwritable(exc.errno, exc.strerror, exc.filename) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputUnwritable(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return fd


def _await(
    proc: subprocess.Popen[bytes],
    stdin: bytes | None,
    deadline: float,
    should_stop: Callable[[], bool] | None,
) -> Finished:
    """Feed ``stdin``, collect the output and wait for the exit; the returned record is marked
    ``timed_out`` or ``stopped`` (with no exit code yet) when the command was still running."""
    import subprocess

    feed = stdin
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return Finished(-1, timed_out=True)
        try:
            out, err = proc.communicate(feed, timeout=left if should_stop is None else min(STOP_POLL_S, left))
            return Finished(proc.returncode, out or b"", err or b"")
        except subprocess.TimeoutExpired:
            feed = None  # a retried communicate carries on with the input it was given
            if should_stop is not None and should_stop():
                return Finished(-1, stopped=True)


def end_group(proc: subprocess.Popen[bytes], grace: float = 0.0) -> None:
    """End ``proc``'s whole process group (it was started in a session of its own) and reap it:
    with ``grace``, ``SIGTERM`` first and up to ``grace`` seconds for ``proc`` to exit; then
    ``SIGKILL`` to whatever is left of the group."""
    import subprocess

    if grace > 0 and proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        proc.wait()


def cap_file(path: Path, keep: int) -> None:
    """Keep the first and last ``keep`` bytes of a longer file, with a line saying how many
    bytes between them were not kept (best effort: a file that cannot be rewritten stays)."""
    from pisub.core.fsio import atomic_write

    try:
        size = path.stat().st_size
        if size <= 2 * keep:
            return
        with open(path, "rb") as fh:
            head = fh.read(keep)
            fh.seek(size - keep)
            tail = fh.read()
        marker = f"\n[... {size - 2 * keep} bytes not kept ...]\n".encode()
        atomic_write(path, head + marker + tail)
    except OSError:
        return
