"""Health checks of a pisub installation (``pisub doctor``) and garbage collection (``pisub gc``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pisub.agents.catalog import Catalog
from pisub.core.fsio import fsync_dir
from pisub.core.locks import exclusive, is_held
from pisub.errors import PisubError, RunNotFound, translating
from pisub.protocol.codec import parse_iso
from pisub.protocol.status import Status
from pisub.store.leases import LeaseInfo
from pisub.store.paths import Home, RunPaths, is_run_id
from pisub.store.runs import load_status

MIN_FREE_BYTES = 100 * 1024 * 1024
MIN_FREE_INODES = 10_000
INOTIFY = Path("/proc/sys/fs/inotify")
TMP_MAX_AGE_S = 36 * 3600
"""``inbox/tmp`` files older than this are left over from a crashed writer (Maildir's rule)."""

STAGING_MAX_AGE_S = 3600
"""A ``runs/.creating-<id>`` directory older than this was left by a killed launcher."""


@dataclass
class Check:
    """One finding: ``ok`` or a problem with the fix for it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, ok, detail, fix))


def diagnose(home: Home, pi_bin: str | None) -> Report:
    """Every check; never raises for a problem it can describe."""
    report = Report()
    checks: list[tuple[str, Callable[[], None]]] = [
        ("home", lambda: _check_home(home, report)),
        ("inotify", lambda: _check_inotify(report)),
        ("pi", lambda: _check_pi(pi_bin, home, report)),
        ("runs", lambda: _check_runs(home, report)),
        ("leases", lambda: _check_leases(home, report)),
        ("agents", lambda: _check_agents(home, report)),
        ("schedule", lambda: _check_schedules(home, report)),
    ]
    for name, check in checks:
        try:
            check()
        except (PisubError, OSError) as exc:
            detail = exc.message if isinstance(exc, PisubError) else f"{exc.strerror or exc}"
            report.add(name, False, f"the check failed: {detail}", "see the message")
    return report


def _writable(home: Home) -> bool:
    """A run can be created: ``runs/`` is writable, on a file system mounted read-write."""
    try:
        read_only = bool(os.statvfs(home.runs).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return not read_only and os.access(home.runs, os.W_OK | os.X_OK)


def _check_home(home: Home, report: Report) -> None:
    try:
        st = home.root.stat()
    except OSError as exc:
        report.add("home", False, f"{home.root}: {exc.strerror}", "create it, or set PISUB_HOME")
        return
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 or st.st_uid != os.getuid():
        report.add(
            "home",
            False,
            f"{home.root} is mode {mode:o}, uid {st.st_uid}",
            f"chmod 700 {home.root} (and make sure it is yours)",
        )
    elif not _writable(home):
        report.add(
            "home",
            False,
            f"{home.root}: runs cannot be created in it (read-only, or no write permission)",
            f"make {home.runs} writable, or set PISUB_HOME to a writable directory",
        )
    else:
        report.add("home", True, f"{home.root} (mode 700)")
    vfs = os.statvfs(home.root)
    free = vfs.f_bavail * vfs.f_frsize
    if free < MIN_FREE_BYTES:
        report.add(
            "disk",
            False,
            f"only {free // 2**20} MiB free under {home.root}",
            "free space or run: pisub gc --older-than 7d",
        )
    else:
        report.add("disk", True, f"{free // 2**20} MiB free")
    if vfs.f_files and vfs.f_favail < MIN_FREE_INODES:
        report.add(
            "inodes",
            False,
            f"only {vfs.f_favail} free inodes under {home.root} (every run needs about 20)",
            "remove files or run: pisub gc --older-than 7d",
        )
    elif vfs.f_files:
        report.add("inodes", True, f"{vfs.f_favail} free inodes")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _check_inotify(report: Report) -> None:
    instances = _read_int(INOTIFY / "max_user_instances")
    watches = _read_int(INOTIFY / "max_user_watches")
    queued = _read_int(INOTIFY / "max_queued_events")
    if instances is None:
        report.add(
            "inotify",
            False,
            "no inotify on this system: runners poll their inboxes (slower control)",
            "nothing to do; control requests still work by polling",
        )
        return
    detail = f"max_user_instances={instances}, max_user_watches={watches}, max_queued_events={queued}"
    if instances < 256:
        report.add(
            "inotify",
            True,
            detail + f": about {instances} runners can use inotify at once; "
            "more runners poll their inboxes (every 0.2 s)",
        )
    else:
        report.add("inotify", True, detail)


def _check_pi(pi_bin: str | None, home: Home, report: Report) -> None:
    from pisub.children.pi.versions import SUPPORTED, install_hint, supported_version

    if pi_bin is None:
        report.add(
            "pi",
            False,
            f"the pi coding agent was not found (PISUB_PI_BIN, PATH); pisub drives {SUPPORTED}",
            install_hint(),
        )
        return
    try:
        version = supported_version(pi_bin, home.cache)
    except PisubError as exc:
        report.add(
            "pi", False, exc.message, "scripts/install_pi.sh installs a supported pi; set PISUB_PI_BIN to it"
        )
        return
    report.add("pi", True, f"{pi_bin} {version} (pisub drives {SUPPORTED})")
    _check_model(pi_bin, report)


LIST_MODELS_TIMEOUT_S = 20.0
"""How long ``doctor`` waits for ``pi --list-models`` (``PISUB_DOCTOR_PI_TIMEOUT_S`` overrides it:
a slow machine's pi may need more, a test of a hanging pi less)."""


def list_models_timeout() -> float:
    """:data:`LIST_MODELS_TIMEOUT_S`, or ``$PISUB_DOCTOR_PI_TIMEOUT_S`` when it is a number of
    seconds from 1 to 600 (anything else is ignored)."""
    try:
        given = float(os.environ.get("PISUB_DOCTOR_PI_TIMEOUT_S", ""))
    except ValueError:
        return LIST_MODELS_TIMEOUT_S
    return given if 1.0 <= given <= 600.0 else LIST_MODELS_TIMEOUT_S


MODEL_FIX = (
    "give pi a provider's key (e.g. export ANTHROPIC_API_KEY=… or OPENAI_API_KEY=…; or run pi and "
    "/login), or try pisub without one: . scripts/env.sh in a pisub checkout (a local scripted model)"
)


PI_BIN_FIX = (
    "run {pi} --list-models yourself to see why it {what}; or point PISUB_PI_BIN at a pi that "
    "answers (scripts/install_pi.sh installs one)"
)


def pi_agent_dir(env: dict[str, str] | None = None) -> Path:
    """pi's own folder (``models.json``, ``settings.json``, ``auth.json``): ``$PI_CODING_AGENT_DIR``,
    else ``~/.pi/agent``."""
    env = dict(os.environ) if env is None else env
    configured = env.get("PI_CODING_AGENT_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".pi" / "agent"


def listed_models(text: str) -> list[str]:
    """``provider/model`` of each row ``pi --list-models`` prints under its ``provider model``
    header (none when it says ``No models available``)."""
    rows: list[str] = []
    seen_header = False
    for line in text.splitlines():
        words = line.split()
        if seen_header and len(words) >= 2:
            rows.append(f"{words[0]}/{words[1]}")
        elif words[:2] == ["provider", "model"]:
            seen_header = True
    return rows


def _check_model(pi_bin: str, report: Report) -> None:
    """pi has a model it can use — a provider with a key (an environment variable, auth.json) or a
    models.json entry: what ``pi --list-models`` lists. Without one every pi run fails at once."""
    from pisub.core.procs import run_bounded
    from pisub.termsafe import printable

    where = printable(os.fspath(pi_agent_dir()), one_line=True)
    env = {**os.environ, "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
    limit = list_models_timeout()
    done = run_bounded([pi_bin, "--list-models"], timeout=limit, env=env)
    said = done.stdout[:262144].decode("utf-8", "replace")
    models = listed_models(said)
    shown_bin = printable(pi_bin, one_line=True)
    lingered = done.timed_out and done.returncode == 0  # pi answered; something it left held the pipe
    if done.timed_out and not lingered:
        detail = (
            f"{shown_bin} --list-models did not answer in {limit:g} s (timed out): "
            "cannot tell whether pi has a usable model"
        )
        report.add("model", False, detail, PI_BIN_FIX.format(pi=shown_bin, what="hangs"))
    elif done.returncode != 0:
        last = printable(
            " ".join(done.stderr[-2000:].decode("utf-8", "replace").split())[-200:], one_line=True
        )
        detail = f"{shown_bin} --list-models exited {done.returncode}" + (f": {last}" if last else "")
        report.add("model", False, detail, PI_BIN_FIX.format(pi=shown_bin, what="fails"))
    elif lingered and not models:
        detail = (
            f"{shown_bin} --list-models exited, but a process it left behind held its output open for "
            f"{limit:g} s (timed out): its answer could not be read"
        )
        report.add("model", False, detail, PI_BIN_FIX.format(pi=shown_bin, what="lingers"))
    elif not models:
        detail = (
            f"pi has no usable model (pi --list-models lists none; its agent dir {where}): "
            "every pi run would fail with 'No API key found'"
        )
        report.add("model", False, detail, MODEL_FIX)
    else:
        shown = printable(", ".join(models[:3]), one_line=True)
        more = f" and {len(models) - 3} more" if len(models) > 3 else ""
        slow = f"; a process pi left behind held its output for {limit:g} s" if lingered else ""
        report.add(
            "model", True, f"pi lists {len(models)} usable model(s): {shown}{more} (agent dir {where}){slow}"
        )


def _check_agents(home: Home, report: Report) -> None:
    """The agent files seen from the working directory: each one skipped is a problem; so is a
    refinement overlay not used (a check of its own); a review gate's reviewer that is not the
    one pisub ships is a warning (the check stays ok)."""
    from pisub.agents.catalog import discover

    catalog = discover(home.agents, Path(os.getcwd()).resolve())
    count = f"{len(catalog.agents)} agents"
    skipped = {p: why for p, why in catalog.problems.items() if p not in catalog.overlay_problems}
    if skipped:
        detail = f"{count}; {len(skipped)} skipped: {_some(skipped)}"
        report.add("agents", False, detail, "pisub agents list names each and why: fix or remove those files")
    else:
        report.add("agents", True, count)
    if catalog.overlay_problems:
        detail = f"{len(catalog.overlay_problems)} not used: {_some(catalog.overlay_problems)}"
        fix = "pisub agents refine NAME --show says why; fix or remove those files"
        report.add("overlays", False, detail, fix)
    _check_reviewer(home, catalog, report)


def _some(problems: dict[Path, str]) -> str:
    from pisub.termsafe import printable

    shown = [printable(f"{path}: {why}", one_line=True) for path, why in sorted(problems.items())[:3]]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(shown) + more


def _check_reviewer(home: Home, catalog: Catalog, report: Report) -> None:
    from pisub.api.agents import reviewer_tools
    from pisub.store.config import load_config
    from pisub.termsafe import printable

    try:
        name = load_config(home.root).acceptance.reviewer or "reviewer"
    except PisubError:
        name = "reviewer"  # a bad config.toml is reported where it is read
    agent = catalog.agents.get(name)
    if agent is None:
        report.add("reviewer", True, f"warning: no agent {name!r}: a review gate cannot start")
    elif agent.scope == "builtin":
        report.add("reviewer", True, f"review gates run the {name!r} pisub ships")
    else:
        where = printable(str(agent.path), one_line=True)
        detail = f"warning: review gates run {where} ({agent.scope} scope), not the {name!r} pisub ships"
        report.add("reviewer", True, f"{detail}; {reviewer_tools(agent)}")


def _check_schedules(home: Home, report: Report) -> None:
    """How many schedules the home has and the timer that fires them (``pisub schedule timer``):
    no timer is a warning when there are schedules; a timer that is not ticking, a problem."""
    from pisub.api.schedule_timer import doctor_check

    ok, detail, fix = doctor_check(home)
    report.add("schedule", ok, detail, fix)


def _check_runs(home: Home, report: Report) -> None:
    from pisub.runs.reconcile import runner_alive
    from pisub.store.runs import RunStore

    names, stray_names = RunStore(home).entries()
    stuck, unreadable = [], []
    for name in names:
        paths = home.run(name)
        try:
            status = load_status(paths)
        except RunNotFound:
            continue  # removed meanwhile
        except PisubError as exc:
            unreadable.append(f"{name} ({exc.message})")
            continue
        if not os.path.lexists(paths.manifest):  # (its status was read: the folder is there)
            unreadable.append(f"{name} (its manifest.json is missing: pisub gc removes it once it has ended)")
            continue
        if not status.state.is_terminal and not runner_alive(paths, status):
            stuck.append(name)
    if stuck:
        report.add(
            "runs",
            False,
            f"{len(stuck)} run(s) say running but their runner is dead: {', '.join(stuck)}",
            "pisub status RUN (or pisub list) marks them failed and ends what is left of them",
        )
    else:
        read = len(names) - len(unreadable)
        report.add(
            "runs", True, f"{read} run(s) read, none stuck" + (" (see runfiles)" if unreadable else "")
        )
    strays = [f"{n} (not a directory)" for n in stray_names]
    if unreadable or strays:
        report.add(
            "runfiles",
            False,
            f"{len(unreadable) + len(strays)} run(s) cannot be read: {'; '.join(unreadable + strays)}",
            "inspect them; pisub gc never removes a run whose status it cannot read",
        )


def _check_leases(home: Home, report: Report) -> None:
    from pisub.store.leases import list_leases

    orphans = [i for i in list_leases(home.leases) if i.alive is not True]
    if orphans:
        detail = "; ".join(_lease_problem(i) for i in orphans)
        report.add(
            "leases",
            False,
            f"{len(orphans)} lease(s) without a live owner: {detail}",
            "a dead owner is reclaimed by the next resume; for an unknown one: pisub lease break RUN --force",
        )
    else:
        report.add("leases", True, "no orphaned leases")


def _lease_problem(info: LeaseInfo) -> str:
    owner = info.owner
    if owner is None:
        return f"{info.path.name}: {info.error}"
    why = "is dead" if info.alive is False else "cannot be checked (other host or boot)"
    return f"{info.path.name}: run {owner.run_id} (pid {owner.pid} on {owner.host}) {why}"


# -- gc -----------------------------------------------------------------------------------


@dataclass
class GcResult:
    removed: list[str] = field(default_factory=list)
    kept_live: list[str] = field(default_factory=list)
    """Runs that are live themselves (not terminal, runner alive, session or journal driven)."""
    kept_recent: list[str] = field(default_factory=list)
    """Runs that ended after the cutoff (too recent to remove)."""
    kept_with_tree: list[str] = field(default_factory=list)
    """Runs that ended before the cutoff, kept because a run of their tree stays (or their
    worktree holds work not yet applied)."""
    swept_tmp: list[Path] = field(default_factory=list)


def _sweep_staging(path: Path, now: float, dry_run: bool, result: GcResult) -> None:
    """A run directory whose launcher died while creating it (never visible to readers)."""
    try:
        if now - path.lstat().st_mtime <= STAGING_MAX_AGE_S:
            return
    except OSError:
        return
    if dry_run or _remove(path):
        result.swept_tmp.append(path)


def parse_age(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``15m``, ``45s`` (or a bare number of seconds)."""
    import math

    from pisub.errors import InvalidInput

    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or seconds > 100 * 365 * 86400:
        raise InvalidInput(f"not an age: {text[:32]!r} (use e.g. 30d, 12h, 15m)")
    return seconds


DELETING = ".deleting-"
"""A run being removed is first renamed to ``runs/.deleting-<id>-<hex>`` (readers then find
it gone at once), then deleted; a leftover of a killed ``gc`` is removed by the next one."""


@translating("collect garbage in")
def collect(
    home: Home, older_than: float, dry_run: bool, progress: Callable[[str, int, int], None] | None = None
) -> GcResult:
    """Remove finished runs that ended more than ``older_than`` seconds ago and stale
    ``inbox/tmp`` files of the runs that stay.

    A run is removed only when its own ``status.json`` is terminal, its ``runner.lock`` is free
    and no live run drives a session stored in it (a resume of it may still be running),
    decided under its repair lock (which crash-repairing readers take too), and only with its
    whole tree (:func:`_kept`); only one ``gc`` runs at a time (the lock on ``runs/``). No
    lock needs a new file, so ``gc`` works on a full disk. Ages are wall-clock: a stepped
    clock can make a finished run look older or younger, never a live run removable.
    ``progress(phase, done, total)`` follows both passes.
    """
    from pisub.runs.reconcile import observe

    result = GcResult()
    now = time.time()
    with exclusive(home.gc_lock, timeout=60, directory=True):
        try:
            names = sorted(os.listdir(home.runs))
        except FileNotFoundError:
            return result
        leased = _leased_sessions(home)
        statuses: dict[str, Status] = {}
        unread: list[str] = []
        for number, name in enumerate(names, start=1):
            _tell(progress, "checking runs", number, len(names))
            if name.startswith(".creating-"):
                _sweep_staging(home.runs / name, now, dry_run, result)
            elif name.startswith(DELETING) and (dry_run or _remove(home.runs / name)):
                result.swept_tmp.append(home.runs / name)
            if not is_run_id(name) or not _is_real_dir(home.runs / name):
                continue
            try:
                statuses[name] = observe(home.run(name))  # a dead runner's run is repaired first
            except PisubError:
                unread.append(name)  # never removed, nor is its tree
        kept, live = _kept(home, statuses, unread, now, older_than, leased)
        for number, name in enumerate(statuses, start=1):
            _tell(progress, "deciding" if dry_run else "removing", number, len(statuses))
            paths = home.run(name)
            doomed = None
            if name in live:
                result.kept_live.append(name)
            elif name in kept:
                if _ended_before(statuses[name], now, older_than):
                    result.kept_with_tree.append(name)  # old, but its tree stays
                else:
                    result.kept_recent.append(name)
            else:
                with contextlib.suppress(PisubError):
                    doomed = _claim_if_removable(paths, now, older_than, dry_run, result, leased)
            if doomed is not None:
                shutil.rmtree(doomed, ignore_errors=True)
            elif name not in result.removed:
                _sweep_tmp(paths.inbox / "tmp", now, dry_run, result)
    return result


def _ended_before(status: Status, now: float, older_than: float) -> bool:
    """Whether ``status`` ended more than ``older_than`` ago (False at a time it cannot read)."""
    try:
        return now - parse_iso(status.ended_at or status.updated_at) > older_than
    except ValueError:
        return False


def _tell(progress: Callable[[str, int, int], None] | None, what: str, done: int, total: int) -> None:
    """Progress every 64 runs and at the end."""
    if progress is not None and (done % 64 == 0 or done == total):
        progress(what, done, total)


def _kept(
    home: Home,
    statuses: dict[str, Status],
    unread: list[str],
    now: float,
    older_than: float,
    leased: list[str],
) -> tuple[set[str], set[str]]:
    """The runs ``gc`` keeps, and which of them are live: a tree of runs goes together, only
    when no run of it stays on its own.

    A run stays on its own while it is live (not terminal, its runner alive, or its session or
    journal driven by a live run), ended more recently than ``older_than`` (or at a time that
    cannot be read), holds a worktree's pending work, or cannot be read at all. A tree is a run
    with its parent and children (by ``parent_run_id``, a run started by a launch inside a run
    too) and, for a workflow, the run whose directory holds its journal (a resumed workflow's
    first run): a killed workflow whose children run stays, so its resume can re-attach them."""
    live = {name for name, st in statuses.items() if _is_live(home.run(name), st, leased)}
    stays = live | set(unread) | _held_by_worktrees(home, statuses)
    stays |= {name for name, st in statuses.items() if not _ended_before(st, now, older_than)}
    root: dict[str, str] = {name: name for name in [*statuses, *unread]}

    def find(name: str) -> str:
        while root[name] != name:
            root[name] = root[root[name]]
            name = root[name]
        return name

    for name in root:
        for other in _linked(home, name, statuses.get(name)):
            if other in root:
                root[find(name)] = find(other)
    staying_trees = {find(name) for name in stays}
    return {name for name in root if find(name) in staying_trees}, live


def _is_live(paths: RunPaths, status: Status, leased: list[str]) -> bool:
    """Not terminal, its runner alive, or a session (or journal) in it driven by a live run."""
    if not status.state.is_terminal or is_held(paths.runner_lock):
        return True
    inside = os.path.realpath(paths.root) + os.sep
    return any(session.startswith(inside) for session in leased)


def _linked(home: Home, name: str, status: Status | None) -> list[str]:
    """The runs ``name``'s tree joins it to: its parent and, for a workflow, its journal's run."""
    from pisub.store.runs import load_manifest

    links = [status.parent_run_id] if status is not None and status.parent_run_id else []
    try:
        manifest = load_manifest(home.run(name))
    except PisubError:
        return links
    if manifest.parent_run_id:
        links.append(manifest.parent_run_id)
    if manifest.workflow is not None:
        links.append(Path(manifest.workflow.journal).parent.name)
    return links


def _held_by_worktrees(home: Home, statuses: dict[str, Status]) -> set[str]:
    """Runs whose git worktree holds work not yet applied or discarded: their patch file is
    part of that work (``pisub worktree apply`` reads it)."""
    from pisub.protocol.worktree import WorktreeState
    from pisub.store.runs import load_manifest
    from pisub.worktrees import load_record

    kept = set()
    for name in statuses:
        try:
            link = load_manifest(home.run(name)).worktree
        except PisubError:
            continue  # judged as any run is
        if link is None:
            continue
        try:
            state = load_record(Path(link.record)).state
        except PisubError:
            kept.add(name)  # a worktree we cannot judge: kept
            continue
        if state in (WorktreeState.ALLOCATED, WorktreeState.CAPTURED):
            kept.add(name)
    return kept


def _leased_sessions(home: Home) -> list[str]:
    """Session files that a run not proven dead drives (a resume may be running on them)."""
    from pisub.store.leases import list_leases

    return [
        i.owner.session_file for i in list_leases(home.leases) if i.owner is not None and i.alive is not False
    ]


def _remove(path: Path) -> bool:
    """Remove what ``gc`` sweeps: a directory's tree, or the entry itself when it is a symlink or
    a file (never what a symlink points to); whether it is gone."""
    try:
        if _is_real_dir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _claim_if_removable(
    paths: RunPaths, now: float, older_than: float, dry_run: bool, result: GcResult, leased: list[str]
) -> Path | None:
    """Under the run's repair lock: decide, and rename a removable run out of ``runs/``; the
    renamed directory to delete (None when kept, or for a dry run)."""
    with exclusive(paths.repair_lock, timeout=10, directory=True):
        status = load_status(paths)
        if _is_live(paths, status, leased):  # again, under the lock
            result.kept_live.append(paths.run_id)
            return None
        try:
            ended = parse_iso(status.ended_at or status.updated_at)
        except ValueError:
            return None  # an unreadable time: keep it
        if now - ended <= older_than:
            return None
        result.removed.append(paths.run_id)
        if dry_run:
            return None
        doomed = paths.root.with_name(f"{DELETING}{paths.run_id}-{os.urandom(3).hex()}")
        os.rename(paths.root, doomed)
        fsync_dir(paths.root.parent)
        return doomed


def _sweep_tmp(tmp_dir: Path, now: float, dry_run: bool, result: GcResult) -> None:
    """Remove what crashed writers left in ``inbox/tmp`` (older than :data:`TMP_MAX_AGE_S`)."""
    try:
        entries = list(os.scandir(tmp_dir))
    except OSError:
        return
    for entry in entries:
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime <= TMP_MAX_AGE_S:
                continue
            result.swept_tmp.append(Path(entry.path))
            if dry_run:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            continue


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
