"""Workflow runs of the real pi against the scripted model server."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_chain, launch_parallel, launch_workflow, resume_workflow
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli, wait_for, wait_no_processes
from tests.helpers import sent_with, write_script

pytestmark = pytest.mark.pi

SAID = "Hello from the fake LLM. You said: "


def _states(run: pisub.Run) -> list[str]:
    return [str(s.status) for s in run.status().steps]


@pytest.mark.pi_versions
def test_a_parallel_fan_out_of_four_returns_results_in_order(pi_home: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    run = launch_parallel([{"agent": "pi", "task": f"hello {tag}-{i}"} for i in range(4)])
    result = run.wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    assert [r.output for r in result.details.results] == [f"{SAID}hello {tag}-{i}" for i in range(4)]
    assert all(r.usage.turns >= 1 and r.session_file for r in result.details.results)


def test_a_chain_of_three_passes_each_output_forward(pi_home: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    run = launch_chain(
        [
            {"agent": "pi", "task": f"start {tag}"},
            {"agent": "pi", "task": "then <{previous}>"},
            {"agent": "pi", "task": "last <{previous}>"},
        ]
    )
    result = run.wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    assert result.content[0].text == f"{SAID}last <{SAID}then <{SAID}start {tag}>>"


def test_a_rolling_fan_out_steers_the_slower_sibling_with_the_first_ones_output(
    pi_home: Path, model_server: FakeModelServer, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    script = write_script(
        tmp_path,
        f"""
        import asyncio

        async def main(runs, state, args):
            first = await runs.all([
                {{"key": "a", "agent": "pi", "task": "alpha {tag}"}},
                {{"key": "b", "agent": "pi", "task": "beta {tag}"}},
            ])
            fast = runs.run("fast", agent="pi", task="fast {tag}")
            slow = runs.run("slow", agent="pi", task="SLOW:80 story {tag}")
            done, pending = await asyncio.wait({{fast, slow}}, return_when=asyncio.FIRST_COMPLETED)
            winner = done.pop().result()
            steer = await runs.steer("slow", "STEER {tag} " + winner.output, ack_timeout=30)
            slow_result = await slow
            return {{"first": [r.output for r in first], "winner": winner.key, "steer": steer.state,
                    "delivery": steer.delivery_status, "slow": slow_result.output}}
        """,
    )
    result = launch_workflow(script).wait(timeout=180)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    assert value["first"] == [f"{SAID}alpha {tag}", f"{SAID}beta {tag}"]
    assert value["winner"] == "fast"
    assert (value["steer"], value["delivery"]) == ("delivered", "delivered")
    assert value["slow"] == f"{SAID}STEER {tag} {SAID}fast {tag}"
    assert sent_with(model_server, f"STEER {tag}")


def test_stopping_one_child_lets_its_siblings_finish(pi_home: Path, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    script = write_script(
        tmp_path,
        f"""
        async def main(runs, state, args):
            results = await runs.all([
                {{"key": "long", "agent": "pi", "task": "SLOW:200 long {tag}"}},
                {{"key": "short", "agent": "pi", "task": "SLOW:20 short {tag}"}},
            ])
            return [[r.key, r.state] for r in results]
        """,
    )
    run = launch_workflow(script)
    wait_for(lambda: _states(run) == ["running", "running"], 60)
    proc = pisub_cli("stop", run.id, "--child", "long", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "delivered", proc.stdout + proc.stderr
    result = run.wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == [["long", "stopped"], ["short", "complete"]]


@pytest.mark.parametrize("how", ["stop", "interrupt"])
def test_stopping_or_interrupting_a_workflow_leaves_no_process(
    how: str, pi_home: Path, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    script = write_script(
        tmp_path,
        f"""
        async def main(runs, state, args):
            calls = [{{"key": f"k{{i}}", "agent": "pi", "task": f"SLOW:300 k{{i}} {tag}"}} for i in range(2)]
            await runs.all(calls)
        """,
    )
    run = launch_workflow(script)
    wait_for(lambda: _states(run) == ["running", "running"], 60)
    proc = pisub_cli(how, run.id, "--json")
    assert json.loads(proc.stdout)["state"] == "delivered", proc.stderr
    result = run.wait(timeout=120)
    expected = "stopped" if how == "stop" else "paused"
    assert result.state == expected
    assert [r.state for r in result.details.results] == [expected, expected]
    wait_no_processes(pi_home, timeout=20)


def test_a_killed_coordinator_is_resumed_without_running_a_finished_child_again(
    pi_home: Path, model_server: FakeModelServer, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    script = write_script(
        tmp_path,
        f"""
        async def main(runs, state, args):
            first = await runs.run("first", agent="pi", task="first {tag}")
            calls = [{{"key": f"r{{i}}", "agent": "pi", "task": f"SLOW:40 r{{i}} {tag}"}} for i in range(3)]
            rest = await runs.all(calls)
            return [first.output] + [r.state for r in rest]
        """,
    )
    run = launch_workflow(script)
    wait_for(lambda: _states(run) == ["complete", "running", "running", "running"], 90)
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 20)

    again = resume_workflow(run.id)
    result = again.wait(timeout=180)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == [f"{SAID}first {tag}", "complete", "complete", "complete"]
    assert len(sent_with(model_server, f"first {tag}")) == 1  # never run again
    for i in range(3):
        assert len(sent_with(model_server, f"r{i} {tag}")) == 1  # re-attached, not restarted


def test_limits_are_refused_with_their_codes(
    pi_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            await runs.all([{"key": f"k{i}", "agent": "pi", "task": "x"} for i in range(3)])
        """,
    )
    fanout = launch_workflow(script, max_spawns=2).wait(timeout=60)
    assert fanout.state == "failed" and "RUN_FANOUT_LIMIT" in fanout.content[0].text
    unknown = pisub_cli("run", "--task", "pi=x", "--task", "nobody=y")
    assert unknown.returncode == 1 and "[UNKNOWN_AGENT]" in unknown.stderr
    monkeypatch.setenv("PISUB_MAX_DEPTH", "0")
    deep = launch_workflow(script).wait(timeout=60)
    assert deep.state == "failed" and "SUBAGENT_DEPTH_EXCEEDED" in deep.content[0].text
    assert [s.run_id for s in pisub.list_runs(children=True)] == [fanout.details.run_id, deep.details.run_id]
