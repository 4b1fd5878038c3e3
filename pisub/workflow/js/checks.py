"""Static checks of a JavaScript workflow script (``validate``; also refused at launch/load).

STUB on main: the validate helper replaces it.
"""

from __future__ import annotations

from pisub.workflow.validate import Report


def validate_js(
    source: str, agents: set[str] | None, filename: str = "<workflow>", max_spawns: int | None = None
) -> Report:
    """Every problem of the JavaScript statement body ``source`` (see the module docstring)."""
    return Report()
