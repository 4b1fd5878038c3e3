"""What an outside attack on workflow runs found (issue 12), each kept broken-no-more here:
huge outputs and errors, secrets in tasks, gc of a workflow's tree, a child run removed before a
resume, hostile scripts, a script's own launches, planted symlinks, bad tasks, long request ids."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_parallel, launch_workflow, resume_workflow
from pisub.core.locks import is_held
from pisub.errors import InvalidInput, UnknownAgent
from pisub.workflow.forwarding import forwarded_id
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import write_script

ECHO = """
import sys
task = sys.stdin.read().strip()
words = task.split()
if words and words[0] == "flood":
    sys.stdout.write("x" * int(words[1]) + "\\n")
elif len(words) >= 2 and words[-2] == "sleep":
    import time
    time.sleep(float(words[-1]))
    print("slept")
elif len(words) >= 2 and words[-2] == "latch":  # wait (at most 120 s) until the test opens it
    import os, time
    end = time.monotonic() + 120
    while not os.path.exists(words[-1]) and time.monotonic() < end:
        time.sleep(0.05)
    print("slept")
else:
    print("did:", task)
"""


@pytest.fixture
def worker(home: Path, make_agent: AgentMaker) -> None:
    make_agent("worker", python=ECHO)


def test_results_stay_bounded_whatever_the_children_print(home: Path, worker: None) -> None:
    calls = [{"key": f"k{i}", "agent": "worker", "task": "flood 3000000"} for i in range(3)]
    run = launch_parallel(calls)
    result = run.wait(timeout=120)
    assert result.state == "complete"
    whole = (run.dir / "result.json").stat().st_size
    assert whole < 5 * 1024 * 1024, whole
    for single in result.details.results:
        assert single.run_id is not None and single.output is not None
        assert "earlier bytes not shown" in single.output or "[TRUNCATED:" in single.output


def test_a_huge_error_and_a_huge_return_value_are_cut(home: Path, worker: None, tmp_path: Path) -> None:
    raising = write_script(
        tmp_path, 'async def main(runs, state, args):\n    raise ValueError("e" * 5_000_000)\n'
    )
    result = launch_workflow(raising).wait(timeout=60)
    assert result.state == "failed" and result.details.error is not None
    assert len(result.details.error.message) <= 8000
    returning = write_script(
        tmp_path, 'async def main(runs, state, args):\n    return "r" * 3_000_000\n', "r.py"
    )
    run = launch_workflow(returning)
    result = run.wait(timeout=60)
    assert result.state == "complete"
    assert (run.dir / "result.json").stat().st_size < 1024 * 1024


def test_secrets_in_tasks_and_outputs_are_redacted_in_the_workflows_result(home: Path, worker: None) -> None:
    secret = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
    task = f'use {{"SecretAccessKey": "{secret}"}} and apiToken={secret}'
    run = launch_parallel([{"key": "s", "agent": "worker", "task": task}])
    result = run.wait(timeout=60)
    assert result.state == "complete"
    text = (run.dir / "result.json").read_text()
    assert secret not in text
    assert secret not in json.dumps(pisub_cli("status", run.id, "--json").stdout)


def test_a_non_json_return_value_fails_with_what_it_is(home: Path, worker: None, tmp_path: Path) -> None:
    script = write_script(tmp_path, "async def main(runs, state, args):\n    return {1, 2}\n")
    result = launch_workflow(script).wait(timeout=60)
    assert result.state == "failed" and result.details.error is not None
    assert "not JSON" in result.details.error.message and "set" in result.details.error.message


def test_an_exception_whose_str_raises_still_fails_the_workflow_cleanly(
    home: Path, worker: None, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        import asyncio

        class Evil(Exception):
            def __str__(self):
                raise RuntimeError("no")

        async def boom():
            await asyncio.sleep(1.5)
            raise Evil()

        async def main(runs, state, args):
            await asyncio.gather(runs.run("a", agent="worker", task="sleep 30"), boom())
        """,
    )
    run = launch_workflow(script)
    result = run.wait(timeout=60)
    assert result.state == "failed" and result.details.error is not None
    assert "Evil" in result.details.error.message
    child = result.details.results[0].run_id
    assert child is not None and pisub.Run(child).wait(timeout=30).state == "stopped"


def test_a_script_blocking_at_its_top_level_can_be_stopped(home: Path, worker: None, tmp_path: Path) -> None:
    script = write_script(
        tmp_path, "import time\ntime.sleep(600)\n\nasync def main(runs, state, args):\n    pass\n"
    )
    run = launch_workflow(script)
    wait_for(lambda: run.status().state == "running", 20)
    run.send_stop()
    result = run.wait(timeout=30)
    assert result.state == "stopped"


