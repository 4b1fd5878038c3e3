"""``--on-done CMD``: one command run once when a run has ended — by its runner right after the
terminal status, or, when the runner died, by the reader that repaired the run (detached).
Exactly once: whoever creates ``on-done.claimed`` (``O_EXCL``) runs it. Its argv (no shell),
the run's cwd, ``PISUB_RUN_ID``, ``PISUB_RUN_STATE`` and ``PISUB_RUN_DIR`` in its environment;
its output goes to ``on-done.log`` (capped) and its exit status to the events."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pisub.core.procs import end_group
from pisub.protocol.env import ENV_RUN_DIR, ENV_RUN_ID
from pisub.protocol.manifest import Manifest
from pisub.store.paths import RunPaths

TIMEOUT_S = 300.0
KEEP_BYTES = 64 * 1024
TAIL_BYTES = 1024


def claim(paths: RunPaths) -> bool:
    """Whether this process is the one to run the command (creates the claim file)."""
    try:
        fd = os.open(
            paths.on_done_claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError:
        return False  # claimed already (or the run directory is unusable: nothing to run then)
    os.close(fd)
    return True


def after_end(paths: RunPaths, manifest: Manifest, state: str) -> None:
    """What a runner does once its terminal status is written: the run's ``on_done``, if any."""
    if manifest.on_done:
        run_on_done(paths, manifest.on_done, manifest.cwd, state)


def run_on_done(paths: RunPaths, argv: list[str], cwd: str, state: str, timeout: float = TIMEOUT_S) -> None:
    """Run the command if nobody has (never raises: what happened is an event)."""
    if not argv or not claim(paths):
        return
    env = {
        **os.environ,
        ENV_RUN_ID: paths.run_id,
        "PISUB_RUN_STATE": state,
        ENV_RUN_DIR: str(paths.root),
    }
    try:
        fd = os.open(
            paths.on_done_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        _event(paths, "on_done.failed", error=f"cannot write on-done.log: {exc.strerror or exc}")
        return
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd if os.path.isdir(cwd) else str(paths.root),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        _event(paths, "on_done.failed", error=f"cannot start {argv[0]!r}: {exc}")
        return
    finally:
        os.close(fd)
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    end_group(proc)  # nothing it started outlives it (nor it, past its timeout)
    code = proc.returncode
    _event(paths, "on_done.finished", exitCode=code, timedOut=timed_out, output=_tail(paths.on_done_log))


def _tail(log: Path) -> str:
    try:
        size = log.stat().st_size
        with open(log, "rb") as fh:
            fh.seek(max(0, size - TAIL_BYTES))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _event(paths: RunPaths, kind: str, **data: object) -> None:
    from pisub.core.redact import redact
    from pisub.store.runs import append_event

    payload: dict[str, Any] = {k: redact(v) if isinstance(v, str) else v for k, v in data.items()}
    with contextlib.suppress(Exception):  # the run has ended; nothing else depends on this line
        append_event(paths, kind, None, **payload)


def spawn_detached(paths: RunPaths) -> None:
    """For a reader that repaired a run whose runner died: run the command in a process of its
    own, in a session of its own (``python -m pisub.store.on_done --detach RUN_DIR`` starts it and
    exits at once), so the reader neither waits for it nor leaves a child behind."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):  # not started: not claimed either
        subprocess.run(
            [sys.executable, "-m", "pisub.store.on_done", "--detach", str(paths.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )


def _detach(run_dir: str) -> int:
    subprocess.Popen(
        [sys.executable, "-m", "pisub.store.on_done", run_dir],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return 0


def main() -> int:
    from pisub.store.runs import load_manifest, load_status

    if len(sys.argv) == 3 and sys.argv[1] == "--detach":
        return _detach(sys.argv[2])
    if len(sys.argv) != 2:
        return 2
    paths = RunPaths(Path(sys.argv[1]))
    try:
        manifest = load_manifest(paths)
        status = load_status(paths)
    except Exception:
        return 1
    if manifest.on_done and status.state.is_terminal:
        run_on_done(paths, manifest.on_done, manifest.cwd, status.state.value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
