"""Which pi pisub drives, and every difference between the supported versions, in one table.

pisub supports pi **0.85.x and 1.x** (``>= 0.85.0, < 2``). 1.x is the current line (the
default pin); 0.85.x is the line the original pi-subagents extension requires. 0.73.1 (the
last ``@mariozechner`` release) was dropped: its Node-20-era start-up takes 1.4 s, closing its
stdin leaves the bash tool's processes alive, it has no ``clear_queue`` or ``--approve``, and
testing it in CI would cost another two minutes for a version its users have left.

The version is detected once per binary (:func:`detect_version`: ``pi --version``, cached under
the home by the binary's path, inode, size, mtime and ctime), recorded in the run's manifest,
and turned into :class:`PiCaps` — the only place that knows how versions differ. Nothing else
in pisub compares pi versions.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import msgspec

from pisub.core.procs import run_bounded
from pisub.errors import UnsupportedPi
from pisub.termsafe import printable

SUPPORTED = "pi 0.85.x or 1.x (>= 0.85.0, < 2.0.0)"
"""The supported range, as refusals and ``pisub doctor`` say it."""

MIN_VERSION = (0, 85, 0)
MAX_VERSION_EXCLUSIVE = (2, 0, 0)
INSTALL_HINT = (
    "install a supported pi with scripts/install_pi.sh, or: npm install -g @earendil-works/pi-coding-agent@1 "
    "(Node >= 22.19), and set PISUB_PI_BIN"
)
CHECKOUT_PI_CLI = Path(__file__).resolve().parents[3] / ".pi-cli"
"""Where ``scripts/install_pi.sh`` installs pi when pisub runs from a checkout (the demo)."""


def installed_pi(pi_cli: Path = CHECKOUT_PI_CLI) -> Path | None:
    """The newest supported ``<checkout>/.pi-cli/<version>/bin/pi`` that is an executable file,
    when pisub runs from a checkout where ``scripts/install_pi.sh`` installed one."""
    found: list[tuple[tuple[int, ...], Path]] = []
    try:
        entries = list(pi_cli.iterdir())
    except OSError:
        return None
    for entry in entries:
        if not _EXACT_RE.fullmatch(entry.name):
            continue
        version = tuple(int(part) for part in entry.name.split("."))
        launcher = entry / "bin" / "pi"
        if (
            MIN_VERSION <= version < MAX_VERSION_EXCLUSIVE
            and launcher.is_file()
            and os.access(launcher, os.X_OK)
        ):
            found.append((version, launcher))
    return max(found)[1] if found else None


def install_hint() -> str:
    """How to get a pi: the one this checkout installed when there is one, else how to install."""
    launcher = installed_pi()
    if launcher is None:
        return INSTALL_HINT
    shown = printable(os.fspath(launcher), one_line=True)
    env_sh = printable(os.fspath(launcher.parents[2].parent / "scripts" / "env.sh"), one_line=True)
    return f"scripts/install_pi.sh installed one: export PISUB_PI_BIN={shown} (or: . {env_sh})"


VERSION_TIMEOUT_S = 30.0
"""How long ``pi --version`` may take: a Node start-up, which on a loaded 2-core machine took
more than 10 s (asked once per binary per home, then cached); as long as ``--list-models``."""
_VERSION_RE = re.compile(r"([0-9]+)\.([0-9]+)\.([0-9]+)")
_EXACT_RE = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}", re.ASCII)
"""What ``pi --version`` must print: one line, ASCII digits, nothing else."""


class PiCaps(msgspec.Struct, frozen=True):
    """What a pi version can do, where versions differ."""

    version: tuple[int, int, int]
    clear_queue: bool = True
    """``clear_queue`` RPC (0.84.4+): emptied before an abort, since 0.85 would otherwise start a
    new run with the queued message."""
    approve_flag: bool = True
    """``--approve`` (0.85+): without it RPC mode ignores a project's ``.pi/`` resources."""
    agent_settled: bool = True
    """``agent_settled`` event (0.80.4+): a trigger for the idle check (always confirmed by
    ``get_state``: 0.85+ also emits a stray one early in a run)."""
    system_messages: bool = False
    """``role: "system"`` messages (~8 KB each) in events (1.x): kept out of ``events.jsonl``."""

    @property
    def text(self) -> str:
        return ".".join(map(str, self.version))


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of an exact ``X.Y.Z``; None for anything else."""
    match = _VERSION_RE.fullmatch(text) if _EXACT_RE.fullmatch(text) else None
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def caps_for(version: str) -> PiCaps:
    """The capabilities of pi ``version``.

    Raises:
        UnsupportedPi: naming the supported range.
    """
    parsed = parse_version(version)
    if parsed is None or not MIN_VERSION <= parsed < MAX_VERSION_EXCLUSIVE:
        raise UnsupportedPi(f"pi {version or '(unknown version)'} is not supported: pisub drives {SUPPORTED}")
    return PiCaps(version=parsed, system_messages=parsed >= (1, 0, 0))


def detect_version(pi_bin: str, cache_dir: Path | None = None) -> str:
    """The version of the pi at ``pi_bin``, as ``pi --version`` prints it, normalised to
    ``MAJOR.MINOR.PATCH``. Running it is the proof that it runs at all (pi 1.x under Node 20
    dies at import); the answer is cached by the binary's path, inode, size and both its times
    (its ctime cannot be set back), so a replaced binary is asked again.

    Raises:
        UnsupportedPi: it does not run, hangs, or prints no single ``X.Y.Z`` line.
    """
    key = _cache_key(pi_bin)
    cache = cache_dir / "pi-versions.json" if cache_dir is not None else None
    cached = _read_cache(cache).get(key) if cache is not None and key else None
    if isinstance(cached, str) and _EXACT_RE.fullmatch(cached):
        return cached
    version = _run_version(pi_bin)
    if cache is not None and key:
        _write_cache(cache, key, version)
    return version


def _cache_key(pi_bin: str) -> str | None:
    try:
        real = os.path.realpath(pi_bin)
        st = os.stat(real)
    except OSError:
        return None
    return f"{real}\0{st.st_dev}:{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"


def _read_cache(path: Path) -> dict[str, str]:
    """The cached versions (empty: no cache, or one that does not decode — a miss)."""
    from pisub.core.fsio import read_bytes
    from pisub.errors import ProtocolError
    from pisub.protocol.cache import PiVersions
    from pisub.protocol.codec import decode

    try:
        raw = read_bytes(path, limit=1_000_000)
    except OSError:
        return {}
    try:
        return dict(decode(raw, PiVersions, "pi-versions.json").versions)
    except ProtocolError:
        return _legacy_cache(raw)


def _legacy_cache(raw: bytes) -> dict[str, str]:
    """A file of a pisub from before ``v`` (a bare ``{key: version}`` object) still loads: its
    entries that are versions. Anything else (another ``v``, not JSON) is a miss."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or "v" in data:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str) and _EXACT_RE.fullmatch(v)}


