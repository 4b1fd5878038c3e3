"""``pisub run|status|list|logs|wait|result|path``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from pisub.cli.render import err, json_line, list_text, out, result_text, status_text

JSON = typer.Option(False, "--json", help="Machine-readable output (documented in spec/cli.md).")


def register(app: typer.Typer) -> None:
    for fn in (run, status, list_, logs, wait, result, path):
        app.command(fn.__name__.rstrip("_"))(fn)


def run(
    task: str = typer.Argument(..., help="What the agent should do."),
    agent: str = typer.Option(..., "--agent", "-a", help="Agent name."),
    cwd: Path | None = typer.Option(None, "--cwd", help="Working directory of the child."),
    timeout: float | None = typer.Option(None, "--timeout", help="Runtime limit in seconds."),
    idle_timeout: float | None = typer.Option(None, "--idle-timeout", help="Seconds without output."),
    as_json: bool = JSON,
) -> None:
    """Start a detached run and print its id once the runner has started the child."""
    from pisub.client import launch

    handle = launch(agent, task, cwd=cwd, timeout=timeout, idle_timeout=idle_timeout)
    if as_json:
        st = handle.status()
        json_line({"runId": handle.id, "runDir": str(handle.dir), "state": st.state, "pid": st.pid})
    else:
        out(handle.id)


def status(ref: str = typer.Argument(..., metavar="RUN"), as_json: bool = JSON) -> None:
    """Show where a run is now (after crash detection)."""
    from pisub.client import Run

    st = Run(ref).status()
    json_line(st) if as_json else out(status_text(st))


def list_(
    state: str | None = typer.Option(None, "--state", help="Only runs in this state."),
    as_json: bool = JSON,
) -> None:
    """List runs, oldest first."""
    from pisub.client import list_runs
    from pisub.errors import InvalidInput
    from pisub.protocol.status import RunState

    try:
        wanted = RunState(state) if state else None
    except ValueError:
        raise InvalidInput(
            f"unknown state {state!r}; one of {', '.join(s.value for s in RunState)}"
        ) from None
    problems: list[str] = []
    statuses = list(list_runs(state=wanted, problems=problems))
    if as_json:
        for st in statuses:
            json_line(st)
    else:
        out(list_text(statuses))
    for problem in problems:
        err(f"pisub: unreadable run {problem}")


def logs(
    ref: str = typer.Argument(..., metavar="RUN"),
    child: int = typer.Option(0, "--child", min=0, help="Child index."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
) -> None:
    """Print a child's output log."""
    from pisub.client import Run
    from pisub.errors import InvalidInput

    handle = Run(ref)
    log = handle.paths.output_log(child)
    if not os.path.lexists(log) and not follow:
        raise InvalidInput(f"run {handle.id} has no output log for child {child}")
    _follow(handle, log) if follow else _copy(log, 0)


def _copy(log: Path, offset: int) -> int:
    from pisub.errors import storage_error
    from pisub.fsio import open_regular

    try:
        fd = open_regular(log)
    except FileNotFoundError:
        return offset
    except OSError as exc:
        raise storage_error(exc, "read", log) from exc
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 16):
            sys.stdout.buffer.write(chunk)
            offset += len(chunk)
    finally:
        os.close(fd)
    sys.stdout.flush()
    return offset


def _follow(handle: object, log: Path) -> None:
    from pisub.client import Run
    from pisub.defaults import READ_POLL_S
    from pisub.polling import Every, poll

    assert isinstance(handle, Run)
    offset = [0]
    end_check = Every(0.5)

    def printed_to_the_end() -> bool | None:
        offset[0] = _copy(log, offset[0])
        if end_check.due() and handle.status().state.is_terminal:
            _copy(log, offset[0])
            return True
        return None

    poll(printed_to_the_end, None, interval=READ_POLL_S * 2)


def wait(
    ref: str = typer.Argument(..., metavar="RUN"),
    timeout: float | None = typer.Option(None, "--timeout", help="Give up after this many seconds (exit 3)."),
    as_json: bool = JSON,
) -> None:
    """Wait for a run to end and print its result; exit 0 only for a complete run."""
    from pisub.client import Run
    from pisub.errors import WaitTimeout

    handle = Run(ref)
    try:
        res = handle.wait(timeout)
    except WaitTimeout as exc:
        err(f"pisub: {exc.message} [{exc.code}]")
        raise typer.Exit(3) from None
    json_line(res) if as_json else out(result_text(res))
    raise typer.Exit(0 if res.state == "complete" else 1)


def result(ref: str = typer.Argument(..., metavar="RUN"), as_json: bool = JSON) -> None:
    """Print a finished run's result."""
    from pisub.client import Run
    from pisub.errors import InvalidInput

    handle = Run(ref)
    handle.status()  # crash repair may write the result
    res = handle.result()
    if res is None:
        raise InvalidInput(f"run {handle.id} has no result yet (it is still running)")
    json_line(res) if as_json else out(result_text(res))


def path(ref: str = typer.Argument(..., metavar="RUN")) -> None:
    """Print the run directory."""
    from pisub.client import Run

    out(str(Run(ref).dir))
