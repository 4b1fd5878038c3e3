"""``pisub.api.launch.start`` refuses the option combinations ``pisub run`` refuses, with the
same ``INVALID_INPUT`` lines, before anything is created; the workflow launchers refuse
``backend``; a task may be a checked record or its JSON object."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

import pisub
from pisub.api.launch import start
from pisub.errors import InvalidInput
from pisub.protocol.workflow import ChildCall


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            {"workflow": "w.py", "parallel": "t.json"},
            "give one of --workflow, --workflow-script, --parallel, --chain, --lanes or --task",
        ),
        ({"tasks": [{"agent": "a", "task": "t"}], "lanes": "l.json"}, "give one of --workflow"),
        ({"agent": "a", "workflow": "w.py"}, "a workflow takes no --agent or TASK"),
        ({"task": "t", "chain": "c.json"}, "a workflow takes no --agent or TASK"),
        ({"workflow": "w.py", "backend": "slurm"}, "--backend places one run; a workflow's coordinator"),
        ({"agent": "a"}, "give --agent NAME and TASK"),
        ({}, "give --agent NAME and TASK"),
        ({"agent": "a", "task": "t", "isolation": "sideways"}, "isolation must be none or worktree"),
        ({"agent": "a", "task": "t", "context": "borrowed"}, "context: must be one of fresh, fork, profile"),
        ({"agent": "a", "task": "t", "max_output_lines": 0}, "maxOutput.lines must be a whole number"),
        ({"agent": "a", "task": "t", "usage_budget": {"tokens": {"hard": 1}}}, "is for workflows"),
        ({"parallel": [{"agent": "a", "task": "t"}], "args": {"x": 1}}, "--arg is for --workflow"),
    ],
)
def test_start_refuses_what_the_command_line_refuses(
    tmp_path: Path, call: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace("-", r"\-")):
        start(**call, home=tmp_path / "home")
    assert not (tmp_path / "home" / "runs").exists() or not list((tmp_path / "home" / "runs").iterdir())


def test_the_workflow_launchers_refuse_a_backend(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="--backend places one run"):
        pisub.launch_workflow(tmp_path / "w.py", backend="slurm", home=tmp_path / "home")
    with pytest.raises(InvalidInput, match="--backend places one run"):
        pisub.launch_parallel([{"agent": "a", "task": "t"}], backend="slurm", home=tmp_path / "home")


def test_a_task_is_a_record_or_its_json_object(tmp_path: Path) -> None:
    record = ChildCall(key="k", agent="nobody", task="t", idle_timeout=5)
    as_json = msgspec.to_builtins(record)
    assert as_json == {"key": "k", "agent": "nobody", "task": "t", "idleTimeout": 5}
    for given in (record, as_json):  # both reach the agent check (no such agent): nothing created
        with pytest.raises(pisub.PisubError, match=r"tasks\[0\] \(k\).*nobody"):
            pisub.launch_parallel([given], home=tmp_path / "home", cwd=tmp_path)


def test_a_misspelt_option_is_refused_not_left_aside() -> None:
    """Outside attack: ``start(..., timeout_s=5)`` started a run with the agent's timeout."""
    with pytest.raises(InvalidInput, match="unknown option 'timeout_s'"):
        start("echo", "x", timeout_s=5)  # type: ignore[call-arg]


@pytest.mark.parametrize("timeout", [True, "x", 10**400, float("nan")], ids=["bool", "str", "huge", "nan"])
def test_a_timeout_that_is_no_number_is_refused_before_a_run_exists(timeout: object) -> None:
    """Outside attack: ``timeout=True`` got past the checks and left a failed run."""
    with pytest.raises(InvalidInput, match="timeout must be a positive number of seconds"):
        start("echo", "x", timeout=timeout)  # type: ignore[arg-type]
