"""``pisub steer|follow-up|interrupt|stop|resume``: write a request, wait for its receipt.

Exit codes: 0 ``delivered`` / ``queued`` / ``scheduled`` / ``recovered`` (and ``--wait 0``),
2 ``failed`` / ``rejected`` / ``partial``, 3 no answer within the wait.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import typer

from pisub.cli.complete import RUN
from pisub.cli.render import err, json_line, out

if TYPE_CHECKING:
    from pisub.api.client import Run
    from pisub.protocol.control import Receipt

JSON = typer.Option(False, "--json", help="Print the receipt object as in the outbox.")
WAIT = typer.Option(3.0, "--wait", min=0, help="Seconds to wait for the receipt (0: do not wait).")
OK_STATES = ("delivered", "queued", "scheduled", "recovered")
CHILD = typer.Option(
    None, "--child", metavar="KEY|INDEX", help="Only this child (a workflow's key, or an index)."
)


def register(app: typer.Typer) -> None:
    app.command("steer")(steer)
    app.command("follow-up")(follow_up)
    app.command("interrupt")(interrupt)
    app.command("stop")(stop)
    app.command("resume")(resume)


def _message(text: str) -> str:
    return sys.stdin.read() if text == "-" else text


def steer(
    ref: str = RUN,
    message: str = typer.Argument(..., help="The message ('-' reads it from stdin)."),
    mode: str = typer.Option("steer", "--mode", help="steer | follow_up | auto"),
    child: str | None = CHILD,
    wait: float = WAIT,
    as_json: bool = JSON,
    recover: bool = typer.Option(
        True,
        "--recover/--no-recover",
        help="If pi does not take the steer in time: pause and resume with it.",
    ),
) -> None:
    """Correct a running child; pi applies it at its next turn boundary."""
    from pisub.api.client import Run
    from pisub.store.mailbox import InboxClosed

    text = _message(message)
    _check_wait(wait)
    run = Run(ref)

    def recovering(rid: str) -> None:
        err(f"pisub: pi did not take steer {rid} within {wait:g}s: pausing the run to resume with it")

    try:
        rid, receipt = run.steer(
            text, mode=mode, child=_child(run, child), wait=wait, recover=recover, on_recovery=recovering
        )
    except InboxClosed as exc:
        _closed(run, "steer", exc.message, as_json)
    _report(run, rid, "steer", wait, as_json, receipt)


def follow_up(
    ref: str = RUN,
    message: str = typer.Argument(..., help="The message ('-' reads it from stdin)."),
    child: str | None = CHILD,
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """Queue more work: for a running run, after its current work; for a finished pi run, as a
    brief that its next resume delivers."""
    from pisub.api.client import Run
    from pisub.store.mailbox import InboxClosed

    _check_wait(wait)
    run = Run(ref)
    try:
        rid, brief = run.follow_up(_message(message), child=_child(run, child))
    except InboxClosed as exc:
        _closed(run, "follow_up", exc.message, as_json)
    if brief is not None:
        _print_receipt(brief, "follow_up", rid, as_json)
    _await(run, rid, "follow_up", wait, as_json)


def interrupt(
    ref: str = RUN,
    child: str | None = CHILD,
    reason: str | None = typer.Option(None, "--reason"),
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """Abort the child's current work; the run ends paused (resumable). A workflow: every
    running child is paused, or with --child only that one."""
    _send(
        ref,
        lambda run: run.send_interrupt(child=_child(run, child), reason=reason),
        "interrupt",
        wait,
        as_json,
    )


def stop(
    ref: str = RUN,
    child: str | None = CHILD,
    reason: str | None = typer.Option(None, "--reason"),
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """End the child and everything it started; the run ends stopped. A workflow: every child
    is stopped, or with --child only that one (the others go on)."""
    from pisub.api.client import Run
    from pisub.store.mailbox import InboxClosed

    _check_wait(wait)
    run = Run(ref)
    try:
        rid, receipt = run.stop(child=_child(run, child), reason=reason, wait=wait)
    except InboxClosed as exc:
        _closed(run, "stop", exc.message, as_json)
    _report(run, rid, "stop", wait, as_json, receipt)


def resume(
    ref: str = RUN,
    message: str | None = typer.Argument(
        None, help="The next user turn ('-' reads it from stdin); not for a workflow."
    ),
    child: int | None = typer.Option(None, "--child", min=0),
    timeout: float | None = typer.Option(None, "--timeout", help="Runtime limit of the new run."),
    as_json: bool = JSON,
) -> None:
    """Continue a finished pi run's session in a new run (its briefs first, then MESSAGE), or a
    failed or paused workflow (its finished children are not run again)."""
    from pisub.api.client import Run, resume_workflow
    from pisub.api.client import resume as do_resume
    from pisub.errors import InvalidInput

    source = Run(ref)
    if source.manifest().workflow is not None and message is not None:
        if child is None:
            raise InvalidInput(
                "a workflow is resumed without a message; to continue one child's session, "
                "give --child INDEX and the message"
            )
        run = do_resume(source.child(str(child)).id, _message(message), timeout=timeout)
    elif source.manifest().workflow is not None:
        if child is not None:
            raise InvalidInput("--child continues one child's session: give the message too")
        run = resume_workflow(ref)
    elif message is None:
        raise InvalidInput("give the next user turn: pisub resume RUN MESSAGE")
    else:
        run = do_resume(ref, _message(message), child=child, timeout=timeout)
    if as_json:
        st = run.status()
        json_line(
            {
                "runId": run.id,
                "runDir": str(run.dir),
                "state": st.state,
                "pid": st.pid,
                "resumedFrom": run.manifest().resumed_from,
            }
        )
    else:
        out(run.id)


def _send(ref: str, write: Callable[[Run], str], type_: str, wait: float, as_json: bool) -> None:
    from pisub.api.client import Run
    from pisub.store.mailbox import InboxClosed

    _check_wait(wait)
    run = Run(ref)
    try:
        rid = write(run)
    except InboxClosed as exc:
        _closed(run, type_, exc.message, as_json)
    _await(run, rid, type_, wait, as_json)


def _child(run: Run, which: str | None) -> int | None:
    """An index goes to the runner as given (it answers for a child it does not have); a key
    is looked up in the run's ``steps[]``."""
    if which is None:
        return None
    return int(which) if which.isascii() and which.isdigit() else run.child_index(which)


