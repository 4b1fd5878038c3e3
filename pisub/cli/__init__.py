"""The ``pisub`` command line: a thin skin over :mod:`pisub.client`.

Exit codes: 0 success; 1 a pisub error (one line on stderr, with its code); 2 a usage
error; ``wait`` exits 1 for a run that ended other than ``complete`` and 3 when its
``--timeout`` ran out.
"""

from __future__ import annotations

import sys

import typer

from pisub.cli import agents as _agents
from pisub.cli import control as _control
from pisub.cli import leases as _leases
from pisub.cli import ops as _ops
from pisub.cli import runs as _runs
from pisub.errors import PisubError

app = typer.Typer(
    name="pisub",
    help="Detached background runs of coding sub-agents, controlled through plain files.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
_runs.register(app)
_control.register(app)
_ops.register(app)
app.add_typer(_agents.app, name="agents")
app.add_typer(_leases.app, name="lease")


def main() -> None:
    """Console-script entry point."""
    try:
        app(prog_name="pisub")
    except PisubError as exc:
        print(f"pisub: {exc.message} [{exc.code}]", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
