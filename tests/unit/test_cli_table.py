"""The command line's table of contents (``pisub.cli.commands``) is the real command line, and
a command imports no other command's module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from pisub.cli import full_app
from pisub.cli.commands import COMMANDS


def test_the_table_names_every_command_with_its_short_help() -> None:
    """Names, order and short help of the table are those of the commands built from their
    modules (the table is what ``pisub --help`` lists without importing them)."""
    group = typer.main.get_group(full_app())
    real = [
        (name, cmd.get_short_help_str(limit=10_000)) for name, cmd in group.commands.items() if not cmd.hidden
    ]
    assert real == [(c.name, c.help) for c in COMMANDS]


def test_each_entry_names_the_module_that_defines_it() -> None:
    """An entry's module defines the command (its callback, or its group's)."""
    group = typer.main.get_group(full_app())
    for entry in COMMANDS:
        command = group.commands[entry.name]
        if entry.app is None:
            assert command.callback is not None
            assert command.callback.__module__ == f"pisub.cli.{entry.module}", entry


_PROBE = """
import json, sys
sys.argv = ["pisub", *json.loads(sys.argv[1])]
from pisub.cli import main
try:
    main()
except SystemExit:
    pass
finally:
    loaded = sorted(m for m in sys.modules if m.startswith("pisub.cli."))
    sys.__stderr__.write("\\nLOADED " + json.dumps(loaded) + "\\n")
"""


def _loaded(home: Path, *argv: str) -> set[str]:
    env = {**os.environ, "PISUB_HOME": str(home)}
    env = {k: v for k, v in env.items() if not k.endswith("_COMPLETE")}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(argv))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED ")]
    assert line, proc.stderr
    return set(json.loads(line[-1][len("LOADED ") :]))


# what every command loads: the parser, the table and the root's --version option
BASE = {"pisub.cli.parser", "pisub.cli.failing", "pisub.cli.commands", "pisub.cli.version"}


def test_help_imports_no_command_module(tmp_path: Path) -> None:
    assert _loaded(tmp_path, "--help") <= BASE
    assert _loaded(tmp_path) <= BASE  # bare `pisub`: the help too
    assert _loaded(tmp_path, "--version") <= BASE | {"pisub.cli.render"}


def test_a_command_imports_only_its_own_module(tmp_path: Path) -> None:
    shared = BASE | {"pisub.cli.render", "pisub.cli.complete"}
    reading = shared | {"pisub.cli.runs", "pisub.cli.reading"}
    assert _loaded(tmp_path, "status") <= reading
    assert _loaded(tmp_path, "list", "--json") <= reading
    assert _loaded(tmp_path, "status", "00000000-0000-4000-8000-000000000000", "--json") <= reading
    assert _loaded(tmp_path, "lease", "--help") <= shared | {"pisub.cli.leases"}
    assert _loaded(tmp_path, "stop", "--help") <= shared | {"pisub.cli.control"}


def test_an_unknown_command_is_named_with_a_hint_without_importing_commands(tmp_path: Path) -> None:
    env = {**os.environ, "PISUB_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "statsu"], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "pisub: No such command 'statsu'. Did you mean 'status'? Try 'pisub --help'. [USAGE]"
    )
    assert _loaded(tmp_path, "statsu") <= BASE


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["run", "--agent"], "pisub run"),
        (["list", "--limit"], "pisub list"),
        (["schedule", "create", "--every"], "pisub schedule create"),
        (["--version", "--bogus"], "pisub"),
    ],
)
def test_an_option_missing_its_value_names_its_command_help(
    tmp_path: Path, argv: list[str], path: str
) -> None:
    """The attack's F7 (issue 29): click gives no context for it, and the line said `pisub --help`."""
    env = {**os.environ, "PISUB_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", *argv], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 2 and proc.stderr.endswith(f" Try '{path} --help'. [USAGE]\n"), proc.stderr