def test_a_run_the_script_launches_itself_is_the_workflows_child_run(
    home: Path, worker: None, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        import pisub

        async def main(runs, state, args):
            inner = pisub.launch("worker", "hello")
            inner.wait(timeout=60)
            return inner.id
        """,
    )
    run = launch_workflow(script)
    result = run.wait(timeout=90)
    assert result.state == "complete", result.content[0].text
    inner = pisub.Run(result.content[0].text).status()
    assert inner.parent_run_id == run.id and inner.depth == 1
    assert inner.root_run_id == run.id
    assert result.content[0].text not in {s.run_id for s in pisub.list_runs()}  # not top-level


def test_a_planted_symlink_for_the_script_is_refused_on_resume(
    home: Path, worker: None, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        "async def main(runs, state, args):\n    await runs.run('a', agent='worker', task='sleep 30')\n",
    )
    run = launch_workflow(script)
    wait_for(lambda: run.status().steps and run.status().steps[0].pid, 30)
    run.send_interrupt()
    wait_for(lambda: run.status().state == "paused", 30)
    copy = run.dir / "workflow.py"
    assert copy.is_file()
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not yours to read\n")
    copy.unlink()
    copy.symlink_to(elsewhere)
    with pytest.raises(pisub.PisubError):
        resume_workflow(run.id)
    done = pisub_cli("resume", run.id)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_child_run_removed_before_its_end_was_journaled_is_not_started_again(
    home: Path, worker: None, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            r = await runs.run("once", agent="worker", task="sleep 1")
            return [r.state, r.error.message if r.error else None]
        """,
    )
    run = launch_workflow(script)
    wait_for(lambda: run.status().steps and run.status().steps[0].pid, 30)
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 15)
    child = run.status().steps[0].run_id
    assert child is not None
    pisub.Run(child).wait(timeout=30)
    shutil.rmtree(pisub.Run(child).dir)  # gone, as if removed by hand
    again = resume_workflow(run.id)
    result = again.wait(timeout=60)
    state, message = json.loads(result.content[0].text)
    assert state == "failed" and "removed" in message
    assert not [s for s in pisub.list_runs(children=True) if s.parent_run_id in (run.id, again.id)]


def test_a_child_whose_journal_line_is_damaged_is_reattached_not_started_twice(
    home: Path, worker: None, tmp_path: Path
) -> None:
    """A journal line that does not decode may be a running child's start: on resume the child
    is found from its manifest (its key, its parent a run of this workflow) and re-attached."""
    latch = tmp_path / "latch"
    calls = [{"key": f"k{i}", "agent": "worker", "task": f"k{i} latch {latch}"} for i in range(2)]
    run = launch_parallel(calls, concurrency=2)
    steps = wait_for(lambda: (s := run.status().steps) and all(x.pid for x in s) and s, 30)
    children = {step.key: step.run_id for step in steps}
    _kill_coordinator(run)
    journal = run.dir / "journal.jsonl"
    lines = journal.read_bytes().split(b"\n")
    started = [i for i, line in enumerate(lines) if b'"started"' in line and b'"k0"' in line]
    assert started, lines
    lines[started[0]] = b"\xff\xfegarbage{"  # the start of k0: unreadable
    journal.write_bytes(b"\n".join(lines))
    again = resume_workflow(run.id)
    attached = lambda: {s.key: s.run_id for s in again.status().steps} == children  # noqa: E731
    wait_for(attached, 30, what="both children re-attached")
    latch.touch()
    result = again.wait(timeout=60)
    assert result.state == "complete", result
    ran = [s for s in pisub.list_runs(children=True) if s.parent_run_id in (run.id, again.id)]
    assert sorted(s.run_id for s in ran) == sorted(children.values()), ran  # no key started twice


def test_gc_keeps_a_going_workflows_tree(home: Path, worker: None) -> None:
    calls = [
        {"key": "quick", "agent": "worker", "task": "x"},
        {"key": "slow", "agent": "worker", "task": "sleep 30"},
    ]
    run = launch_parallel(calls, concurrency=2)
    # The step says complete once the child's run did (its run id shows earlier, while the run
    # is being created: no run to ask yet).
    quick = wait_for(lambda: (s := run.status().steps) and str(s[0].status) == "complete" and s, 30)
    quick_id = quick[0].run_id
    pisub_cli("gc", "--older-than", "0s", check=True)
    assert pisub.Run(quick_id).dir.is_dir() and run.dir.is_dir()
    run.send_stop()
    run.wait(timeout=30)


