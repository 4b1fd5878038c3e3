"""Named workflow resources through the API: ``launch_resource("run-ci", {"command": "npm
test"})`` and ``list_resources()`` (``spec/resources.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from pisub.api.options import WorkflowOptions

if TYPE_CHECKING:
    from pisub.api.client import Run
    from pisub.workflow.resources import ResourceInfo


def launch_resource(name: str, args: dict[str, Any] | None = None, **options: Unpack[WorkflowOptions]) -> Run:
    """Start the named workflow resource ``name`` (``review``, ``run-ci``, or one registered in
    the user's ``config.toml``) with ``args`` as a detached workflow run; its provenance is in
    ``manifest().workflow.resource``; ``options`` are :func:`pisub.launch_workflow`'s. Only a
    resource's workflow may run host commands (``runs.host``), and only those its permit lists.

    Raises:
        InvalidInput: no such resource, bad args (naming the arg), or a config resource that is
            not safe to run (naming why).
    """
    from pisub.api.client import _launch_workflow
    from pisub.protocol.workflow import Shape
    from pisub.store.paths import open_home
    from pisub.workflow.resources import resolve

    resolved = resolve(name, args, open_home(options.get("home")).root)
    return _launch_workflow(
        Shape.WORKFLOW,
        name=resolved.origin.name,
        script_text=resolved.text,
        language=resolved.language,
        permit=resolved.permit,
        resource=resolved.origin,
        args=resolved.args,
        **options,
    )


def list_resources(*, home: Path | None = None) -> list[ResourceInfo]:
    """Every named workflow resource: the builtins, then the user's config ones.

    Raises:
        InvalidInput: the config is bad or registers a resource that shadows a builtin.
    """
    from pisub.store.paths import open_home_to_read
    from pisub.workflow.resources import list_all

    return list_all(open_home_to_read(home).root)
