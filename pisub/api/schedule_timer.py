"""The real timer of schedules (``spec/schedules.md (Timers)``).

``pisub schedule install`` puts ONE entry that runs ``pisub schedule tick --from cron|systemd
--quiet`` every minute into a timer the machine already has: a systemd user timer when a user
manager answers ``systemctl --user``, else one line of the user's crontab. ``uninstall`` removes
it, ``timer`` says what is installed and when the home last ticked. No pisub process stays
resident: the timer starts a tick, the tick starts the due fires as detached runs and exits.

The entry names the pisub it was installed from by absolute path (``<python> -m pisub``) and
carries ``PISUB_HOME`` (and the installer's ``PATH``, ``PISUB_PI_BIN``): cron starts jobs with a
bare environment. It is marked with the home's hash (``# pisub-tick:<hash>``), so each home has
its own entry and every other line of the crontab — other homes', other programs' — is written
back byte for byte. The crontab is read and written with ``crontab -l`` / ``crontab -`` (argv,
never a shell) under a lock of the user's, so two installs at once cannot lose a line.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pisub.errors import InvalidInput, PisubError, TimerError, storage_error
from pisub.protocol.schedule_timer import TimerKind, TimerRecord
from pisub.store.paths import Home, default_home, open_home

TICK_STALE_S = 180.0
"""A timer whose home has not ticked for this long (or never, this long after its install) is
named: it ticks every minute."""

CRON_COMMAND_MAX = 999
"""The longest command (the part after the five time fields, in bytes) Debian's cron takes
(``MAX_COMMAND`` 1000 with its NUL): ``crontab -`` refuses a longer line."""

MARK = "pisub-tick:"
"""The comment that marks a home's entry: ``# pisub-tick:<home hash>``."""

TOOL_TIMEOUT_S = 30.0
"""How long ``crontab``, ``systemctl`` and the check of the installed command may take."""

RECORD_LIMIT = 64 * 1024

_ENV = "/usr/bin/env"
"""The crontab entry sets its variables through ``env`` (any crontab ``SHELL`` runs it)."""


@dataclass(frozen=True)
class UnitFile:
    """A systemd unit file ``install`` writes (or would write)."""

    path: str
    text: str


@dataclass(frozen=True)
class Installed:
    """One timer entry of this home found on the machine."""

    kind: TimerKind
    entry: str
    """The crontab line, or the path of the ``.timer`` unit."""
    pisub: list[str]
    """The pisub it runs (``<python> -m pisub``; empty when the entry cannot be read)."""
    pisub_exists: bool
    active: bool | None
    """systemd: the timer unit is active (None: no user manager answers); cron: a cron daemon
    runs on this machine (None: cannot tell)."""


