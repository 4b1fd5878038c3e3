"""``pisub steer|follow-up|interrupt|stop|resume``: write a request, wait for its receipt.

Exit codes for one run: 0 ``delivered`` / ``queued`` / ``scheduled`` / ``recovered`` (and
``--wait 0``), 1 a refusal before anything was written (``RUN_CLOSED``: the run has finished;
``NOT_STEERABLE``, ``NOT_RESUMABLE``...), 2 ``failed`` / ``rejected`` / ``partial``, 3 no answer
within the wait. ``stop``/``interrupt`` of several runs (``A B``, ``--all``, ``--agent``,
``--label``): one line per run, exit 0 when every run took it, else 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import typer

from pisub.cli.complete import RUN, finite_seconds, run_ids
from pisub.cli.render import err, json_line, out

if TYPE_CHECKING:
    from pisub.api.client import Run
    from pisub.api.many import Outcome
    from pisub.errors import InboxClosed
    from pisub.protocol.control import Receipt

JSON = typer.Option(False, "--json", help="Print the receipt object as in the outbox.")
WAIT = typer.Option(
    3.0, "--wait", min=0, callback=finite_seconds, help="Seconds to wait for the receipt (0: do not wait)."
)
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
    from pisub.errors import InboxClosed

    text = _message(message)
    run = Run(ref)

    def recovering(rid: str) -> None:
        err(f"pisub: pi did not take steer {rid} within {wait:g}s: pausing the run to resume with it")

    try:
        rid, receipt = run.steer(
            text, mode=mode, child=_child(run, child), wait=wait, recover=recover, on_recovery=recovering
        )
    except InboxClosed as exc:
        _closed(run, "steer", exc, as_json)
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
    from pisub.errors import InboxClosed

    run = Run(ref)
    try:
        rid, brief = run.follow_up(_message(message), child=_child(run, child))
    except InboxClosed as exc:
        _closed(run, "follow_up", exc, as_json)
    if brief is not None:
        _print_receipt(brief, "follow_up", rid, as_json)
    _await(run, rid, "follow_up", wait, as_json)


RUNS = typer.Argument(None, metavar="RUN...", autocompletion=run_ids, show_default=False)
ALL = typer.Option(False, "--all", help="Every live run that no live workflow stops with itself.")
AGENT = typer.Option(None, "--agent", help="Every such live run of this agent.")
LABEL = typer.Option(None, "--label", help="Every such live run with this label.")
REASON = typer.Option(None, "--reason")


def interrupt(
    refs: list[str] | None = RUNS,
    all_: bool = ALL,
    agent: str | None = AGENT,
    label: str | None = LABEL,
    child: str | None = CHILD,
    reason: str | None = REASON,
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """Abort the current work of one or more runs; each ends paused (resumable).

    A workflow: every running child is paused, or with --child only that one. A run that
    cannot be resumed (an external CLI) is refused with NOT_RESUMABLE: stop it instead."""
    from pisub.api.many import interrupt_runs

    many = _selection(refs or [], all_, agent, label, child, as_json)
    if many is None:
        _send(
            (refs or [""])[0],
            lambda run: run.interrupt(child=_child(run, child), reason=reason),
            "interrupt",
            wait,
            as_json,
        )
    runs, selected = many
    _report_many(interrupt_runs(runs, reason=reason, wait=wait, selected=selected), wait, as_json)


def stop(
    refs: list[str] | None = RUNS,
    all_: bool = ALL,
    agent: str | None = AGENT,
    label: str | None = LABEL,
    child: str | None = CHILD,
    reason: str | None = REASON,
    wait: float = WAIT,
    as_json: bool = JSON,
) -> None:
    """End one or more runs and everything they started; each ends stopped.

    Several runs: give their ids, or --all, --agent A, --label L (the live runs at that
    moment, but a live workflow's children: it stops them); one line per run. A workflow: every
    child is stopped, or with --child only that one (the others go on)."""
    from pisub.api.client import Run
    from pisub.api.many import stop_runs
    from pisub.errors import InboxClosed

    many = _selection(refs or [], all_, agent, label, child, as_json)
    if many is not None:
        runs, selected = many
        _report_many(stop_runs(runs, reason=reason, wait=wait, selected=selected), wait, as_json)
    run = Run((refs or [""])[0])
    try:
        rid, receipt = run.stop(child=_child(run, child), reason=reason, wait=wait)
    except InboxClosed as exc:
        _closed(run, "stop", exc, as_json)
    _report(run, rid, "stop", wait, as_json, receipt)


def _selection(
    refs: list[str], all_: bool, agent: str | None, label: str | None, child: str | None, as_json: bool
) -> tuple[list[Run], bool] | None:
    """The runs to act on and whether they are a selection; None for exactly one run named.
    Every reference is resolved before anything is written (a bad one refuses them all). A
    selection of no run says so (with ``as_json``, nothing: no receipt), exit 0."""
    import click

    from pisub.api.many import live_runs, resolve_runs
    from pisub.errors import InvalidInput

    selecting = all_ or agent is not None or label is not None
    if selecting and refs:
        raise click.UsageError("give run ids, or --all / --agent / --label, not both.")
    if not selecting and not refs:
        raise click.UsageError("give a run id (or several), or --all / --agent A / --label L.")
    if not selecting and len(refs) == 1:
        return None
    if child is not None:
        raise InvalidInput("--child names one run's child: give one run")
    if not selecting:
        return resolve_runs(refs), False
    runs = live_runs(agent=agent, label=label)
    if not runs and as_json:
        raise typer.Exit(0)
    if not runs:
        which = " ".join(
            w
            for w in (
                f"of agent {agent!r}" if agent is not None else "",
                f"labelled {label!r}" if label is not None else "",
            )
            if w
        )
        out(f"no live run{' ' + which if which else ''}")
        raise typer.Exit(0)
    return runs, True


def _report_many(outcomes: list[Outcome], wait: float, as_json: bool) -> NoReturn:
    """One line per run (``<run id>  <state>: <type> <request id>[: reason]``); exit 0 when every
    run took the request (or had ended, in a selection), else 1."""
    for o in outcomes:
        if as_json:
            json_line(
                o.receipt
                if o.receipt is not None
                else {
                    "requestId": o.request_id,
                    "runId": o.run_id,
                    "type": o.type,
                    "state": o.state,
                    **({"reason": o.reason} if o.reason else {}),
                    **({"code": o.code} if o.code else {}),
                }
            )
            continue
        what = f"{o.type} {o.request_id}" if o.request_id else o.type
        if o.state == "no answer":
            what += f" within {wait:g}s"
        reason = f": {o.reason}" if o.reason else ""
        code = f" [{o.code}]" if o.code else ""
        out(f"{o.run_id}  {o.state}: {what}{reason}{code}")
    raise typer.Exit(0 if all(o.ok for o in outcomes) else 1)


def resume(
    ref: str = RUN,
    message: str | None = typer.Argument(
        None, help="The next user turn ('-' reads it from stdin); not for a workflow."
    ),
    child: int | None = typer.Option(None, "--child", min=0),
    timeout: float | None = typer.Option(None, "--timeout", help="Runtime limit of the new run."),
    as_json: bool = JSON,
) -> None:
    """Continue a finished pi run's session in a new run, or a failed or paused workflow.

    A pi run: its briefs (``follow-up``, steers carried from a pause) first, then MESSAGE;
    without MESSAGE the briefs alone are the next turn. A workflow: its finished children are
    not run again."""
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
    else:
        run = do_resume(ref, None if message is None else _message(message), child=child, timeout=timeout)
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


def _send(ref: str, write: Callable[[Run], str], type_: str, wait: float, as_json: bool) -> NoReturn:
    from pisub.api.client import Run
    from pisub.errors import InboxClosed

    run = Run(ref)
    try:
        rid = write(run)
    except InboxClosed as exc:
        _closed(run, type_, exc, as_json)
    _await(run, rid, type_, wait, as_json)


def _child(run: Run, which: str | None) -> int | None:
    """An index goes to the runner as given (it answers for a child it does not have); a key
    is looked up in the run's ``steps[]``."""
    if which is None:
        return None
    return int(which) if which.isascii() and which.isdigit() else run.child_index(which)


def _closed(run: Run, type_: str, exc: InboxClosed, as_json: bool) -> NoReturn:
    """The run has finished: nothing was written (``RUN_CLOSED``, exit 1)."""
    if as_json:
        json_line(
            {
                "requestId": None,
                "runId": run.id,
                "type": type_,
                "state": "failed",
                "reason": exc.message,
                "code": exc.code,
            }
        )
    err(f"pisub: {exc.message} [{exc.code}]")
    raise typer.Exit(1)


def _await(run: Run, rid: str, type_: str, wait: float, as_json: bool) -> NoReturn:
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
    from pisub.api.many import closed_meanwhile

    if closed_meanwhile(receipt):  # written, but the run finished before taking it
        if as_json:
            json_line(receipt)
        err(f"pisub: run {receipt.run_id} has finished: {receipt.reason} [RUN_CLOSED]")
        raise typer.Exit(1)
    if as_json:
        json_line(receipt)
    else:
        reason = f": {receipt.reason}" if receipt.reason else ""
        out(f"{receipt.state}: {type_} {rid}{reason}")
    raise typer.Exit(0 if receipt.state in OK_STATES else 2)
