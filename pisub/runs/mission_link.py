"""A workflow launch's mission (``spec/missions.md``): every workflow belongs to one — its
default enclosing mission, one given as ``mission={title|summary, ...}``, or an existing one
(``mission_id``) — unless ``mission=False``; the mission's ``state`` is the script's.

What is checked here is checked before anything is created; :func:`link` runs last, right
before the run is created, and attaches the run's id to the mission first: a launcher that dies
between the two leaves a mission listing a run that never appeared (shown as gone), never a
run whose mission does not know it. An explicit mission (``mission_id``, ``mission={...}``) is
strict: any failure to read, create or attach it fails the launch, and nothing starts. The
default mission is not: if it cannot be made, the workflow starts without one (and without
``state``), and the launch says why (``WorkflowSpec.mission_warning``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.mission import MissionInput, check_mission_id, check_session_key, parse_mission_input
from pisub.store.lineage import Lineage
from pisub.store.paths import Home

MAX_TITLE = 80
"""The longest title a launch makes for a default mission."""


@dataclass(frozen=True)
class MissionChoice:
    """What a launch asked for: ``none`` (``mission=False``), ``attach`` (``mission_id``),
    ``new`` (``mission={...}``) or ``default``."""

    kind: str
    mission_id: str | None = None
    given: MissionInput | None = None
    session_key: str | None = None


@dataclass
class Linked:
    """The mission a run belongs to (``mission_id`` None: none) and the launch's warning about
    it (a default mission that could not be made, a resumed run its mission refused)."""

    mission_id: str | None = None
    project: str | None = None
    warning: str | None = None


def choose(
    mission_id: str | None,
    mission: Any,
    session_key: str | None,
    state_ns: str | None,
) -> MissionChoice:
    """The launch's mission options, checked (nothing is read or written): ``mission`` by
    :func:`pisub.protocol.mission.parse_mission_input`, the seed's object (or False).

    Raises:
        InvalidInput: a bad value (naming the field path: ``mission.budget.tokens: ...``), or
            two options that contradict each other (naming both).
    """
    if mission_id is not None and mission is False:
        raise InvalidInput("--mission-id and --no-mission (mission false): give one")
    if mission_id is not None and mission is not None:
        raise InvalidInput(
            "--mission-id and --mission: give one (--mission-id attaches to an existing mission, "
            "--mission makes a new one)"
        )
    if session_key is not None:
        if mission is False:
            raise InvalidInput(
                "--session-key and --no-mission: give one (the key names a new mission's owner)"
            )
        if mission_id is not None:
            raise InvalidInput(
                "--session-key and --mission-id: give one (the key names a new mission's owner; "
                "an existing mission keeps its own)"
            )
        session_key = check_session_key(session_key, "--session-key")
    if mission_id is not None:
        if state_ns is not None:
            raise InvalidInput(
                "--mission-id and --state-ns: give one "
                "(the script's state is the mission's, or the namespace's)"
            )
        return MissionChoice("attach", mission_id=check_mission_id(mission_id, "--mission-id"))
    if mission is False:
        return MissionChoice("none")
    if mission is None:
        return MissionChoice("default", session_key=session_key)
    return MissionChoice("new", given=parse_mission_input(mission, "mission"), session_key=session_key)


def _head(text: str, limit: int = MAX_TITLE) -> str:
    """The first non-blank line of ``text``, one printable line, cut to ``limit`` characters."""
    from pisub.termsafe import printable

    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = printable(line, one_line=True)
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


_COMMENT = re.compile(r"^\s*(?://+|/\*+|\*+/?|#+|\"\"\"|''')\s*")
_COMMENT_END = re.compile(r"\s*(?:\*+/|\"\"\"|''')\s*$")


def default_title(label: str | None, what: str, text: str | None) -> str:
    """The title of a workflow's default mission: its label, else what it runs (``workflow
    review.js``, ``parallel: 3 tasks``) and the first line of its script (comment marks left
    out) or of its first task — redacted, one line, at most :data:`MAX_TITLE` characters."""
    from pisub.core.redact import redact

    if label is not None:
        return _head(label)
    line = ""
    for raw in (text or "").splitlines():
        if raw.startswith("#!"):  # a shebang says nothing
            continue
        stripped = _COMMENT_END.sub("", _COMMENT.sub("", raw)).strip()
        if stripped:
            line = stripped
            break
    title = f"{what}: {line}" if line else what
    return _head(redact(title)) or "workflow"


def link(
    home: Home,
    workdir: Path,
    choice: MissionChoice,
    run_id: str,
    lineage: Lineage,
    title: str,
) -> Linked:
    """The mission run ``run_id`` (a workflow about to be created) belongs to, with the run
    attached (``mode`` workflow). A workflow started inside a tree of runs (by a child) with no
    mission option of its own belongs to its root workflow's mission (if that has one: a
    ``mission=False`` tree stays without); children get no missions of their own.

    Raises:
        MissionNotFound: ``mission_id`` names no mission of this project.
        InvalidInput, StorageError: an explicit mission cannot be read, made or attached
            (a closed one, say); a default mission's trouble is only :attr:`Linked.warning`.
    """
    if choice.kind == "none":
        return Linked()
    from pisub.protocol.mission import MissionStatus
    from pisub.store.missions import MissionStore, project_key

    if choice.kind == "attach":
        assert choice.mission_id is not None
        project = project_key(workdir)
        store = MissionStore(home, project)
        store.get(choice.mission_id)  # MissionNotFound before anything else
        store.attach_run(choice.mission_id, run_id, "workflow")
        return Linked(mission_id=choice.mission_id, project=project)
    if choice.kind == "new":
        given = choice.given
        assert given is not None
        project = project_key(workdir)
        store = MissionStore(home, project)
        named = given.title if given.title is not None else given.summary  # a summary is its title
        assert named is not None
        try:
            made = store.create(
                title=named,
                cwd=workdir,
                objective=given.objective,
                goal=bool(given.goal),
                budget_tokens=given.budget.tokens if given.budget is not None else None,
                labels=given.labels or [],
                status=MissionStatus.ACTIVE,
                owner_session=choice.session_key,
            )
        except InvalidInput as exc:
            raise InvalidInput(f"mission: {exc.message}") from None
        store.attach_run(made.id, run_id, "workflow")
        return Linked(mission_id=made.id, project=project)
    if lineage.root_run_id is not None:
        return _inherited(home, lineage.root_run_id, run_id)
    try:
        project = project_key(workdir)
        store = MissionStore(home, project)
        made = store.create(
            title=title, cwd=workdir, status=MissionStatus.ACTIVE, owner_session=choice.session_key
        )
        store.attach_run(made.id, run_id, "workflow")
    except (PisubError, OSError) as exc:
        reason = exc.message if isinstance(exc, PisubError) else f"{type(exc).__name__}: {exc}"
        return Linked(
            warning=f"the workflow's default mission could not be made ({reason}); it runs without one"
        )
    return Linked(mission_id=made.id, project=project)


def _inherited(home: Home, root_run_id: str, run_id: str) -> Linked:
    """The mission of the root workflow ``root_run_id`` of this tree, with ``run_id`` attached
    (none if the root has none; a root that cannot be read or a mission that refuses the run
    is a warning)."""
    from pisub.store.runs import load_manifest

    try:
        root = load_manifest(home.run(root_run_id))
    except (PisubError, OSError):
        return Linked()
    spec = root.workflow
    if spec is None or spec.mission_id is None or spec.mission_project is None:
        return Linked()
    return attach_again(home, spec.mission_id, spec.mission_project, run_id)


def attach_again(home: Home, mission_id: str, project: str, run_id: str) -> Linked:
    """Attach ``run_id`` (a resumed workflow, or one started inside a tree) to a mission it
    belongs to already: the run keeps the mission and its state whatever happens; a mission
    that cannot take the run is a warning."""
    from pisub.store.missions import MissionStore

    try:
        MissionStore(home, project).attach_run(mission_id, run_id, "workflow")
    except (PisubError, OSError) as exc:
        reason = exc.message if isinstance(exc, PisubError) else f"{type(exc).__name__}: {exc}"
        return Linked(
            mission_id=mission_id,
            project=project,
            warning=(
                f"run {run_id} could not be listed in mission {mission_id} ({reason}); it keeps its state"
            ),
        )
    return Linked(mission_id=mission_id, project=project)
