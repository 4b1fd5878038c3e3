"""Keys a damaged journal no longer names: found again from the children's own manifests.

A journal line that does not decode (a bad disk block, a hand edit) may have been the
``started`` entry of a child that runs or ran. Without it a resumed workflow would start that
key a second time, breaking "a child is never started twice" (spec/protocol.md, Resume). So when
a replay skipped lines, the coordinator looks at the home's runs once: a run whose manifest
names a key and a parent that is a run of this workflow (its manifest names the same journal)
is that key's child, and is re-attached like a journaled start.
"""

from __future__ import annotations

from pisub.errors import PisubError
from pisub.store.journal import KeyRecord, Replay
from pisub.store.paths import Home
from pisub.store.runs import RunStore, load_manifest


def children_by_key(home: Home, journal: str) -> dict[str, str]:
    """``{key: run id}`` of every run in ``home`` started by a run of the workflow whose journal
    is ``journal`` (the newest by run id order when a key has several; unreadable runs are
    skipped)."""
    parents: dict[str, bool] = {}

    def ours(parent: str) -> bool:
        if parent not in parents:
            try:
                spec = load_manifest(home.run(parent)).workflow
            except (PisubError, OSError):
                spec = None
            parents[parent] = spec is not None and spec.journal == journal
        return parents[parent]

    found: dict[str, tuple[str, str]] = {}
    for run_id in RunStore(home).ids():
        try:
            manifest = load_manifest(home.run(run_id))
        except (PisubError, OSError):
            continue
        key, parent = manifest.key, manifest.parent_run_id
        if key is None or parent is None or not ours(parent):
            continue
        known = found.get(key)
        if known is None or known[0] < manifest.created_at:
            found[key] = (manifest.created_at, run_id)
    return {key: run_id for key, (_, run_id) in found.items()}


def recover_lost_keys(home: Home, journal: str, replayed: Replay) -> int:
    """When ``replayed`` skipped lines, add the children of this workflow that its journal no
    longer names (re-attached on resume, their parameters unchecked); the number added."""
    if not replayed.skipped:
        return 0
    added = 0
    for key, run_id in children_by_key(home, journal).items():
        if key in replayed.keys or key in replayed.host:
            continue
        replayed.keys[key] = KeyRecord(fingerprint="", run_id=run_id, created=True, recovered=True)
        added += 1
    return added
