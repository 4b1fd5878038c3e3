"""`pisub wait --any/--all` over several runs (a crashed one included) and `pisub list`'s filters."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import run_events


def test_wait_any_returns_the_first_to_end_and_all_waits_for_every_one(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    release = tmp_path / "release"  # the slow one ends once the --any wait is answered
    make_agent("quick", command="true")
    make_agent("slow", command="sh", args=["-c", f"while [ ! -e '{release}' ]; do sleep 0.05; done"])
    make_agent("bad", command="false")
    slow, quick = pisub.launch("slow", "x"), pisub.launch("quick", "x")
    proc = pisub_cli("wait", slow.id, quick.id, "--any", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        {"runId": quick.id, "state": "complete"}
    ]
    release.touch()
    bad = pisub.launch("bad", "x")
    proc = pisub_cli("wait", slow.id, bad.id, "--all", timeout=60)
    assert (
        proc.returncode == 1 and f"{bad.id}  failed" in proc.stdout and f"{slow.id}  complete" in proc.stdout
    )
    proc = pisub_cli("wait", slow.id, quick.id)  # several runs: every one, as --all
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, proc.stderr


def test_wait_sees_a_run_whose_runner_was_killed(home: Path, make_agent: AgentMaker) -> None:
    make_agent("long", command="sleep", args=["60"])
    run = pisub.launch("long", "x")
    pid = wait_for(lambda: run.status().pid, timeout=30)
    os.kill(pid, signal.SIGKILL)
    proc = pisub_cli("wait", run.id, run.id, "--all", "--timeout", "30", timeout=60)
    assert proc.returncode == 1 and "failed" in proc.stdout, proc.stdout + proc.stderr


def test_wait_timeout_names_what_is_still_going(home: Path, make_agent: AgentMaker) -> None:
    make_agent("long", command="sleep", args=["30"])
    run = pisub.launch("long", "x")
    proc = pisub_cli("wait", run.id, "--any", "--timeout", "0.3")
    assert proc.returncode == 3 and run.id[:8] in proc.stderr and "[WAIT_TIMEOUT]" in proc.stderr
    assert pisub_cli("stop", run.id).returncode == 0


def test_list_filters(home: Path, make_agent: AgentMaker) -> None:
    make_agent("a", command="true")
    make_agent("b", command="true")
    runs = [pisub.launch(name, "x") for name in ("a", "b", "a")]
    for run in runs:
        run.wait(timeout=30)

    def ids(*args: str) -> list[str]:
        proc = pisub_cli("list", "--json", *args)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line)["runId"] for line in proc.stdout.splitlines()]

    assert ids("--agent", "a") == [runs[0].id, runs[2].id]
    assert ids("--limit", "2") == [runs[1].id, runs[2].id]
    assert ids("--since", "1h") == [r.id for r in runs]
    assert ids("--since", "0s") == []
    nothing = pisub_cli("list", "--limit", "0")  # none asked for: not "no runs"
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (0, "", "")


@pytest.mark.parametrize("since", ["nan", "-1h", "infd", "x"])
def test_a_bad_since_is_one_line(home: Path, since: str) -> None:
    proc = pisub_cli("list", "--since", since)
    assert proc.returncode == 1 and "not an age" in proc.stderr and "Traceback" not in proc.stderr


def test_on_done_runs_once_after_the_terminal_status(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("quick", command="true")
    out = tmp_path / "done.txt"
    script = tmp_path / "hook.py"
    script.write_text(
        "import os, sys\n"
        "env = os.environ\n"
        f"line = env['PISUB_RUN_ID'] + ' ' + env['PISUB_RUN_STATE'] + '\\n'\n"
        f"open({str(out)!r}, 'a').write(line)\n"
        "print('hooked'); sys.exit(3)\n"
    )
    proc = pisub_cli("run", "--agent", "quick", "--on-done", f"{sys.executable} {script}", "x")
    assert proc.returncode == 0, proc.stderr
    run = pisub.Run(proc.stdout.strip())
    assert run.wait(timeout=30).state == "complete"
    finished = wait_for(lambda: run_events(run, "on_done.finished"), timeout=30)
    assert finished[0]["data"]["exitCode"] == 3 and "hooked" in str(finished[0]["data"]["output"])
    assert out.read_text() == f"{run.id} complete\n"
    assert oct((run.dir / "on-done.log").stat().st_mode & 0o777) == "0o600"


def test_on_done_runs_once_for_a_run_whose_runner_died(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("long", command="sleep", args=["60"])
    out = tmp_path / "done.txt"
    line = f"import os; open({str(out)!r}, 'a').write(os.environ['PISUB_RUN_STATE'] + chr(10))"
    hook = f'{sys.executable} -c "{line}"'
    run = pisub.launch("long", "x", on_done=hook)
    pid = wait_for(lambda: run.status().pid, timeout=30)
    os.kill(pid, signal.SIGKILL)
    assert run.wait(timeout=30).state == "failed"  # repaired by this reader
    wait_for(lambda: out.exists() and out.read_text() == "failed\n", timeout=30, what="the hook")
    for _ in range(3):
        run.status()  # later readers do not run it again
    assert out.read_text() == "failed\n"


def test_on_done_of_a_workflow_runs_once_when_the_workflow_ends(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("quick", command="true")
    make_agent("long", command="sleep", args=["60"])
    out = tmp_path / "done.txt"
    line = f"import os; open({str(out)!r}, 'a').write(os.environ['PISUB_RUN_STATE'] + chr(10))"
    hook = f'{sys.executable} -c "{line}"'
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"agent": "quick", "task": "a"}, {"agent": "quick", "task": "b"}]))
    proc = pisub_cli("run", "--parallel", str(tasks), "--on-done", hook)
    assert proc.returncode == 0, proc.stderr
    run = pisub.Run(proc.stdout.strip())
    assert run.wait(timeout=60).state == "complete"
    wait_for(lambda: out.exists() and out.read_text() == "complete\n", timeout=30, what="the hook")
    assert len(wait_for(lambda: run_events(run, "on_done.finished"), timeout=30)) == 1
    # A workflow whose coordinator is killed: the repairing reader runs it, once.
    out.unlink()
    tasks.write_text(json.dumps([{"agent": "long", "task": "a"}]))
    from pisub.api.client import launch_parallel

    run = launch_parallel([{"agent": "long", "task": "a"}], on_done=hook)
    pid = wait_for(lambda: run.status().pid, timeout=30)
    os.kill(pid, signal.SIGKILL)
    assert run.wait(timeout=60).state == "failed"
    wait_for(lambda: out.exists() and out.read_text() == "failed\n", timeout=30, what="the hook")
    run.status()
    assert out.read_text() == "failed\n"


@pytest.mark.parametrize(
    ("hook", "why"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("tr\0ue", "on_done"),
        ("'unbalanced", "split"),
        ("x" * 17000, "16 KiB"),
    ],
)
def test_a_bad_on_done_is_refused(home: Path, make_agent: AgentMaker, hook: str, why: str) -> None:
    from pisub.errors import InvalidInput

    make_agent("quick", command="true")
    with pytest.raises(InvalidInput, match="on_done") as caught:
        pisub.launch("quick", "x", on_done=hook)
    assert why in caught.value.message


def test_logs_of_a_workflow_interleave_its_children_with_their_keys(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    from pisub.api.client import launch_parallel

    make_agent(
        "talker",
        command="sh",
        args=["-c", "cat >/dev/null; for i in 1 2 3; do echo line $i; sleep 0.2; done"],
    )
    run = launch_parallel(
        [{"agent": "talker", "task": "a", "key": "one"}, {"agent": "talker", "task": "b", "key": "two"}]
    )
    proc = pisub_cli("logs", run.id, "-f", timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for key in ("one", "two"):
        assert [line for line in lines if line.startswith(f"[{key}] ")] == [
            f"[{key}] line {i}" for i in (1, 2, 3)
        ]
    assert pisub_cli("logs", run.id).stdout.splitlines().count("[one] line 3") == 1
