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
from pisub.store.lineage import Lineage
from pisub.store.paths import Home

MISSION_FIELDS = ("title", "summary", "objective", "goal", "budget", "labels")
"""The fields of ``mission={...}`` (the seed's ``{title | summary, objective?, goal?, budget?,
labels?}``)."""

MAX_TITLE = 80
"""The longest title a launch makes (a default one, or one cut from a ``summary``)."""

GIVE_OBJECT = "give an object {title|summary, objective?, goal?, budget?, labels?} or false"
MAX_LABELS = 32
MAX_BUDGET_TOKENS = 10**12
SESSION_KEY_RE = re.compile(r"[0-9a-f]{32}")
MISSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a mission id may look like (checked before any file is opened with it)."""


@dataclass(frozen=True)
class MissionInput:
    """``mission={...}``, checked."""

    title: str
    objective: str | None = None
    goal: bool = False
    budget_tokens: int | None = None
    labels: tuple[str, ...] = ()


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
    """The mission a run belongs to (``mission_id`` None: none) and why not, when the default
    one could not be made."""

    mission_id: str | None = None
    project: str | None = None
    warning: str | None = None


def choose(
    mission_id: str | None,
    mission: Any,
    session_key: str | None,
    state_ns: str | None,
) -> MissionChoice:
    """The launch's mission options, checked (nothing is read or written).

    Raises:
        InvalidInput: a bad value (naming the field path: ``mission.budget.tokens: ...``), or
            two options that contradict each other (naming both).
    """
    if mission is True:
        raise InvalidInput(f"mission: {GIVE_OBJECT}")
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
        session_key = check_session_key(session_key)
    if mission_id is not None:
        if state_ns is not None:
            raise InvalidInput(
                "--mission-id and --state-ns: give one "
                "(the script's state is the mission's, or the namespace's)"
            )
        return MissionChoice("attach", mission_id=check_mission_id(mission_id))
    if mission is False:
        return MissionChoice("none")
    if mission is None:
        return MissionChoice("default", session_key=session_key)
    return MissionChoice("new", given=check_mission(mission), session_key=session_key)


def check_session_key(key: object, where: str = "--session-key") -> str:
    """A pi session's key (32 lowercase hexadecimal digits, the pi extension's ``sessionKey``).

    Raises:
        InvalidInput: naming ``where``.
    """
    if not isinstance(key, str) or not SESSION_KEY_RE.fullmatch(key):
        shown = repr(key)[:60]
        raise InvalidInput(f"{where}: {shown} is not a session key (32 lowercase hexadecimal digits)")
    return key


def check_mission_id(mission_id: object, where: str = "--mission-id") -> str:
    """A mission id as given.

    Raises:
        InvalidInput: naming ``where``.
    """
    if not isinstance(mission_id, str) or not MISSION_ID_RE.fullmatch(mission_id):
        shown = repr(mission_id)[:60]
        raise InvalidInput(f"{where}: {shown} is not a mission id (see pisub mission list)")
    return mission_id


def check_mission(value: Any, where: str = "mission") -> MissionInput:
    """``mission={title | summary, objective?, goal?, budget?{tokens}, labels?}``, strictly:
    unknown fields, wrong types, both or neither of title and summary, ``goal`` other than
    true, a goal without ``budget.tokens`` are refused.

    Raises:
        InvalidInput: naming the field path (``mission.labels[2]: ...``).
    """
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: {GIVE_OBJECT}, not {_kind(value)}")
    for key in value:
        if key not in MISSION_FIELDS:
            raise InvalidInput(
                f"{where}.{str(key)[:40]}: unknown field; the fields are {', '.join(MISSION_FIELDS)}"
            )
    title, summary = value.get("title"), value.get("summary")
    if title is not None and summary is not None:
        raise InvalidInput(f"{where}: give title or summary, not both")
    if title is None and summary is None:
        raise InvalidInput(f"{where}: give a non-empty title or summary")
    objective = None
    if "objective" in value:
        objective = _text(value["objective"], f"{where}.objective")
    if title is not None:
        shown = _text(title, f"{where}.title")
        if "\n" in shown or "\r" in shown:
            raise InvalidInput(f"{where}.title: give one line (a longer text is a summary)")
    else:
        text = _text(summary, f"{where}.summary")
        shown = _head(text)
        if objective is None and text.strip() != shown:
            objective = text.strip()  # the whole summary is kept: the title is its first line
    goal = False
    if "goal" in value:
        if value["goal"] is not True:
            raise InvalidInput(
                f"{where}.goal: only true (a goal mission, with budget.tokens); leave it out otherwise, "
                f"not {_kind(value['goal'])}"
            )
        goal = True
    tokens = None
    if "budget" in value:
        tokens = _budget(value["budget"], f"{where}.budget")
    if goal and tokens is None:
        raise InvalidInput(
            f"{where}.budget.tokens: a goal mission needs a token budget (budget: {{tokens: N}})"
        )
    labels: tuple[str, ...] = ()
    if "labels" in value:
        labels = _labels(value["labels"], f"{where}.labels")
    return MissionInput(title=shown, objective=objective, goal=goal, budget_tokens=tokens, labels=labels)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return {str: "text", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: must be text, not {_kind(value)}")
    if not value.strip():
        raise InvalidInput(f"{where}: is empty")
    from pisub.termsafe import printable

    if printable(value) != value.replace("\r\n", "\n"):
        raise InvalidInput(f"{where}: holds a control character: {printable(value, one_line=True)[:80]}")
    return value.strip()


def _budget(value: Any, where: str) -> int:
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: give an object {{tokens: N}}, not {_kind(value)}")
    for key in value:
        if key != "tokens":
            raise InvalidInput(f"{where}.{str(key)[:40]}: unknown field; the field is tokens")
    tokens = value.get("tokens")
    if tokens is None:
        raise InvalidInput(f"{where}.tokens: required (a whole number of tokens)")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_BUDGET_TOKENS:
        raise InvalidInput(
            f"{where}.tokens: must be a whole number from 1 to {MAX_BUDGET_TOKENS}, not {str(tokens)[:40]}"
        )
    return tokens


def _labels(value: Any, where: str) -> tuple[str, ...]:
    from pisub.store.paths import check_label

    if not isinstance(value, list):
        raise InvalidInput(f"{where}: give a list of labels, not {_kind(value)}")
    if len(value) > MAX_LABELS:
        raise InvalidInput(f"{where}: {len(value)} labels; at most {MAX_LABELS}")
    labels = tuple(check_label(item, f"{where}[{i}]") for i, item in enumerate(value))
    return tuple(dict.fromkeys(labels))


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
        try:
            made = store.create(
                title=given.title,
                cwd=workdir,
                objective=given.objective,
                goal=given.goal,
                budget_tokens=given.budget_tokens,
                labels=list(given.labels),
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
