"""Entry point of the detached runner: ``python -m pisub.runner RUN_DIR --ready-fd N --lock-fd M``
(cold), ``python -m pisub.runner --warm-fd N`` (warm: the run comes later, :mod:`pisub.backends.warm`),
or ``python -m pisub.runner RUN_DIR --foreground`` (an engine's job: no detaching, the runner takes
``runner.lock`` itself and stays the job's main process; :mod:`pisub.backends.slurm`).

It only wires the pieces together: detach (second fork), become a subreaper, read
the manifest and hand over to its run mode (:mod:`pisub.runner.modes`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import NoReturn


class Args:
    """The runner's arguments."""

    def __init__(
        self,
        run_dir: Path | None = None,
        ready_fd: int | None = None,
        lock_fd: int | None = None,
        warm_fd: int | None = None,
        foreground: bool = False,
    ) -> None:
        self.run_dir = run_dir
        self.ready_fd = ready_fd
        self.lock_fd = lock_fd
        self.warm_fd = warm_fd
        self.foreground = foreground


def _parse(argv: list[str]) -> Args:
    """The arguments: the three shapes launchers write are read directly (argparse, some 5 ms of
    a runner's start, parses anything else and says what is wrong)."""
    with contextlib.suppress(ValueError):
        if len(argv) == 2 and argv[0] == "--warm-fd":
            return Args(warm_fd=int(argv[1]))
        if len(argv) == 5 and argv[1] == "--ready-fd" and argv[3] == "--lock-fd" and argv[0][:1] != "-":
            return Args(Path(argv[0]), ready_fd=int(argv[2]), lock_fd=int(argv[4]))
        if len(argv) == 2 and argv[1] == "--foreground" and argv[0][:1] != "-":
            return Args(Path(argv[0]), foreground=True)
    return _parse_any(argv)


def _parse_any(argv: list[str]) -> Args:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pisub.runner")
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--ready-fd", type=int)
    parser.add_argument("--lock-fd", type=int)
    parser.add_argument("--warm-fd", type=int)
    parser.add_argument("--foreground", action="store_true")
    args = parser.parse_args(argv)
    if args.foreground:
        if args.run_dir is None or args.ready_fd is not None or args.lock_fd is not None or args.warm_fd:
            parser.error("--foreground takes RUN_DIR only")
    elif args.warm_fd is None and None in (args.run_dir, args.ready_fd, args.lock_fd):
        parser.error("give RUN_DIR --ready-fd N --lock-fd M, RUN_DIR --foreground, or --warm-fd N")
    return Args(args.run_dir, args.ready_fd, args.lock_fd, args.warm_fd, args.foreground)


class _Reporter:
    """Answers the launcher once on the readiness pipe, then closes it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self, message: dict[str, object]) -> None:
        if self.fd < 0:
            return
        try:
            os.write(self.fd, json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the launcher is gone; the run goes on
        finally:
            os.close(self.fd)
            self.fd = -1


RESERVED_LOG_BYTES = 64 * 1024
"""Disk space set aside beyond the end of ``runner.log`` (its stdout and stderr), so that the
runner can still say why it could not write when the disk is full."""


def _reserve_log_space() -> None:
    from pisub.core.fsio import reserve_space

    reserve_space(2, RESERVED_LOG_BYTES)  # best effort: the runner works without it


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.foreground:
        from pisub.runner.foreground import run_foreground

        assert args.run_dir is not None
        return run_foreground(args.run_dir)
    # Second fork: the launcher reaps the intermediate at once and the runner, not a
    # session leader, can never regain a controlling terminal.
    if os.fork() > 0:
        os._exit(0)
    os.umask(0o077)
    from pisub.protocol.msgspec_lean import import_msgspec

    import_msgspec()
    from pisub.backends import warm

    warm.configure(spares=False)  # a run it starts (a workflow's child, a review) is its descendant
    if args.warm_fd is not None and not _take_handoff(args):
        return 0  # nobody handed a run over: nothing happened
    _reserve_log_space()
    run_dir, ready_fd, lock_fd = args.run_dir, args.ready_fd, args.lock_fd
    assert run_dir is not None and ready_fd is not None and lock_fd is not None
    for fd in (ready_fd, lock_fd):
        os.set_inheritable(fd, False)
    report = _Reporter(ready_fd)
    try:
        from pisub.core.procs import set_child_subreaper
        from pisub.store.paths import RunPaths
        from pisub.store.runs import load_manifest

        set_child_subreaper()
        paths = RunPaths(run_dir.resolve())
        manifest = load_manifest(paths)
        from pisub.runner.modes import mode_for

        if manifest.queue is not None:
            from pisub.runner.queue_wait import wait_turn

            if not wait_turn(paths, manifest, report):
                return 0  # it ended while queued (its files are written), or its directory vanished
        try:
            return mode_for(paths, manifest, report).run()
        finally:
            if manifest.queue is not None:
                from pisub.runs.queue import leave_run

                leave_run(paths)  # (its run mode left already when it ended normally)
    except BaseException as exc:
        import traceback

        from pisub.runner.recorder import note_raw

        note_raw(traceback.format_exc())  # runner.log, whoever holds descriptor 2 now
        report({"ok": False, "error": f"runner crashed: {type(exc).__name__}: {exc}"})
        return 1


def _take_handoff(args: Args) -> bool:
    """A warm runner: import what a run needs, then wait for the run; fills in ``args`` (and
    stdout/stderr, the working directory and the environment) as a cold start would have."""
    from pisub.backends import warm

    assert args.warm_fd is not None
    warm.preload(args.warm_fd)
    handoff = warm.await_handoff(args.warm_fd)
    if handoff is None:
        return False
    for std in (1, 2):
        os.dup2(handoff.log_fd, std)
    os.close(handoff.log_fd)
    os.chdir(handoff.run_dir)
    os.environb.clear()
    os.environb.update(handoff.env)
    args.run_dir = Path(handoff.run_dir)
    args.ready_fd, args.lock_fd = args.warm_fd, handoff.lock_fd
    return True


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` without the interpreter's teardown once the run's files are written and
    its processes ended (:func:`pisub.core.fast_exit.exit_now`: the exit handlers run, the
    standard streams are flushed); a thread that is not a daemon still running (none should
    be), or a stream that cannot be flushed, gets the ordinary exit."""
    from pisub.core.fast_exit import exit_now as fast

    done = SystemExit(code)
    fast(done)
    raise done


if __name__ == "__main__":
    exit_now(main())
