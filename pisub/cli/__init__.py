"""The ``pisub`` command line: a thin skin over :mod:`pisub.api.client`.

Exit codes: 0 success; 1 a pisub error (one line on stderr, with its code); 2 a usage
error (one line too: ``pisub: <message> Try 'pisub CMD --help'. [USAGE]``); ``wait`` exits 1
for a run that ended other than ``complete`` and 3 when its ``--timeout`` ran out.

No command prints a traceback: every error is one redacted line ``pisub: <message> [<CODE>]``.
An ``OSError`` that escaped its seam becomes ``IO_ERROR``, anything else ``INTERNAL_ERROR``
(``PISUB_DEBUG=1`` shows the traceback).

Importing this package imports no parser: typer and click load with :mod:`pisub.cli.parser`,
when a command needs them (the plain ``status`` and ``list`` do not: :mod:`pisub.cli.fast`).
"""

from __future__ import annotations

from typing import Any


def main(failed: BaseException | None = None) -> None:
    """The command line (see :mod:`pisub.__main__`). ``failed``: what a launch made without the
    parser raised (``pisub run --agent NAME TASK``), reported as this command's own."""
    from pisub.cli.parser import main as parsed

    parsed(failed)


_PARSER_NAMES = frozenset({"full_app", "root_app", "Group", "LazyGroup", "SETTINGS"})


def __getattr__(name: str) -> Any:
    """``app`` (every command, built: for tests and tools that walk all the commands) and the
    parser's names (:mod:`pisub.cli.parser`); a submodule's name is left to the import system."""
    if name != "app" and name not in _PARSER_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pisub.cli import parser

    return parser.full_app() if name == "app" else getattr(parser, name)
