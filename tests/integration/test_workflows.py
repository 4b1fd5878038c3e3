"""Workflow runs with external-cli children: real coordinators, real child runs (the Python
script's own behaviour; what every script language must keep — kill -9 and resume, interrupt,
stop, steering, a script that fails — is tests/contract/test_script_language_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_chain, launch_parallel, launch_workflow
from tests.conftest import AgentMaker, pisub_cli, processes_of, wait_for
from tests.helpers import write_script

# Each child appends its task to $PISUB_TEST_COUNT (one line per start), sleeps the seconds
# its task ends with ("... sleep 2"), waits for the file $PISUB_TEST_GATE when its task says
# "gated" (60 s at most), fails when the task says "fail", and echoes its task.
WORKER = """
import os, sys, time
task = sys.stdin.read().strip()
with open(os.environ["PISUB_TEST_COUNT"], "a") as fh:
    fh.write(task + "\\n")
words = task.split()
if len(words) >= 2 and words[-2] == "sleep":
    time.sleep(float(words[-1]))
deadline = time.monotonic() + 60
while "gated" in words and not os.path.exists(os.environ["PISUB_TEST_GATE"]):
    if time.monotonic() > deadline:
        sys.exit("the gate never opened")
    time.sleep(0.02)
if "fail" in words:
    print("failing on purpose", file=sys.stderr)
    sys.exit(3)
print("did:", task)
"""


@pytest.fixture
def counted(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``worker`` agent whose starts are counted in the returned file."""
    count = tmp_path / "starts.txt"
    count.touch()
    monkeypatch.setenv("PISUB_TEST_COUNT", str(count))
    make_agent("worker", python=WORKER)
    return count


def _starts(count: Path) -> list[str]:
    return count.read_text().splitlines()


def _child_runs(home: Path, parent: str) -> list[pisub.Status]:
    return [s for s in pisub.list_runs(children=True) if s.parent_run_id == parent]


