"""The common forms of ``pisub status`` and ``pisub list`` run without typer and click (whose
imports and parser cost more than reading a run: ~35 ms of a ~100 ms command).

Only command lines whose meaning is plain are taken here — each option spelt out once, in
its long form, with a value that does not start with ``-``; ``--limit`` in decimal digits;
no ``--help``, no ``--``, no shell completion. They run the very functions the typer
commands run (:mod:`pisub.cli.reading`) and end the same way (:func:`pisub.cli.failing.guarded`).
Anything else — every usage error included — goes through typer as always, so that its
messages stay typer's."""

from __future__ import annotations

import os
from collections.abc import Callable

COMMANDS = frozenset({"status", "list"})

_LIST_FLAGS = frozenset({"--json", "--all"})
_LIST_VALUES = frozenset({"--state", "--agent", "--since", "--limit"})


def run_if_plain(argv: list[str]) -> None:
    """Run ``pisub ARGV`` and exit when it is a plain ``status`` or ``list``; else return."""
    if "_PISUB_COMPLETE" in os.environ or not all(_utf8(arg) for arg in argv):
        return
    command = _status(argv[1:]) if argv[0] == "status" else _list(argv[1:]) if argv[0] == "list" else None
    if command is None:
        return
    from pisub.cli.failing import guarded

    guarded(command)


def _status(args: list[str]) -> Callable[[], None] | None:
    """``status [RUN] [--json]``, in either order."""
    as_json = args.count("--json")
    refs = [a for a in args if a != "--json"]
    if as_json > 1 or len(refs) > 1 or any(not ref or ref.startswith("-") for ref in refs):
        return None
    ref = refs[0] if refs else None

    def command() -> None:
        from pisub.cli.reading import status

        status(ref, None, "summary", 80, bool(as_json))

    return command


def _list(args: list[str]) -> Callable[[], None] | None:
    """``list`` with ``--json``, ``--all``, ``--state S``, ``--agent A``, ``--since AGE`` and
    ``--limit N``, each at most once."""
    given: dict[str, str | None] = {}
    rest = iter(args)
    for arg in rest:
        if arg in given:
            return None
        if arg in _LIST_FLAGS:
            given[arg] = None
        elif arg in _LIST_VALUES:
            value = next(rest, None)
            if value is None or not value or value.startswith("-"):
                return None
            given[arg] = value
        else:
            return None
    limit = given.get("--limit")
    if limit is not None and not (limit.isascii() and limit.isdigit()):
        return None

    def command() -> None:
        from pisub.cli.reading import listed

        listed(
            given.get("--state"),
            "--all" in given,
            given.get("--agent"),
            given.get("--since"),
            int(limit) if limit is not None else None,
            "--json" in given,
        )

    return command


def _utf8(arg: str) -> bool:
    """An argument that was valid UTF-8 (one that was not is left to click)."""
    try:
        arg.encode()
    except UnicodeEncodeError:
        return False
    return True
