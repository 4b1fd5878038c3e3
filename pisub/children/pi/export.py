"""pi's own HTML export of a session (``pi --export SESSION OUT``), as ``pisub share`` runs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pisub.errors import LaunchFailed

EXPORT_TIMEOUT_S = 120.0


def export_html(pi: str, session: Path, out: Path) -> None:
    """Have ``pi`` write the HTML export of ``session`` to ``out`` (a new path in a private
    directory); offline, without a terminal.

    Raises:
        LaunchFailed: pi cannot start, fails or takes longer than :data:`EXPORT_TIMEOUT_S`
            (its last stderr line in the message), or wrote nothing.
    """
    env = {**os.environ, "PI_OFFLINE": "1"}
    try:
        done = subprocess.run(
            [pi, "--export", str(session), str(out)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            cwd=out.parent,
            timeout=EXPORT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LaunchFailed(f"pi --export took longer than {EXPORT_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise LaunchFailed(f"cannot run {pi}: {exc.strerror or exc}") from None
    if done.returncode != 0 or not out.is_file():
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["(no message)"]
        raise LaunchFailed(f"pi --export failed (exit {done.returncode}): {lines[-1][:300]}")
