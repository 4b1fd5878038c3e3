"""``pisub group add|set-limit|list|pause|resume|rm``: groups with a parallel limit and a queue."""

from __future__ import annotations

import typer

from pisub.cli.render import json_line, out

app = typer.Typer(
    help="Groups: at most N runs of a group at once, the rest queued (spec/queue.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

NAME = typer.Argument(..., metavar="NAME", help="The group's name (letters, digits, '_', '-').")


def _line(view: object) -> str:
    from pisub.api.groups import GroupView

    assert isinstance(view, GroupView)
    limit = "no limit" if view.limit is None else f"limit {view.limit}"
    paused = "  paused" if view.paused else ""
    line = f"{view.name}  {limit}  running {view.running}  queued {view.queued}{paused}"
    return line + (f"  ({view.error})" if view.error else "")


def _json(view: object) -> dict[str, object]:
    import msgspec

    assert isinstance(view, msgspec.Struct)
    return msgspec.structs.asdict(view)


@app.command("add")
def add(
    name: str = NAME,
    limit: int | None = typer.Option(None, "--limit", help="Runs of the group at once (default: no limit)."),
) -> None:
    """Create a group; runs launched with --group NAME wait for one of its LIMIT slots."""
    from pisub.api.groups import group_add

    out(_line(group_add(name, limit=limit)))


@app.command("set-limit")
def set_limit(name: str = NAME, limit: int = typer.Argument(..., metavar="N", help="Runs at once.")) -> None:
    """Change a group's parallel limit (a raised limit starts waiting runs at once)."""
    from pisub.api.groups import group_set_limit

    out(_line(group_set_limit(name, limit)))


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per group.")) -> None:
    """Every group: its limit, runs holding a slot, runs queued, whether it is paused."""
    from pisub.api.groups import group_list

    for view in group_list():
        if as_json:
            json_line(_json(view))
        else:
            out(_line(view))


@app.command("pause")
def pause(name: str = NAME) -> None:
    """Start no queued run of the group until it is resumed (runs going on are not touched)."""
    from pisub.api.groups import group_pause

    out(_line(group_pause(name)))


@app.command("resume")
def resume(name: str = NAME) -> None:
    """Start queued runs of the group again, as many as it has free slots."""
    from pisub.api.groups import group_resume

    out(_line(group_resume(name)))


@app.command("rm")
def rm(name: str = NAME) -> None:
    """Remove a group (refused while runs wait or run in it)."""
    from pisub.api.groups import group_rm

    group_rm(name)
    out(f"removed group {name}")
