"""Shell completion of run ids (live runs first) and agent names (``pisub --install-completion``).
Completion never fails: whatever cannot be read is left out."""

from __future__ import annotations

import os
from typing import Any

MAX_SHOWN = 200


def run_ids(incomplete: str) -> list[str]:
    """Run ids starting with ``incomplete``: the live ones first, newest first within each."""
    from pisub.fsio import load_json
    from pisub.paths import is_run_id, open_home
    from pisub.protocol.status import Status

    try:
        runs = open_home().runs
        names = [n for n in os.listdir(runs) if n.startswith(incomplete) and is_run_id(n)]
    except Exception:
        return []
    ranked = []
    for name in names[: MAX_SHOWN * 5]:
        try:
            st = load_json(runs / name / "status.json", Status, limit=1 << 20)
            ranked.append((st.state.is_terminal, _negated(st.started_at), name))
        except Exception:
            ranked.append((True, "", name))
    return [name for _, _, name in sorted(ranked)][:MAX_SHOWN]


def _negated(stamp: str) -> str:
    """An ISO time sorting newest first."""
    return "".join(chr(0x10FFFF - ord(c)) if c.isdigit() else c for c in stamp)


def agent_names(incomplete: str) -> list[str]:
    try:
        from pisub.client import agent_catalog

        return sorted(name for name in agent_catalog().agents if name.startswith(incomplete))
    except Exception:
        return []


def _run_argument() -> Any:
    import typer

    return typer.Argument(..., metavar="RUN", autocompletion=run_ids)


RUN: Any = _run_argument()
"""A command's RUN argument (a run id or prefix), completed with :func:`run_ids`."""
