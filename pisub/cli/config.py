"""``pisub config show``: the effective defaults, where each comes from, and every file read."""

from __future__ import annotations

import typer

from pisub.cli.render import json_line, out

app = typer.Typer(
    help="The user's configuration ($XDG_CONFIG_HOME/pisub/config.toml, default "
    "~/.config/pisub/config.toml; the old <home>/config.toml is still read).",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("show")
def show(
    as_json: bool = typer.Option(False, "--json", help="A JSON array of {name, value, source, file}."),
) -> None:
    """Every setting config.toml may hold: its value when neither a call nor an agent sets it,
    and where that comes from (which config.toml, an environment variable, or pisub's default).
    The lines starting with # name every file looked at and every key both files set."""
    from pisub.api.admin import config_sources, settings
    from pisub.termsafe import printable

    _path, rows = settings()
    if as_json:
        json_line(
            [
                {
                    "name": r.name,
                    "value": r.value,
                    "source": r.source,
                    "file": str(r.file) if r.file else None,
                }
                for r in rows
            ]
        )
        return
    loaded = config_sources()
    for file in loaded.files:
        where = printable(str(file.path), one_line=True)
        state = "read" if file.found else "absent"
        role = " (the old place: still read; the file above wins key by key)" if file.old else ""
        out(f"# {state:<6} {where}{role}")
    for key, used, ignored in loaded.conflicts():
        shown = printable(f"{key} = {used!r} (not {ignored!r}, from the old place)", one_line=True)
        out(f"# both set {shown}")
    width = max(len(r.name) for r in rows)
    for r in rows:
        value = "none" if r.value is None else r.value
        source = printable(str(r.file), one_line=True) if r.file else r.source
        out(f"{r.name.ljust(width)}  {value}  ({source})")
