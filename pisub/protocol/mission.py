"""Mission records (``spec/missions.md``): a goal, its runs, decisions and state across
workflows.

``<home>/missions/<project key>/<id>.json`` is a :class:`Mission`; what callers give is strict
(:class:`MissionInput`, the seed's ``mission`` object; :class:`MissionUpdate`, the seed's
``missionUpdate``), every error naming the field's path."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any

import msgspec

from pisub.errors import InvalidInput
from pisub.protocol.codec import Record, StrictRecord
from pisub.protocol.json_words import duplicate_key, problem

MISSION_ID_RE = re.compile(r"[0-9a-f]{12}")
"""A mission id: 12 lower-case hex digits (48 random bits), also its file's name."""
PROJECT_KEY_RE = re.compile(r"[0-9a-f]{20}")
"""A project key: 20 hex digits of a sha256 (:func:`pisub.store.missions.project_key`)."""
DECISION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A decision id (given, or ``d1``, ``d2``, ... when not)."""
SESSION_KEY_RE = re.compile(r"[0-9a-f]{32}")
"""A pi session key (the pi extension's ``sessionKey``)."""

MAX_TITLE = 200
MAX_OBJECTIVE = 4000
MAX_LABELS = 20
MAX_DECISIONS = 100
MAX_ARTIFACTS = 200
MAX_RECEIPTS = 100
MAX_RUNS = 500
MAX_CHILDREN = 500
MAX_PATH = 4096
MAX_URL = 2048
MAX_SHORT = 80
MAX_TEXT = 2000
MAX_BUDGET_TOKENS = 10**12
MAX_UPDATE_BYTES = 4 * 1024 * 1024
"""Longest ``missionUpdate`` text read (``--set``, stdin): more than any valid update."""


class MissionStatus(enum.StrEnum):
    """The seed's mission states."""

    PLANNED = "planned"
    ACTIVE = "active"
    WAITING = "waiting"
    NEEDS_DECISION = "needs_decision"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (MissionStatus.COMPLETED, MissionStatus.FAILED, MissionStatus.CANCELLED)


class DecisionStatus(enum.StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


class ReceiptKind(enum.StrEnum):
    PULL_REQUEST = "pull_request"
    CI = "ci"
    DEPLOYMENT = "deployment"
    RELEASE = "release"


class RunMode(enum.StrEnum):
    """How a linked run was started: a workflow (``pisub run --workflow``, ``--workflow-script``,
    parallel, chain, lanes) or one agent's run."""

    WORKFLOW = "workflow"
    RUN = "run"


class MissionBudget(Record, kw_only=True):
    tokens: int


class MissionUsage(Record, kw_only=True):
    """The sum of the linked runs' real usage (their results; a live workflow's ended children)."""

    tokens: int = 0
    cost_usd: float = 0.0
    turns: int = 0


class MissionRun(Record, kw_only=True):
    """One linked run, as last observed."""

    run_id: str
    mode: RunMode
    status: str
    """The run's state (``starting``, ``queued``, ``running``, ``complete``, ``failed``,
    ``stopped``, ``paused``), or ``missing`` once its directory is gone (``pisub gc``)."""
    usage: MissionUsage = msgspec.field(default_factory=MissionUsage)
    attached_at: str | None = None
    ended_at: str | None = None


class WorkflowChild(Record, kw_only=True):
    """One child of a linked workflow run (its ``status.json`` ``steps``)."""

    workflow_run_id: str
    key: str | None = None
    status: str
    run_id: str | None = None
    agent: str | None = None


class Decision(Record, kw_only=True):
    id: str
    status: DecisionStatus
    title: str
    resolution: str | None = None
    created_at: str | None = None
    resolved_at: str | None = None


class Artifact(Record, kw_only=True):
    kind: str
    path: str


class MissionReceipt(Record, kw_only=True):
    kind: ReceiptKind
    status: str
    url: str


class NoticeMark(Record, kw_only=True):
    """What the last goal continuation notice of the mission was, and the progress it saw: no
    second notice is given until the progress differs (``spec/missions.md`` "Goal missions")."""

    at: str
    text: str
    reason: str
    progress: str


class Mission(Record, kw_only=True):
    """``<home>/missions/<project key>/<id>.json``."""

    v: int = 1
    id: str
    title: str
    objective: str | None = None
    status: MissionStatus = MissionStatus.PLANNED
    goal: bool = False
    budget: MissionBudget | None = None
    usage: MissionUsage = msgspec.field(default_factory=MissionUsage)
    labels: list[str] = []
    runs: list[MissionRun] = []
    workflow_children: list[WorkflowChild] = []
    decisions: list[Decision] = []
    artifacts: list[Artifact] = []
    receipts: list[MissionReceipt] = []
    created_at: str
    updated_at: str
    owner_session: str | None = None
    project: str
    cwd: str
    closed: bool = False
    """Closed explicitly (``close``, or ``update`` to a final status): its runs no longer move it."""
    summary: str | None = None
    """The closing summary."""
    revision: int = 0
    """Incremented by every change a person or tool makes (create, update, decisions,
    attach-run, close) — not by a refresh of the runs or a notice."""
    last_notice: NoticeMark | None = None


class MissionProject(Record, kw_only=True):
    """``<home>/missions/<project key>/project.json``: whose store it is."""

    v: int = 1
    key: str
    root: str
    """The project's directory: the repository's (its common dir's parent for ``.git``) or the
    directory missions were first made in."""
    created_at: str


# ---- input from outside (strict) ---------------------------------------------------------


class BudgetInput(StrictRecord, kw_only=True):
    tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_BUDGET_TOKENS)]


