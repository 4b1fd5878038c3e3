"""Where a new run sits in a tree of runs: its parent, its root, its depth and the depth limit.

A run launched from outside any run is a top-level run (depth 0, no parent). A run launched
from inside a run — by its child process (a pi that runs ``pisub run``) or by a workflow's
coordinator — is that run's child: one deeper, with the same root. Every child process carries
its run's markers (:data:`~pisub.store.paths.RUN_MARKERS` and ``PISUB_MAX_DEPTH``), which is how a
launch from inside a run knows where it is. A launch from a run whose depth is already at the
limit is refused before anything is created (:class:`~pisub.errors.DepthExceeded`).

The markers are guard rails against runaway recursion, not a security boundary: a child can
change its own environment.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from pisub.defaults import DEFAULT_MAX_DEPTH
from pisub.errors import DepthExceeded, InvalidInput
from pisub.protocol.env import ENV_DEPTH, ENV_MAX_DEPTH, ENV_ROOT_RUN_ID, ENV_RUN_ID
from pisub.store.paths import is_run_id

MAX_DEPTH_LIMIT = 1000
"""The largest depth (or depth limit) pisub accepts from an environment variable."""


class Lineage(msgspec.Struct, frozen=True):
    """The place of a run that is about to be created."""

    parent_run_id: str | None
    """The run it is started from, None at the top level."""
    root_run_id: str | None
    """The top-level run of its tree, None when it is itself the top."""
    depth: int
    max_depth: int
    """The depth limit that holds inside the new run (for the runs it starts in turn)."""

    @classmethod
    def top(cls, max_depth: int = DEFAULT_MAX_DEPTH) -> Lineage:
        return cls(parent_run_id=None, root_run_id=None, depth=0, max_depth=max_depth)

    def child(self, run_id: str, *, agent_max_depth: int | None = None) -> Lineage:
        """The place of a run started from inside run ``run_id`` (which sits at ``self``).

        Raises:
            DepthExceeded: ``self`` is already at the depth limit.
        """
        if self.depth >= self.max_depth:
            raise DepthExceeded(
                f"Nested subagent call blocked (depth={self.depth}, max={self.max_depth}): "
                "complete the current task directly instead of starting another run"
            )
        return Lineage(
            parent_run_id=run_id,
            root_run_id=self.root_run_id or run_id,
            depth=self.depth + 1,
            max_depth=self.max_depth,
        ).lowered(agent_max_depth)

    def lowered(self, agent_max_depth: int | None) -> Lineage:
        """The same place with the limit lowered by an agent's ``maxDepth`` (never raised)."""
        if agent_max_depth is None or agent_max_depth >= self.max_depth:
            return self
        return Lineage(self.parent_run_id, self.root_run_id, self.depth, agent_max_depth)


def caller_lineage(env: Mapping[str, str]) -> Lineage:
    """The place of a run launched by a process with environment ``env``.

    Raises:
        InvalidInput: a marker is malformed (naming the variable).
        DepthExceeded: the caller runs inside a run at the depth limit.
    """
    max_depth = _count(env, ENV_MAX_DEPTH, DEFAULT_MAX_DEPTH)
    parent = env.get(ENV_RUN_ID)
    if not parent:
        return Lineage.top(max_depth)
    if not is_run_id(parent):
        raise InvalidInput(f"{ENV_RUN_ID} is not a run id: {parent[:80]!r} (unset it outside pisub runs)")
    root = env.get(ENV_ROOT_RUN_ID) or parent
    if not is_run_id(root):
        raise InvalidInput(f"{ENV_ROOT_RUN_ID} is not a run id: {root[:80]!r}")
    here = Lineage(
        parent_run_id=None,
        root_run_id=root if root != parent else None,
        depth=_count(env, ENV_DEPTH, 0),
        max_depth=max_depth,
    )
    return here.child(parent)


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or int(raw) > MAX_DEPTH_LIMIT:
        raise InvalidInput(f"{name} must be a whole number from 0 to {MAX_DEPTH_LIMIT}, not {raw[:40]!r}")
    return int(raw)


def markers(run_id: str, root_run_id: str | None, depth: int, max_depth: int) -> dict[str, str]:
    """The lineage variables a child process of run ``run_id`` carries (besides its run dir)."""
    return {
        ENV_RUN_ID: run_id,
        ENV_ROOT_RUN_ID: root_run_id or run_id,
        ENV_DEPTH: str(depth),
        ENV_MAX_DEPTH: str(max_depth),
    }