def test_a_workflow_gathers_then_fans_out(home: Path, counted: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        import asyncio

        async def main(runs, state, args):
            first = await runs.all([
                {"key": "a", "agent": "worker", "task": "one"},
                {"key": "b", "agent": "worker", "task": "two"},
            ])
            c = runs.run("c", agent="worker", task="three after " + first[0].output.strip())
            d = runs.run("d", agent="worker", task="four")
            done, pending = await asyncio.wait({c, d}, return_when=asyncio.FIRST_COMPLETED)
            rest = await asyncio.gather(*pending)
            again = await runs.run("a", agent="worker", task="one")
            same = again.run_id == first[0].run_id
            return {"first": [r.output for r in first], "n": len(done) + len(rest), "same": same}
        """,
    )
    run = launch_workflow(script, args={"x": 1})
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    assert value == {"first": ["did: one\n", "did: two\n"], "n": 2, "same": True}
    assert result.details.mode == "workflow"
    assert [r.key for r in result.details.results] == ["a", "b", "c", "d"]
    assert all(r.state == "complete" and r.run_id for r in result.details.results)
    assert sorted(_starts(counted)) == ["four", "one", "three after did: one", "two"]
    status = run.status()
    assert [(s.key, s.status) for s in status.steps] == [(k, "complete") for k in "abcd"]
    children = _child_runs(home, run.id)
    assert {c.key for c in children} == {"a", "b", "c", "d"}
    assert all(c.root_run_id == run.id and c.depth == 1 for c in children)
    assert [s.run_id for s in pisub.list_runs()] == [run.id]  # children are not top level
    assert run.child("c").status().state == "complete"
    assert run.child(3).id == status.steps[3].run_id
    text = pisub_cli("status", run.id, check=True).stdout
    assert "children" in text and " c " in text
    shown = json.loads(pisub_cli("status", run.id, "--child", "b", "--json", check=True).stdout)
    assert shown["key"] == "b" and shown["parentRunId"] == run.id
    assert "did: two" in pisub_cli("logs", run.id, "--child", "b", check=True).stdout


def test_parallel_results_come_in_task_order(home: Path, counted: Path) -> None:
    proc = pisub_cli(
        "run", "--concurrency", "2",
        "--task", "worker=slow sleep 1", "--task", "worker=quick", "--task", "worker=third", "--json",
        check=True,
    )  # fmt: skip
    run = pisub.Run(json.loads(proc.stdout)["runId"])
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert result.details.mode == "parallel"
    assert [r.key for r in result.details.results] == ["task-1", "task-2", "task-3"]
    assert [r.output for r in result.details.results] == [
        "did: slow sleep 1\n",
        "did: quick\n",
        "did: third\n",
    ]
    assert "## task-2 (worker): complete" in result.content[0].text


def test_parallel_with_a_failure_fails_and_keeps_every_result(home: Path, counted: Path) -> None:
    run = launch_parallel([{"agent": "worker", "task": "ok"}, {"agent": "worker", "task": "please fail"}])
    result = run.wait(timeout=60)
    assert result.state == "failed"
    assert "1 of 2 tasks failed: task-2" in result.content[0].text
    assert [r.state for r in result.details.results] == ["complete", "failed"]
    assert "did: ok" in result.content[0].text


def test_a_chain_passes_output_forward_and_skips_after_a_failure(
    home: Path, counted: Path, tmp_path: Path
) -> None:
    tasks = tmp_path / "chain.json"
    tasks.write_text(json.dumps([
        {"key": "one", "agent": "worker", "task": "first"},
        {"key": "two", "agent": "worker", "task": "got <{previous}>"},
        {"key": "three", "agent": "worker", "task": "and then <{previous}>"},
    ]))  # fmt: skip
    proc = pisub_cli("run", "--chain", str(tasks), check=True)
    result = pisub.Run(proc.stdout.strip()).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert result.content[0].text == "did: and then <did: got <did: first\n>\n>\n"
    assert result.details.mode == "chain"

    failing = launch_chain([
        {"key": "one", "agent": "worker", "task": "first"},
        {"key": "two", "agent": "worker", "task": "fail {previous}"},
        {"key": "three", "agent": "worker", "task": "never"},
    ])  # fmt: skip
    result = failing.wait(timeout=60)
    assert result.state == "failed"
    assert [(r.key, r.state) for r in result.details.results] == [
        ("one", "complete"),
        ("two", "failed"),
        ("three", "skipped"),
    ]
    assert "never" not in _starts(counted)
    assert [s.status for s in failing.status().steps] == ["complete", "failed", "skipped"]


def test_stopping_one_child_lets_its_siblings_finish(home: Path, counted: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            results = await runs.all([
                {"key": "long", "agent": "worker", "task": "long sleep 60"},
                {"key": "short", "agent": "worker", "task": "short sleep 1"},
            ])
            return [[r.key, r.state, r.ok] for r in results]
        """,
    )
    run = launch_workflow(script)
    wait_for(lambda: [s.status for s in run.status().steps] == ["running", "running"], 30)
    proc = pisub_cli("stop", run.id, "--child", "long", "--json")
    receipt = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert receipt["state"] == "delivered" and receipt["targets"][0]["child"] == 0
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == [["long", "stopped", False], ["short", "complete", True]]


