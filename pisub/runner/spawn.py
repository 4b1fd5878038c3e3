"""The launcher's side of starting a runner: spawn it detached and wait for its commit.

The runner is started with ``setsid`` (new session and process group), stdin from
/dev/null, stdout and stderr appended to ``runner.log`` and only two descriptors
passed: the write end of a readiness pipe and ``runner.lock``. It forks once more and
answers on the pipe after its startup commit (``status.json`` says ``running``) or
with the reason it could not start. EOF without an answer means it died.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

from pisub.defaults import STARTUP_TIMEOUT_S
from pisub.errors import LaunchFailed, storage_error
from pisub.fsio import open_append, read_tail
from pisub.paths import ENV_RUNNER, RUN_MARKERS, RunPaths


def spawn_runner(paths: RunPaths, lock_fd: int, timeout: float = STARTUP_TIMEOUT_S) -> int:
    """Start the runner of ``paths`` and wait for its startup commit; its pid.

    Raises:
        LaunchFailed: the runner reported an error, died, or did not commit in time.
    """
    try:
        log_fd = open_append(paths.runner_log)
    except OSError as exc:
        raise storage_error(exc, "open", paths.runner_log) from exc
    ready_r, ready_w = os.pipe()
    # A runner started from inside another run's child must not carry that run's marker.
    env = {k: v for k, v in os.environ.items() if k not in RUN_MARKERS}
    env[ENV_RUNNER] = paths.run_id
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
        message = _read_answer(ready_r, deadline)
    except (subprocess.TimeoutExpired, TimeoutError):
        # The runner never leaves the process group its setsid made: end it whole.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise LaunchFailed(f"the runner did not commit its startup within {timeout:g}s") from None
    finally:
        os.close(ready_r)
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
        chunk = os.read(fd, 4096)
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
