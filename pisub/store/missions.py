"""Mission stores: ``<home>/missions/<project key>/`` per repository (``spec/missions.md``).

One directory per project (:func:`project_key`: the git common dir, so a worktree or a
subdirectory finds the same store; else the directory itself), holding ``project.json`` (the
project's root, for ``list --scope global``), one ``<id>.json`` per mission, its lock
``<id>.lock`` (never replaced: every read-modify-write of the record holds it) and its shared
``state`` in ``state/<id>.json`` (a :class:`StateNamespace`: locked on every call, never stale,
256 KiB). Records are replaced atomically, files 0600, directories 0700. The 200 newest
finished missions of a project are kept; older ones are removed.

Anything else in a store (a symlink, FIFO or directory in a record's place, a record too large,
not ours or not decodable, a name that is not UTF-8) is skipped with a reason, never followed."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from pisub.core import fsio
from pisub.core.fsio import atomic_write, file_kind, load_json, open_dir, private_mkdir
from pisub.core.locks import exclusive
from pisub.errors import (
    InvalidInput,
    MissionNotFound,
    PisubError,
    ProtocolError,
    storage_error,
)
from pisub.protocol.codec import encode_pretty, now_iso
from pisub.protocol.mission import (
    MAX_ARTIFACTS,
    MAX_BUDGET_TOKENS,
    MAX_DECISIONS,
    MAX_OBJECTIVE,
    MAX_RECEIPTS,
    MAX_RUNS,
    MAX_TEXT,
    MAX_TITLE,
    MISSION_ID_RE,
    PROJECT_KEY_RE,
    Artifact,
    Decision,
    DecisionStatus,
    Mission,
    MissionBudget,
    MissionProject,
    MissionReceipt,
    MissionRun,
    MissionStatus,
    MissionUpdate,
    MissionUsage,
    RunMode,
    WorkflowChild,
    check_decision_id,
    check_labels,
    check_mission_id,
    check_one_line,
    check_session_key,
    check_text,
)
from pisub.store.paths import Home, is_run_id
from pisub.store.shared_state import StateNamespace

MAX_RECORD_BYTES = 4 * 1024 * 1024
"""Largest mission record read (a bigger file is quarantined). pisub never writes one this big:
what a person adds is capped at :data:`MAX_OWN_BYTES`, and the runs and workflow children (each
at most 500, their texts cut) cannot make up the rest."""
MAX_OWN_BYTES = 512 * 1024
"""Largest record a change by a person or a tool may make, without its runs, workflow children
and last notice (the parts a refresh writes): an update that would grow it past this is refused
(``INVALID_INPUT``)."""
MAX_CHILD_TEXT = 200
"""A workflow child's key, agent and status are cut to this many characters."""
QUARANTINE = ".quarantine"
"""Where a record too large to read is moved (with a ``.reason`` file beside it)."""
KEEP_FINISHED = 200
"""Finished (completed, failed, cancelled) missions kept per project; older ones are removed."""
LOCK_TIMEOUT = 30.0
"""How long a writer waits for a mission's lock (a refresh holds it while it reads the runs)."""
PROJECT_FILE = "project.json"
STATE_DIR = "state"
GIT_TIMEOUT = 10.0


ProjectInfo = MissionProject


def _git_common_dir(cwd: Path) -> Path | None:
    """The realpath of ``cwd``'s git common dir (``git rev-parse --git-common-dir``, argv, no
    shell, no ``GIT_*`` variable of the caller's), else of the one found by walking up for
    ``.git``; None outside a repository, and when the common dir found is not a git directory
    of this user's (:func:`_trusted_git_dir`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--git-common-dir"],
            cwd=cwd,
            capture_output=True,
            timeout=GIT_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except (OSError, subprocess.SubprocessError):
        found = _walk_for_git(cwd)
    else:
        out = os.fsdecode(proc.stdout.rstrip(b"\n"))
        if proc.returncode != 0 or not out:
            found = _walk_for_git(cwd)  # (not a repository; or one git refuses: "dubious ownership")
        else:
            found = Path(os.path.realpath(os.path.join(cwd, out)))
    return found if found is not None and _trusted_git_dir(found) else None


def _trusted_git_dir(path: Path) -> bool:
    """Whether ``path`` (a realpath) can key a project: a directory of this user's that is a git
    directory (``HEAD``, ``objects/`` and ``refs/`` in it). A ``.git`` file or ``commondir``
    naming ``/``, ``/etc`` or another user's folder is not followed: the directory keys itself."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        return (
            stat.S_ISREG(os.lstat(path / "HEAD").st_mode)
            and stat.S_ISDIR(os.lstat(path / "objects").st_mode)
            and stat.S_ISDIR(os.lstat(path / "refs").st_mode)
        )
    except OSError:
        return False


