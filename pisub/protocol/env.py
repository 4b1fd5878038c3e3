"""The environment a run's processes get: the variables that mark them as a run's (the
child-environment contract of spec/protocol.md)."""

from __future__ import annotations

ENV_RUN_ID = "PISUB_RUN_ID"
"""Set in every child's environment: the run it belongs to (finds strays after a crash)."""
ENV_RUN_DIR = "PISUB_RUN_DIR"
"""Set in every child's environment: its run directory."""
ENV_ROOT_RUN_ID = "PISUB_ROOT_RUN_ID"
"""Set in every child's environment: the top-level run of its tree (its own run at the top)."""
ENV_DEPTH = "PISUB_DEPTH"
"""Set in every child's environment: the depth of its run (0 for a top-level run)."""
ENV_MAX_DEPTH = "PISUB_MAX_DEPTH"
"""The deepest run a launch may create below the top level. Set by a user (default
:data:`~pisub.defaults.DEFAULT_MAX_DEPTH`) and, in every child's environment, by its runner to
the limit that holds inside the run (an agent's ``maxDepth`` may lower it, never raise it)."""
ENV_RUNNER = "PISUB_RUNNER"
"""Set in a runner's own environment (never its child's): the run it supervises. A runner
started from inside another run's tree is adopted by that run's runner, which must not end it
with its own leftovers (:mod:`pisub.runner.tree`)."""
RUN_MARKERS = (ENV_RUN_ID, ENV_RUN_DIR, ENV_ROOT_RUN_ID, ENV_DEPTH, ENV_RUNNER)
"""The variables that say which run a process belongs to."""
