"""``acceptance`` and ``gate`` as a call, an agent file or a workflow child gives them."""

from __future__ import annotations

from typing import Any

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.acceptance import Acceptance, AcceptanceSpec, Level, VerifyCommand
from pisub.protocol.codec import convert

GATE_ID = "gate"


def parse(acceptance: Any, gate: Any, where: str, *, resume: bool = False) -> Acceptance | None:
    """The explicit acceptance of a call (None: ``"auto"`` or nothing given).

    ``gate: "CMD"`` is ``{level: "verified", verify: [{id: "gate", command: CMD}]}``.

    ``false`` (the seed's obsolete shorthand) turns the gates off: level ``none``, nothing
    added (with ``gate``: omitted). An object without ``level`` (or ``level: "auto"``) takes the
    level ``auto`` gives the agent (:func:`resolve_level`).

    Raises:
        InvalidInput: naming ``where`` and the field — a bare ``"none"``, ``true``,
            ``"reviewed"`` as a level, ``gate`` with ``acceptance`` (other than ``false``),
            ``gate`` on a resume, or any bad field.
    """
    from pisub.acceptance.report import clean_texts

    clean_texts(gate, f"{where}.gate")
    clean_texts(acceptance, f"{where}.acceptance")
    if gate is not None:
        if acceptance is not None and acceptance is not False and acceptance != "auto":
            raise InvalidInput(f"{where}: give gate or acceptance, not both")
        if resume:
            raise InvalidInput(f"{where}: gate does not apply to a resume (its work was accepted before)")
        if not isinstance(gate, str) or not gate.strip():
            raise InvalidInput(f'{where}.gate: give the command that must pass, e.g. "pytest -q"')
        try:
            command = convert({"id": GATE_ID, "command": gate}, VerifyCommand, f"{where}.gate")
        except PisubError as exc:
            raise InvalidInput(exc.message) from None
        _check_split(command, f"{where}.gate")
        return Acceptance(spec=AcceptanceSpec(level=Level.VERIFIED, verify=[command]), explicit=True)
    if acceptance is False:  # the seed: the obsolete shorthand that turns the gates off
        return Acceptance(spec=AcceptanceSpec(level=Level.NONE, reason=OFF_REASON), explicit=True)
    if acceptance is None or acceptance == "auto":
        return None
    if acceptance is True or acceptance == "none":
        raise InvalidInput(
            f'{where}.acceptance: give "auto", false or an object {{level?, ...}} '
            "(level none, attested, checked, verified), not a bare " + repr(acceptance)
        )
    if not isinstance(acceptance, dict):
        raise InvalidInput(f'{where}.acceptance: give "auto", false or an object {{level?, verify?, ...}}')
    if acceptance.get("level") == "reviewed":
        raise InvalidInput(
            f'{where}.acceptance.level: "reviewed" is an outcome, not a level; ask for it with '
            "review: {required: true}"
        )
    auto = acceptance.get("level", "auto") == "auto"
    if auto:  # the level "auto" gives, decided with the agent (resolve_level)
        acceptance = {**acceptance, "level": Level.NONE.value}
    try:
        spec = convert(acceptance, AcceptanceSpec, f"{where}.acceptance")
    except PisubError as exc:
        raise InvalidInput(exc.message) from None
    for index, command in enumerate(spec.verify or []):
        _check_split(command, f"{where}.acceptance.verify[{index}]")
    ids = [v.id for v in spec.verify or []]
    if len(ids) != len(set(ids)):
        raise InvalidInput(f"{where}.acceptance.verify: ids must be unique")
    if not auto:
        check_level(spec, where)
    return Acceptance(spec=spec, explicit=True, auto_level=auto or None)


OFF_REASON = "acceptance: false (no gates)"


def resolve_level(accepted: Acceptance | None, level: Level, where: str) -> None:
    """An explicit acceptance that left its level to ``auto`` (``{review: {required: true}}``,
    the short form) takes ``level``, the one the inference gives the agent where it runs.

    Raises:
        InvalidInput: the level contradicts the rest (:func:`check_level`).
    """
    if accepted is None or not accepted.auto_level:
        return
    accepted.auto_level = None
    accepted.spec.level = Level.VERIFIED if accepted.spec.verify else level
    check_level(accepted.spec, where)


def check_level(spec: AcceptanceSpec, where: str) -> None:
    """Raises: InvalidInput: ``report`` or ``verify`` contradicts the level."""
    if spec.report == "off" and spec.level in (Level.ATTESTED, Level.CHECKED):
        raise InvalidInput(
            f"{where}.acceptance.report: off contradicts level {spec.level.value}, which is the "
            "child's report (use level none, or verified with its commands)"
        )
    if spec.report == "on" and spec.level is Level.NONE:
        raise InvalidInput(
            f"{where}.acceptance.report: on needs a level that reads the report (attested, checked, verified)"
        )
    if spec.level is Level.VERIFIED and not spec.verify:
        raise InvalidInput(f"{where}.acceptance.verify: level verified needs at least one command")


def _check_split(command: VerifyCommand, where: str) -> None:
    """The command splits like a shell line into a program and its arguments.

    Raises:
        InvalidInput: unbalanced quotes, or nothing to run.
    """
    import shlex

    try:
        argv = shlex.split(command.command)
    except ValueError as exc:
        raise InvalidInput(f"{where}: the command does not split like a shell line ({exc})") from None
    if not argv:
        raise InvalidInput(f"{where}: the command is empty")