def _walk_for_git(cwd: Path) -> Path | None:
    """What git would say, without git: the first ``.git`` up from ``cwd`` — a directory (its
    ``commondir`` file, when a worktree's) or a ``gitdir: X`` file (a linked worktree: X's
    ``commondir``)."""
    here = Path(os.path.realpath(cwd))
    for folder in (here, *here.parents):
        dot = folder / ".git"
        try:
            st = os.stat(dot)
        except OSError:
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                gitdir = dot
            else:
                text = _small_text(dot)
                if text is None or not text.startswith("gitdir:"):
                    return None
                gitdir = Path(os.path.join(folder, text[len("gitdir:") :].strip()))
            common = _small_text(gitdir / "commondir")
            if common is not None:
                return Path(os.path.realpath(os.path.join(gitdir, common)))
        except OSError:
            return None
        return Path(os.path.realpath(gitdir))
    return None


def _small_text(path: Path) -> str | None:
    """The stripped text of a small regular file (``.git``, ``commondir``: 4 KiB at most, never
    read through a FIFO), else None."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as fh:
            return fh.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None


def project_of(cwd: Path) -> tuple[str, str]:
    """``(key, root)`` of ``cwd``'s project (see :func:`project_key`)."""
    real = Path(os.path.realpath(cwd))
    common = _git_common_dir(real)
    if common is None:
        return _key(str(real)), str(real)
    root = common.parent if common.name == ".git" else common
    return _key(str(common)), str(root)


def _key(path: str) -> str:
    return hashlib.sha256(os.fsencode(path)).hexdigest()[:20]


def project_key(cwd: Path) -> str:
    """The key of ``cwd``'s project: 20 hex digits of the sha256 of the realpath of its git
    common dir (so a worktree or a subdirectory finds the same store), else of ``cwd``'s
    realpath."""
    return project_of(cwd)[0]


def check_project_key(key: str) -> str:
    if not isinstance(key, str) or not PROJECT_KEY_RE.fullmatch(key):
        raise InvalidInput(f"{key!r:.40} is not a project key (20 hex digits)")
    return key


@dataclass
class RunSeen:
    """What a refresh saw of one linked run (the API reads it the way ``pisub status`` does)."""

    status: str
    ended_at: str | None = None
    usage: MissionUsage | None = None
    """None: unchanged (a run that ended and was summed before)."""
    children: list[WorkflowChild] | None = None
    """A workflow's children (None: not a workflow, or unknown)."""


@dataclass
class Listing:
    missions: list[Mission] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """One line per entry skipped, with the reason."""


TERMINAL_RUN = frozenset({"complete", "failed", "stopped", "paused", "missing"})
_RUN_END = {
    "complete": MissionStatus.COMPLETED,
    "failed": MissionStatus.FAILED,
    "stopped": MissionStatus.CANCELLED,
    "paused": MissionStatus.WAITING,
}
"""How a mission follows its last run's end (a workflow interrupted or paused waits)."""


