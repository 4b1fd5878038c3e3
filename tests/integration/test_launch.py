"""A real detached run end to end: launch, files, result, the read-side CLI."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pisub
from pisub.protocol import RunState, Status, decode
from tests.conftest import AgentMaker, pisub_cli, wait_for

ECHO = """
import os, sys
data = sys.stdin.read()
print("got:", data.strip())
print("run:", os.environ.get("PISUB_RUN_ID"), os.environ.get("PISUB_RUN_DIR"))
"""


def test_cli_run_wait_result(home: Path, make_agent: AgentMaker) -> None:
    make_agent("echo", python=ECHO, body="You are an echo.")
    proc = pisub_cli("run", "--agent", "echo", "--json", "hello world", check=True)
    launched = json.loads(proc.stdout)
    run_id, run_dir = launched["runId"], Path(launched["runDir"])
    assert run_dir == home / "runs" / run_id
    assert launched["state"] in ("running", "complete")

    waited = pisub_cli("wait", run_id[:8], "--timeout", "30", "--json")
    assert waited.returncode == 0, waited.stderr
    result = json.loads(waited.stdout)
    single = result["details"]["results"][0]
    assert result["state"] == "complete"
    assert single["exitCode"] == 0
    assert "You are an echo.\n\nhello world" in single["output"]
    assert f"run: {run_id} {run_dir}" in single["output"]
    assert result["content"][0]["text"] == single["output"]
    assert result["details"]["runId"] == run_id

    status = json.loads(pisub_cli("status", run_id, "--json", check=True).stdout)
    assert status["state"] == "complete"
    assert status["runId"] == run_id and status["agent"] == "echo"
    assert status["pid"] > 0 and status["pidStartTime"] > 0
    assert status["startedAt"] <= status["updatedAt"] and status["endedAt"]
    step = status["steps"][0]
    assert step["index"] == 0 and step["status"] == "complete" and step["exitCode"] == 0
    assert step["pid"] > 0 and step["lastActivityAt"]

    assert pisub_cli("path", run_id[:10], check=True).stdout.strip() == str(run_dir)
    logs = pisub_cli("logs", run_id, check=True).stdout
    assert "got: You are an echo." in logs
    human = pisub_cli("result", run_id, check=True).stdout
    assert "hello world" in human
    listed = pisub_cli("list", "--json", check=True).stdout.splitlines()
    assert [json.loads(line)["runId"] for line in listed] == [run_id]
    assert run_id[:8] in pisub_cli("list", check=True).stdout


def test_run_directory_layout_and_modes(home: Path, make_agent: AgentMaker) -> None:
    make_agent("echo", python=ECHO)
    run = pisub.launch("echo", "hi")
    run.wait(timeout=30)
    names = set(os.listdir(run.dir))
    assert {
        "manifest.json",
        "status.json",
        "events.jsonl",
        "result.json",
        "runner.log",
        "output-0.log",
        "stderr-0.log",
        "inbox",
        "outbox",
    } <= names
    assert {"tmp", "new"} <= set(os.listdir(run.dir / "inbox"))
    assert not [n for n in names if n.endswith(".tmp")]
    for path in [home, home / "runs", run.dir, run.dir / "inbox", run.dir / "outbox"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for name in names:
        path = run.dir / name
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

    def event_types() -> list[str]:
        return [json.loads(line)["type"] for line in (run.dir / "events.jsonl").read_text().splitlines()]

    # run.finished follows the terminal status (spec/protocol.md: result → status → run.finished)
    types = wait_for(lambda: (t := event_types()) and t[-1] == "run.finished" and t, what="run.finished")
    assert types[0] == "run.created"
    assert "child.started" in types and "child.exited" in types
    manifest = json.loads((run.dir / "manifest.json").read_text())
    assert manifest["task"] == "hi" and manifest["agent"]["name"] == "echo"


def test_failing_child_is_failed_with_stderr(home: Path, make_agent: AgentMaker) -> None:
    make_agent(
        "bad", python="import sys; print('partial'); print('boom: it broke', file=sys.stderr); sys.exit(3)"
    )
    run = pisub.launch("bad", "x")
    result = run.wait(timeout=30)
    assert result.state == "failed"
    single = result.details.results[0]
    assert single.exit_code == 3
    assert result.details.error is not None and result.details.error.code == "SUBAGENT_FAILED"
    assert "boom: it broke" in result.details.error.message
    assert single.output == "partial\n"
    assert run.status().state == RunState.FAILED
    assert pisub_cli("wait", run.id).returncode == 1


def test_wait_timeout_exit_3_and_result_before_end(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleepy", python="import time; time.sleep(30)")
    run = pisub.launch("sleepy", "x")
    proc = pisub_cli("wait", run.id, "--timeout", "0.3")
    assert proc.returncode == 3
    assert "still running" in proc.stderr
    early = pisub_cli("result", run.id)
    assert early.returncode == 1 and "no result yet" in early.stderr
    assert run.status().state == RunState.RUNNING


def test_logs_follow_prints_everything_until_the_end(home: Path, make_agent: AgentMaker) -> None:
    make_agent(
        "ticker",
        python="""
        import time
        for i in range(5):
            print("tick", i, flush=True)
            time.sleep(0.1)
    """,
    )
    run = pisub.launch("ticker", "x")
    proc = pisub_cli("logs", run.id, "-f", timeout=30)
    assert proc.returncode == 0
    assert [line for line in proc.stdout.splitlines()] == [f"tick {i}" for i in range(5)]


def test_agents_list_and_show(home: Path, make_agent: AgentMaker, tmp_path: Path) -> None:
    make_agent("alpha", command="echo", args=["-c", "echo hi"], description="the first", body="Be brief.")
    project = tmp_path / ".pisub" / "agents"
    project.mkdir(parents=True)
    (project / "alpha.md").write_text("---\nname: alpha\ncommand: cat\ndescription: project one\n---\n")
    (project / "broken.md").write_text("---\nname: broken\nbogus: 1\n---\n")
    listed = [
        json.loads(line) for line in pisub_cli("agents", "list", "--json", check=True).stdout.splitlines()
    ]
    mine = [(a["name"], a["scope"]) for a in listed if a["scope"] != "builtin"]
    assert mine == [("alpha", "project")]
    shipped = {a["name"] for a in listed if a["scope"] == "builtin"}
    assert shipped == {"coder", "hello", "reviewer", "scout", "worker"}
    proc = pisub_cli("agents", "list")
    assert "broken.md" in proc.stderr and "bogus" in proc.stderr
    shown = pisub_cli("agents", "show", "alpha", check=True).stdout
    assert "project one" in shown and "cat" in shown
    (project / "alpha.md").unlink()
    shown = pisub_cli("agents", "show", "alpha", check=True).stdout
    assert "-c echo hi" in shown and "Be brief." in shown
    missing = pisub_cli("agents", "show", "nope")
    assert missing.returncode == 1 and "UNKNOWN_AGENT" in missing.stderr and "alpha" in missing.stderr


def test_list_filters_by_state(home: Path, make_agent: AgentMaker) -> None:
    make_agent("ok", python="print('ok')")
    make_agent("sleepy", python="import time; time.sleep(30)")
    done = pisub.launch("ok", "x")
    done.wait(timeout=30)
    live = pisub.launch("sleepy", "x")
    running = pisub_cli("list", "--state", "running", "--json", check=True).stdout.splitlines()
    assert [json.loads(line)["runId"] for line in running] == [live.id]
    complete = pisub_cli("list", "--state", "complete", "--json", check=True).stdout.splitlines()
    assert [json.loads(line)["runId"] for line in complete] == [done.id]
    bad = pisub_cli("list", "--state", "bogus")
    assert bad.returncode == 1 and "INVALID_INPUT" in bad.stderr


def test_child_gets_the_callers_umask_and_default_sighup(home: Path, make_agent: AgentMaker) -> None:
    make_agent(
        "probe",
        python="""
        import os, signal
        mask = os.umask(0); os.umask(mask)
        print(oct(mask), signal.getsignal(signal.SIGHUP) == signal.SIG_DFL)
    """,
    )
    old = os.umask(0o022)
    try:
        run = pisub.launch("probe", "x")
    finally:
        os.umask(old)
    result = run.wait(timeout=30)
    assert result.details.results[0].output == "0o22 True\n"


def test_nul_in_agent_args_is_refused(home: Path, make_agent: AgentMaker) -> None:
    make_agent("nul", command="cat", args=["a\u0000b"])
    proc = pisub_cli("run", "--agent", "nul", "x")
    assert proc.returncode == 1 and "UNKNOWN_AGENT" in proc.stderr and "NUL" in proc.stderr


def test_status_polled_while_the_runner_rewrites_it(home: Path, make_agent: AgentMaker) -> None:
    """Readers never see a torn status.json written by a live runner."""
    make_agent(
        "chatty",
        python="""
        import time
        end = time.monotonic() + 3
        while time.monotonic() < end:
            print("tick", flush=True)
            time.sleep(0.01)
    """,
    )
    run = pisub.launch("chatty", "x")
    seen = set()
    reads = 0
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the run was still going after 60 s"
        status = decode((run.dir / "status.json").read_bytes(), Status, "status.json")
        seen.add(status.updated_at)
        reads += 1
        if status.state.is_terminal:
            break
    assert reads > 200 and len(seen) > 5
