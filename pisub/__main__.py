"""``python -m pisub`` and the ``pisub`` console script (``pisub.__main__:main``).

A command that starts a run (``run``, ``resume``) starts a warm runner first
(:mod:`pisub.api.warm`), before anything else is imported — ``pisub.cli`` is a package that
imports typer and click —, so that the runner's interpreter starts and imports on the other
core while the command line imports its parser, checks the agent and writes the manifest.
Such a command also exits without the interpreter's teardown once its output is flushed
(:func:`exit_now`): it has printed the run's id, and tearing down the ~250 modules a launch
imports only delays the caller that waits for it.
"""

from __future__ import annotations

import sys

LAUNCHING = frozenset({"run", "resume"})


def launching(argv: list[str]) -> bool:
    """The command is one that starts a run (help or completion requests are not)."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in LAUNCHING:
        return False
    return not any(a in ("--help", "-h") for a in argv)


def main() -> None:
    if not launching(sys.argv[1:]):
        from pisub.cli import main as cli_main

        cli_main()
        return
    from pisub.api.warm import prestart_for_one_launch

    prestart_for_one_launch()
    from pisub.cli import main as cli_main

    try:
        cli_main()
    except SystemExit as exc:
        exit_now(exc)
        raise


def exit_now(done: SystemExit) -> None:
    """End the process as ``done`` would, without tearing the interpreter down: the exit
    handlers run (an unused warm runner is ended) and the standard streams are flushed. Returns
    (the caller re-raises ``done``: the ordinary exit) when the code is not a number, a thread
    that is not a daemon still runs, or a stream cannot be flushed (the ordinary exit reports
    it as it always does)."""
    code = 0 if done.code is None else done.code
    if not isinstance(code, int) or isinstance(code, bool):
        return
    threading = sys.modules.get("threading")
    if threading is not None and any(
        t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()
    ):
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            return  # (an exit handler wrote to a stream that broke: the ordinary exit says so)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