class MissionInput(StrictRecord, kw_only=True, omit_defaults=True):
    """The seed's ``mission`` object: ``{title | summary, objective?, goal?, budget?, labels?}``
    (exactly one non-empty title or summary; ``goal`` only ``true``, and it needs
    ``budget.tokens``)."""

    title: str | None = None
    summary: str | None = None
    objective: str | None = None
    goal: bool | None = None
    budget: BudgetInput | None = None
    labels: list[str] | None = None


class DecisionInput(StrictRecord, kw_only=True, omit_defaults=True):
    """A decision to add (no ``id``, or a new one) or change (an existing ``id``)."""

    id: str | None = None
    title: str | None = None
    status: DecisionStatus | None = None
    resolution: str | None = None


class ArtifactInput(StrictRecord, kw_only=True):
    kind: str
    path: str


class ReceiptInput(StrictRecord, kw_only=True):
    kind: ReceiptKind
    status: str
    url: str


class MissionUpdate(StrictRecord, kw_only=True, omit_defaults=True):
    """The seed's ``missionUpdate``: ``title`` and ``objective`` replace, ``labels`` replaces the
    list, ``status`` sets it (a final one closes the mission; ``needs_decision`` is never set,
    it follows the open decisions), ``decisions`` add or change decisions by id, ``artifacts``
    and ``receipts`` are added (a receipt of the same kind and url is replaced)."""

    title: str | None = None
    objective: str | None = None
    status: MissionStatus | None = None
    labels: list[str] | None = None
    budget: BudgetInput | None = None
    decisions: list[DecisionInput] | None = None
    artifacts: list[ArtifactInput] | None = None
    receipts: list[ReceiptInput] | None = None


def _decode_input(value: Any, type_: type[Any], what: str) -> Any:
    """``value`` (JSON text or parsed data) as ``type_``, strictly; InvalidInput naming ``what``
    and the path inside it."""
    try:
        if isinstance(value, str | bytes):
            decoded = msgspec.json.decode(value, type=type_, strict=True)
            twice = duplicate_key(value)
            if twice is not None:
                raise InvalidInput(f"{what}: {twice}")
            return decoded
        return msgspec.convert(value, type=type_, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidInput(_path_in(exc, what)) from None
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"{what}: not valid JSON ({problem(value, exc)})") from None
    except RecursionError:
        raise InvalidInput(f"{what}: nested too deeply") from None


def _path_in(exc: msgspec.ValidationError, what: str) -> str:
    """msgspec's ``... - at `$.a[0].b``` as ``what.a[0].b: ...``."""
    text = str(exc)
    head, sep, at = text.rpartition(" - at `$")
    if sep:
        return f"{what}{at.rstrip('`')}: {head}"
    return f"{what}: {text}"


def check_one_line(value: Any, where: str, limit: int, *, empty: bool = False, visible: bool = True) -> str:
    """``value`` when it is text of one line of printable characters, at most ``limit`` long;
    with ``visible`` (titles, labels) also no invisible character (a zero-width space, a BOM,
    a space other than U+0020) and at least one character that shows — the rule run labels
    follow.

    Raises:
        InvalidInput: naming ``where``."""
    from pisub.termsafe import invisible_char, printable, shows_nothing

    if not isinstance(value, str):
        raise InvalidInput(f"{where}: must be text, not {type(value).__name__}")
    if not empty and not value.strip():
        raise InvalidInput(f"{where}: is empty")
    if len(value) > limit:
        raise InvalidInput(f"{where}: is {len(value)} characters long; at most {limit}")
    if printable(value, one_line=True) != value:
        raise InvalidInput(f"{where}: holds a control character or line break (give one line)")
    if visible:
        char = invisible_char(value)
        if char is not None:
            raise InvalidInput(
                f"{where}: holds an invisible character (U+{ord(char):04X}); type it with visible ones"
            )
        if value and shows_nothing(value):
            raise InvalidInput(f"{where}: shows nothing (only spaces, combining or private-use characters)")
    return value


def check_text(value: Any, where: str, limit: int) -> str:
    """Text of several lines (an objective, a resolution): no control character but newlines
    and tabs, at most ``limit`` long.

    Raises:
        InvalidInput: naming ``where``."""
    from pisub.termsafe import printable

    if not isinstance(value, str):
        raise InvalidInput(f"{where}: must be text, not {type(value).__name__}")
    if len(value) > limit:
        raise InvalidInput(f"{where}: is {len(value)} characters long; at most {limit}")
    if printable(value) != value:
        raise InvalidInput(f"{where}: holds a control character (only newlines and tabs may be in it)")
    return value


