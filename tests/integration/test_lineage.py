"""Runs started from inside runs: links, depth markers, the depth limit, top-level listing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import pisub
from pisub.errors import DepthExceeded, InvalidInput
from pisub.store.lineage import Lineage, caller_lineage
from tests.conftest import AgentMaker, pisub_cli

SHOW_ENV = """
import json, os
print(json.dumps({k: os.environ.get(k) for k in
    ("PISUB_RUN_ID", "PISUB_ROOT_RUN_ID", "PISUB_DEPTH", "PISUB_MAX_DEPTH")}))
"""

# Starts one run of the agent named on stdin's last line from inside its own run, and prints
# what the launch printed (stdout, stderr, exit code) as one JSON line.
NEST = f"""
import json, subprocess, sys
agent = sys.stdin.read().split()[-1]
proc = subprocess.run([{sys.executable!r}, "-m", "pisub", "run", "--agent", agent, "--json", "go " + agent],
                      capture_output=True, text=True)
print(json.dumps({{"out": proc.stdout, "err": proc.stderr, "rc": proc.returncode}}))
"""


def _output(run: pisub.Run) -> str:
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    return result.details.results[0].output or ""


def _run_dirs(home: Path) -> set[str]:
    return {p.name for p in (home / "runs").iterdir() if not p.name.startswith(".")}


def test_a_child_process_carries_its_runs_place(home: Path, make_agent: AgentMaker) -> None:
    make_agent("env", python=SHOW_ENV)
    run = pisub.launch("env", "x")
    seen = json.loads(_output(run))
    assert seen == {
        "PISUB_RUN_ID": run.id,
        "PISUB_ROOT_RUN_ID": run.id,
        "PISUB_DEPTH": "0",
        "PISUB_MAX_DEPTH": "2",
    }
    status = run.status()
    assert status.parent_run_id is None and status.root_run_id is None and status.depth == 0


def test_a_run_started_inside_a_run_is_its_child(home: Path, make_agent: AgentMaker) -> None:
    make_agent("nest", python=NEST)
    make_agent("env", python=SHOW_ENV)
    top = pisub.launch("nest", "env")
    launched = json.loads(_output(top))
    assert launched["rc"] == 0, launched["err"]
    child = pisub.Run(json.loads(launched["out"])["runId"])
    seen = json.loads(_output(child))
    assert seen["PISUB_ROOT_RUN_ID"] == top.id and seen["PISUB_DEPTH"] == "1"
    manifest, status = child.manifest(), child.status()
    assert (manifest.parent_run_id, manifest.root_run_id, manifest.depth) == (top.id, top.id, 1)
    assert (status.parent_run_id, status.root_run_id, status.depth) == (top.id, top.id, 1)

    assert [s.run_id for s in pisub.list_runs()] == [top.id]
    assert {s.run_id for s in pisub.list_runs(children=True)} == {top.id, child.id}
    listed = pisub_cli("list", "--json", check=True).stdout.splitlines()
    assert [json.loads(line)["runId"] for line in listed] == [top.id]
    everything = pisub_cli("list", "--all", check=True).stdout
    assert child.id[:8] in everything and f"{top.id[:8]}" in everything
    assert f"parent   {top.id}" in pisub_cli("status", child.id, check=True).stdout


def test_the_depth_limit_refuses_before_anything_is_created(
    home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISUB_MAX_DEPTH", "1")
    make_agent("nest", python=NEST)
    make_agent("env", python=SHOW_ENV)
    top = pisub.launch("nest", "nest")  # depth 0 starts "nest" at depth 1, which starts "env"...
    first = json.loads(_output(top))
    middle = pisub.Run(json.loads(first["out"])["runId"])
    assert middle.status().depth == 1
    before = _run_dirs(home)
    refused = json.loads(_output(middle))  # ...refused: depth 1 is at the limit
    assert refused["rc"] == 1
    assert "[SUBAGENT_DEPTH_EXCEEDED]" in refused["err"] and "depth=1, max=1" in refused["err"]
    result = json.loads(refused["out"])
    assert result["state"] == "failed" and result["details"]["mode"] == "management"
    assert result["details"]["error"]["code"] == "SUBAGENT_DEPTH_EXCEEDED"
    assert _run_dirs(home) == before


def test_an_agent_may_only_lower_the_limit(home: Path, make_agent: AgentMaker) -> None:
    make_agent("shy", python=NEST, maxDepth=0)
    make_agent("bold", python=SHOW_ENV, maxDepth=9)
    make_agent("env", python=SHOW_ENV)
    refused = json.loads(_output(pisub.launch("shy", "env")))
    assert "[SUBAGENT_DEPTH_EXCEEDED]" in refused["err"] and "max=0" in refused["err"]
    assert json.loads(_output(pisub.launch("bold", "x")))["PISUB_MAX_DEPTH"] == "2"


def test_caller_lineage_reads_the_markers() -> None:
    run, root = "0" * 8 + "-0000-4000-8000-" + "0" * 12, "1" * 8 + "-0000-4000-8000-" + "1" * 12
    assert caller_lineage({}) == Lineage.top()
    assert caller_lineage({"PISUB_MAX_DEPTH": "5"}).max_depth == 5
    inside = caller_lineage({"PISUB_RUN_ID": run, "PISUB_ROOT_RUN_ID": root, "PISUB_DEPTH": "1"})
    assert inside == Lineage(parent_run_id=run, root_run_id=root, depth=2, max_depth=2)
    assert caller_lineage({"PISUB_RUN_ID": run}).root_run_id == run
    with pytest.raises(DepthExceeded):
        caller_lineage({"PISUB_RUN_ID": run, "PISUB_DEPTH": "2"})
    for bad in (
        {"PISUB_RUN_ID": "../x"},
        {"PISUB_RUN_ID": run, "PISUB_DEPTH": "-1"},
        {"PISUB_RUN_ID": run, "PISUB_DEPTH": "\u0661"},
        {"PISUB_MAX_DEPTH": "99999"},
        {"PISUB_RUN_ID": run, "PISUB_ROOT_RUN_ID": "x"},
    ):
        with pytest.raises(InvalidInput) as caught:
            caller_lineage(bad)
        assert any(name in str(caught.value) for name in bad)


def test_the_runner_does_not_carry_its_launchers_markers(home: Path, make_agent: AgentMaker) -> None:
    """A run launched by a child is not one of its launcher's strays: its runner's environment
    names no run (only its own child's does)."""
    make_agent("nest", python=NEST)
    make_agent("slow", command="sleep", args=["30"])
    top = pisub.launch("nest", "slow")
    child = pisub.Run(json.loads(json.loads(_output(top))["out"])["runId"])
    pid = child.status().pid
    assert pid is not None
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not [v for v in environ if v.startswith((b"PISUB_RUN_ID=", b"PISUB_DEPTH="))], environ
    child.send_stop()
    assert child.wait(timeout=30).state == "stopped"


def test_a_run_started_inside_a_run_outlives_it(home: Path, make_agent: AgentMaker) -> None:
    """Its runner is adopted by the launching run's runner (their subreaper), which spares it
    when it ends its own leftovers: a detached run survives its launcher, even a run."""
    make_agent("nest", python=NEST)
    make_agent("slow", command="sleep", args=["30"])
    top = pisub.launch("nest", "slow")
    child = pisub.Run(json.loads(json.loads(_output(top))["out"])["runId"])
    assert top.status().state == "complete"
    assert child.status().state == "running"
    child.send_stop()
    assert child.wait(timeout=30).state == "stopped"


# Creates a run directory as a launcher does (a child run of this run, or of none), starts a
# process working in it, and exits: like a launch of a child run cut short before its runner's
# startup commit.
HALF_LAUNCH = """
import os, subprocess, sys, uuid
from pisub.store.paths import open_home
from pisub.protocol import AgentSpec, Limits, Manifest, now_iso
from pisub.store.runs import RunStore
pids = []
for parent in (os.environ["PISUB_RUN_ID"], None):
    manifest = Manifest(v=1, run_id=str(uuid.uuid4()), created_at=now_iso(),
        agent=AgentSpec(name="x", runner="external-cli", command="true"), task="t", cwd="/",
        umask=0o22, limits=Limits(timeout=60, idle_timeout=None, grace=1, output_cap=1,
        output_hard_cap=1), parent_run_id=parent)
    paths, fd = RunStore(open_home()).create(manifest)
    pids.append(subprocess.Popen(["sleep", "30"], cwd=paths.root, start_new_session=True).pid)
print(*pids, flush=True)
"""


def test_a_child_runs_runner_before_its_startup_commit_is_spared(home: Path, make_agent: AgentMaker) -> None:
    """A process working in a child run's directory while that run is still ``starting`` is
    its runner-to-be (a warm runner has no marker): it outlives the run that launched it. One
    working in a run that is not this run's child is a leftover like any other."""
    import os
    import signal

    from tests.conftest import pid_alive, wait_for

    make_agent("half", python=HALF_LAUNCH)
    top = pisub.launch("half", "x")
    spared, stray = map(int, _output(top).split())
    wait_for(lambda: not pid_alive(stray), what="the stray to be ended")
    assert pid_alive(spared)
    os.kill(spared, signal.SIGKILL)
