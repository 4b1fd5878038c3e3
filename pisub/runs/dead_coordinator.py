"""How far a dead workflow coordinator got with a stop (or interrupt) of the whole workflow
that it had claimed but not yet answered (it answers once every running child was asked).

The copies it forwarded stay in its children's inboxes (claimed or not), each from ``source``
``workflow <id>``: the repair counts them, so the request's one receipt says what happened
("the coordinator died after forwarding the stop to 14 of its 16 running children") rather
than that nothing was consumed.
"""

from __future__ import annotations

from pisub.errors import PisubError
from pisub.protocol.control import Interrupt, Stop, owed, request_type
from pisub.protocol.status import Status, StepState
from pisub.store.mailbox import (
    claimed_key,
    new_key,
    parse_request_file,
    pending_files,
    read_receipt,
    run_owner,
)
from pisub.store.paths import RunPaths

ENDINGS = (Stop, Interrupt)
"""The requests a coordinator passes on to every running child before it answers them."""


def forwarded_reasons(paths: RunPaths, status: Status) -> dict[str, str]:
    """For each whole-workflow stop or interrupt claimed by the dead coordinator of ``paths``,
    the reason its failed receipt gives when copies of it reached children (request id →
    reason); empty for any other run, or when no copy was found. Never raises: a child that
    cannot be read counts as not reached."""
    if status.runner != "workflow":
        return {}
    try:
        claimed = _claimed_endings(paths)
    except (PisubError, OSError):
        return {}
    if not claimed:
        return {}
    source = f"workflow {status.run_id}"
    going = (StepState.RUNNING, StepState.PENDING)
    running = {s.run_id for s in status.steps if s.run_id and s.status in going}
    reached: dict[str, set[str]] = {type_: set() for type_ in claimed.values()}
    for run_id in sorted({s.run_id for s in status.steps if s.run_id}):
        try:
            for type_ in _copies(paths.home.run(run_id), source):
                if type_ in reached:
                    reached[type_].add(run_id)
        except (PisubError, OSError):
            continue
    reasons = {}
    for rid, type_ in claimed.items():
        got = reached[type_]
        if got:
            n, of = len(got), len(running | got)
            what = f"the coordinator died after forwarding the {type_}"
            reasons[rid] = f"{what} to {n} of its {of} running children"
    return reasons


def _claimed_endings(paths: RunPaths) -> dict[str, str]:
    """The whole-workflow stops and interrupts in the coordinator's ``inbox/cur`` still owed
    an answer (a claimed file stays there once answered): id → type."""
    owner = run_owner(paths)
    found = {}
    for name in pending_files(paths, "cur"):
        parsed = parse_request_file(paths.box("cur") / name, claimed_key(name), owner=owner)
        if not isinstance(parsed.request, ENDINGS) or parsed.request.child is not None:
            continue
        try:
            receipt = read_receipt(paths, parsed.request_id)
        except PisubError:
            receipt = None  # (the repair quarantines it and answers the request)
        if receipt is None or owed(receipt):
            found[parsed.request_id] = request_type(parsed.request)
    return found


def _copies(child: RunPaths, source: str) -> set[str]:
    """The types of the stops and interrupts from ``source`` in ``child``'s inbox."""
    owner = run_owner(child)
    types = set()
    for box, key in (("new", new_key), ("cur", claimed_key)):
        for name in pending_files(child, box):
            request = parse_request_file(child.box(box) / name, key(name), owner=owner).request
            if isinstance(request, ENDINGS) and request.source == source:
                types.add(request_type(request))
    return types
