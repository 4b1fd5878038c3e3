"""``pisub cluster doctor``: whether runs can be placed on the Slurm cluster safely."""

from __future__ import annotations

import typer

from pisub.cli.render import out, print_report

app = typer.Typer(help="The engine runs are placed on (Slurm).", no_args_is_help=True, add_completion=False)


@app.command("doctor")
def doctor(
    partition: str | None = typer.Option(
        None, "--partition", help="The partition to check (default: [slurm] partition, else Slurm's default)."
    ),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the probe job."),
    as_json: bool = typer.Option(False, "--json", help="{healthy, checks: [{name, ok, detail, fix}]}."),
) -> None:
    """Check Slurm, the partition, KillWait, proctrack/cgroup, the home on shared storage (a probe
    job writes a file this host reads back), the lookup cache and clock skew."""
    from pisub.api.slurm_doctor import diagnose_cluster
    from pisub.errors import InvalidInput
    from pisub.store.config import load_config
    from pisub.store.paths import open_home

    if not 0 < timeout <= 3600:
        raise InvalidInput("--timeout must be between 0 and 3600 seconds")
    home = open_home()
    configured = load_config(home.root).slurm
    report = diagnose_cluster(home, partition or (configured.partition if configured else None), timeout)
    print_report(report, as_json, width=11)
    for check in report.checks:
        out(f"{'ok ' if check.ok else 'BAD'}  {check.name:<11} {check.detail}")
        if not check.ok and check.fix:
            out(f"              fix: {check.fix}")
    out("healthy" if report.healthy else "problems found")
    raise typer.Exit(0 if report.healthy else 1)