def settle(mission: Mission, runs_changed: bool) -> None:
    """The mission's status after a change (``spec/missions.md`` "States"): an explicit close
    wins; an open decision gates it (``needs_decision``); resolving the last returns it to
    ``active``; when its runs changed, a live run makes it ``active``, and once every run has
    ended a goal mission stays ``active`` while another follows its last run's end."""
    if mission.closed:
        return
    if any(d.status == DecisionStatus.OPEN for d in mission.decisions):
        mission.status = MissionStatus.NEEDS_DECISION
        return
    if mission.status == MissionStatus.NEEDS_DECISION:
        mission.status = MissionStatus.ACTIVE
    if not runs_changed or not mission.runs:
        return
    if any(r.status not in TERMINAL_RUN for r in mission.runs) or mission.goal:
        mission.status = MissionStatus.ACTIVE
        return
    for run in reversed(mission.runs):
        if run.status in _RUN_END:
            mission.status = _RUN_END[run.status]
            return


def sum_usage(runs: Sequence[MissionRun]) -> MissionUsage:
    """The runs' usage summed; a negative count (a broken result) counts 0, never against the
    others."""
    return MissionUsage(
        tokens=sum(max(0, r.usage.tokens) for r in runs),
        cost_usd=round(sum(max(0.0, r.usage.cost_usd) for r in runs), 6),
        turns=sum(max(0, r.usage.turns) for r in runs),
    )


def own_bytes(mission: Mission) -> int:
    """The size of ``mission``'s record without what a refresh writes (runs, workflow children,
    the last notice): what :data:`MAX_OWN_BYTES` bounds."""
    own = msgspec.structs.replace(mission, runs=[], workflow_children=[], last_notice=None)
    return len(encode_pretty(own))


