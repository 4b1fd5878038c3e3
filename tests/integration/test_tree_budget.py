"""The spawn budget of a tree of runs counts every run started inside the tree, whoever started
it: a workflow's children, the CLI or the API from inside a child process or a script, and
concurrent launches race for the last slots under one lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pisub
from pisub.api.client import launch_workflow
from pisub.protocol.manifest import Manifest
from pisub.store.paths import open_home
from pisub.store.spawn_budget import SpawnBudget
from tests.conftest import AgentMaker
from tests.helpers import write_script

# Runs `pisub run --agent leaf` five times from inside its own run (the real CLI, with the
# markers its runner gave it) and prints each launch's exit code and error code as JSON.
SPAWNER = f"""
import json, re, subprocess, sys
seen = []
for i in range(5):
    argv = [{sys.executable!r}, "-m", "pisub", "run", "--agent", "leaf", "--json", f"leaf {{i}}"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    code = re.search(r"\\[([A-Z_]+)\\]", proc.stderr)
    seen.append([proc.returncode, code.group(1) if code else None])
print(json.dumps(seen))
"""


def _runs(home: Path) -> dict[str, Manifest]:
    found = {}
    for entry in (home / "runs").iterdir():
        if not entry.name.startswith("."):
            found[entry.name] = pisub.Run(entry.name).manifest()
    return found


def _claims(home: Path, budget: str) -> int:
    return len(os.listdir(home / "budgets" / budget / "claims"))


def test_runs_a_child_starts_with_the_cli_count_against_the_trees_budget(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("leaf", python="print('leaf')")
    make_agent("spawner", python=SPAWNER)
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            child = await runs.run("s", agent="spawner", task="go")
            return child.output
        """,
    )
    run = launch_workflow(script, max_spawns=3)
    result = run.wait(timeout=90)
    assert result.state == "complete", result.content[0].text
    seen = json.loads(result.content[0].text)
    seen = json.loads(seen) if isinstance(seen, str) else seen
    assert seen == [[0, None], [0, None]] + [[1, "RUN_FANOUT_LIMIT"]] * 3
    runs = _runs(home)
    assert len(runs) == 4  # the workflow, its child, two leaves: a refused launch left no run
    leaves = [m for m in runs.values() if m.agent.name == "leaf"]
    assert len(leaves) == 2 and all(m.root_run_id == run.id for m in leaves)
    assert _claims(home, run.id) == 3  # each run charged once: the child by its key, a leaf by its id


def test_runs_a_script_starts_with_the_api_share_the_budget_with_its_children(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("leaf", python="print('leaf')")
    script = write_script(
        tmp_path,
        """
        import pisub
        from pisub.errors import PisubError

        async def main(runs, state, args):
            seen = []
            for i in range(3):
                try:
                    pisub.launch("leaf", f"api {i}")
                    seen.append("started")
                except PisubError as exc:
                    seen.append(exc.code)
            try:
                await runs.run("late", agent="leaf", task="child")
                seen.append("child started")
            except PisubError as exc:
                seen.append(exc.code)
            return seen
        """,
    )
    run = launch_workflow(script, max_spawns=2)
    result = run.wait(timeout=90)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == [
        "started",
        "started",
        "RUN_FANOUT_LIMIT",
        "RUN_FANOUT_LIMIT",
    ]
    runs = _runs(home)
    assert len(runs) == 3 and _claims(home, run.id) == 2


def test_concurrent_launches_for_the_last_slots_start_exactly_that_many(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("leaf", python="print('leaf')")
    root = str(uuid.uuid4())
    budget = SpawnBudget(open_home(home).budgets, root, 5)
    budget.ensure()
    budget.claim("elsewhere", ["a", "b"])  # 3 slots left
    env = dict(os.environ, PISUB_RUN_ID=root, PISUB_ROOT_RUN_ID=root, PISUB_DEPTH="0")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pisub", "run", "--agent", "leaf", "--json", f"race {i}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    outcomes = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
    for p in procs:
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    started = [rc for rc, _ in outcomes if rc == 0]
    refused = [err for rc, err in outcomes if rc != 0]
    assert len(started) == 3, outcomes
    assert len(refused) == 5 and all("[RUN_FANOUT_LIMIT]" in err for err in refused), refused
    assert len(_runs(home)) == 3 and _claims(home, root) == 5