def _write_cache(path: Path, key: str, version: str) -> None:
    """Remember a detected version (best effort: a failed write only costs the next detection)."""
    from pisub.core.fsio import atomic_write, private_mkdir
    from pisub.protocol.cache import PiVersions
    from pisub.protocol.codec import encode

    entries = _read_cache(path)
    entries.pop(key, None)  # the latest written last: the 64 kept are the latest
    entries[key] = version
    try:
        private_mkdir(path.parent)
        record = PiVersions(v=1, versions=dict(list(entries.items())[-64:]))
        atomic_write(path, encode(record), durable=False)
    except OSError:
        pass


def _run_version(pi_bin: str) -> str:
    """``pi --version`` (see :func:`pisub.core.procs.run_bounded`)."""
    try:
        done = run_bounded([pi_bin, "--version"], timeout=VERSION_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        raise UnsupportedPi(f"{pi_bin} --version cannot be run: {exc}; {INSTALL_HINT}") from exc
    if done.timed_out:
        raise UnsupportedPi(
            f"{pi_bin} --version did not answer within {VERSION_TIMEOUT_S:g}s; {INSTALL_HINT}"
        )
    code, out, err = done.returncode, done.stdout, done.stderr
    stdout, stderr = out[:65536].decode("utf-8", "replace"), err[:65536].decode("utf-8", "replace")
    # 1.x prints the version on stdout, older releases on stderr: exactly one line, X.Y.Z.
    lines = [line.strip() for line in (stdout if stdout.strip() else stderr).splitlines() if line.strip()]
    if code == 0 and len(lines) == 1 and _EXACT_RE.fullmatch(lines[0]):
        return ".".join(str(int(part)) for part in lines[0].split("."))
    said = " ".join((stderr or stdout).split())
    why = (said if len(said) <= 300 else "…" + said[-299:].lstrip()) or f"exit code {code}"  # its end
    if "enableCompileCache" in said:  # pi 0.85+ under an older Node dies at import
        why = "it needs Node >= 22.19, and the Node it finds is older"
    raise UnsupportedPi(f"{pi_bin} does not run as a pi (--version: {why}); {INSTALL_HINT}")


def supported_version(pi_bin: str, cache_dir: Path | None = None) -> str:
    """The version of the pi at ``pi_bin``, once it is known to be supported.

    Raises:
        UnsupportedPi: it does not run, or its version is outside :data:`SUPPORTED` (one line).
    """
    version = detect_version(pi_bin, cache_dir)
    caps_for(version)
    return version


def caps_of(version: str | None) -> PiCaps:
    """The capabilities to drive a run with: those of its recorded version; for a manifest
    without one (written before versions were recorded) the most careful set."""
    if version is None:
        return PiCaps(version=(0, 0, 0), clear_queue=False, approve_flag=False, system_messages=True)
    try:
        return caps_for(version)
    except UnsupportedPi:
        return PiCaps(version=(0, 0, 0), clear_queue=False, approve_flag=False, system_messages=True)