class MissionStore:
    """One project's missions; every write under the mission's lock, atomic, 0600."""

    def __init__(self, home: Home, project: str) -> None:
        self.home = home
        self.project = check_project_key(project)
        self.dir = home.missions / project

    # ---- files -------------------------------------------------------------------------

    def record(self, mission_id: str) -> Path:
        return self.dir / f"{check_mission_id(mission_id)}.json"

    def lock(self, mission_id: str) -> Path:
        return self.dir / f"{check_mission_id(mission_id)}.lock"

    def _ensure(self) -> None:
        for folder in (self.home.missions, self.dir):
            try:
                private_mkdir(folder)
            except OSError as exc:
                raise storage_error(exc, "create", folder) from exc
        self.check()

    def check(self) -> bool:
        """Whether the store exists; it (and ``missions/``) must be a directory of this user's,
        never a symlink; one open to others is tightened to 0700 (as the home is).

        Raises:
            StorageError: a symlink or a non-directory in the store's place, or a folder of
                another user's (``IO_ERROR``, naming the fix)."""
        for folder in (self.home.missions, self.dir):
            fix, foreign = (
                f"move it aside (mv {folder} {folder}.{end}) and retry" for end in ("bad", "foreign")
            )
            if not fsio.own_private_dir(folder, "mission store", fix, foreign):
                return False
        return True

    def ensure_project(self, root: str) -> None:
        """Create the store and its ``project.json`` (naming ``root``) when missing."""
        self._ensure()
        path = self.dir / PROJECT_FILE
        try:
            fsio.lstat(path)
            return
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise storage_error(exc, "read", path) from exc
        info = ProjectInfo(key=self.project, root=root, created_at=now_iso())
        try:
            atomic_write(path, encode_pretty(info))
        except OSError as exc:
            raise storage_error(exc, "write", path) from exc

    def info(self) -> ProjectInfo | None:
        try:
            return load_json(self.dir / PROJECT_FILE, ProjectInfo, limit=64 * 1024)
        except (FileNotFoundError, ProtocolError):
            return None

    @contextlib.contextmanager
    def locked(self, mission_id: str, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
        """Hold mission ``mission_id``'s lock (the store is created when missing)."""
        self._ensure()
        with exclusive(self.lock(mission_id), timeout=timeout):
            yield

    def _read(self, mission_id: str) -> Mission:
        """The record (no lock). Raises MissionNotFound; ProtocolError for an entry that is
        not a record of ours (a symlink, FIFO, directory, too large, another user's, undecodable)."""
        path = self.record(mission_id)
        self.check()
        reason = _unusable(path)
        if reason is not None and reason.startswith("too large:"):
            moved = self._quarantine(path, f"mission {mission_id}: its record is {reason}")
            where = f"moved to {moved} with the reason beside it" if moved else f"remove {path}"
            raise ProtocolError(f"mission {mission_id}: its record is {reason}; {where}")
        if reason == "missing":
            raise MissionNotFound(
                f"no mission {mission_id} in this project's store "
                "(`pisub mission list --scope global` lists all)"
            )
        if reason is not None:
            raise ProtocolError(f"mission {mission_id}: {reason}; skipped (remove {path})")
        try:
            mission = load_json(path, Mission, limit=MAX_RECORD_BYTES)
        except FileNotFoundError:
            raise MissionNotFound(f"no mission {mission_id} in this project's store") from None
        if mission.id != mission_id:
            raise ProtocolError(f"{path}: names mission {mission.id!r}, not {mission_id}; skipped")
        if mission.project != self.project:
            raise ProtocolError(
                f"{path}: names project {mission.project!r:.40}, not this store's {self.project} "
                "(a copied record?); skipped (move it to its own store or remove it)"
            )
        return mission

    def _quarantine(self, path: Path, reason: str) -> Path | None:
        """Move a bad record out of the way into ``<store>/.quarantine/`` with ``<name>.reason``
        beside it; where it went (None: it could not be moved)."""
        from pisub.termsafe import printable

        return fsio.quarantine(path, self.dir / QUARANTINE, printable(path.name)[:80], reason)

    def _write(self, mission: Mission) -> None:
        path = self.record(mission.id)
        try:
            atomic_write(path, encode_pretty(mission))
        except OSError as exc:
            raise storage_error(exc, "write", path) from exc

    # ---- the fixed interface --------------------------------------------------------------

    def create(
        self,
        *,
        title: str,
        cwd: Path,
        objective: str | None = None,
        goal: bool = False,
        budget_tokens: int | None = None,
        labels: Sequence[str] = (),
        status: MissionStatus = MissionStatus.PLANNED,
        owner_session: str | None = None,
    ) -> Mission:
        """A new mission (checked: title one printable line)."""
        check_one_line(title, "title", MAX_TITLE, visible=False)  # (a default title; input is checked before)
        if objective is not None:
            check_text(objective, "objective", MAX_OBJECTIVE)
        checked_labels = check_labels(list(labels), "labels")
        if budget_tokens is not None and (
            isinstance(budget_tokens, bool)
            or not isinstance(budget_tokens, int)
            or not 1 <= budget_tokens <= MAX_BUDGET_TOKENS
        ):
            raise InvalidInput(f"budget.tokens: must be a whole number from 1 to {MAX_BUDGET_TOKENS}")
        if goal and budget_tokens is None:
            raise InvalidInput("budget.tokens: a goal mission needs a token budget (--budget-tokens N)")
        if owner_session is not None:
            check_session_key(owner_session, "session key")
        status = MissionStatus(status)
        if status == MissionStatus.NEEDS_DECISION or status.is_terminal:
            raise InvalidInput(f"status: a new mission is planned, active or waiting, not {status}")
        real = os.path.realpath(cwd)
        key, root = project_of(Path(real))
        self.ensure_project(root if key == self.project else real)
        now = now_iso()
        while True:
            mission_id = secrets.token_hex(6)
            with self.locked(mission_id):
                if os.path.lexists(self.record(mission_id)):
                    continue
                mission = Mission(
                    id=mission_id,
                    title=title,
                    objective=objective,
                    status=status,
                    goal=bool(goal),
                    budget=MissionBudget(tokens=budget_tokens) if budget_tokens is not None else None,
                    labels=checked_labels,
                    created_at=now,
                    updated_at=now,
                    owner_session=owner_session,
                    project=self.project,
                    cwd=real,
                    revision=1,
                )
                self._write(mission)
                return mission

    def get(self, mission_id: str) -> Mission:
        """Raises MissionNotFound."""
        check_mission_id(mission_id)
        return self._read(mission_id)

    def attach_run(self, mission_id: str, run_id: str, mode: str) -> Mission:
        """Link run ``run_id`` (``mode``: workflow, run, ...) to the mission; idempotent.
        Raises MissionNotFound; InvalidInput for a closed mission."""
        if not isinstance(run_id, str) or not is_run_id(run_id):
            raise InvalidInput(f"run id {run_id!r:.60}: not a complete run id")
        try:
            run_mode = RunMode(mode)
        except ValueError:
            raise InvalidInput(f"run mode {mode!r:.40}: must be workflow or run") from None

        def attach(mission: Mission) -> bool:
            if any(r.run_id == run_id for r in mission.runs):
                return False
            if mission.closed:
                raise InvalidInput(
                    f"mission {mission.id} is closed ({mission.status}); create a new mission for more runs"
                )
            if len(mission.runs) >= MAX_RUNS:
                raise InvalidInput(f"mission {mission.id} has {MAX_RUNS} runs already; create a new mission")
            run = MissionRun(run_id=run_id, mode=run_mode, status="starting", attached_at=now_iso())
            mission.runs.append(run)
            mission.revision += 1
            settle(mission, runs_changed=True)
            return True

        return self.modify(mission_id, attach, by_person=False)  # (a run is not counted in MAX_OWN_BYTES)

    def state(self, mission_id: str) -> StateNamespace:
        """The mission's shared ``state`` (the same 256 KiB rules as ``--state-ns``)."""
        self.get(mission_id)
        self._ensure()
        for path in (self.dir / STATE_DIR, self.dir / STATE_DIR / f"{mission_id}.json"):
            try:
                st = fsio.lstat(path)
            except FileNotFoundError:
                break
            except OSError as exc:
                raise storage_error(exc, "read", path) from exc
            if st.st_uid != os.getuid():
                raise ProtocolError(
                    f"mission {mission_id}'s state {path} belongs to uid {st.st_uid}, not to you; "
                    f"not read (move it aside: mv {path} {path}.foreign)"
                )
        return StateNamespace(self.dir / STATE_DIR, mission_id)

    # ---- more ----------------------------------------------------------------------------

    def modify(
        self,
        mission_id: str,
        change: Callable[[Mission], bool],
        *,
        by_person: bool = True,
        timeout: float = LOCK_TIMEOUT,
    ) -> Mission:
        """Read the mission, let ``change`` alter it (True: it did) and write it back, all under
        the mission's lock; finished missions beyond :data:`KEEP_FINISHED` are pruned after.
        A change ``by_person`` (not a refresh or a notice) may not grow the record past
        :data:`MAX_OWN_BYTES` (``INVALID_INPUT``)."""
        check_mission_id(mission_id)
        with self.locked(mission_id, timeout):
            mission = self._read(mission_id)
            was_final = mission.status.is_terminal
            before = own_bytes(mission) if by_person else 0
            if not change(mission):
                return mission
            if by_person:
                after = own_bytes(mission)
                if after > MAX_OWN_BYTES and after > before:
                    raise InvalidInput(
                        f"missionUpdate: mission {mission_id}'s record would be {after} bytes "
                        f"(its runs aside); at most {MAX_OWN_BYTES}: give shorter texts, or start a new "
                        "mission for more artifacts, receipts and decisions"
                    )
            mission.updated_at = now_iso()
            self._write(mission)
        if mission.status.is_terminal and not was_final:
            self.prune()
        return mission

    def update(self, mission_id: str, update: MissionUpdate) -> Mission:
        """Apply the checked ``missionUpdate`` (:func:`apply_update`)."""
        return self.modify(mission_id, lambda m: apply_update(m, update))

    def resolve_decision(self, mission_id: str, decision_id: str, summary: str) -> Mission:
        """Resolve decision ``decision_id`` with ``summary`` (resolving the last open one returns
        the mission to ``active``). Raises InvalidInput: no such decision, or resolved already."""
        check_decision_id(decision_id, "decision id")
        check_text(summary, "summary", MAX_TEXT)
        if not summary.strip():
            raise InvalidInput("summary: is empty (say what was decided)")

        def resolve(mission: Mission) -> bool:
            for decision in mission.decisions:
                if decision.id == decision_id:
                    if decision.status == DecisionStatus.RESOLVED:
                        raise InvalidInput(f"decision {decision_id} of mission {mission.id} is resolved")
                    decision.status = DecisionStatus.RESOLVED
                    decision.resolution = summary
                    decision.resolved_at = now_iso()
                    mission.revision += 1
                    settle(mission, runs_changed=False)
                    return True
            known = ", ".join(d.id for d in mission.decisions) or "none"
            raise InvalidInput(f"mission {mission.id} has no decision {decision_id!r} (decisions: {known})")

        return self.modify(mission_id, resolve)

    def close(self, mission_id: str, status: MissionStatus, summary: str | None = None) -> Mission:
        """Close the mission as ``status`` (completed, failed or cancelled): it stays so, whatever
        its runs do. Closing a closed mission again changes its status and summary."""
        status = MissionStatus(status)
        if not status.is_terminal:
            raise InvalidInput(f"--status: close as completed, failed or cancelled, not {status}")
        if summary is not None:
            check_text(summary, "summary", MAX_TEXT)

        def close(mission: Mission) -> bool:
            if mission.closed and mission.status == status and summary in (None, mission.summary):
                return False  # (closed so already: no change, no new revision)
            mission.status = status
            mission.closed = True
            if summary is not None:
                mission.summary = summary
            mission.revision += 1
            return True

        # (a close adds at most its summary: always allowed, even to a record over the cap)
        return self.modify(mission_id, close, by_person=False)

    def refresh(
        self, mission_id: str, see: Callable[[MissionRun], RunSeen], timeout: float = LOCK_TIMEOUT
    ) -> Mission:
        """Bring the linked runs up to date under the lock: ``see`` reads each the way ``pisub
        status`` does; the mission's usage and status follow (:func:`settle`)."""

        def observe(mission: Mission) -> bool:
            changed = runs_changed = False
            for run in mission.runs:
                seen = see(run)
                if seen.status != run.status:
                    run.status = seen.status
                    changed = runs_changed = True
                if seen.ended_at != run.ended_at:
                    run.ended_at = seen.ended_at
                    changed = True
                if seen.usage is not None and seen.usage != run.usage:
                    run.usage = seen.usage
                    changed = True
                if seen.children is not None:
                    for child in seen.children:
                        child.key = None if child.key is None else child.key[:MAX_CHILD_TEXT]
                        child.agent = None if child.agent is None else child.agent[:MAX_CHILD_TEXT]
                        child.status = child.status[:MAX_CHILD_TEXT]
                    others = [c for c in mission.workflow_children if c.workflow_run_id != run.run_id]
                    mine = [c for c in mission.workflow_children if c.workflow_run_id == run.run_id]
                    if mine != seen.children:
                        mission.workflow_children = others + seen.children
                        changed = True
            del mission.workflow_children[: max(0, len(mission.workflow_children) - 500)]
            total = sum_usage(mission.runs)
            if total != mission.usage:
                mission.usage = total
                changed = True
            before = mission.status
            settle(mission, runs_changed)
            return changed or mission.status != before

        return self.modify(mission_id, observe, by_person=False, timeout=timeout)

    def ids(self) -> list[str]:
        try:
            fd = open_dir(self.dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, "list", self.dir) from exc
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        return sorted(n[:-5] for n in names if n.endswith(".json") and MISSION_ID_RE.fullmatch(n[:-5]))

    def listing(self) -> Listing:
        """Every readable mission, newest first; the rest skipped with a reason."""
        listing = Listing()
        self.check()
        try:
            fd = open_dir(self.dir)
        except FileNotFoundError:
            return listing
        except OSError as exc:
            listing.skipped.append(f"{self.dir}: cannot list: {exc.strerror or exc}")
            return listing
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        for name in sorted(names):
            shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                listing.skipped.append(f"{self.dir}/{shown}: a name that is not UTF-8 (not a mission)")
                continue
            if name.endswith(".json") and MISSION_ID_RE.fullmatch(name[:-5]):
                try:
                    listing.missions.append(self._read(name[:-5]))
                except (ProtocolError, MissionNotFound) as exc:
                    listing.skipped.append(exc.message)
                continue
            if _known(name):
                continue
            listing.skipped.append(f"{self.dir}/{shown}: not a mission file (ignored)")
        listing.missions.sort(key=lambda m: m.created_at, reverse=True)
        return listing

    def prune(self) -> list[str]:
        """Remove the finished missions beyond the :data:`KEEP_FINISHED` newest (by update);
        the ids removed."""
        finished = [m for m in self.listing().missions if m.status.is_terminal]
        if len(finished) <= KEEP_FINISHED:
            return []
        finished.sort(key=lambda m: m.updated_at, reverse=True)
        removed = []
        for old in finished[KEEP_FINISHED:]:
            with contextlib.suppress(PisubError), self.locked(old.id):
                try:
                    current = self._read(old.id)
                except (MissionNotFound, ProtocolError):
                    continue
                if not current.status.is_terminal or current.updated_at != old.updated_at:
                    continue
                for path in (
                    self.dir / STATE_DIR / f"{old.id}.json",
                    self.dir / STATE_DIR / f"{old.id}.lock",
                    self.record(old.id),
                ):
                    with contextlib.suppress(FileNotFoundError):
                        fsio.unlink(path)
                removed.append(old.id)
        return removed


def _known(name: str) -> bool:
    """A store's own entries besides records: its project file, locks, the state folder,
    temp files of an atomic write, locks moved aside."""
    if name in (PROJECT_FILE, STATE_DIR, QUARANTINE):
        return True
    if name.endswith(".lock") and MISSION_ID_RE.fullmatch(name[:-5]):
        return True
    return name.startswith(".") and (name.endswith(".tmp") or ".bad-" in name)


def _unusable(path: Path) -> str | None:
    """Why ``path`` cannot be a record of ours (``missing`` when absent), else None."""
    try:
        st = fsio.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"a {file_kind(st.st_mode)} stands where its record is expected (not followed)"
    if st.st_uid != os.getuid():
        return f"its record belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_size > MAX_RECORD_BYTES:
        return f"too large: {st.st_size} bytes; at most {MAX_RECORD_BYTES}"
    return None


def project_keys(home: Home) -> tuple[list[str], list[str]]:
    """The project keys of every store under the home, and the entries skipped (with why)."""
    try:
        fd = open_dir(home.missions)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{home.missions}: cannot list: {exc.strerror or exc}"]
    try:
        names = os.listdir(fd)
        keys, skipped = [], []
        for name in sorted(names):
            if not PROJECT_KEY_RE.fullmatch(name):
                shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
                skipped.append(f"{home.missions}/{shown}: not a project store (ignored)")
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                skipped.append(f"{home.missions}/{name}: cannot be read: {exc.strerror or exc}")
                continue
            if not stat.S_ISDIR(st.st_mode):
                kind = file_kind(st.st_mode)
                skipped.append(f"{home.missions}/{name}: a {kind}, not a store (not followed)")
            elif st.st_uid != os.getuid():
                skipped.append(f"{home.missions}/{name}: belongs to uid {st.st_uid}, not to you")
            else:
                keys.append(name)
        return keys, skipped
    finally:
        os.close(fd)


def find(home: Home, mission_id: str, first: str | None = None) -> MissionStore:
    """The store that holds mission ``mission_id``: project ``first``'s, else any project's.

    Raises:
        MissionNotFound: no store holds it (naming the stores skipped, if any).
        StorageError: project ``first``'s store is not a directory of this user's.
        ProtocolError: two stores hold a record of that id (a copy)."""
    check_mission_id(mission_id)
    if first is not None:
        MissionStore(home, first).check()
    keys, skipped = project_keys(home)
    order = ([first] if first in keys else []) + [k for k in keys if k != first]
    holders = []
    for key in order:
        store = MissionStore(home, key)
        if os.path.lexists(store.record(mission_id)):
            holders.append(store)
    if len(holders) > 1 and first in keys and holders[0].project == first:
        return holders[0]  # (this project's own: the one meant here)
    if len(holders) > 1:
        where = ", ".join(str(s.record(mission_id)) for s in holders)
        raise ProtocolError(
            f"mission {mission_id} is in {len(holders)} stores ({where}): a copy; "
            "remove the one that is not meant, or run in its project"
        )
    if holders:
        return holders[0]
    note = f"; {len(skipped)} store(s) skipped: {skipped[0]}" if skipped else ""
    raise MissionNotFound(
        f"no mission {mission_id} (`pisub mission list --scope global` lists them all){note}"
    )


def apply_update(mission: Mission, update: MissionUpdate) -> bool:
    """Apply a checked ``missionUpdate`` to ``mission`` (see :class:`MissionUpdate`).

    Raises:
        InvalidInput: a closed mission's status set back to an open one without a close
            status, a decision id that collides, too many decisions."""
    now = now_iso()
    unchanged = msgspec.json.encode(mission)
    if update.title is not None:
        mission.title = update.title
    if update.objective is not None:
        mission.objective = update.objective
    if update.labels is not None:
        mission.labels = update.labels
    if update.budget is not None:
        mission.budget = MissionBudget(tokens=update.budget.tokens)
    for n, given in enumerate(update.decisions or []):
        where = f"missionUpdate.decisions[{n}]"
        existing = next((d for d in mission.decisions if given.id is not None and d.id == given.id), None)
        if existing is None:
            if given.title is None:
                raise InvalidInput(f"{where}.title: a new decision needs a title")
            ids = {d.id for d in mission.decisions}
            new_id = given.id or next(f"d{i}" for i in range(1, 10**6) if f"d{i}" not in ids)
            status = given.status or DecisionStatus.OPEN
            if len(mission.decisions) >= MAX_DECISIONS:
                raise InvalidInput(
                    f"{where}: mission {mission.id} has {MAX_DECISIONS} decisions already (at most "
                    f"{MAX_DECISIONS}); change one by its id, or start a new mission"
                )
            mission.decisions.append(
                Decision(
                    id=new_id,
                    status=status,
                    title=given.title,
                    resolution=given.resolution,
                    created_at=now,
                    resolved_at=now if status == DecisionStatus.RESOLVED else None,
                )
            )
            continue
        if given.title is not None:
            existing.title = given.title
        if given.resolution is not None:
            existing.resolution = given.resolution
        if given.status is not None and given.status != existing.status:
            existing.status = given.status
            existing.resolved_at = now if given.status == DecisionStatus.RESOLVED else None
    for art in update.artifacts or []:
        item = Artifact(kind=art.kind, path=art.path)
        if item not in mission.artifacts:
            mission.artifacts.append(item)
    if len(mission.artifacts) > MAX_ARTIFACTS:
        raise InvalidInput(
            f"missionUpdate.artifacts: mission {mission.id} would have {len(mission.artifacts)} "
            f"artifacts; at most {MAX_ARTIFACTS} (start a new mission for more)"
        )
    for rec in update.receipts or []:
        mission.receipts = [r for r in mission.receipts if (r.kind, r.url) != (rec.kind, rec.url)]
        mission.receipts.append(MissionReceipt(kind=rec.kind, status=rec.status, url=rec.url))
    if len(mission.receipts) > MAX_RECEIPTS:
        raise InvalidInput(
            f"missionUpdate.receipts: mission {mission.id} would have {len(mission.receipts)} "
            f"receipts; at most {MAX_RECEIPTS} (start a new mission for more)"
        )
    if update.status is not None:
        if update.status.is_terminal:
            mission.status = update.status
            mission.closed = True
        else:
            mission.closed = False
            mission.status = update.status
    settle(mission, runs_changed=False)
    if msgspec.json.encode(mission) == unchanged:
        return False  # (nothing changed: no new revision, so no new goal notice either)
    mission.revision += 1
    return True
