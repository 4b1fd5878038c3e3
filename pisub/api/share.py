"""``pisub share RUN``: a pi run's session exported as HTML the way ``pi --export`` writes it,
to a file on this machine (the seed's ``share: true`` uploads it to a gist; pisub writes the
file and says where). The file is new or replaced whole (0600, renamed into place: a symlink at
the destination is replaced, never followed)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import msgspec

from pisub.errors import InvalidInput, NotResumable, storage_error
from pisub.runs.run_options import MAX_NAME_BYTES, inside
from pisub.termsafe import has_controls

SHARE_FILE = "share.html"
"""The export's name in the run directory when no ``out`` is given."""


class Shared(msgspec.Struct, rename="camel", kw_only=True):
    """What ``share`` wrote: ``{"runId", "path"}``."""

    run_id: str
    path: str


def share(ref: str, out: str | Path | None = None, *, home: Path | None = None) -> Shared:
    """Export the pi session of run ``ref`` to ``out`` (default ``<run dir>/share.html``).

    Raises:
        NotResumable: the run is not a pi run or has no session file yet.
        InvalidInput: ``out`` is a directory or a special file, its directory is missing, its
            name is over 255 bytes, or it is inside pisub's home (but the default).
        LaunchFailed: pi cannot export it.
    """
    from pisub.api.client import Run
    from pisub.children.pi.export import export_html
    from pisub.children.pi.rpc import find_pi

    run = Run(ref, home=home)
    if run.manifest().agent.runner != "pi":
        raise NotResumable(f"run {run.id} is not a pi run: only a pi session can be shared")
    session = run.status().session_file
    if session is None or not os.path.isfile(session):
        raise NotResumable(f"run {run.id} has no session file yet: pi writes it after its first reply")
    default = run.dir / SHARE_FILE
    dest = _destination(Path(out) if out is not None else default)
    if dest != default and inside(dest, run.home.root):
        raise InvalidInput(f"--out: {dest} is inside pisub's home {run.home.root}; give a file of your own")
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".pisub-share-", dir=dest.parent))
    except OSError as exc:
        raise storage_error(exc, "write in", dest.parent) from exc
    try:
        written = scratch / SHARE_FILE
        export_html(find_pi(), Path(session), written)
        try:
            os.chmod(written, 0o600)
            os.replace(written, dest)
        except OSError as exc:
            raise storage_error(exc, "write", dest) from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Shared(run_id=run.id, path=str(dest))


def _destination(given: Path) -> Path:
    """``given`` made absolute, when a file may be put there.

    Raises:
        InvalidInput: naming ``--out``.
    """
    text = str(given)
    if not text.strip() or has_controls(text):
        raise InvalidInput("--out: give a file path without control characters")
    dest = Path(os.path.abspath(given))
    parent = Path(os.path.realpath(dest.parent))
    if not parent.is_dir():
        raise InvalidInput(f"--out: {dest.parent} is not a directory")
    dest = parent / dest.name
    if len(os.fsencode(dest.name)) > MAX_NAME_BYTES:
        raise InvalidInput(f"--out: the file name is longer than {MAX_NAME_BYTES} bytes")
    try:
        info = os.lstat(dest)
    except FileNotFoundError:
        return dest
    except OSError as exc:
        raise storage_error(exc, "read", dest) from exc
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        raise InvalidInput(f"--out: {dest} exists and is not a regular file")
    return dest
