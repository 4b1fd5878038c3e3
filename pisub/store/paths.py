"""Where things live: the home, run-id validation, and every name inside a run directory."""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

import msgspec

from pisub.core.fsio import trust_home
from pisub.defaults import MIN_PREFIX
from pisub.errors import HomeUnusable, InvalidInput
from pisub.protocol.env import RUN_MARKERS

RUN_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PREFIX_RE = re.compile(r"[0-9a-f][0-9a-f-]{0,35}")

STATUS_FILE = "status.json"
ANSWERED_MARKER = "answered"
INBOX_BOXES = ("tmp", "new", "cur", "rejected")


def without_markers(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without :data:`RUN_MARKERS`: a runner started from inside another run's
    child must not carry that run's markers (a repair of that run ends the processes that do)."""
    return {k: v for k, v in environ.items() if k not in RUN_MARKERS}


MAX_HOME_BYTES = 2048
"""Longest home path: the deepest path pisub makes inside a run adds about 500 bytes to it
(a 200-character request id, its collision suffix and temp name), and PATH_MAX is 4096."""


LABEL_REF = "@"
"""``@LABEL`` names the run whose label is LABEL (a label may look like a prefix: ``cafe``)."""
MAX_LABEL = 80
"""Longest label (characters)."""


def check_label(label: object, where: str = "label") -> str:
    """``label`` when it is a usable run label: text, one line of printable characters (no
    control character, escape, bidi control or line separator), not blank, no surrounding
    spaces, no invisible character and at least one that shows (a zero-width space alone,
    combining marks alone), at most :data:`MAX_LABEL` characters.

    Raises:
        InvalidInput: naming ``where`` (the field path).
    """
    from pisub.termsafe import printable

    if not isinstance(label, str):
        raise InvalidInput(f"{where}: must be text, not {type(label).__name__}")
    if not label.strip():
        raise InvalidInput(f"{where}: is empty")
    if len(label) > MAX_LABEL:
        raise InvalidInput(f"{where}: is {len(label)} characters long; at most {MAX_LABEL}")
    if printable(label, one_line=True) != label:
        shown = printable(label, one_line=True)[:100]
        if any("\udc80" <= c <= "\udcff" for c in label):  # (an undecodable byte, surrogateescape)
            raise InvalidInput(f"{where}: is not valid UTF-8 text: {shown}")
        raise InvalidInput(f"{where}: holds a control character or line break: {shown} (give one line)")
    if label != label.strip():
        raise InvalidInput(f"{where}: {label!r} starts or ends with a space")
    _visible_label(label, where)
    return label


def _visible_label(label: str, where: str) -> None:
    """A label is seen and typed as ``@LABEL``: no invisible character (the rule agent names
    follow, :func:`pisub.termsafe.invisible_char`) and at least one character that shows.

    Raises:
        InvalidInput: naming ``where``.
    """
    from pisub.termsafe import invisible_char, shows_nothing

    char = invisible_char(label)
    if char is not None:
        raise InvalidInput(
            f"{where}: holds an invisible character (U+{ord(char):04X}); "
            "give a label made of visible characters"
        )
    if shows_nothing(label):
        codes = " ".join(f"U+{ord(c):04X}" for c in label[:8])
        raise InvalidInput(f"{where}: shows nothing ({codes}); give a label made of visible characters")


def validate_run_ref(ref: str) -> str:
    """Check that ``ref`` is a run id, a prefix of one, or ``@LABEL``, before any disk access.

    Returns the reference (an id or prefix lower-cased).

    Raises:
        InvalidInput: for anything that is not hex digits and dashes of at least
            :data:`~pisub.defaults.MIN_PREFIX` characters (``../x``, ``/abs``, empty), or a
            ``@`` and a label (:func:`check_label`).
    """
    if not isinstance(ref, str):
        raise InvalidInput(f"a run id must be text, not {type(ref).__name__}")
    if ref.startswith(LABEL_REF):
        check_label(ref[1:], f"run label {ref[:90]!r}")
        return ref
    norm = ref.lower()
    if not norm.strip():
        raise InvalidInput("run id is empty")
    if not _PREFIX_RE.fullmatch(norm):
        hint = f"; a label: @{ref}" if _looks_like_label(ref) else ""
        raise InvalidInput(f"not a run id or prefix: {ref[:90]!r} (expected hex digits and dashes{hint})")
    if len(norm) < MIN_PREFIX:
        raise InvalidInput(
            f"run id prefix {ref!r} is too short: give at least {MIN_PREFIX} characters (or @LABEL)"
        )
    return norm


def _looks_like_label(ref: str) -> bool:
    if "/" in ref or ref.startswith("."):
        return False  # a path, not a label
    try:
        check_label(ref)
    except InvalidInput:
        return False
    return True


def is_run_id(name: str) -> bool:
    """Whether ``name`` is a complete run id (a lower-case UUID)."""
    return RUN_ID_RE.fullmatch(name) is not None


def default_home(env: Mapping[str, str] | None = None) -> Path:
    """``$PISUB_HOME``, else ``$XDG_STATE_HOME/pisub``, else ``~/.local/state/pisub``."""
    env = os.environ if env is None else env
    if env.get("PISUB_HOME"):
        return Path(env["PISUB_HOME"]).expanduser().absolute()
    xdg = env.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return (base / "pisub").absolute()


class Home(msgspec.Struct, frozen=True):
    """The pisub home directory and its fixed subfolders."""

    root: Path

    def __post_init__(self) -> None:
        trust_home(self.root)  # below it, no folder is reached through a symlink

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def agents(self) -> Path:
        return self.root / "agents"

    @property
    def leases(self) -> Path:
        return self.root / "leases"

    @property
    def cache(self) -> Path:
        """Things pisub can always recompute (detected pi versions)."""
        return self.root / "cache"

    @property
    def state(self) -> Path:
        """Workflow state namespaces: ``state/<ns>.json`` and its lock ``state/<ns>.lock``."""
        return self.root / "state"

    @property
    def clock_probe(self) -> Path:
        """A file whose mtime a reader sets to "now" to read the file server's clock."""
        return self.cache / "clock-probe"

    @property
    def schedules(self) -> Path:
        """Schedules: ``schedules/<id>/`` (``spec/schedules.md``), and ``schedules/last-tick.json``
        (the last ``pisub schedule tick``)."""
        return self.root / "schedules"

    @property
    def missions(self) -> Path:
        """Missions: ``missions/<project key>/`` per repository (``spec/missions.md``)."""
        return self.root / "missions"

    @property
    def budgets(self) -> Path:
        """Spawn budgets of root runs: ``budgets/<root run id>/``."""
        return self.root / "budgets"

    @property
    def worktrees(self) -> Path:
        """Where isolated children's git worktrees live: ``$PISUB_WORKTREES``, else
        ``worktrees/`` here; one root per repository, ``<that>/<repository name>/``."""
        given = os.environ.get("PISUB_WORKTREES")
        return Path(given).expanduser() if given else self.root / "worktrees"

    @property
    def live_index(self) -> Path:
        """The index of runs not known to have ended: ``index/live/<run id>``, empty files
        (:mod:`pisub.store.live_index`)."""
        return self.root / "index" / "live"

    @property
    def live_index_ok(self) -> Path:
        """Written after a rebuild: ``index/live/`` names every run that had not ended."""
        return self.root / "index" / "live.ok"

    @property
    def ended_cache(self) -> Path:
        """A cache of ended runs' statuses for ``pisub list`` (:mod:`pisub.runs.ended_cache`):
        ignored when it cannot be trusted, rebuilt by the next reader; removing it is harmless."""
        return self.cache / "ended-runs"

    @property
    def gc_lock(self) -> Path:
        """What ``pisub gc`` locks (one at a time): the ``runs`` directory itself."""
        return self.runs

    def run(self, run_id: str) -> RunPaths:
        """The paths of run ``run_id`` (which must be a complete, valid id)."""
        if not is_run_id(run_id):
            raise InvalidInput(f"not a run id: {run_id!r}")
        return RunPaths(self.runs / run_id)


def open_home(root: Path | None = None, *, create: bool = True) -> Home:
    """Resolve the home and make sure it is a private directory.

    A home with group or other permission bits is tightened to 0700 (with a note on
    stderr) when it holds nothing but what a home holds (:data:`HOME_ENTRIES`) and refused otherwise (a
    folder of other files named as the home is never changed); one owned by another user is
    refused.

    Raises:
        HomeUnusable: the home cannot be created, is not a directory, or is not ours; its path
            is too long or not UTF-8 (whether it exists or not).
    """
    home = Home(root if root is not None else default_home())
    size = len(os.fsencode(home.root))
    if size > MAX_HOME_BYTES:
        raise HomeUnusable(
            f"the pisub home path is {size} bytes long; it may be at most {MAX_HOME_BYTES} bytes, so that "
            "every path inside a run stays within the system's limit: set PISUB_HOME to a shorter path"
        )
    from pisub.termsafe import is_utf8, printable  # (loaded by every command already)

    if not is_utf8(str(home.root)):
        raise HomeUnusable(
            f"the pisub home path {printable(str(home.root), one_line=True)} is not valid UTF-8, and "
            "a run's files (UTF-8 JSON) name files in it: set PISUB_HOME to a path that is UTF-8"
        )
    try:
        if create:
            _ensure_private_dir(home.root, top=True)
            _ensure_private_dir(home.runs)
    except OSError as exc:
        raise HomeUnusable(f"cannot use pisub home {home.root}: {exc.strerror or exc}") from exc
    return home


def open_home_to_read(root: Path | None = None) -> Home:
    """:func:`open_home` for a command that only reads (``list``, ``status``, ``logs``, ``top``):
    a home that does not exist is not created — it has no runs, and its readers say so. One that
    exists is checked (and its ``runs`` folder made) as :func:`open_home` does.

    Raises:
        HomeUnusable: as :func:`open_home` (a path too long for the paths inside it, whether
            it exists or not).
    """
    home = open_home(root, create=False)  # (only checks its path's length)
    try:
        os.lstat(home.root)
    except FileNotFoundError:
        return home
    except OSError:
        pass  # (open_home names what is wrong)
    return open_home(home.root)


def _ensure_private_dir(path: Path, top: bool = False) -> None:
    """``path`` exists as a directory of this user's, 0700. Permissions are tightened only on a
    folder that is pisub's: one below the home, or a home that holds nothing but what a home
    holds — never on another folder named as a home (``PISUB_HOME=/tmp`` is refused)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        try:
            st = path.stat()
        except FileNotFoundError:
            raise HomeUnusable(
                f"pisub home {path} is a symbolic link to {os.readlink(path)}, which does not exist: "
                "create that folder, or set PISUB_HOME to another"
            ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise HomeUnusable(f"pisub home {path} exists and is not a directory")
    if st.st_uid != os.getuid():
        raise HomeUnusable(
            f"pisub home {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
            "set PISUB_HOME to a directory of your own"
        )
    if st.st_mode & 0o077:
        if top and not _is_pisubs(path):
            raise HomeUnusable(
                f"pisub home {path} is a folder of other files, open to others "
                f"(mode {stat.S_IMODE(st.st_mode):o}); name an empty or new folder as PISUB_HOME"
            )
        os.chmod(path, 0o700)
        print(f"pisub: tightened permissions of {path} to 0700", file=sys.stderr)


HOME_ENTRIES = frozenset(
    {
        "runs",
        "agents",
        "config.toml",
        "leases",
        "cache",
        "state",
        "budgets",
        "worktrees",
        "index",
        "notices",
        "groups",
        "schedules",
        "missions",
    }
)
"""What a pisub home holds (:class:`Home` names each; ``notices/`` is the pi extension's, and a
quarantined index is ``index.bad-*``)."""


def _is_pisubs(home: Path) -> bool:
    """The folder holds nothing but what a pisub home holds (nothing at all, say, or the
    ``agents/`` and ``config.toml`` a user wrote before the first run)."""
    with os.scandir(home) as entries:
        return all(e.name in HOME_ENTRIES or e.name.startswith("index.bad-") for e in entries)


class RunPaths(msgspec.Struct, frozen=True):
    """The one place that names every file and folder of a run directory (``spec/protocol.md``
    says who writes each)."""

    root: Path

    def __post_init__(self) -> None:
        trust_home(self.root.parent.parent)  # its home: no folder below is reached through a symlink

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def home(self) -> Home:
        """The home this run lives in (``<home>/runs/<id>``)."""
        return Home(self.root.parent.parent)

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def placement(self) -> Path:
        """Where the runner lives (:class:`~pisub.protocol.placement.Placement`), by the launcher."""
        return self.root / "placement.json"

    @property
    def heartbeat(self) -> Path:
        """The runner's lease on the run directory (Slurm runs), by the runner."""
        return self.root / "heartbeat.json"

    @property
    def status(self) -> Path:
        return self.root / STATUS_FILE

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def repair_events(self) -> Path:
        """Events a repairing reader writes (``run.repaired``) for a run an engine placed."""
        return self.root / "events.repair.jsonl"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def result_text(self) -> Path:
        """A workflow's result text whole (raw; at most the run's output cap), when
        ``result.json`` holds it cut: what its ``[TRUNCATED: …]`` marker names."""
        return self.root / "result.txt"

    @property
    def runner_log(self) -> Path:
        return self.root / "runner.log"

    @property
    def runner_lock(self) -> Path:
        return self.root / "runner.lock"

    @property
    def repair_lock(self) -> Path:
        """What crash repair and ``gc`` lock: the run directory itself (``flock`` on it needs
        no file, so it works on a full disk)."""
        return self.root

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    def box(self, name: str) -> Path:
        """``inbox/<name>``: ``tmp``, ``new``, ``cur`` or ``rejected``."""
        assert name in INBOX_BOXES, name
        return self.inbox / name

    @property
    def inbox_closed(self) -> Path:
        """The tombstone: the runner no longer consumes requests."""
        return self.inbox / "closed"

    @property
    def inbox_answered(self) -> Path:
        """The marker: every request of the finished run has its final answer."""
        return self.inbox / ANSWERED_MARKER

    @property
    def outbox(self) -> Path:
        return self.root / "outbox"

    def receipt(self, request_id: str) -> Path:
        """``outbox/<id>.json``: the one receipt of a request."""
        return self.outbox / f"{request_id}.json"

    @property
    def session(self) -> Path:
        """pi's session of a first run (a resume continues its source's)."""
        return self.root / "session.jsonl"

    def pi_session(self, session_file: str | None, session_dir: str | None) -> Path:
        """Where the run's pi session is: the session it continues (``session_file``), else
        ``<session_dir>/<run id>.jsonl`` (``--session-dir``), else :attr:`session`."""
        if session_file is not None:
            return Path(session_file)
        if session_dir is not None:
            return Path(session_dir) / f"{self.run_id}.jsonl"
        return self.session

    @property
    def system_prompt(self) -> Path:
        """The agent's body, appended to pi's system prompt."""
        return self.root / "system-prompt.md"

    @property
    def briefs(self) -> Path:
        """Follow-ups stored for the next resume (``briefs/<id>.json``)."""
        return self.root / "briefs"

    @property
    def briefs_delivered(self) -> Path:
        return self.briefs / "delivered"

    @property
    def recovery_claim(self) -> Path:
        """Pause-and-revive's one-time claim on a steer's answer."""
        return self.root / "recovery" / "claim.json"

    @property
    def quarantine(self) -> Path:
        """Where unreadable files are moved, each with a ``.reason``."""
        return self.root / "quarantine"

    @property
    def journal(self) -> Path:
        """A workflow's journal of child starts and ends (``journal.jsonl``)."""
        return self.root / "journal.jsonl"

    @property
    def acceptance_dir(self) -> Path:
        """The outputs of the run's acceptance ``verify`` commands: ``acceptance/<id>.log``."""
        return self.root / "acceptance"

    @property
    def handoff(self) -> Path:
        """A lane's recorded evidence (``pisub lane record-merge`` / ``record-supersession``)."""
        return self.root / "handoff.json"

    @property
    def handoff_lock(self) -> Path:
        """Held while evidence is checked and recorded, and while ``cleanup --lane`` removes
        the lane's worktrees (the evidence cannot change under either)."""
        return self.root / "handoff.lock"

    @property
    def on_done_claim(self) -> Path:
        """Created (``O_EXCL``) by whoever runs the run's ``--on-done`` command: exactly once."""
        return self.root / "on-done.claimed"

    @property
    def on_done_log(self) -> Path:
        """The ``--on-done`` command's output."""
        return self.root / "on-done.log"

    @property
    def worktree_patch(self) -> Path:
        """The patch of the work done in this run's git worktree (isolation ``worktree``)."""
        return self.root / "worktree.patch"

    @property
    def workflow_script(self) -> Path:
        """A workflow's copy of its Python script, as it was at launch."""
        return self.root / "workflow.py"

    @property
    def workflow_script_js(self) -> Path:
        """A workflow's copy of its JavaScript script (a file's, or the inline text)."""
        return self.root / "workflow.js"

    @property
    def host_dir(self) -> Path:
        """The logs of a workflow's ``runs.host`` commands: ``host/<key>.log``."""
        return self.root / "host"

    @property
    def script_log(self) -> Path:
        """What a workflow's script printed (its stdout and stderr), up to the output cap."""
        return self.root / "script.log"

    def output_log(self, child: int) -> Path:
        """``output-<N>.log``: the live, human-readable output of child N."""
        return self.root / f"output-{int(child)}.log"

    def stderr_log(self, child: int) -> Path:
        """``stderr-<N>.log``: the standard error of child N."""
        return self.root / f"stderr-{int(child)}.log"

    def control_dirs(self) -> list[Path]:
        """The inbox and outbox folders created with the run."""
        return [self.inbox, *(self.box(name) for name in INBOX_BOXES), self.outbox]