@dataclass(frozen=True)
class Plan:
    """What ``install`` did (or, with ``dry_run``, would do)."""

    kind: TimerKind
    home: str
    pisub: list[str]
    """The pisub the timer runs: ``[<python>, "-m", "pisub"]``."""
    command: list[str]
    """The whole command the timer runs, variables included."""
    entry: str
    """The crontab line, or the path of the ``.timer`` unit."""
    files: list[UnitFile]
    """systemd: the service and the timer unit; cron: none."""
    changed: bool
    """False when exactly this entry was installed already (nothing was written)."""
    dry_run: bool
    owner: str
    """Whose crontab or user manager: the user name."""
    removed: list[Installed] = field(default_factory=list)
    """The other kind's entry of this home, removed (one timer per home)."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LastTick:
    """``<home>/schedules/last-tick.json``, as the last ``pisub schedule tick`` wrote it, and its
    age."""

    at: str
    age_s: float
    source: str
    fired: int


@dataclass(frozen=True)
class TimerStatus:
    """What ``pisub schedule timer`` says."""

    home: str
    installed: list[Installed]
    last_tick: LastTick | None
    warnings: list[str]
    notes: list[str]
    available: TimerKind | None
    """The timer ``install`` would choose on this machine (None: none)."""


# -- the home's identity and the command ----------------------------------------------------


def home_hash(root: str | Path) -> str:
    """12 hex digits naming a home (of its real path) in the crontab marker and the unit names."""
    return hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:12]


def pisub_command() -> list[str]:
    """The pisub running now, by absolute path: ``[<python>, "-m", "pisub"]`` (a venv's python
    is kept as named, not resolved: resolving it would leave the venv)."""
    if not sys.executable:
        raise TimerError("cannot tell which Python runs pisub (sys.executable is empty)")
    return [os.path.abspath(sys.executable), "-m", "pisub"]


_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def check_path_text(what: str, text: str) -> None:
    """A path written into a crontab line or a unit file: a control character (a newline would
    end the line) or a backslash (cron's and systemd's escape character) is refused, and so is
    a name that is not UTF-8. A space, a quote or ``$`` is quoted; ``%`` (cron's newline) is
    escaped as ``\\%`` (systemd: ``%%``).

    Raises:
        InvalidInput: the path cannot be written safely.
    """
    from pisub.termsafe import printable

    bad = _BAD_CHARS.search(text)
    if bad is not None:
        shown = printable(text, one_line=True)
        which = "a backslash" if bad.group() == "\\" else "a control character"
        raise InvalidInput(
            f"{what} {shown} contains {which}, which a crontab line or a unit file cannot hold safely: "
            "use a path without it (PISUB_HOME, or a venv elsewhere)"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{what} {printable(text, one_line=True)} is not UTF-8: use a path that is"
        ) from None


def _path_dirs() -> str:
    """The installer's ``PATH`` (absolute entries that can be written, each once): a tick's
    workflow runs pi and git as the installer would."""
    kept: list[str] = []
    for entry in os.environ.get("PATH", "").split(":"):
        if entry and os.path.isabs(entry) and not _BAD_CHARS.search(entry) and entry not in kept:
            kept.append(entry)
    return ":".join(kept)


def tick_env(root: str, *, with_path: bool = True) -> list[tuple[str, str]]:
    """The variables the entry sets: ``PISUB_HOME``, and the installer's ``PATH`` and
    ``PISUB_PI_BIN`` (when set, absolute and writable)."""
    env = [("PISUB_HOME", root)]
    path = _path_dirs() if with_path else ""
    if path:
        env.append(("PATH", path))
    pi = os.environ.get("PISUB_PI_BIN", "")
    if pi and os.path.isabs(pi) and not _BAD_CHARS.search(pi):
        env.append(("PISUB_PI_BIN", pi))
    return env


def tick_args(kind: TimerKind) -> list[str]:
    return ["schedule", "tick", "--from", kind.value, "--quiet"]


# -- cron -----------------------------------------------------------------------------------


def cron_escape(text: str) -> str:
    """``%`` is cron's newline (the rest of the line becomes the job's stdin): ``\\%``."""
    return text.replace("%", "\\%")


def cron_line(root: str, pisub: Sequence[str], env: Sequence[tuple[str, str]]) -> str:
    """The crontab line of a home: every minute, ``env`` with the variables, then the tick, then
    the marker (a shell comment naming the home)."""
    words = [_ENV, *(f"{k}={v}" for k, v in env), *pisub, *tick_args(TimerKind.CRON)]
    command = " ".join(shlex.quote(w) for w in words)
    mark = f"# {MARK}{home_hash(root)} home {shlex.quote(root)}"
    return "* * * * * " + cron_escape(f"{command} {mark}")


def _cron_line_fitting(
    root: str, pisub: Sequence[str], notes: list[str]
) -> tuple[str, list[tuple[str, str]]]:
    """The crontab line and the variables it sets: without ``PATH`` when the line would pass
    cron's limit with it (said in ``notes``)."""
    env = tick_env(root)
    line = cron_line(root, pisub, env)
    if len(line.encode()) - len("* * * * * ") > CRON_COMMAND_MAX:
        env = tick_env(root, with_path=False)
        line = cron_line(root, pisub, env)
        notes.append(
            f"PATH is not kept in the entry: with it the line would pass cron's {CRON_COMMAND_MAX}-byte "
            "limit (the tick runs with cron's PATH, /usr/bin:/bin; set PISUB_PI_BIN for pi)"
        )
    size = len(line.encode()) - len("* * * * * ")
    if size > CRON_COMMAND_MAX:
        raise InvalidInput(
            f"the crontab entry would be {size} bytes long; cron takes at most {CRON_COMMAND_MAX}: "
            "set PISUB_HOME to a shorter path, or install pisub in a venv with a shorter one"
        )
    return line, env


_MARKED = re.compile(rb"(?:^|\s)#\s*" + re.escape(MARK.encode()) + rb"([0-9a-f]{12})(?=\s|$)")