def check_labels(labels: Any, where: str) -> list[str]:
    if not isinstance(labels, list | tuple):
        raise InvalidInput(f"{where}: must be a list of text")
    if len(labels) > MAX_LABELS:
        raise InvalidInput(f"{where}: {len(labels)} labels; at most {MAX_LABELS}")
    seen: list[str] = []
    for n, label in enumerate(labels):
        check_one_line(label, f"{where}[{n}]", MAX_SHORT)
        if label != label.strip():
            raise InvalidInput(f"{where}[{n}]: starts or ends with a space")
        if label not in seen:
            seen.append(label)
    return seen


def check_mission_id(value: Any, where: str = "mission id") -> str:
    """``value`` when it is a mission id (:data:`MISSION_ID_RE`).

    Raises:
        InvalidInput: naming ``where``."""
    if not isinstance(value, str) or not MISSION_ID_RE.fullmatch(value):
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise InvalidInput(f"{where}: {shown!r} is not a mission id (12 hex digits: pisub mission list)")
    return value


def check_session_key(value: Any, where: str = "session key") -> str:
    if not isinstance(value, str) or not SESSION_KEY_RE.fullmatch(value):
        # (worded so that no "key: value" shape is there for the redactor to mask)
        raise InvalidInput(f"{where} is not a pi session's key (give 32 lower-case hex digits)")
    return value


def check_decision_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not DECISION_ID_RE.fullmatch(value):
        raise InvalidInput(f"{where}: must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return value


def parse_mission_input(value: Any, what: str = "mission") -> MissionInput:
    """The seed's ``mission`` object, checked.

    Raises:
        InvalidInput: naming the field's path."""
    given: MissionInput = _decode_input(value, MissionInput, what)
    names = [n for n in ("title", "summary") if getattr(given, n) is not None]
    if len(names) != 1:
        raise InvalidInput(f"{what}: give exactly one of title and summary (got {len(names)})")
    check_one_line(getattr(given, names[0]), f"{what}.{names[0]}", MAX_TITLE)
    if given.objective is not None:
        check_text(given.objective, f"{what}.objective", MAX_OBJECTIVE)
    if given.goal is False:
        raise InvalidInput(f"{what}.goal: may only be true (leave it out for an ordinary mission)")
    if given.goal and given.budget is None:
        raise InvalidInput(f"{what}.budget.tokens: a goal mission needs a token budget")
    if given.labels is not None:
        given.labels = check_labels(given.labels, f"{what}.labels")
    return given


def parse_mission_update(value: Any, what: str = "missionUpdate") -> MissionUpdate:
    """The seed's ``missionUpdate`` object, checked (see :class:`MissionUpdate`).

    Raises:
        InvalidInput: naming the field's path."""
    if isinstance(value, str | bytes):
        size = len(value.encode() if isinstance(value, str) else value)
        if size > MAX_UPDATE_BYTES:
            raise InvalidInput(f"{what}: more than {MAX_UPDATE_BYTES} bytes (give a smaller update)")
    update: MissionUpdate = _decode_input(value, MissionUpdate, what)
    if update.title is not None:
        check_one_line(update.title, f"{what}.title", MAX_TITLE)
    if update.objective is not None:
        check_text(update.objective, f"{what}.objective", MAX_OBJECTIVE)
    if update.status == MissionStatus.NEEDS_DECISION:
        raise InvalidInput(
            f"{what}.status: needs_decision follows the open decisions; add one under decisions instead"
        )
    if update.labels is not None:
        update.labels = check_labels(update.labels, f"{what}.labels")
    for n, d in enumerate(update.decisions or []):
        where = f"{what}.decisions[{n}]"
        if d.id is not None:
            check_decision_id(d.id, f"{where}.id")
        if d.title is not None:
            check_one_line(d.title, f"{where}.title", MAX_TITLE)
        if d.resolution is not None:
            check_text(d.resolution, f"{where}.resolution", MAX_TEXT)
    if len(update.decisions or []) > MAX_DECISIONS:
        raise InvalidInput(f"{what}.decisions: at most {MAX_DECISIONS}")
    for n, a in enumerate(update.artifacts or []):
        check_one_line(a.kind, f"{what}.artifacts[{n}].kind", MAX_SHORT)
        check_one_line(a.path, f"{what}.artifacts[{n}].path", MAX_PATH, visible=False)
    if len(update.artifacts or []) > MAX_ARTIFACTS:
        raise InvalidInput(f"{what}.artifacts: at most {MAX_ARTIFACTS}")
    for n, r in enumerate(update.receipts or []):
        check_one_line(r.status, f"{what}.receipts[{n}].status", MAX_SHORT)
        check_url(r.url, f"{what}.receipts[{n}].url")
    if len(update.receipts or []) > MAX_RECEIPTS:
        raise InvalidInput(f"{what}.receipts: at most {MAX_RECEIPTS}")
    return update


def check_url(value: str, where: str) -> str:
    check_one_line(value, where, MAX_URL)
    if not re.fullmatch(r"https?://[^\s]+", value):
        raise InvalidInput(f"{where}: must be an http:// or https:// address without spaces")
    return value
