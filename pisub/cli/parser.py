"""The ``pisub`` command line's parser (typer and click): the root group, whose commands are
built when used, and :func:`main`. What :mod:`pisub.cli` says of exit codes and errors holds
here."""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any, NoReturn

import click
import typer
import typer.core

from pisub.cli.commands import BY_NAME, COMMANDS, Command
from pisub.cli.failing import _fail, guarded, quiet_broken_pipe
from pisub.cli.version import root as _root_options
from pisub.errors import PisubError
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


class LazyGroup(Group):
    """The root ``pisub``: its commands come from the table :data:`~pisub.cli.commands.COMMANDS`
    and a command's module is imported (and its parser built) only when that command is used
    — its help, its usage errors and its completion are the same as if every command were
    built (``pisub --help`` lists the table's short helps)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(BY_NAME)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in BY_NAME:
            command = self.commands[cmd_name] = _load(BY_NAME[cmd_name])
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(c.name, c.help) for c in COMMANDS])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # (typer would exit 1) the reader went away: 141, silently
            quiet_broken_pipe()

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return click.Group.resolve_command(self, ctx, args)
        except click.UsageError as exc:  # typer's hint, from the table (no command is built)
            from difflib import get_close_matches

            matches = get_close_matches(args[0], list(BY_NAME)) if args else []
            if matches:
                suggestions = ", ".join(f"{m!r}" for m in matches)
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {suggestions}?"  # type: ignore[misc]
            raise


SETTINGS: dict[str, object] = {
    "cls": Group,
    "name": "pisub",
    "help": "Detached background runs of coding sub-agents, controlled through plain files.",
    "no_args_is_help": True,
    "pretty_exceptions_enable": False,
    "rich_markup_mode": None,
}


def _typer(*, add_completion: bool = False, cls: type[click.Group] = Group) -> typer.Typer:
    one = typer.Typer(add_completion=add_completion, **{**SETTINGS, "cls": cls})  # type: ignore[arg-type]
    one.callback()(_root_options)
    return one


def _attach(app: typer.Typer, entry: Command) -> None:
    """Add the command ``entry`` (only it) to ``app``, importing its module."""
    module: Any = importlib.import_module(f"pisub.cli.{entry.module}")
    if entry.app is not None:
        app.add_typer(getattr(module, entry.app), name=entry.name)
    else:
        one = typer.Typer()
        module.register(one)
        app.registered_commands += [c for c in one.registered_commands if c.name == entry.name]
        app.registered_groups += [g for g in one.registered_groups if g.name == entry.name]
    _every_group_lists_whole_sentences(app)


def _load(entry: Command) -> click.Command:
    """The click command of ``entry``, built from its module alone."""
    one = _typer()
    _attach(one, entry)
    return typer.main.get_group(one).commands[entry.name]


def root_app() -> typer.Typer:
    """The command line run by :func:`main`: the root, whose commands load when used."""
    return _typer(add_completion=True, cls=LazyGroup)


def full_app() -> typer.Typer:
    """The whole command line with every command built (every command module imported): for
    tests and tools that walk all the commands."""
    app = _typer(add_completion=True)
    for entry in COMMANDS:
        _attach(app, entry)
    return app


def _every_group_lists_whole_sentences(typer_app: typer.Typer) -> None:
    """Give every sub-app (at any depth, whichever module adds it) the :class:`Group` help."""
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            group.typer_instance.info.cls = Group
            _every_group_lists_whole_sentences(group.typer_instance)


def main(failed: BaseException | None = None) -> None:
    """The command line's parser, run (``failed``: an error a launch made without the parser
    raised, reported here as the command's own: the same line, the same exit code)."""

    def parsed() -> object:
        try:
            if failed is not None:
                raise failed
            return root_app()(prog_name="pisub", standalone_mode=False)
        except click.UsageError as exc:
            _usage(exc)
        except click.ClickException as exc:  # e.g. a file argument that cannot be opened
            _fail(PisubError(exc.format_message()))
        except click.Abort:
            sys.exit(130)

    guarded(parsed)


def _usage(error: click.UsageError) -> NoReturn:
    """A usage error as one line, like every other error: ``pisub: <message> Try 'pisub CMD
    --help'. [USAGE]``, exit 2 (click's own says "Usage: …", a blank line and "Error: …",
    and typer added its "Did you mean" once per resolution)."""

    if isinstance(error, click.exceptions.NoArgsIsHelpError):  # a bare group: its help, as click
        print(error.format_message(), file=sys.stderr)
        sys.exit(2)
    message = " ".join(error.format_message().split())
    hints = list(dict.fromkeys(re.findall(r" ?Did you mean [^?]*\?", message)))
    message = re.sub(r" ?\(?Did you mean [^?]*\?\)?", "", message).rstrip()  # (click's in parentheses)
    if hints:
        message = f"{message.rstrip('.')}. {hints[0].strip()}"
    elif not message.endswith((".", "?", "!")):
        message += "."  # ("Got unexpected extra argument (x)" has none)
    path = error.ctx.command_path if error.ctx is not None else _command_path(sys.argv[1:])
    line = printable(f"{message} Try '{path} --help'.", one_line=True)
    print(f"pisub: {line} [USAGE]", file=sys.stderr)
    sys.exit(2)


def _command_path(argv: list[str]) -> str:
    """``pisub CMD [SUB]`` as far as ``argv`` names commands (click gives no context for some
    usage errors, e.g. an option missing its value)."""
    command: click.Command = typer.main.get_command(root_app())
    path = ["pisub"]
    for token in argv:
        if not isinstance(command, click.Group) or token.startswith("-"):
            break
        found = command.get_command(click.Context(command, info_name=path[-1]), token)
        if found is None:
            break
        command, path = found, [*path, token]
    return " ".join(path)
