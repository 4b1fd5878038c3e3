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
    from pisub.store.leases import list_leases
    from pisub.store.paths import open_home

    infos = list_leases(open_home().leases)
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
    from pisub.api.client import Run
    from pisub.errors import InvalidInput
    from pisub.store.leases import break_lease, canonical, list_leases

    run = Run(ref)
    session = run.status().session_file
    matches = [
        i
        for i in list_leases(run.home.leases)
        if i.owner is not None
        and (
            run.id in (i.owner.run_id, i.owner.source_run_id)
            or (session and i.owner.session_file == canonical(session))
        )
    ]
    if not matches:
        raise InvalidInput(f"no lease belongs to run {run.id}")
    if not force:
        raise InvalidInput(
            "refusing to break a lease without --force (pi itself cannot be fenced: an old pi "
            "still alive could keep writing to the session)"
        )
    for info in matches:
        break_lease(run.home.leases, info.path)
        owner = info.owner
        assert owner is not None
        out(f"broke the lease of {owner.run_id} (generation {owner.generation}) on {owner.session_file}")
