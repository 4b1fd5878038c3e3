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

import os
import sys

from pisub.core.fast_exit import exit_now

TYPE_CHECKING = False  # (not typing's: a launch starts its warm runner before importing it)
if TYPE_CHECKING:
    from typing import NoReturn

LAUNCHING = frozenset({"run", "resume"})


def launching(argv: list[str]) -> bool:
    """The command is one that starts a run (help or completion requests are not)."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in LAUNCHING:
        return False
    return not any(a in ("--help", "-h") for a in argv)


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] in (["status"], ["list"]):
        from pisub.cli.fast import run_if_plain
        from pisub.protocol.msgspec_lean import import_msgspec

        import_msgspec()

        run_if_plain(argv)  # exits when it ran the command (a plain form: no parser)
    if not launching(argv):
        from pisub.cli import main as cli_main

        cli_main()
        return
    from pisub.api.warm import prestart_for_one_launch

    prestart_for_one_launch()
    from pisub.protocol.msgspec_lean import import_msgspec

    import_msgspec()
    plain = plain_run(argv)
    try:
        if plain is not None and sys.stdout is not None and "_PISUB_COMPLETE" not in os.environ:
            _run_plain(*plain)
        from pisub.cli import main as cli_main

        cli_main()
    except SystemExit as exc:
        exit_now(exc)
        raise


def plain_run(argv: list[str]) -> tuple[str, str] | None:
    """``(agent, task)`` when ``argv`` is exactly ``run --agent NAME TASK`` (``-a NAME``,
    ``--agent=NAME``, in either order): the launch the command line runs without building its
    parser (typer and click cost such a launch some 50 ms; a help request, any other option, a
    task that looks like an option go through the parser)."""
    if not argv or argv[0] != "run":
        return None
    agent: str | None = None
    task: str | None = None
    words = iter(argv[1:])
    for word in words:
        if word in ("--agent", "-a") and agent is None:
            agent = next(words, None)
            if agent is None or agent.startswith("-"):
                return None
        elif word.startswith("--agent=") and agent is None:
            agent = word.removeprefix("--agent=")
        elif not word.startswith("-") and task is None:
            task = word
        else:
            return None
    return (agent, task) if agent is not None and task is not None else None


def _run_plain(agent: str, task: str) -> NoReturn:
    """``pisub run --agent AGENT TASK`` (:func:`plain_run`), printing what the parser's ``run``
    prints (``pisub/cli/runs.py``; ``tests/unit/test_launch_entry.py`` holds them equal). A
    failure is the command line's to report: it raises it inside its own error handling, so
    the line and the exit code are the same."""
    try:
        from pisub.api.acceptance import launch_lines
        from pisub.api.agents import first_launch_warnings
        from pisub.api.launch import start
        from pisub.termsafe import printable

        handle = start(agent, task)
        lines = first_launch_warnings(handle)
        lines += launch_lines(handle.manifest().acceptance_plan)
        for line in lines:
            sys.stderr.write(printable(line.rstrip("\n"), one_line=True) + "\n")
        sys.stdout.write(printable(handle.id, one_line=True) + "\n")
    except BaseException as exc:
        from pisub.cli import main as cli_main

        cli_main(failed=exc)
    raise SystemExit(0)


if __name__ == "__main__":
    main()
