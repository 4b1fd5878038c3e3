"""What shell completion offers (``pisub --install-completion``): run ids (live runs first) and agent
names. Completion never fails: whatever cannot be read is left out, and a Tab press never writes."""

from __future__ import annotations

import os
from typing import Any

MAX_SHOWN = 200


def run_ids(incomplete: str) -> list[str]:
    """Run ids starting with ``incomplete``: the live ones first (from the index of live runs
        when it is complete, else from each run's status), the most recently active first within each
    (the run directory's mtime: a display order, nothing depends on it)."""
    from pisub.store import live_index
    from pisub.store.paths import LABEL_REF, is_run_id, open_home

    if incomplete.startswith(LABEL_REF):
        return _labels(incomplete[len(LABEL_REF) :])
    try:
        home = open_home(create=False)  # a Tab press never writes
        names = [n for n in os.listdir(home.runs) if n.startswith(incomplete) and is_run_id(n)]
    except Exception:
        return []
    live = set(live_index.live_ids(home) or []) if live_index.is_complete(home) else None
    ranked = [(_ended(home.runs, name, live), _newest_first(home.runs, name), name) for name in names]
    return [name for _, _, name in sorted(ranked)][:MAX_SHOWN]


def _labels(incomplete: str) -> list[str]:
    """``@LABEL`` for each run label starting with ``incomplete`` (those printable on one line),
    the most recently active run's first."""
    from pisub.core.fsio import load_json
    from pisub.protocol.status import Status
    from pisub.store.paths import RunPaths, is_run_id, open_home
    from pisub.termsafe import printable

    try:
        home = open_home(create=False)  # a Tab press never writes
        names = [n for n in os.listdir(home.runs) if is_run_id(n)]
    except Exception:
        return []
    found: dict[str, float] = {}
    for name in names:
        try:
            label = load_json(RunPaths(home.runs / name).status, Status, limit=1 << 20).label
        except Exception:
            continue
        if label and label.startswith(incomplete) and printable(label, one_line=True) == label:
            found[label] = min(found.get(label, 0.0), _newest_first(home.runs, name))
    return ["@" + label for label in sorted(found, key=lambda x: found[x])][:MAX_SHOWN]


def _ended(runs: Any, name: str, live: set[str] | None) -> bool:
    """Whether the run has ended (from the index when given, else from its status)."""
    if live is not None:
        return name not in live
    from pisub.core.fsio import load_json
    from pisub.protocol.status import Status
    from pisub.store.paths import RunPaths

    try:
        return load_json(RunPaths(runs / name).status, Status, limit=1 << 20).state.is_terminal
    except Exception:
        return True


def _newest_first(runs: Any, name: str) -> float:
    try:
        return -os.stat(runs / name, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def agent_names(incomplete: str) -> list[str]:
    try:
        from pathlib import Path

        from pisub.agents.catalog import discover
        from pisub.store.paths import open_home

        catalog = discover(open_home(create=False).agents, Path.cwd())  # a Tab press never writes
        return sorted(name for name in catalog.agents if name.startswith(incomplete))
    except Exception:
        return []