def _is_ours(line: bytes, digest: str) -> bool:
    found = _MARKED.search(line)
    return found is not None and found.group(1) == digest.encode()


def with_cron_line(current: bytes, line: bytes, digest: str) -> bytes:
    """``current`` (a crontab) with this home's entry: replaced in place where it is (a second
    copy dropped), else added at the end; every other line byte for byte."""
    lines = current[:-1].split(b"\n") if current.endswith(b"\n") else current.split(b"\n")
    if current == b"":
        lines = []
    out: list[bytes] = []
    placed = False
    for old in lines:
        if _is_ours(old, digest):
            if not placed:
                out.append(line)
                placed = True
            continue
        out.append(old)
    if not placed:
        out.append(line)
    return b"\n".join(out) + b"\n"


def without_cron_line(current: bytes, digest: str) -> tuple[bytes, list[bytes]]:
    """``current`` without this home's entries, and those entries."""
    lines = current[:-1].split(b"\n") if current.endswith(b"\n") else current.split(b"\n")
    if current == b"":
        return current, []
    ours = [old for old in lines if _is_ours(old, digest)]
    if not ours:
        return current, []
    kept = [old for old in lines if not _is_ours(old, digest)]
    return (b"\n".join(kept) + b"\n" if kept else b""), ours


def parse_cron_pisub(line: str) -> list[str]:
    """The pisub (``<python> -m pisub``) a crontab line of ours runs; [] when it cannot be read."""
    fields = line.split(None, 5)
    if len(fields) < 6:
        return []
    command = re.sub(r"\\%", "%", fields[5])
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return []
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    return words[: words.index("schedule")] if "schedule" in words else []


