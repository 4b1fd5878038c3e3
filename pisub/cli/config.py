"""``pisub config show``: the effective defaults and where each comes from."""

from __future__ import annotations

import typer

from pisub.cli.render import json_line, out

app = typer.Typer(
    help="The user's configuration (<home>/config.toml).", no_args_is_help=True, add_completion=False
)


@app.command("show")
def show(
    as_json: bool = typer.Option(False, "--json", help="A JSON array of {name, value, source}."),
) -> None:
    """Every setting config.toml may hold: its value when neither a call nor an agent sets it,
    and where that comes from (config.toml, an environment variable, or pisub's default)."""
    from pisub.store.config import config_path, effective
    from pisub.store.paths import open_home

    home = open_home()
    rows = effective(home.root)
    if as_json:
        json_line([{"name": r.name, "value": r.value, "source": r.source} for r in rows])
        return
    out(f"# {config_path(home.root)}")
    width = max(len(r.name) for r in rows)
    for r in rows:
        value = "none" if r.value is None else r.value
        out(f"{r.name.ljust(width)}  {value}  ({r.source})")