def _kill_coordinator(run: pisub.Run) -> None:
    """Kill -9 a workflow's runner and wait until a reader has repaired it ``failed``."""
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 15)


def _gc() -> dict[str, list[str]]:
    report: dict[str, list[str]] = json.loads(
        pisub_cli("gc", "--older-than", "0s", "--json", check=True).stdout
    )
    return report


def _runners_exited(run_ids: list[str]) -> None:
    """Wait until these ended runs' runners have exited (one may still be exiting just after its
    run ended, and gc keeps a run whose runner lives)."""
    locks = [pisub.Run(r).dir / "runner.lock" for r in run_ids]
    wait_for(lambda: not any(is_held(lock) for lock in locks), 30, what="the runners to exit")


def _gone(run_id: str) -> bool:
    return not os.path.lexists(Path(os.environ["PISUB_HOME"]) / "runs" / run_id)


TWO_WAITERS = """
async def main(runs, state, args):
    tasks = [{"key": f"c{i}", "agent": "worker", "task": f"c{i} latch {args['latch']}"} for i in range(2)]
    rest = await runs.all(tasks)
    return [r.output for r in rest]
"""


def test_gc_keeps_a_killed_workflow_whose_children_still_run(
    home: Path, worker: None, tmp_path: Path
) -> None:
    latch = tmp_path / "latch"
    run = launch_workflow(write_script(tmp_path, TWO_WAITERS), args={"latch": str(latch)})
    wait_for(lambda: [str(s.status) for s in run.status().steps].count("running") == 2, 30)
    _kill_coordinator(run)
    children = [str(s.run_id) for s in run.status().steps]
    said = pisub_cli("gc", "--older-than", "0s", "--dry-run", check=True).stdout
    assert said.endswith(
        "would remove 0 run(s) and 0 temp file(s); kept 2 live run(s), 1 ended run(s) their trees need\n"
    ), said
    report = _gc()
    assert run.dir.is_dir() and run.id not in report["removed"], report
    assert sorted(report["keptLive"]) == sorted(children), report  # the children: the workflow is not live
    assert report["keptWithTree"] == [run.id], report
    resumed = json.loads(pisub_cli("resume", run.id, "--json", check=True).stdout)["runId"]
    latch.touch()  # the children end only now: gc saw them running
    result = pisub.Run(resumed).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == ["slept\n", "slept\n"]
    assert [r.run_id for r in result.details.results] == children  # re-attached, not started again
    _runners_exited([resumed, *children])
    report = _gc()
    assert sorted(report["removed"]) == sorted([run.id, resumed, *children]), report
    assert all(_gone(r) for r in [run.id, resumed, *children])


def test_gc_keeps_a_nested_workflow_whose_grandchildren_run(home: Path, worker: None, tmp_path: Path) -> None:
    latch = tmp_path / "latch"
    outer = launch_workflow(
        write_script(
            tmp_path,
            """
            import asyncio
            from pisub.api.client import launch_parallel

            async def main(runs, state, args):
                latch = args["latch"]
                calls = [{"key": f"g{i}", "agent": "worker", "task": f"g{i} latch {latch}"} for i in range(2)]
                launch_parallel(calls)
                await asyncio.sleep(60)
            """,
        ),
        args={"latch": str(latch)},
    )
    inner = wait_for(
        lambda: [s for s in pisub.list_runs(children=True) if s.parent_run_id == outer.id and s.steps], 30
    )[0]
    inner_run = pisub.Run(inner.run_id)
    wait_for(lambda: [str(s.status) for s in inner_run.status().steps].count("running") == 2, 30)
    _kill_coordinator(inner_run)
    _kill_coordinator(outer)
    grandchildren = [str(s.run_id) for s in inner_run.status().steps]
    report = _gc()
    assert not report["removed"], report
    assert outer.dir.is_dir() and inner_run.dir.is_dir()
    assert sorted(report["keptLive"]) == sorted(grandchildren), report
    assert sorted(report["keptWithTree"]) == sorted([outer.id, inner_run.id]), report
    resumed = json.loads(pisub_cli("resume", inner_run.id, "--json", check=True).stdout)["runId"]
    latch.touch()  # the grandchildren end only now: gc saw them running
    result = pisub.Run(resumed).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert [r.run_id for r in result.details.results] == grandchildren
    _runners_exited([resumed, *grandchildren])
    everything = {outer.id, inner_run.id, resumed, *grandchildren}
    assert set(_gc()["removed"]) == everything
    assert all(_gone(r) for r in everything)