def _tool(argv: list[str], stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    """Run a timer's command (no shell), bounded: its exit code, stdout and stderr."""
    from pisub.core.procs import run_bounded

    try:
        done = run_bounded(argv, timeout=TOOL_TIMEOUT_S, stdin=stdin, cwd="/")
    except OSError as exc:
        raise TimerError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    if done.timed_out:
        raise TimerError(f"{' '.join(argv)} did not answer in {TOOL_TIMEOUT_S:g} s")
    return done.returncode, done.stdout, done.stderr


def _said(stderr: bytes) -> str:
    from pisub.termsafe import printable

    text = " ".join(stderr.decode("utf-8", "replace").split())
    return printable(text[-300:], one_line=True) or "no message"


def read_crontab() -> bytes:
    """The user's crontab (``crontab -l``; b"" when there is none).

    Raises:
        TimerError: no ``crontab`` command, or it failed (e.g. the user may not use cron).
    """
    if shutil.which("crontab") is None:
        raise TimerError("no crontab command on this machine: install cron (e.g. apt-get install cron)")
    code, out, err = _tool(["crontab", "-l"])
    if code == 0:
        return out
    if b"no crontab for" in err:
        return b""
    raise TimerError(f"crontab -l failed (exit {code}): {_said(err)}")


def write_crontab(data: bytes) -> None:
    """Replace the user's crontab with ``data`` (``crontab -``; an empty one is removed:
    ``crontab -r``).

    Raises:
        TimerError: ``crontab`` refused it.
    """
    if data == b"":
        code, _, err = _tool(["crontab", "-r"])
        if code != 0 and b"no crontab for" not in err:
            raise TimerError(f"crontab -r failed (exit {code}): {_said(err)}")
        return
    code, _, err = _tool(["crontab", "-"], stdin=data)
    if code != 0:
        raise TimerError(f"crontab - refused the new crontab (exit {code}): {_said(err)}")


def cron_daemon() -> int | None:
    """The pid of a cron daemon running on this machine (``cron``, ``crond``), or None."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/comm", "rb") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if comm in (b"cron", b"crond"):
            return int(name)
    return None


# -- systemd --------------------------------------------------------------------------------


def unit_dir() -> Path:
    """Where the user's own units live: ``$XDG_CONFIG_HOME/systemd/user``, else
    ``~/.config/systemd/user``."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "systemd" / "user"


def unit_names(root: str) -> tuple[str, str]:
    """The service and the timer unit of a home: ``pisub-tick-<hash>.service|.timer``."""
    stem = f"pisub-tick-{home_hash(root)}"
    return f"{stem}.service", f"{stem}.timer"


def _sd_quote(word: str, *, exec_line: bool) -> str:
    """One word of a unit file, double-quoted: ``"`` escaped, ``%`` (a specifier) doubled, and
    in ``ExecStart=`` ``$`` (a variable) doubled too."""
    word = word.replace('"', '\\"').replace("%", "%%")
    return '"' + (word.replace("$", "$$") if exec_line else word) + '"'


def unit_texts(root: str, pisub: Sequence[str], env: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The service and the timer unit of a home."""
    mark = f"# {MARK}{home_hash(root)} home {root}\n"
    shown = root.replace("%", "%%")
    environment = "".join(f"Environment={_sd_quote(f'{k}={v}', exec_line=False)}\n" for k, v in env)
    exec_start = " ".join(_sd_quote(w, exec_line=True) for w in [*pisub, *tick_args(TimerKind.SYSTEMD)])
    service = (
        f"{mark}[Unit]\nDescription=pisub schedule tick for {shown}\n\n"
        f"[Service]\nType=oneshot\n{environment}ExecStart={exec_start}\n"
    )
    timer = (
        f"{mark}[Unit]\nDescription=pisub schedule tick every minute for {shown}\n\n"
        "[Timer]\nOnCalendar=minutely\nPersistent=true\nAccuracySec=1s\n\n"
        "[Install]\nWantedBy=timers.target\n"
    )
    return service, timer


def parse_unit_pisub(text: str) -> list[str]:
    """The pisub a service unit of ours runs (from ``ExecStart=``); [] when it cannot be read."""
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            try:
                words = shlex.split(line[len("ExecStart=") :].replace("%%", "%").replace("$$", "$"))
            except ValueError:
                return []
            return words[: words.index("schedule")] if "schedule" in words else []
    return []


def user_manager() -> bool:
    """Whether a systemd user manager answers ``systemctl --user``."""
    if shutil.which("systemctl") is None:
        return False
    try:
        code, out, _ = _tool(["systemctl", "--user", "show", "--property=Version"])
    except TimerError:
        return False
    return code == 0 and out.startswith(b"Version=")


def _systemctl(*args: str, check: bool = True) -> None:
    code, _, err = _tool(["systemctl", "--user", *args])
    if code != 0 and check:
        raise TimerError(f"systemctl --user {' '.join(args)} failed (exit {code}): {_said(err)}")


def _lingers() -> bool | None:
    """Whether the user's manager runs while they are logged out (``loginctl``), None: unknown."""
    if shutil.which("loginctl") is None:
        return None
    try:
        code, out, _ = _tool(["loginctl", "show-user", str(os.getuid()), "--property=Linger", "--value"])
    except TimerError:
        return None
    return None if code != 0 else out.strip() == b"yes"


LINGER_NOTE = (
    "systemd runs your user timers only while you are logged in unless lingering is on: "
    "loginctl enable-linger (schedules then fire with no session open)"
)


# -- which timer ----------------------------------------------------------------------------


def available_kind() -> TimerKind | None:
    """The timer ``install`` chooses: systemd when a user manager answers, else cron when a
    ``crontab`` command exists, else None."""
    if user_manager():
        return TimerKind.SYSTEMD
    if shutil.which("crontab") is not None:
        return TimerKind.CRON
    return None


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


@contextlib.contextmanager
def user_lock() -> Iterator[None]:
    """The user's lock around reading and rewriting the crontab (or the unit files): a file
    ``pisub-timer-<uid>.lock`` in the temp dir, refused when someone else owns it."""
    from pisub.core.locks import exclusive

    path = Path(tempfile.gettempdir()) / f"pisub-timer-{os.geteuid()}.lock"
    with exclusive(path, timeout=60):
        try:
            owner = os.lstat(path).st_uid
        except OSError as exc:
            raise storage_error(exc, "check the lock", path) from exc
        if owner != os.geteuid():
            raise TimerError(f"the lock {path} belongs to uid {owner}, not you: remove it")
        yield


def _record_path(home: Home) -> Path:
    from pisub.store.schedules import TIMER

    return home.schedules / TIMER


def _read_record(home: Home) -> TimerRecord | None:
    from pisub.core.fsio import load_json

    try:
        return load_json(_record_path(home), TimerRecord, limit=RECORD_LIMIT)
    except (FileNotFoundError, PisubError):
        return None


def _write_record(home: Home, record: TimerRecord) -> None:
    from pisub.core.fsio import atomic_write, private_mkdir
    from pisub.protocol.codec import encode_pretty

    try:
        private_mkdir(home.schedules)
        atomic_write(_record_path(home), encode_pretty(record))
    except OSError as exc:
        raise storage_error(exc, "write", _record_path(home)) from exc


def _drop_record(home: Home) -> None:
    from pisub.core.fsio import unlink

    try:
        unlink(_record_path(home))
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise storage_error(exc, "remove", _record_path(home)) from exc


def _check_runs(pisub: list[str], env: Sequence[tuple[str, str]]) -> None:
    """The command the timer will run starts in a bare environment (cron's: ``PATH``
    /usr/bin:/bin, ``HOME``, in ``/``): ``<pisub> --version``."""
    from pisub.core.procs import run_bounded

    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8", **dict(env)}
    try:
        done = run_bounded([*pisub, "--version"], timeout=TOOL_TIMEOUT_S, env=bare, cwd="/")
    except OSError as exc:
        raise TimerError(f"{pisub[0]} cannot be run: {exc.strerror or exc}") from exc
    if done.returncode != 0 or done.timed_out:
        why = "timed out" if done.timed_out else f"exit {done.returncode}: {_said(done.stderr)}"
        raise TimerError(
            f"{shlex.join(pisub)} --version fails in the timer's bare environment ({why}): "
            "install from a pisub that runs on its own (pip install it, or its venv's python)"
        )


# -- install / uninstall / status -----------------------------------------------------------


def install(kind: TimerKind | None = None, *, dry_run: bool = False, home: Path | None = None) -> Plan:
    """Install this home's timer entry (``kind``: the machine's when None); idempotent: the same
    entry twice changes nothing, a changed one (another pisub, another ``PATH``) replaces the old
    one in place, and the other kind's entry of this home is removed.

    Raises:
        TimerError: no timer on this machine, or ``crontab``/``systemctl`` failed.
        InvalidInput: the home's or the Python's path cannot be written into the entry.
    """
    check_path_text("the pisub home", str(home if home is not None else default_home()))
    opened = open_home(home)  # (refused first: a home no entry can name is not created)
    root = str(opened.root)
    chosen = kind if kind is not None else available_kind()
    if chosen is None:
        raise TimerError(
            "no timer on this machine: no systemd user manager answers `systemctl --user` and there is "
            "no crontab command (install cron, e.g. apt-get install cron; or run pisub schedule tick every "
            "minute)"
        )
    pisub = pisub_command()
    check_path_text("the pisub home", root)
    check_path_text("the Python running pisub", pisub[0])
    _check_runs(pisub, tick_env(root))
    if chosen is TimerKind.CRON:
        return _install_cron(opened, pisub, dry_run)
    return _install_systemd(opened, pisub, dry_run)


def _install_cron(home: Home, pisub: list[str], dry_run: bool) -> Plan:
    root = str(home.root)
    digest = home_hash(root)
    notes: list[str] = []
    line, env = _cron_line_fitting(root, pisub, notes)
    command = [_ENV, *(f"{k}={v}" for k, v in env), *pisub, *tick_args(TimerKind.CRON)]
    if any("%" in word for word in command):
        notes.append("a % in a path is written as \\% (cron reads a bare % as a newline)")
    removed: list[Installed] = []
    if dry_run:
        try:
            current = read_crontab()
            changed = with_cron_line(current, line.encode(), digest) != current
        except TimerError as exc:
            changed = True
            notes.append(f"the crontab cannot be read here: {exc.message}")
    else:
        with user_lock():
            current = read_crontab()
            new = with_cron_line(current, line.encode(), digest)
            changed = new != current
            if changed:
                write_crontab(new)
                kept = read_crontab()
                if sum(1 for x in kept.split(b"\n") if x == line.encode()) != 1:
                    raise TimerError(
                        "the crontab did not keep the new entry (another program rewrote it?): try again"
                    )
            removed = _remove_units(home)
            _keep_record(home, TimerKind.CRON, line, pisub)
        if cron_daemon() is None:
            notes.append(NO_CRON_DAEMON)
    return Plan(
        kind=TimerKind.CRON,
        home=root,
        pisub=pisub,
        command=command,
        entry=line,
        files=[],
        changed=changed,
        dry_run=dry_run,
        owner=_user_name(),
        removed=removed,
        notes=notes,
    )


NO_CRON_DAEMON = (
    "no cron daemon runs on this machine (no cron or crond process): the entry fires once one runs "
    "(e.g. sudo service cron start)"
)


def _keep_record(home: Home, kind: TimerKind, entry: str, pisub: list[str]) -> None:
    from pisub.protocol.codec import now_iso

    old = _read_record(home)
    if old is not None and old.kind is kind and old.entry == entry and old.pisub == pisub:
        return  # installed as it was: its time stays
    _write_record(home, TimerRecord(kind=kind, installed_at=now_iso(), entry=entry, pisub=pisub))


def _install_systemd(home: Home, pisub: list[str], dry_run: bool) -> Plan:
    from pisub.core.fsio import atomic_write

    root = str(home.root)
    digest = home_hash(root)
    env = tick_env(root)
    service_text, timer_text = unit_texts(root, pisub, env)
    where = unit_dir()
    check_path_text("the systemd unit folder", str(where))
    service_name, timer_name = unit_names(root)
    files = [UnitFile(str(where / service_name), service_text), UnitFile(str(where / timer_name), timer_text)]
    command = [*pisub, *tick_args(TimerKind.SYSTEMD)]
    changed = any(_read_text(Path(f.path)) != f.text for f in files)
    notes: list[str] = []
    if _lingers() is False:
        notes.append(LINGER_NOTE)
    removed: list[Installed] = []
    if dry_run:
        if not user_manager():
            notes.append("no systemd user manager answers `systemctl --user` here: the install would fail")
    else:
        if not user_manager():
            raise TimerError(
                "no systemd user manager answers `systemctl --user` (no user session bus): use --cron instead"
            )
        with user_lock():
            try:
                where.mkdir(mode=0o700, parents=True, exist_ok=True)
                for unit in files:
                    atomic_write(Path(unit.path), unit.text.encode())
            except OSError as exc:
                raise storage_error(exc, "write the unit files in", where) from exc
            _systemctl("daemon-reload")
            _systemctl("enable", "--now", timer_name)
            try:
                removed = _remove_cron_line(digest)
            except TimerError as exc:  # the timer is installed; an old line may stay
                notes.append(f"a crontab line of this home could not be removed: {exc.message}")
            _keep_record(home, TimerKind.SYSTEMD, files[1].path, pisub)
    return Plan(
        kind=TimerKind.SYSTEMD,
        home=root,
        pisub=pisub,
        command=command,
        entry=files[1].path,
        files=files,
        changed=changed,
        dry_run=dry_run,
        owner=_user_name(),
        removed=removed,
        notes=notes,
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _remove_cron_line(digest: str) -> list[Installed]:
    """This home's crontab lines, removed (none when there is no crontab command)."""
    if shutil.which("crontab") is None:
        return []
    current = read_crontab()
    new, ours = without_cron_line(current, digest)
    if not ours:
        return []
    write_crontab(new)
    return [_cron_installed(x.decode("utf-8", "replace"), None) for x in ours]


def _remove_units(home: Home) -> list[Installed]:
    """This home's systemd units, stopped (when a manager answers) and removed."""
    root = str(home.root)
    service_name, timer_name = unit_names(root)
    where = unit_dir()
    found = [where / n for n in (service_name, timer_name) if (where / n).exists()]
    if not found:
        return []
    manager = user_manager()
    if manager:
        _systemctl("disable", "--now", timer_name, check=False)
    entry = _unit_installed(where / timer_name, where / service_name, None)
    for path in found:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error(exc, "remove", path) from exc
    if manager:
        _systemctl("daemon-reload", check=False)
    return [entry]


@dataclass(frozen=True)
class Uninstalled:
    """What ``uninstall`` removed (nothing when no timer of the home was installed)."""

    home: str
    removed: list[Installed]


def uninstall(*, home: Path | None = None) -> Uninstalled:
    """Remove this home's timer entries (its crontab line, its systemd units); every other line
    and unit stays. A home that no longer exists is not created again (its entry still goes).

    Raises:
        TimerError: ``crontab`` failed.
    """
    opened = open_home(home, create=False)
    digest = home_hash(str(opened.root))
    with user_lock():
        removed = _remove_cron_line(digest) + _remove_units(opened)
        if opened.root.is_dir():
            _drop_record(opened)
    return Uninstalled(str(opened.root), removed)


def _cron_installed(line: str, daemon: bool | None) -> Installed:
    pisub = parse_cron_pisub(line)
    return Installed(TimerKind.CRON, line, pisub, bool(pisub) and os.path.exists(pisub[0]), daemon)


def _unit_installed(timer: Path, service: Path, active: bool | None) -> Installed:
    pisub = parse_unit_pisub(_read_text(service) or "")
    return Installed(TimerKind.SYSTEMD, str(timer), pisub, bool(pisub) and os.path.exists(pisub[0]), active)


def installed(home: Home, problems: list[str] | None = None) -> list[Installed]:
    """This home's timer entries on the machine (a crontab that cannot be read is named in
    ``problems``, never raised)."""
    root = str(home.root)
    digest = home_hash(root)
    found: list[Installed] = []
    if shutil.which("crontab") is not None:
        try:
            lines = [x for x in read_crontab().split(b"\n") if _is_ours(x, digest)]
        except TimerError as exc:
            lines = []
            if problems is not None:
                problems.append(f"the crontab cannot be read: {exc.message}")
        if lines:
            daemon = cron_daemon() is not None
            found += [_cron_installed(x.decode("utf-8", "replace"), daemon) for x in lines]
    service_name, timer_name = unit_names(root)
    where = unit_dir()
    if (where / timer_name).exists() or (where / service_name).exists():
        active: bool | None = None
        if user_manager():
            with contextlib.suppress(TimerError):
                code, out, _ = _tool(["systemctl", "--user", "is-active", timer_name])
                active = code == 0 and out.strip() == b"active"
        found.append(_unit_installed(where / timer_name, where / service_name, active))
    return found


def last_tick(home: Home, problems: list[str] | None = None) -> LastTick | None:
    """``<home>/schedules/last-tick.json`` as the last ``pisub schedule tick`` wrote it (None: no
    tick yet; one that cannot be read is named in ``problems``)."""
    from pisub.core.fsio import load_json
    from pisub.protocol.codec import parse_iso
    from pisub.protocol.schedule import LastTick as TickRecord
    from pisub.store.schedules import LAST_TICK

    path = home.schedules / LAST_TICK
    try:
        tick = load_json(path, TickRecord, limit=RECORD_LIMIT)
        age = time.time() - parse_iso(tick.at)
    except FileNotFoundError:
        return None
    except (PisubError, ValueError) as exc:
        if problems is not None:
            why = exc.message if isinstance(exc, PisubError) else f"its time {exc}"
            problems.append(f"{LAST_TICK} cannot be read ({why}): the next tick rewrites it")
        return None
    return LastTick(at=tick.at, age_s=max(0.0, age), source=tick.source, fired=tick.fired)


def gone_homes() -> list[str]:
    """Homes that crontab entries of pisub tick (any home's marker) but that no longer exist: a
    home removed without ``uninstall`` (never raises)."""
    if shutil.which("crontab") is None:
        return []
    try:
        lines = read_crontab().split(b"\n")
    except TimerError:
        return []
    gone: list[str] = []
    for line in lines:
        if _MARKED.search(line) is None:
            continue
        fields = line.decode("utf-8", "replace").split(None, 5)
        try:
            words = shlex.split(fields[5].replace("\\%", "%"), comments=True) if len(fields) == 6 else []
        except ValueError:
            continue
        for word in words:
            if word.startswith("PISUB_HOME="):
                root = word.removeprefix("PISUB_HOME=")
                if os.path.isabs(root) and not os.path.lexists(root) and root not in gone:
                    gone.append(root)
                break
    return gone


def ago(seconds: float) -> str:
    """``40 s``, ``5 min``, ``3 h``, ``2 d``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def status(home: Path | None = None) -> TimerStatus:
    """What is installed for the home, its last tick, and what looks wrong (never raises for a
    problem it can describe)."""
    from pisub.store.paths import open_home_to_read

    return timer_status(open_home_to_read(home))  # (it only reads: a missing home is not made)


def timer_status(home: Home) -> TimerStatus:
    """:func:`status` of an opened home."""
    warnings: list[str] = []
    notes: list[str] = []
    found = installed(home, warnings)
    tick = last_tick(home, warnings)
    record = _read_record(home)
    for entry in found:
        what = "crontab entry" if entry.kind is TimerKind.CRON else "systemd timer"
        if not entry.pisub:
            warnings.append(f"the {what} cannot be read: pisub schedule install writes it again")
        elif not entry.pisub_exists:
            warnings.append(
                f"the pisub the {what} runs ({entry.pisub[0]}) no longer exists: run pisub schedule install "
                "again from the pisub to use"
            )
        if entry.kind is TimerKind.CRON and entry.active is False:
            warnings.append(NO_CRON_DAEMON)
        if entry.kind is TimerKind.SYSTEMD and entry.active is False:
            _, timer_name = unit_names(str(home.root))
            warnings.append(f"the timer unit is not active: systemctl --user enable --now {timer_name}")
        if entry.kind is TimerKind.SYSTEMD and _lingers() is False:
            notes.append(LINGER_NOTE)
    if len({e.kind for e in found}) > 1:
        warnings.append(
            "both a crontab entry and a systemd timer tick this home: pisub schedule install keeps one"
        )
    if found:
        stale = _stale(found[0], tick, record)
        if stale:
            warnings.append(stale)
    elif record is not None:
        warnings.append(
            f"a {record.kind.value} timer was installed at {record.installed_at} but is gone (removed "
            "outside pisub): pisub schedule install puts it back"
        )
    gone = gone_homes()
    if gone:
        shown = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
        notes.append(
            f"{len(gone)} crontab entr{'y ticks a pisub home' if len(gone) == 1 else 'ies tick pisub homes'} "
            f"that no longer exist{'s' if len(gone) == 1 else ''} ({shown}): "
            "PISUB_HOME=<that path> pisub schedule uninstall removes one"
        )
    return TimerStatus(str(home.root), found, tick, warnings, notes, None if found else available_kind())


def _stale(entry: Installed, tick: LastTick | None, record: TimerRecord | None) -> str | None:
    """A warning when the installed timer is not ticking: the last tick older than
    :data:`TICK_STALE_S`, or none that long after the install."""
    from pisub.protocol.codec import parse_iso

    why = "is the cron daemon running?" if entry.kind is TimerKind.CRON else "systemctl --user status"
    if tick is not None:
        if tick.age_s > TICK_STALE_S:
            return (
                f"the last tick was {ago(tick.age_s)} ago while a {entry.kind.value} timer is installed: "
                f"it is not ticking ({why})"
            )
        return None
    since: float | None = None
    if record is not None and record.kind is entry.kind:
        with contextlib.suppress(ValueError):
            since = time.time() - parse_iso(record.installed_at)
    elif entry.kind is TimerKind.SYSTEMD:
        with contextlib.suppress(OSError):
            since = time.time() - os.stat(entry.entry).st_mtime
    if since is not None and since > TICK_STALE_S:
        kind = entry.kind.value
        return f"installed {ago(since)} ago and never ticked: the {kind} timer is not ticking ({why})"
    return None


# -- pisub doctor ---------------------------------------------------------------------------


def count_schedules(home: Home) -> int:
    """Schedules of the home (every project's)."""
    from pisub.store.schedules import ScheduleStore

    try:
        return len(ScheduleStore(home).ids())
    except PisubError:
        return 0


NO_TIMER = (
    "no timer installed: schedules fire only on `pisub schedule tick` (install one: pisub schedule install)"
)


def doctor_check(home: Home) -> tuple[bool, str, str]:
    """``pisub doctor``'s schedules line: (ok, detail, fix). No timer is a warning when schedules
    exist (ok); an installed timer that is not ticking, or runs a pisub that is gone, is a
    problem when schedules exist (a warning otherwise)."""
    count = count_schedules(home)
    state = timer_status(home)
    head = f"{count} schedule{'' if count == 1 else 's'}"
    if not state.installed:
        if count:
            return True, f"warning: {head}; {NO_TIMER}", ""
        return True, f"{head}; {NO_TIMER}", ""
    kinds = "+".join(dict.fromkeys(e.kind.value for e in state.installed))
    tick = state.last_tick
    when = f"last tick {ago(tick.age_s)} ago" if tick is not None else "no tick yet"
    detail = f"{head}; timer: {kinds} ({when})"
    if not state.warnings:
        return True, detail, ""
    problem = "; ".join(state.warnings)
    if count:
        return (
            False,
            f"{detail}: {problem}",
            "pisub schedule timer says more; pisub schedule install repairs the entry",
        )
    return True, f"warning: {detail}: {problem}", ""
