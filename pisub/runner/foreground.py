"""The runner as an engine job's main process (``python -m pisub.runner RUN --foreground``).

No detaching (the job's processes are the job; a detached runner would be killed with its step):
the runner takes ``runner.lock`` itself (the launcher holds it only until the engine accepted
the job), keeps its heartbeat lease (:mod:`pisub.runner.heartbeat`), becomes a subreaper and runs
its run mode. SIGTERM (``scancel``) is a stop, as for a detached runner; SIGUSR1 is the doorbell.
A job the engine starts again (a requeue) finds its run no longer ``starting`` and does nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from pisub.core.polling import poll

LOCK_WAIT_S = 30.0
"""How long the runner waits for the launcher to let go of ``runner.lock``."""
DEFAULT_TTL_S = 30.0


def _say(message: str) -> None:
    from pisub.runner.recorder import note_raw
    from pisub.termsafe import printable

    # runner.log, whoever holds descriptor 2 now
    note_raw(f"pisub runner: {printable(message, one_line=True)}\n")


def run_foreground(run_dir: Path) -> int:
    os.umask(0o077)
    from pisub.backends import warm

    warm.configure(spares=False)
    from pisub.core.locks import try_lock
    from pisub.core.procs import set_child_subreaper
    from pisub.errors import PisubError
    from pisub.protocol.status import RunState
    from pisub.store.paths import RunPaths
    from pisub.store.runs import load_manifest, load_status

    paths = RunPaths(run_dir.resolve())
    try:
        lock_fd = poll(lambda: try_lock(paths.runner_lock), LOCK_WAIT_S, interval=0.02)
        if lock_fd is None:
            _say(f"runner.lock stayed held for {LOCK_WAIT_S:g}s: another runner has this run")
            return 1
        status = load_status(paths)
        if status.state != RunState.STARTING:
            _say(f"the run is already {status.state} (this job was started again): nothing to do")
            return 0
        manifest = load_manifest(paths)
    except PisubError as exc:
        _say(f"{exc.code}: {exc}")
        return 1
    set_child_subreaper()
    from pisub.runner.heartbeat import HeartbeatKeeper

    ttl = manifest.placement.heartbeat_ttl if manifest.placement is not None else DEFAULT_TTL_S
    keeper = HeartbeatKeeper(paths, ttl)
    try:
        keeper.start()
    except OSError as exc:
        _say(f"cannot write {paths.heartbeat}: {exc.strerror or exc}")
        return 1
    from pisub.runner.modes import mode_for

    try:
        return mode_for(paths, manifest, lambda _message: None).run()
    finally:
        keeper.stop()
        os.close(lock_fd)
