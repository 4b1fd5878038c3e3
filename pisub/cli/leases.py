"""``pisub lease list|break``."""

from __future__ import annotations

import typer

from pisub.cli.render import json_line, out

app = typer.Typer(
    help="Session leases: which run drives which pi session.", no_args_is_help=True, rich_markup_mode=None
)


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json")) -> None:
    """List every lease and whether its owner is alive, dead or unknown."""
    from pisub.api.admin import leases

    infos = leases()
    for info in infos:
        alive = {True: "alive", False: "dead", None: "unknown"}[info.alive]
        if as_json:
            json_line(
                {"path": str(info.path), "owner": info.owner, "owner_state": alive, "error": info.error}
            )
        elif info.owner is None:
            out(f"{info.path.name}  unreadable: {info.error}")
        else:
            o = info.owner
            out(f"{o.run_id}  gen {o.generation}  pid {o.pid}@{o.host}  {alive}  {o.session_file}")
    if not infos and not as_json:
        out("no leases")


@app.command("break")
def break_(
    ref: str = typer.Argument(
        ..., metavar="RUN", help="The owning run, its source run, or any run of the session."
    ),
    force: bool = typer.Option(
        False, "--force", help="Required: a broken lease lets a second run drive the session."
    ),
) -> None:
    """Remove a lease by force (when its owner cannot be proven dead, e.g. after a reboot)."""
    from pisub.api.admin import break_leases

    for info in break_leases(ref, force=force):
        owner = info.owner
        assert owner is not None
        out(f"broke the lease of {owner.run_id} (generation {owner.generation}) on {owner.session_file}")
