"""The ``pisub`` command line: a thin skin over :mod:`pisub.api.client`.

Exit codes: 0 success; 1 a pisub error (one line on stderr, with its code); 2 a usage
error (one line too: ``pisub: <message> Try 'pisub CMD --help'. [USAGE]``); ``wait`` exits 1
for a run that ended other than ``complete`` and 3 when its ``--timeout`` ran out.

No command prints a traceback: every error is one redacted line ``pisub: <message> [<CODE>]``.
An ``OSError`` that escaped its seam becomes ``IO_ERROR``, anything else ``INTERNAL_ERROR``
(``PISUB_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from typing import NoReturn

import click
import typer
import typer.core

from pisub.cli import agents as _agents
from pisub.cli import cluster as _cluster
from pisub.cli import config as _config
from pisub.cli import control as _control
from pisub.cli import groups as _groups
from pisub.cli import lanes as _lanes
from pisub.cli import leases as _leases
from pisub.cli import missions as _missions
from pisub.cli import ops as _ops
from pisub.cli import pi_ext as _pi_ext
from pisub.cli import resources as _resources
from pisub.cli import runs as _runs
from pisub.cli import schedules as _schedules
from pisub.cli import version as _version
from pisub.cli import workflows as _workflows
from pisub.cli import worktrees as _worktrees
from pisub.errors import InternalError, PisubError, StorageError, storage_error
from pisub.termsafe import printable


class Group(typer.core.TyperGroup):
    """Every group of the command line: its command list shows each command's whole first
    sentence (wrapped), never one cut mid-sentence."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


SETTINGS: dict[str, object] = {
    "cls": Group,
    "name": "pisub",
    "help": "Detached background runs of coding sub-agents, controlled through plain files.",
    "no_args_is_help": True,
    "pretty_exceptions_enable": False,
    "rich_markup_mode": None,
}
app = typer.Typer(add_completion=True, **SETTINGS)  # type: ignore[arg-type]
_runs.register(app)
_version.register(app)
app.callback()(_version.root)
_control.register(app)
_ops.register(app)
app.add_typer(_agents.app, name="agents")
app.add_typer(_leases.app, name="lease")
app.add_typer(_workflows.app, name="workflow")
app.add_typer(_workflows.children_app, name="children")
app.add_typer(_worktrees.app, name="worktree")
app.add_typer(_lanes.app, name="lane")
app.add_typer(_config.app, name="config")
app.add_typer(_cluster.app, name="cluster")
app.add_typer(_groups.app, name="group")
app.add_typer(_schedules.app, name="schedule")
app.add_typer(_missions.app, name="mission")
_pi_ext.register(app)
_resources.register(app)


def _every_group_lists_whole_sentences(typer_app: typer.Typer) -> None:
    """Give every sub-app (at any depth, whichever module adds it) the :class:`Group` help."""
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            group.typer_instance.info.cls = Group
            _every_group_lists_whole_sentences(group.typer_instance)


_every_group_lists_whole_sentences(app)


CLOSED_STDOUT = "stdout is closed: nothing was done; run it with an open stdout (e.g. >/dev/null)"


def main() -> None:
    """Console-script entry point."""
    if sys.stdout is None:  # fd 1 closed (`>&-`): no command could say what it did
        _fail(StorageError(CLOSED_STDOUT))
    try:
        code = app_for(sys.argv[1:])(prog_name="pisub", standalone_mode=False)
    except click.UsageError as exc:
        _usage(exc)
    except click.ClickException as exc:  # e.g. a file argument that cannot be opened
        _fail(PisubError(exc.format_message()))
    except click.Abort:
        sys.exit(130)
    except PisubError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        _quiet_broken_pipe()
    except OSError as exc:
        _fail(storage_error(exc, "use"), exc)
    except Exception as exc:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        _fail(InternalError(f"internal error (please report it): {what}"), exc)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


def app_for(argv: list[str]) -> typer.Typer:
    """The whole command line, or — when the first argument names a command or a group — one
    holding only that: typer builds every command's parser before it parses (about 40 ms for
    all of them), and a command's own parsing, help and errors are the same in both."""
    if not argv or argv[0].startswith("-") or any(k.endswith("_COMPLETE") for k in os.environ):
        return app
    name = argv[0]
    one = typer.Typer(add_completion=False, **SETTINGS)  # type: ignore[arg-type]
    one.registered_commands = [c for c in app.registered_commands if c.name == name]
    one.registered_groups = [g for g in app.registered_groups if g.name == name]
    if not one.registered_commands and not one.registered_groups:
        return app  # click names the unknown command, with the whole list
    one.callback()(_version.root)
    return one


def _fail(error: PisubError, cause: BaseException | None = None) -> NoReturn:
    """Print one line for ``error`` (redacted) and exit 1."""
    from pisub.api.text import redact

    if cause is not None and os.environ.get("PISUB_DEBUG"):
        traceback.print_exception(cause)
    # one line: every run of whitespace that breaks a line becomes one space; a value's own
    # spaces stay as given ('npm  test' is not 'npm test')
    line = re.sub(r"\s*[^\S ]\s*", " ", redact(error.message)).strip()
    print(f"pisub: {printable(line, one_line=True)} [{error.code}]", file=sys.stderr)
    sys.exit(1)


def _usage(error: click.UsageError) -> NoReturn:
    """A usage error as one line, like every other error: ``pisub: <message> Try 'pisub CMD
    --help'. [USAGE]``, exit 2 (click's own says "Usage: …", a blank line and "Error: …",
    and typer added its "Did you mean" once per resolution)."""

    if isinstance(error, click.exceptions.NoArgsIsHelpError):  # a bare group: its help, as click
        print(error.format_message(), file=sys.stderr)
        sys.exit(2)
    message = " ".join(error.format_message().split())
    hints = list(dict.fromkeys(re.findall(r" ?Did you mean [^?]*\?", message)))
    message = re.sub(r" ?Did you mean [^?]*\?", "", message).rstrip()
    if hints:
        message = f"{message.rstrip('.')}. {hints[0].strip()}"
    path = error.ctx.command_path if error.ctx is not None else "pisub"
    line = printable(f"{message} Try '{path} --help'.", one_line=True)
    print(f"pisub: {line} [USAGE]", file=sys.stderr)
    sys.exit(2)


def _quiet_broken_pipe() -> NoReturn:
    """The reader of our output went away (``pisub list | head``): exit without a word."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(141)
