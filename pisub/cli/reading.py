"""``pisub status`` and ``pisub list`` themselves, without typer: the typer commands of
:mod:`pisub.cli.runs` call them, and so does :mod:`pisub.cli.fast`, which runs the common forms
of these two commands without importing typer or click at all (their parsers cost more than
reading a run)."""

from __future__ import annotations

from typing import Any

from pisub.cli.render import (
    colour_wanted,
    err,
    fleet_text,
    json_line,
    json_lines,
    list_text,
    out,
    out_block,
    out_painted,
    status_text,
    terminal_width,
)


def run_named(ref: str, child: str | None) -> Any:
    """The run ``ref`` names, or its workflow child ``child``."""
    from pisub.api.client import Run

    handle = Run(ref)
    if child is None:
        return handle
    if handle.manifest().workflow is None:
        handle.child_index(child)  # a single run's only child is 0
        return handle
    return handle.child(child)


RECENT = 20
"""How many runs ``pisub status`` without RUN shows."""


def status(ref: str | None, child: str | None, view: str, lines: int, as_json: bool) -> None:
    """``pisub status`` (see :func:`pisub.cli.runs.status`)."""
    from pisub.errors import InvalidInput, ProtocolError
    from pisub.protocol.placement import BackendName, Placement

    if ref is None:
        if child is not None or view != "summary":
            raise InvalidInput("--child and --view name one run's: give RUN")
        _recent(as_json)
        return
    handle = run_named(ref, child)
    if view == "summary":
        st = handle.status()
        try:
            placement = handle.placement()
        except ProtocolError as exc:  # shown as it is: the status is still worth reading
            err(f"pisub: {exc.message} [{exc.code}]")
            placement = Placement(v=1, backend=BackendName.LOCAL, launcher_host="?")
        colour = not as_json and colour_wanted()
        if not as_json and not st.state.is_terminal and handle.liveness(st) == "unknown":
            out_painted(status_text(st, placement, colour=colour))
            out(
                f"note     this host cannot prove whether the runner (on {st.host}) lives — another "
                "host, the engine unreachable, or a lease not yet expired: nothing is repaired yet"
            )
        elif placement.backend == "local":
            json_line(st) if as_json else out_painted(status_text(st, colour=colour))
            _queue_line(handle, st, as_json)
        elif as_json:
            import msgspec

            json_line({**msgspec.to_builtins(st), "placement": msgspec.to_builtins(placement)})
        else:
            out_painted(status_text(st, placement, colour=colour))
        if not as_json:
            _mission_line(handle, st)
            _resource_lines(handle, st)
            from pisub.cli.reviews import print_review_runs

            print_review_runs(handle)
    elif view == "fleet":
        from pisub.api.views import fleet as fleet_rows

        print_fleet(fleet_rows(handle), as_json)
    elif view == "transcript":
        from pisub.api.views import json_lines_of, transcript

        text = transcript(handle, lines)
        if as_json:
            shown, replaced = json_lines_of(text)
            json_line({"runId": handle.id, "lines": shown, "undecodable": replaced})
        else:
            out_block("\n".join(text))
    else:
        raise InvalidInput(f"unknown view {view!r}; one of summary, fleet, transcript")


def _no_cycle_collection() -> None:
    """A command that reads many statuses and then ends: no cyclic garbage collection (its
    passes walk every status read, again and again; nothing it makes is a cycle that matters
    before the process ends)."""
    import gc

    gc.disable()


def _recent(as_json: bool) -> None:
    """``pisub status`` without RUN: the :data:`RECENT` newest top-level runs, newest first,
    and how to see more."""
    _no_cycle_collection()
    from pisub.api.client import list_runs

    problems: list[str] = []
    every = list(list_runs(problems=problems))
    shown = every[-RECENT:][::-1]
    if as_json:
        json_lines(shown)
    else:
        out_painted(list_text(shown, width=terminal_width(), colour=colour_wanted()))
        if len(every) > RECENT:
            out(f"the {RECENT} newest of {len(every)} runs; every one: pisub list (--all: child runs too)")
        elif not every:
            out("start one: pisub run --agent NAME TASK")
    for problem in problems:
        err(f"pisub: unreadable run {problem}")


def print_fleet(rows: list[Any], as_json: bool) -> None:
    if as_json:
        for row in rows:
            json_line(row)
    else:
        out_painted(fleet_text(rows, width=terminal_width(), colour=colour_wanted()))


def listed(
    state: str | None, all_: bool, agent: str | None, since: str | None, limit: int | None, as_json: bool
) -> None:
    """``pisub list`` (see :func:`pisub.cli.runs.list_`)."""
    _no_cycle_collection()
    from pisub.api.client import list_runs
    from pisub.errors import InvalidInput
    from pisub.protocol.status import RunState

    try:
        wanted = RunState(state) if state else None
    except ValueError:
        raise InvalidInput(
            f"unknown state {state!r}; one of {', '.join(s.value for s in RunState)}"
        ) from None
    problems: list[str] = []
    window = None
    if since is not None:
        from pisub.api.admin import parse_age

        window = parse_age(since)
    statuses = list(
        list_runs(state=wanted, problems=problems, children=all_, agent=agent, since=window, limit=limit)
    )
    if as_json:
        json_lines(statuses)
    elif limit != 0:  # (`--limit 0` asks for none, as `head -n 0` does: not "no runs")
        out_painted(list_text(statuses, width=terminal_width(), colour=colour_wanted()))
    for problem in problems:
        err(f"pisub: unreadable run {problem}")


def _queue_line(handle: Any, st: Any, as_json: bool) -> None:
    """A queued run's place in its group's queue (``spec/queue.md``)."""
    if st.state != "queued" or as_json:
        return
    from pisub.api.groups import queue_place

    place = queue_place(handle)
    if place is not None:
        out(f"queue    position {place[0]} of {place[1]} waiting in group {st.group}")


def _mission_line(handle: Any, st: Any) -> None:
    """A workflow's mission, ``mission  <id> (<status>)``, and its launch's warning about it
    (``spec/protocol.md``, Workflow runs, Missions)."""
    from pisub.api.views import mission_of
    from pisub.cli.render import cell

    found = mission_of(handle, st)
    if found is not None:
        out(f"mission  {cell(found[0])} ({cell(found[1])})")
    spec = handle.manifest().workflow if st.runner == "workflow" else None
    if spec is not None and spec.mission_warning:
        out(f"note     {cell(spec.mission_warning)}")


def _resource_lines(handle: Any, st: Any) -> None:
    """A named workflow resource's provenance and its host steps (``spec/resources.md``)."""
    from pisub.cli.render import host_steps_text

    spec = handle.manifest().workflow
    if spec is not None and spec.resource is not None:
        origin = spec.resource
        where = f" {origin.path}" if origin.path else ""
        digest = f" sha256 {origin.sha256[:16]}" if origin.sha256 else ""
        out(f"resource {origin.name} ({origin.source}{where}{digest})")
    if st.host_steps:
        out_block(host_steps_text(st))