def test_bad_calls_raise_in_the_script_and_start_nothing(home: Path, counted: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        from pisub.errors import PisubError

        async def main(runs, state, args):
            k, a, same = "k", "a", "same"  # keys the static check does not see
            seen = []
            for attempt in (
                lambda: runs.all([
                    {"key": a, "agent": "worker", "task": "x"},
                    {"key": "b", "agent": "no" + "body", "task": "x"},
                ]),
                lambda: runs.run("bad" + " key!", agent="worker", task="x"),
                lambda: runs.run(k, agent="worker", task="x", timeout=-1),
                lambda: runs.run(k, agent="worker", task="x", output_mode="sideways"),
                lambda: runs.all([{"key": a, "agent": "worker", "task": "x", "bogus": 1}]),
                lambda: runs.run(k, agent="worker", task="x", context="fork"),
            ):
                try:
                    attempt()
                except PisubError as exc:
                    seen.append([exc.code, exc.message])
            first = await runs.run(same, agent="worker", task="x")
            try:
                (lambda: runs.run(same, agent="worker", task="other"))()
            except PisubError as exc:
                seen.append([exc.code, exc.message])
            return seen
        """,
    )
    result = launch_workflow(script).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    seen = json.loads(result.content[0].text)
    codes = [code for code, _ in seen]
    assert codes == ["UNKNOWN_AGENT"] + ["INVALID_INPUT"] * 6
    assert "nobody" in seen[0][1]
    assert "timeout" in seen[2][1]
    assert "output_mode" in seen[3][1]
    assert "bogus" in seen[4][1]
    assert "needs a pi agent" in seen[5][1]
    assert "already used with other parameters" in seen[6][1]
    assert _starts(counted) == ["x"]  # only "same"


def test_a_fan_out_known_to_exceed_its_spawn_budget_is_refused_before_any_run(home: Path) -> None:
    """N ``--task``s or a tasks file larger than ``--max-spawns``: refused up front (it printed a
    run id, exit 0, and the run then failed ``RUN_FANOUT_LIMIT``)."""
    tasks = [{"agent": "worker", "task": f"t{i}"} for i in range(3)]
    for launch in (launch_parallel, launch_chain):
        with pytest.raises(pisub.PisubError) as refused:
            launch(tasks, max_spawns=2)
        assert refused.value.code == "RUN_FANOUT_LIMIT" and "3 tasks" in refused.value.message
    cli = pisub_cli("run", "--max-spawns", "2", *[a for i in range(3) for a in ("--task", f"worker=t{i}")])
    assert cli.returncode == 1 and cli.stderr.endswith("[RUN_FANOUT_LIMIT]\n") and not cli.stdout
    assert not list(pisub.list_runs(children=True))


def test_the_spawn_budget_refuses_a_batch_that_does_not_fit(
    home: Path, counted: Path, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        from pisub.errors import PisubError

        async def main(runs, state, args):
            try:
                await runs.all([{"key": f"k{i}", "agent": "worker", "task": f"t{i}"} for i in range(3)])
            except PisubError as exc:
                refused = exc.code
            done = await runs.all([{"key": f"k{i}", "agent": "worker", "task": f"t{i}"} for i in range(2)])
            return [refused, len(done)]
        """,
    )
    result = launch_workflow(script, max_spawns=2).wait(timeout=60)
    assert json.loads(result.content[0].text) == ["RUN_FANOUT_LIMIT", 2]
    assert sorted(_starts(counted)) == ["t0", "t1"]


def test_the_depth_limit_holds_for_a_workflows_children(
    home: Path, counted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISUB_MAX_DEPTH", "0")
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            await runs.run("deep", agent="worker", task="x")
        """,
    )
    result = launch_workflow(script).wait(timeout=60)
    assert result.state == "failed"
    assert "Nested subagent call blocked (depth=0, max=0)" in result.content[0].text
    assert _starts(counted) == []


def test_state_is_shared_by_a_namespace_and_never_stale(home: Path, counted: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            before = await state.get("count")
            await state.set("count", (before or 0) + 1)
            await state.set(args["who"], True)
            return [before, await state.get("count")]
        """,
    )
    first = launch_workflow(script, state_ns="team", args={"who": "first"}).wait(timeout=60)
    second = launch_workflow(script, state_ns="team", args={"who": "second"}).wait(timeout=60)
    assert json.loads(first.content[0].text) == [None, 1]
    assert json.loads(second.content[0].text) == [1, 2]
    saved = json.loads((home / "state" / "team.json").read_text())
    assert saved["values"] == {"count": 2, "first": True, "second": True}
    assert oct((home / "state" / "team.json").stat().st_mode & 0o777) == "0o600"
    lonely = write_script(tmp_path, "async def main(runs, state, args):\n    return state is None\n", "n.py")
    alone = launch_workflow(lonely, mission=False)  # no mission, no namespace: no state
    assert alone.wait(timeout=60).content[0].text == "true"


