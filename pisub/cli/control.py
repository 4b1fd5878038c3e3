"""``pisub steer|follow-up|interrupt|stop``: write a request, wait for its receipt.

Exit codes: 0 ``delivered`` / ``queued`` / ``scheduled`` / ``recovered`` (and ``--wait 0``),
2 ``failed`` / ``rejected`` / ``partial``, 3 no answer within the wait.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer

from pisub.cli.render import err, json_line, out

JSON = typer.Option(False, "--json", help="Print the receipt object as in the outbox.")
WAIT = typer.Option(3.0, "--wait", min=0, help="Seconds to wait for the receipt (0: do not wait).")
OK_STATES = ("delivered", "queued", "scheduled", "recovered")


def register(app: typer.Typer) -> None:
    app.command("steer")(steer)
    app.command("follow-up")(follow_up)
    app.command("interrupt")(interrupt)
    app.command("stop")(stop)


def _message(text: str) -> str:
    return sys.stdin.read() if text == "-" else text


def steer(
    ref: str = typer.Argument(..., metavar="RUN"),
    message: str = typer.Argument(..., help="The message ('-' reads it from stdin)."),
    mode: str = typer.Option("steer", "--mode", help="steer | follow_up | auto"),
    child: int | None = typer.Option(None, "--child", min=0),
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """Correct a running child; pi applies it at its next turn boundary."""
    from pisub.errors import InvalidInput

    if mode not in ("steer", "follow_up", "auto"):
        raise InvalidInput(f"unknown mode {mode!r}; one of steer, follow_up, auto")
    text = _message(message)
    _send(ref, lambda run: run.send_steer(text, mode=mode, child=child), "steer", wait, as_json)


def follow_up(
    ref: str = typer.Argument(..., metavar="RUN"),
    message: str = typer.Argument(..., help="The message ('-' reads it from stdin)."),
    child: int | None = typer.Option(None, "--child", min=0),
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """Queue more work for after the child's current work."""
    text = _message(message)
    _send(ref, lambda run: run.send_follow_up(text, child=child), "follow_up", wait, as_json)


def interrupt(
    ref: str = typer.Argument(..., metavar="RUN"),
    reason: str | None = typer.Option(None, "--reason"),
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """Abort the child's current work; the run ends paused (resumable)."""
    _send(ref, lambda run: run.send_interrupt(reason=reason), "interrupt", wait, as_json)


def stop(
    ref: str = typer.Argument(..., metavar="RUN"),
    child: int | None = typer.Option(None, "--child", min=0),
    reason: str | None = typer.Option(None, "--reason"),
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """End the child and everything it started; the run ends stopped."""
    _send(ref, lambda run: run.send_stop(child=child, reason=reason), "stop", wait, as_json)


def _send(ref: str, write: Callable[..., str], type_: str, wait: float, as_json: bool) -> None:
    from pisub.client import Run
    from pisub.mailbox import InboxClosed

    run = Run(ref)
    try:
        rid = write(run)
    except InboxClosed as exc:
        if as_json:
            json_line(
                {"requestId": None, "runId": run.id, "type": type_, "state": "failed", "reason": exc.message}
            )
        else:
            err(f"pisub: failed: {exc.message}")
        raise typer.Exit(2) from None
    if wait <= 0:
        json_line({"requestId": rid, "runId": run.id, "type": type_, "state": "written"}) if as_json else out(
            rid
        )
        return
    receipt = run.wait_for_receipt(rid, wait)
    if receipt is None or receipt.state == "pending":
        if as_json and receipt is not None:
            json_line(receipt)
        err(f"pisub: no answer to {type_} {rid} within {wait:g}s" + (" (still pending)" if receipt else ""))
        raise typer.Exit(3)
    if as_json:
        json_line(receipt)
    else:
        reason = f": {receipt.reason}" if receipt.reason else ""
        out(f"{receipt.state}: {type_} {rid}{reason}")
    raise typer.Exit(0 if receipt.state in OK_STATES else 2)
