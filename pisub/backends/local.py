"""The ``local`` backend: the runner is a detached process on the launcher's machine.

Starting it (:func:`spawn_runner`): spawn it detached and wait for its commit.

The runner is started with ``setsid`` (new session and process group), stdin from
/dev/null, stdout and stderr appended to ``runner.log`` and only two descriptors
passed: the write end of a readiness pipe and ``runner.lock``. It forks once more and
answers on the pipe after its startup commit (``status.json`` says ``running``) or
with the reason it could not start. EOF without an answer means it died.

When this process has a warm runner waiting (:mod:`pisub.backends.warm`), the run is handed to
it instead, and its answer comes on the handoff socket; any failure before it acknowledged
falls back to the cold start above.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Sequence

from pisub.backends.base import EngineState, Liveness
from pisub.core.fsio import open_append, read_tail
from pisub.core.locks import is_held
from pisub.core.procs import boot_id, host_name, is_alive
from pisub.defaults import STARTUP_TIMEOUT_S
from pisub.errors import LaunchFailed, storage_error
from pisub.protocol.env import ENV_RUNNER
from pisub.protocol.placement import BackendName, Placement, PlacementRequest
from pisub.protocol.status import Status
from pisub.store.paths import RunPaths, without_markers


class LocalBackend:
    """Liveness: a runner lives while ``runner.lock`` is held, or while its pid runs with the
    recorded start (boot-relative ticks) on this boot. Proof of death exists only on the run's
    own host: from another host the answer is ``unknown`` (a free lock there proves nothing)."""

    name = BackendName.LOCAL

    def start(self, paths: RunPaths, lock_fd: int, request: PlacementRequest) -> None:
        spawn_runner(paths, lock_fd)

    def ring(self, placement: Placement) -> None:
        """Nothing to do: a local runner watches its inbox with inotify."""

    def cancel(self, placement: Placement) -> bool:
        return False  # a local runner is stopped through its inbox (or by a signal to its pid)

    def observe(self, placements: Sequence[Placement]) -> dict[str, EngineState]:
        return {}

    def liveness(self, paths: RunPaths, status: Status, placement: Placement) -> Liveness:
        if is_held(paths.runner_lock):
            return Liveness.ALIVE
        if status.host != host_name():
            return Liveness.UNKNOWN
        if status.boot_id not in (None, boot_id()):
            return Liveness.DEAD  # this host rebooted since
        alive = is_alive(status.pid, status.pid_start_time, status.pid_start_ticks)
        return Liveness.ALIVE if alive else Liveness.DEAD


def spawn_runner(paths: RunPaths, lock_fd: int, timeout: float = STARTUP_TIMEOUT_S) -> int:
    """Start the runner of ``paths`` and wait for its startup commit; its pid.

    Raises:
        LaunchFailed: the runner reported an error, died, or did not commit in time.
    """
    try:
        log_fd = open_append(paths.runner_log)
    except OSError as exc:
        raise storage_error(exc, "open", paths.runner_log) from exc
    env = without_markers(os.environ)
    env[ENV_RUNNER] = paths.run_id
    handed = _hand_to_warm(paths, env, lock_fd, log_fd)
    if handed is not None:
        os.close(log_fd)
        answer_fd, pgid = handed
        from pisub.backends.warm import refill_back_to_back

        refill_back_to_back()
        return _answered(paths, answer_fd, time.monotonic() + timeout, pgid)
    import subprocess  # (only a cold start needs it)

    ready_r, ready_w = os.pipe()
    argv = [sys.executable, "-m", "pisub.runner", str(paths.root)]
    argv += ["--ready-fd", str(ready_w), "--lock-fd", str(lock_fd)]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(ready_w, lock_fd),
            start_new_session=True,
            close_fds=True,
            cwd=paths.root,
            env=env,
        )
    except OSError as exc:
        os.close(ready_r)
        raise LaunchFailed(f"cannot start the runner: {exc.strerror or exc}") from exc
    finally:
        os.close(ready_w)
        os.close(log_fd)
    deadline = time.monotonic() + timeout
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.close(ready_r)
        _end_group(proc.pid)
        proc.wait()
        raise LaunchFailed(f"the runner did not commit its startup within {timeout:g}s") from None
    return _answered(paths, ready_r, deadline, proc.pid)


def _hand_to_warm(paths: RunPaths, env: dict[str, str], lock_fd: int, log_fd: int) -> tuple[int, int] | None:
    """The descriptor the warm runner that took the run answers on, and its process group
    (None: no warm runner took it)."""
    from pisub.backends.warm import WarmGone, hand_off, take

    waiting = take()
    if waiting is None:
        return None
    try:
        return hand_off(waiting, str(paths.root), env, lock_fd, log_fd), waiting.pid
    except WarmGone:
        return None


def _end_group(pgid: int) -> None:
    """The runner never leaves the process group its setsid made: end it whole."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _answered(paths: RunPaths, fd: int, deadline: float, pgid: int) -> int:
    """The runner's pid from its answer on ``fd`` (closed here).

    Raises:
        LaunchFailed: it reported an error, died, or did not answer by ``deadline``.
    """
    try:
        message = _read_answer(fd, deadline)
    except TimeoutError:
        _end_group(pgid)
        raise LaunchFailed("the runner did not commit its startup in time") from None
    finally:
        os.close(fd)
    if message is None:
        tail = read_tail(paths.runner_log, 2000).decode("utf-8", "replace").strip()
        raise LaunchFailed("the runner exited before its startup commit" + (f": {tail}" if tail else ""))
    if not message.get("ok"):
        raise LaunchFailed(str(message.get("error") or "the runner failed to start"))
    pid = message.get("pid")
    if not isinstance(pid, int):
        raise LaunchFailed(f"the runner answered without a pid: {message}")
    return pid


def _read_answer(fd: int, deadline: float) -> dict[str, object] | None:
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # ECONNRESET: a warm runner died with our GO unread
            break
        if not chunk:
            break
        buf += chunk
    if not buf.strip():
        return None
    try:
        answer = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None
