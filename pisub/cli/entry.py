"""The ``pisub`` console script's first step, before the command line's own imports.

A command that starts a run (``run``, ``resume``) starts a warm runner first
(:mod:`pisub.api.warm`), so that the runner's interpreter starts and imports on the other
core while the command line imports its parser, checks the agent and writes the manifest.

The plain forms of ``status`` and ``list`` run without the parser (:mod:`pisub.cli.fast`).
"""

from __future__ import annotations

import sys

LAUNCHING = frozenset({"run", "resume"})


def _launching(argv: list[str]) -> bool:
    """The command is one that starts a run (help or completion requests are not)."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in LAUNCHING:
        return False
    return not any(a in ("--help", "-h") for a in argv)


def main() -> None:
    if sys.argv[1:2] in (["status"], ["list"]):
        from pisub.cli.fast import run_if_plain

        run_if_plain(sys.argv[1:])  # exits when it ran the command
    if _launching(sys.argv[1:]):
        from pisub.api.warm import prestart_for_one_launch

        prestart_for_one_launch()
    from pisub.cli import main as cli_main

    cli_main()
