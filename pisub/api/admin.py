"""The home's housekeeping, as the commands that are not about one run do it: where the home is,
the effective configuration, session leases (list, break), ``doctor``, ``gc``, the Slurm cluster
check and checking a workflow script. Every function opens the home (``home``: default
``PISUB_HOME``) and raises only :class:`~pisub.errors.PisubError`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pisub.errors import InvalidInput, PisubError

if TYPE_CHECKING:
    from collections.abc import Callable

    from pisub.api.doctor import GcResult, Report
    from pisub.store.config import Loaded, Setting
    from pisub.store.leases import LeaseInfo
    from pisub.workflow.validate import Report as ValidationReport


def home_dir(home: Path | None = None) -> Path:
    """The pisub home directory (created if missing)."""
    from pisub.store.paths import open_home

    return open_home(home).root


def settings(home: Path | None = None) -> tuple[Path, list[Setting]]:
    """The winning ``config.toml``'s path (``$XDG_CONFIG_HOME/pisub/config.toml``) and every
    setting it may hold: the value used when neither a call nor an agent sets it, and where that
    comes from (``config.toml`` — :attr:`Setting.file` says which —, an environment variable,
    pisub's default). :func:`config_sources` lists every file looked at."""
    from pisub.store.config import effective, user_config_path
    from pisub.store.paths import open_home_to_read

    root = open_home_to_read(home).root
    return user_config_path(), effective(root)


def config_sources(home: Path | None = None) -> Loaded:
    """Every ``config.toml`` looked at (the winning one first: found or not, the keys it sets)
    and the keys both set to different values (:meth:`Loaded.conflicts`)."""
    from pisub.store.config import load_all
    from pisub.store.paths import open_home_to_read

    return load_all(open_home_to_read(home).root)


def leases(home: Path | None = None) -> list[LeaseInfo]:
    """Every session lease with its owner and whether that owner is alive (``alive``: True,
    False when proven dead, None when this host cannot tell); an unreadable record has
    ``owner`` None and ``error`` set."""
    from pisub.store.leases import list_leases
    from pisub.store.paths import open_home_to_read

    return list_leases(open_home_to_read(home).leases)


def break_leases(ref: str, *, force: bool = False, home: Path | None = None) -> list[LeaseInfo]:
    """Remove by force the leases run ``ref`` holds — as owner, as the run it resumed, or on its
    session — (when their owner cannot be proven dead, e.g. after a reboot); the leases broken.

    Raises:
        InvalidInput: no lease belongs to the run, or ``force`` is not given (pi itself cannot be
            fenced: an old pi still alive could keep writing to the session).
    """
    from pisub.api.client import Run
    from pisub.store.leases import break_lease, canonical, list_leases

    run = Run(ref, home=home)
    session = run.status().session_file
    matches = [
        i
        for i in list_leases(run.home.leases)
        if i.owner is not None
        and (
            run.id in (i.owner.run_id, i.owner.source_run_id)
            or (session and i.owner.session_file == canonical(session))
        )
    ]
    if not matches:
        raise InvalidInput(f"no lease belongs to run {run.id}")
    if not force:
        raise InvalidInput(
            "refusing to break a lease without --force (pi itself cannot be fenced: an old pi "
            "still alive could keep writing to the session)"
        )
    for info in matches:
        break_lease(run.home.leases, info.path)
    return matches


def doctor(home: Path | None = None) -> Report:
    """Check the home, inotify limits, the pi binary, stuck runs and orphaned leases (never
    raises for a problem it can describe: ``report.healthy``, ``report.checks``)."""
    from pisub.api.doctor import diagnose
    from pisub.store.paths import open_home

    try:
        from pisub.children.pi.rpc import find_pi

        pi_bin: str | None = find_pi()
    except PisubError:
        pi_bin = None
    return diagnose(open_home(home), pi_bin)


def gc(
    older_than: str = "30d",
    *,
    dry_run: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    home: Path | None = None,
) -> GcResult:
    """Remove finished runs that ended more than ``older_than`` ago (``30d``, ``12h``, a number
    of seconds) — never a live one, a tree whole or not at all — and sweep stale temporary files;
    ``progress(phase, done, total)`` follows it.

    Raises:
        InvalidInput: a bad age. LockBusy: another ``gc`` held on for 60 s.
    """
    from pisub.api.doctor import GcResult, collect
    from pisub.store.paths import open_home_to_read

    age = parse_age(older_than)
    h = open_home_to_read(home)  # (no home: no runs to remove)
    return collect(h, age, dry_run, progress) if os.path.lexists(h.root) else GcResult()


def parse_age(text: str) -> float:
    """Seconds in an age like ``30m``, ``12h``, ``7d`` (what ``--since`` and ``--older-than``
    take).

    Raises:
        InvalidInput: not such an age.
    """
    from pisub.api.doctor import parse_age as parse

    return parse(text)


def cluster_doctor(
    *, partition: str | None = None, timeout: float = 120.0, home: Path | None = None
) -> Report:
    """Whether runs can be placed on the Slurm cluster safely: Slurm, the partition (default:
    ``[slurm] partition``, else Slurm's default), KillWait, proctrack/cgroup, the home on shared
    storage (a probe job writes a file this host reads back), the lookup cache, clock skew.

    Raises:
        InvalidInput: ``timeout`` is not between 0 and 3600 seconds.
    """
    from pisub.api.slurm_doctor import diagnose_cluster
    from pisub.store.config import load_config
    from pisub.store.paths import open_home

    if not 0 < timeout <= 3600:
        raise InvalidInput("--timeout must be between 0 and 3600 seconds")
    h = open_home(home)
    configured = load_config(h.root).slurm
    return diagnose_cluster(h, partition or (configured.partition if configured else None), timeout)


def validate_workflow(
    script: str | Path | None = None,
    *,
    text: str | None = None,
    language: str | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> ValidationReport:
    """The checks a workflow script meets before it starts (``pisub workflow validate``): its
    syntax and shape, every agent it names looked up from ``cwd``, and (JavaScript) the spawn
    budget; nothing is started. ``script``: a ``.js`` or ``.py`` file (relative: against
    ``cwd``); ``text``: the script itself (JavaScript unless ``language="python"``).
    ``language`` (``python``/``javascript``) overrides the file's suffix.

    A file that cannot be read (missing, not a regular file, too large, not UTF-8) is a report
    with that one error, not an exception.

    Raises:
        InvalidInput: both or neither of ``script`` and ``text``, an unknown language, a
            file whose suffix names none, or an argument of the wrong type.
    """
    from pisub.api.client import agent_catalog
    from pisub.protocol.workflow import DEFAULT_MAX_SPAWNS
    from pisub.store.config import load_config
    from pisub.store.paths import open_home_to_read
    from pisub.workflow.languages import language_of, runtime
    from pisub.workflow.validate import Report, read_script

    if (script is None) == (text is None):
        raise InvalidInput("validate needs a workflow script: a .js or .py file, or its text (not both)")
    for name, value in (("script", script), ("cwd", cwd), ("home", home)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise InvalidInput(f"{name}: give a path, not {type(value).__name__}")
    if text is not None and not isinstance(text, str):
        raise InvalidInput(f"text: give the script as a string, not {type(text).__name__}")
    where = Path(cwd or os.getcwd())
    chosen = language_of(Path(script if script is not None else "workflowScript.js"), language)
    agents = set(agent_catalog(home=home, cwd=where).agents)
    budget = load_config(open_home_to_read(home).root).workflow.max_spawns or DEFAULT_MAX_SPAWNS
    if text is not None:
        return runtime(chosen).check(text, agents, "workflowScript", budget)
    path = Path(script) if script is not None else Path()
    report = Report()
    source = read_script(path if path.is_absolute() else where / path, report)
    return report if source is None else runtime(chosen).check(source, agents, str(script), budget)
