"""Entry point of the detached runner: ``python -m pisub.runner RUN_DIR --ready-fd N --lock-fd M``.

It only wires the pieces together: detach (second fork), become a subreaper, read
the manifest and hand over to its run mode (:mod:`pisub.runner.modes`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pisub.runner")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--lock-fd", type=int, required=True)
    return parser.parse_args(argv)


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
    from pisub.fsio import reserve_space

    reserve_space(2, RESERVED_LOG_BYTES)  # best effort: the runner works without it


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    # Second fork: the launcher reaps the intermediate at once and the runner, not a
    # session leader, can never regain a controlling terminal.
    if os.fork() > 0:
        os._exit(0)
    os.umask(0o077)
    _reserve_log_space()
    for fd in (args.ready_fd, args.lock_fd):
        os.set_inheritable(fd, False)
    report = _Reporter(args.ready_fd)
    try:
        from pisub.paths import RunPaths
        from pisub.procs import set_child_subreaper
        from pisub.store import load_manifest

        set_child_subreaper()
        paths = RunPaths(args.run_dir.resolve())
        manifest = load_manifest(paths)
        from pisub.runner.modes import mode_for

        return mode_for(paths, manifest, report).run()
    except BaseException as exc:
        traceback.print_exc()
        report({"ok": False, "error": f"runner crashed: {type(exc).__name__}: {exc}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
