"""A workflow child named by its key before the coordinator wrote its steps (just launched)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pisub
from pisub.errors import InvalidInput
from pisub.protocol import AgentSpec, Limits, Manifest, now_iso
from pisub.protocol.lanes import Lane, Stage
from pisub.protocol.workflow import ChildCall, Shape, WorkflowSpec
from pisub.store.paths import Home
from pisub.store.runs import RunStore

RUN_ID = "6" * 8 + "-0000-4000-8000-" + "6" * 12


def _planned(tmp_path: Path, shape: Shape) -> pisub.Run:
    home = Home(tmp_path / "home")
    home.runs.mkdir(parents=True, mode=0o700)
    os.chmod(home.root, 0o700)
    if shape is Shape.LANES:
        stages = [Stage(key=k, task="x", agent="worker") for k in ("plan", "code")]
        spec = WorkflowSpec(shape=shape, lanes=[Lane(key="a", stages=stages)], journal=RUN_ID, budget=RUN_ID)
    else:
        calls = [ChildCall(key=f"task-{n}", agent="worker", task="x") for n in (1, 2)]
        spec = WorkflowSpec(shape=shape, tasks=calls, journal=RUN_ID, budget=RUN_ID)
    limits = Limits(timeout=30.0, idle_timeout=None, grace=1.0, output_cap=1 << 20, output_hard_cap=1 << 26)
    manifest = Manifest(
        v=1,
        run_id=RUN_ID,
        created_at=now_iso(),
        agent=AgentSpec(name="workflow", runner="workflow", command="workflow"),
        task="x",
        cwd=str(tmp_path),
        umask=0o22,
        limits=limits,
        workflow=spec,
    )
    _, lock = RunStore(home).create(manifest)
    os.close(lock)
    return pisub.Run(RUN_ID, home=home.root)


@pytest.mark.parametrize("shape", [Shape.PARALLEL, Shape.CHAIN])
def test_a_task_is_found_by_its_key_before_any_step_exists(tmp_path: Path, shape: Shape) -> None:
    run = _planned(tmp_path, shape)
    assert run.child_index("task-2") == 1
    with pytest.raises(InvalidInput, match="no child with key 'task-9'"):
        run.child_index("task-9")


@pytest.mark.parametrize("shape", [Shape.PARALLEL, Shape.CHAIN])
def test_a_wrong_index_names_the_children_numbers_from_0(tmp_path: Path, shape: Shape) -> None:
    """ "has no child 2 (it has 2)" read as a contradiction: the children are numbered from 0."""
    run = _planned(tmp_path, shape)
    assert run.child_index("1") == 1  # a task not called yet has its index already
    with pytest.raises(InvalidInput, match=r"has no child 2 \(its children are 0 to 1, or their keys\)$"):
        run.child_index("2")


def test_a_lanes_stage_not_reached_yet_is_named_as_such(tmp_path: Path) -> None:
    run = _planned(tmp_path, Shape.LANES)
    with pytest.raises(
        InvalidInput, match=r"child a\.code of .* has not started yet: a lanes stage is a child"
    ):
        run.child_index("a.code")
    with pytest.raises(InvalidInput, match=r"no child with key 'a\.test'"):
        run.child_index("a.test")