def test_gc_keeps_a_resume_chain_together(home: Path, worker: None, tmp_path: Path) -> None:
    """A resumed workflow killed in turn: its journal is in the first run's directory, the
    children it re-attached are the first run's; none of the chain goes while one child runs."""
    latch = tmp_path / "latch"
    run = launch_workflow(write_script(tmp_path, TWO_WAITERS), args={"latch": str(latch)})
    wait_for(lambda: [str(s.status) for s in run.status().steps].count("running") == 2, 30)
    _kill_coordinator(run)
    again = resume_workflow(run.id)
    wait_for(lambda: [str(s.status) for s in again.status().steps].count("running") == 2, 30)
    _kill_coordinator(again)
    children = [str(s.run_id) for s in again.status().steps]
    report = _gc()
    assert not report["removed"], report
    assert run.dir.is_dir() and again.dir.is_dir()
    assert sorted(report["keptWithTree"]) == sorted([run.id, again.id]), report
    last = json.loads(pisub_cli("resume", again.id, "--json", check=True).stdout)["runId"]
    latch.touch()  # the children end only now: gc saw them running
    result = pisub.Run(last).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert [r.run_id for r in result.details.results] == children
    everything = {run.id, again.id, last, *children}
    _runners_exited([last, *children])
    assert set(_gc()["removed"]) == everything
    assert all(_gone(r) for r in everything)


def test_bad_tasks_are_refused_at_launch_naming_the_task(home: Path, worker: None) -> None:
    with pytest.raises(InvalidInput, match=r"tasks\[1\]"):
        launch_parallel(
            [
                {"key": "a", "agent": "worker", "task": "fine"},
                {"key": "b", "agent": "worker", "task": "   "},
            ]
        )
    with pytest.raises(InvalidInput, match=r"tasks\[0\].*pi agent"):
        launch_parallel([{"key": "a", "agent": "worker", "task": "x", "model": "m"}])
    assert not list(pisub.list_runs(children=True))


def test_saved_output_follows_the_launchers_umask(home: Path, worker: None, tmp_path: Path) -> None:
    target = tmp_path / "out.md"
    old = os.umask(0o022)
    try:
        run = launch_parallel([{"key": "a", "agent": "worker", "task": "hi", "output": str(target)}])
    finally:
        os.umask(old)
    assert run.wait(timeout=60).state == "complete"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_long_request_ids_never_share_a_forward() -> None:
    a, b = "r" * 200 + "a", "r" * 200 + "b"
    assert forwarded_id(a, 1) != forwarded_id(b, 1)
    assert len(forwarded_id(a, 19)) <= 200 and forwarded_id("short", 3) == "short.c3"


def test_a_child_index_is_ascii_digits_only(home: Path, worker: None) -> None:
    run = launch_parallel([{"key": "a", "agent": "worker", "task": "x"}])
    run.wait(timeout=60)
    with pytest.raises(InvalidInput):
        run.child("\u0661")  # ARABIC-INDIC DIGIT ONE is not an index
    assert run.child("0").id == run.child("a").id


def test_a_launch_validates_the_script_as_workflow_validate_does_agents_included(
    home: Path, worker: None, tmp_path: Path
) -> None:
    """Outside attack (issue 23): ``workflow validate`` rejected a script calling an unknown
    agent, but ``run --workflow`` started it. Every launch now runs the same checks, in the API,
    before a run directory exists."""
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            return await runs.run("k", agent="nosuch", task="x")
        """,
    )
    checked = pisub_cli("workflow", "validate", str(script))
    assert checked.returncode == 1 and "unknown agent 'nosuch'" in checked.stdout, checked
    started = pisub_cli("run", "--workflow", str(script))
    assert started.returncode == 1, started
    assert "unknown agent 'nosuch'" in started.stderr and "UNKNOWN_AGENT" in started.stderr, started
    assert "Traceback" not in started.stderr
    with pytest.raises(UnknownAgent, match="unknown agent 'nosuch'"):  # its only problem
        launch_workflow(script)
    runs = home / "runs"
    assert not runs.exists() or not list(runs.iterdir())  # nothing was created
    good = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            return await runs.run("k", agent="worker", task="hello")
        """,
        name="good.py",
    )
    assert pisub_cli("workflow", "validate", str(good)).returncode == 0
    assert launch_workflow(good).wait(timeout=90).state == "complete"