def test_output_is_saved_and_file_only_returns_a_pointer(home: Path, counted: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            a = await runs.run("a", agent="worker", task="alpha", output="out/a.md")
            b = await runs.run("b", agent="worker", task="beta", output="out/b.md", output_mode="file-only")
            c = await runs.run("c", agent="worker", task="fail", output="out/c.md", output_mode="file-only")
            return [[r.output, r.output_reference] for r in (a, b, c)]
        """,
    )
    result = launch_workflow(script, cwd=tmp_path).wait(timeout=60)
    (a_out, a_ref), (b_out, b_ref), (_c_out, c_ref) = json.loads(result.content[0].text)
    assert a_out == "did: alpha\n" and a_ref == str(tmp_path / "out" / "a.md")
    assert (tmp_path / "out" / "a.md").read_text() == "did: alpha\n"
    assert b_ref == str(tmp_path / "out" / "b.md")
    assert b_out == f"Output saved to: {tmp_path / 'out' / 'b.md'} (10 B, 1 lines). Read this file if needed."
    assert c_ref is None and not (tmp_path / "out" / "c.md").exists()


def test_validate_reports_every_problem_with_its_line(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("worker", python=WORKER)
    good = write_script(
        tmp_path,
        """
        import asyncio

        async def main(runs, state, args):
            a = runs.run("a", agent="worker", task="x")
            pending = [runs.run(f"p{i}", agent="worker", task="x") for i in range(3)]
            for f in asyncio.as_completed(pending):
                await f
            return await asyncio.gather(a, runs.steer("a", "hi"))
        """,
        "good.py",
    )
    proc = pisub_cli("workflow", "validate", str(good), "--json")
    clean = {"ok": True, "errors": [], "warnings": []}
    assert proc.returncode == 0 and json.loads(proc.stdout) == clean, proc.stdout
    bad = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            runs.run("a", agent="worker", task="x")
            kept = runs.run("b", agent="worker", task="x")
            await runs.run("a", agent="ghost", task="x")
            await runs.all([{"key": "bad key", "agent": "worker", "task": "x"}])
        """,
        "bad.py",
    )
    proc = pisub_cli("workflow", "validate", str(bad), "--json")
    assert proc.returncode == 1
    errors = json.loads(proc.stdout)["errors"]
    assert [(e["line"], e["message"].split(" ")[0]) for e in errors] == [
        (3, "runs.run(...)"),
        (4, "runs.run(...)"),
        (5, "key"),
        (5, "unknown"),
        (6, "'bad"),
    ]
    for source, fragment in (
        ("def main(runs, state, args):\n    pass\n", "must be an async function"),
        ("async def main(runs):\n    pass\n", "exactly three arguments"),
        ("x = 1\n", "defines no main"),
        ("async def main(:\n", "SyntaxError"),
    ):
        path = write_script(tmp_path, source, "x.py")
        proc = pisub_cli("workflow", "validate", str(path))
        assert proc.returncode == 1 and fragment in proc.stdout, proc.stdout
    refused = pisub_cli("run", "--workflow", str(bad))
    assert refused.returncode == 1 and "[INVALID_INPUT]" in refused.stderr
    assert "does not validate" in refused.stderr
    assert not processes_of(home)


def test_the_fleet_and_transcript_views(home: Path, counted: Path, tmp_path: Path) -> None:
    run = launch_parallel(
        [
            {"agent": "worker", "task": "quick"},
            {"agent": "worker", "task": "slow sleep 60"},
            {"agent": "worker", "task": "later sleep 60"},
        ],
        concurrency=2,
    )
    wait_for(lambda: [str(s.status) for s in run.status().steps] == ["complete", "running", "running"], 30)
    rows = [json.loads(line) for line in pisub_cli("fleet", "--json", check=True).stdout.splitlines()]
    assert {(r["key"], r["state"]) for r in rows} == {
        (None, "running"),
        ("task-2", "running"),
        ("task-3", "running"),
    }
    text = pisub_cli("status", run.id, "--view", "fleet", check=True).stdout
    assert "task-2" in text and "task-1" not in text  # live children only
    shown = pisub_cli("status", run.id, "--child", "task-1", "--view", "transcript", "--json", check=True)
    assert json.loads(shown.stdout)["lines"] == ["did: quick"]
    wrong = pisub_cli("status", run.id, "--view", "transcript")
    assert wrong.returncode == 1 and "--child" in wrong.stderr
    assert pisub_cli("status", run.id, "--view", "nope").returncode == 1
    pisub_cli("stop", run.id, check=True)
    assert run.wait(timeout=60).state == "stopped"
    assert pisub_cli("fleet", check=True).stdout.strip() == "no live runs"
