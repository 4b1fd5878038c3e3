"""The command line's table of contents: each command's name, its short help (the first
sentence of its help) and the module that defines it.

``pisub --help`` lists the commands from this table, and ``pisub CMD`` imports only CMD's
module: a command imports what it uses, not every command's parser and dependencies.
``tests/unit/test_cli_table.py`` compares the table with the real commands (names, order and
short help), so it cannot drift from them.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    name: str
    help: str
    """The command's short help, as its group's ``--help`` lists it."""
    module: str
    """Its module under :mod:`pisub.cli`."""
    app: str | None = None
    """The module's ``typer.Typer`` that is this group of commands; None: the module's
    ``register(app)`` adds the command (with others of the module)."""


COMMANDS: tuple[Command, ...] = (
    Command(
        "run",
        "Start a detached run — one agent on TASK, or a workflow (--workflow, --parallel, --chain, "
        "--lanes, --task) — and print its id once its runner has started.",
        "runs",
    ),
    Command(
        "status", "Show where a run is now (after crash detection); a workflow lists its children.", "runs"
    ),
    Command("list", "List the top-level runs (with --all, every run), oldest first.", "runs"),
    Command("fleet", "Every live run and workflow child, one line each.", "runs"),
    Command(
        "top",
        "A full-screen live table of runs: arrows/j/k select, enter log, s steer, i interrupt, "
        "x stop, q quit.",
        "runs",
    ),
    Command(
        "logs",
        "Print a child's output log (a workflow's child: --child KEY|INDEX; a workflow without --child: "
        "every child's lines, prefixed [key]).",
        "runs",
    ),
    Command("wait", "Wait for a run to end and print its result; exit 0 only for a complete run.", "runs"),
    Command("result", "Print a finished run's result.", "runs"),
    Command("path", "Print the run directory.", "runs"),
    Command(
        "share",
        "Export a pi run's session as HTML, the way `pi --export` does, and print the file's path.",
        "runs",
    ),
    Command("version", "Print pisub's version (and, with --json, the Python running it).", "version"),
    Command("steer", "Correct a running child; pi applies it at its next turn boundary.", "control"),
    Command(
        "follow-up",
        "Queue more work: for a running run, after its current work; for a finished pi run, as a brief "
        "that its next resume delivers.",
        "control",
    ),
    Command(
        "interrupt", "Abort the current work of one or more runs; each ends paused (resumable).", "control"
    ),
    Command("stop", "End one or more runs and everything they started; each ends stopped.", "control"),
    Command(
        "resume",
        "Continue a finished pi run's session in a new run, or a failed or paused workflow.",
        "control",
    ),
    Command(
        "doctor",
        "Check the home, inotify limits, the pi binary, stuck runs, orphaned leases and agent files.",
        "ops",
    ),
    Command("gc", "Remove finished runs (never a live one) and sweep stale inbox/tmp files.", "ops"),
    Command("guide", "Print a guide topic (an unknown topic lists the valid ones).", "pi_ext"),
    Command("home", "Print the pisub home directory (created if missing).", "pi_ext"),
    Command(
        "models",
        "The models pi knows (pi --list-models); with --agent, the agent's model and thinking level.",
        "pi_ext",
    ),
    Command(
        "resources",
        "List the named workflow resources (pisub run --resource NAME): the builtins, then those of "
        "your config.toml ([workflows.resources.NAME]), one line each.",
        "resources",
    ),
    Command("agents", "List, show and edit agent definitions.", "agents", "app"),
    Command("lease", "Session leases: which run drives which pi session.", "leases", "app"),
    Command("workflow", "Workflow scripts.", "workflows", "app"),
    Command("children", "Finished child runs to continue.", "workflows", "children_app"),
    Command("worktree", "Isolated children's git worktrees.", "worktrees", "app"),
    Command("lane", "Lane evidence: merges and supersessions.", "lanes", "app"),
    Command(
        "config",
        "The user's configuration ($XDG_CONFIG_HOME/pisub/config.toml, default "
        "~/.config/pisub/config.toml; the old <home>/config.toml is still read).",
        "config",
        "app",
    ),
    Command("cluster", "The engine runs are placed on (Slurm).", "cluster", "app"),
    Command(
        "group",
        "Groups: at most N runs of a group at once, the rest queued (spec/queue.md).",
        "groups",
        "app",
    ),
    Command(
        "schedule",
        "Schedules: workflows fired later or every interval by `pisub schedule tick`.",
        "schedules",
        "app",
    ),
    Command(
        "mission",
        "Missions: a goal, its runs, decisions and state across workflows (spec/missions.md).",
        "missions",
        "app",
    ),
    Command("pi-extension", "The subagent tool for pi (a pi extension).", "pi_ext", "app"),
)

BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}
