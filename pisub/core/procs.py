"""Process facts and process-tree termination.

Identity of a process is ``(pid, start time)``: a pid alone may have been reused.
A process is *proven dead* when its pid is gone, is a zombie, or belongs to a process
started at another time. psutil is imported lazily (only paths that look at live
processes need it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from pisub.protocol.env import ENV_RUN_ID

START_TIME_TOLERANCE = 0.015
"""Start times are known to 1/100 s; two values closer than this are the same process."""

MARKER_ENV = ENV_RUN_ID
"""Environment variable set in every child; lets a later process find strays."""


def start_time(pid: int) -> float | None:
    """The start time of ``pid`` in seconds since the epoch, or None when it is gone.

    For people only: it is derived from the boot time, which moves when the wall clock is
    stepped. Identity checks compare :func:`start_ticks`.
    """
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
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def marked_processes(run_id: str) -> list[int]:
    """Pids whose environment says ``PISUB_RUN_ID=<run_id>`` (Linux /proc scan)."""
    needle = f"{MARKER_ENV}={run_id}".encode()
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


def run_bounded(argv: list[str], timeout: float) -> tuple[int, bytes, bytes]:
    """Run a short command (``pi --version``, ``pi --list-models``) in a process group of its own: its
    exit code, stdout and stderr. The group is ended whole afterwards — nothing it started
    outlives it — and at once when it has not answered within ``timeout`` seconds.

    Raises:
        OSError, ValueError: it cannot be started. TimeoutError: it did not answer in time.
    """
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(proc)
        proc.communicate()  # collect what is left and close the pipes
        raise TimeoutError(f"{argv[0]} did not answer within {timeout:g}s") from None
    end_group(proc)
    return proc.returncode, out, err


def end_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc``'s whole process group (it was started in a session of its own) and reap it."""
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        proc.wait()