def _check_wait(wait: float) -> None:
    """Before anything is written: a NaN wait would never end."""
    from pisub.errors import InvalidInput

    if not math.isfinite(wait):
        raise InvalidInput("--wait must be a finite number of seconds")


def _closed(run: Run, type_: str, reason: str, as_json: bool) -> NoReturn:
    if as_json:
        json_line({"requestId": None, "runId": run.id, "type": type_, "state": "failed", "reason": reason})
    else:
        err(f"pisub: failed: {reason}")
    raise typer.Exit(2)


def _await(run: Run, rid: str, type_: str, wait: float, as_json: bool) -> None:
    _report(run, rid, type_, wait, as_json, run.wait_for_receipt(rid, wait) if wait > 0 else None)


def _report(run: Run, rid: str, type_: str, wait: float, as_json: bool, receipt: Receipt | None) -> NoReturn:
    """Print the answer to a request (or that it was written, with ``--wait 0``) and exit."""
    if wait <= 0:
        json_line({"requestId": rid, "runId": run.id, "type": type_, "state": "written"}) if as_json else out(
            rid
        )
        raise typer.Exit(0)
    if receipt is None or receipt.state == "pending":
        if as_json and receipt is not None:
            json_line(receipt)
        err(f"pisub: no answer to {type_} {rid} within {wait:g}s" + (" (still pending)" if receipt else ""))
        raise typer.Exit(3)
    _print_receipt(receipt, type_, rid, as_json)


def _print_receipt(receipt: Receipt, type_: str, rid: str, as_json: bool) -> NoReturn:
    if as_json:
        json_line(receipt)
    else:
        reason = f": {receipt.reason}" if receipt.reason else ""
        out(f"{receipt.state}: {type_} {rid}{reason}")
    raise typer.Exit(0 if receipt.state in OK_STATES else 2)
