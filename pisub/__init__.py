"""pisub: a file-based control plane for detached background runs of coding sub-agents.

The public names are loaded on first use, so that ``import pisub.<module>`` (the CLI, the
runner) pays only for what it needs — the same reason some imports sit inside functions (the
lazy-import rule: README, "Development").
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: importing typing costs a launch ~10 ms before its warm runner)

__version__ = "0.2.0"

__all__ = [
    "PisubError",
    "Result",
    "Run",
    "RunState",
    "Status",
    "WorkflowFailed",
    "__version__",
    "agent_catalog",
    "group_add",
    "group_list",
    "group_pause",
    "group_resume",
    "group_rm",
    "group_set_limit",
    "launch",
    "launch_chain",
    "launch_lanes",
    "launch_parallel",
    "launch_resource",
    "launch_workflow",
    "list_resources",
    "list_runs",
    "resume",
    "resume_workflow",
    "retained_children",
    "schedule_create",
    "schedule_delete",
    "schedule_history",
    "schedule_list",
    "schedule_pause",
    "schedule_resume",
    "schedule_run",
    "schedule_run_due",
    "schedule_show",
    "schedule_tick",
    "validate_workflow",
]

_HOMES = {
    "Run": "pisub.api.client",
    "agent_catalog": "pisub.api.client",
    "launch": "pisub.api.client",
    "launch_chain": "pisub.api.client",
    "launch_lanes": "pisub.api.client",
    "retained_children": "pisub.api.client",
    "launch_parallel": "pisub.api.client",
    "launch_workflow": "pisub.api.client",
    "launch_resource": "pisub.api.resources",
    "list_resources": "pisub.api.resources",
    "list_runs": "pisub.api.client",
    "resume": "pisub.api.client",
    "resume_workflow": "pisub.api.client",
    "group_add": "pisub.api.groups",
    "group_list": "pisub.api.groups",
    "group_pause": "pisub.api.groups",
    "group_resume": "pisub.api.groups",
    "group_rm": "pisub.api.groups",
    "group_set_limit": "pisub.api.groups",
    "WorkflowFailed": "pisub.errors",
    "PisubError": "pisub.errors",
    "Result": "pisub.protocol.result",
    "RunState": "pisub.protocol.status",
    "Status": "pisub.protocol.status",
    "validate_workflow": "pisub.api.admin",
    "schedule_create": "pisub.api.schedules",
    "schedule_delete": "pisub.api.schedules",
    "schedule_history": "pisub.api.schedules",
    "schedule_list": "pisub.api.schedules",
    "schedule_pause": "pisub.api.schedules",
    "schedule_resume": "pisub.api.schedules",
    "schedule_run": "pisub.api.schedules",
    "schedule_run_due": "pisub.api.schedules",
    "schedule_show": "pisub.api.schedules",
    "schedule_tick": "pisub.api.schedules",
}

if TYPE_CHECKING:
    from typing import Any

    from pisub.api.admin import validate_workflow
    from pisub.api.client import (
        Run,
        agent_catalog,
        launch,
        launch_chain,
        launch_lanes,
        launch_parallel,
        launch_workflow,
        list_runs,
        resume,
        resume_workflow,
        retained_children,
    )
    from pisub.api.groups import (
        group_add,
        group_list,
        group_pause,
        group_resume,
        group_rm,
        group_set_limit,
    )
    from pisub.api.resources import launch_resource, list_resources
    from pisub.api.schedules import (
        schedule_create,
        schedule_delete,
        schedule_history,
        schedule_list,
        schedule_pause,
        schedule_resume,
        schedule_run,
        schedule_run_due,
        schedule_show,
        schedule_tick,
    )
    from pisub.errors import PisubError, WorkflowFailed
    from pisub.protocol.result import Result
    from pisub.protocol.status import RunState, Status


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pisub' has no attribute {name!r}")
