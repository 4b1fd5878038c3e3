"""The real pi CLI as the child, against the scripted model server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pisub
from pisub.core.procs import marked_processes
from pisub.protocol import RunState
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pid_alive, pisub_cli, wait_for
from tests.helpers import cmdline, run_events

pytestmark = pytest.mark.pi


@pytest.mark.pi_versions
def test_plain_reply_with_usage_and_session(pi_home: Path) -> None:
    run = pisub.launch("pi", "hello there")
    result = run.wait(timeout=60)
    single = result.details.results[0]
    assert result.state == "complete", result.content[0].text
    assert single.output == "Hello from the fake LLM. You said: hello there"
    assert result.content[0].text == single.output
    assert single.exit_code == 0
    assert single.usage.input == 100 and single.usage.output > 0 and single.usage.turns == 1
    session = run.dir / "session.jsonl"
    assert single.session_file == str(session) and session.exists()
    status = run.status()
    assert status.session_file == str(session)
    assert status.steps[0].turn_count == 1
    assert status.steps[0].recent_output == [single.output]
    types = [e["type"] for e in run_events(run)]
    assert "pi.agent_start" in types and "pi.agent_end" in types
    assert "pi.message_update" not in types
    assert all(e.get("child") == 0 for e in run_events(run) if str(e["type"]).startswith("pi."))
    # The agent body reached pi as an appended system prompt, through a file.
    assert (run.dir / "system-prompt.md").read_text() == "Be terse."


@pytest.mark.pi_versions
def test_tool_call_logged_and_final_answer(pi_home: Path, model_server: FakeModelServer) -> None:
    run = pisub.launch("pi", "please run TOOL: echo hi")
    result = run.wait(timeout=60)
    assert result.state == "complete"
    assert result.details.results[0].output == "Tool said: hi"
    log = (run.dir / "output-0.log").read_text()
    assert "tool: bash echo hi\n" in log
    assert log.endswith("Tool said: hi\n")
    step = run.status().steps[0]
    assert step.tool_count == 1 and step.turn_count == 2 and step.current_tool is None
    sent = [r for r in model_server.requests if "TOOL: echo hi" in json.dumps(r)]
    system = sent[0]["messages"][0]
    assert system["role"] == "system" and "Be terse." in json.dumps(system)


@pytest.mark.pi_versions
def test_http_500_fails_with_pis_error(pi_home: Path) -> None:
    run = pisub.launch("pi", "ERROR500 please")
    result = run.wait(timeout=60)
    assert result.state == "failed"
    assert result.details.error is not None
    assert result.details.error.code == "SUBAGENT_FAILED"
    assert "fake server error" in result.details.error.message  # 0.85+: "500: <the raw body>"
    single = result.details.results[0]
    assert single.exit_code == 1 and "pi produced no final text" in (single.output or "")
    assert "{" not in (single.output or ""), "never raw JSONL"


@pytest.mark.serial  # 2.5 s of idleness allowed to a real pi: none to spare for a loaded machine
def test_slow_stream_keeps_idle_alive_but_hits_runtime(pi_home: Path) -> None:
    run = pisub.launch("pi", "SLOW:400 tell me a story", timeout=4, idle_timeout=2.5)
    pi_pid = wait_for(lambda: run.status().steps[0].pid, what="pi pid")
    result = run.wait(timeout=60)
    single = result.details.results[0]
    assert single.exit_code == 124 and single.timeout_reason == "runtime", result.content[0].text
    assert not pid_alive(pi_pid)
    assert not marked_processes(run.id)


@pytest.mark.serial  # 2.5 s of idleness allowed to a real pi: none to spare for a loaded machine
def test_silent_tool_hits_idle_timeout_and_sleep_is_gone(pi_home: Path) -> None:
    run = pisub.launch("pi", "please run TOOL: sleep 45", timeout=60, idle_timeout=2.5)

    def sleeping() -> list[int]:
        return [p for p in marked_processes(run.id) if cmdline(p).startswith("sleep 45")]

    (sleep_pid,) = wait_for(sleeping, timeout=30, what="pi's bash tool to run sleep")
    result = run.wait(timeout=60)
    single = result.details.results[0]
    assert single.exit_code == 124 and single.timeout_reason == "idle", result.content[0].text
    assert not pid_alive(sleep_pid)
    assert not marked_processes(run.id)


def test_launcher_sigkilled_while_pi_runs(pi_home: Path) -> None:
    launcher = textwrap.dedent("""
        import time, pisub
        run = pisub.launch("pi", "SLOW:15 a short story")
        print(run.id, flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    run = pisub.Run(run_id)
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert run.status().state == RunState.COMPLETE


def test_missing_pi_binary_is_one_clear_line(pi_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PISUB_PI_BIN", "/nonexistent/pi")
    proc = pisub_cli("run", "--agent", "pi", "hello")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    from pisub.children.pi.versions import installed_pi

    launcher = installed_pi()  # a checkout's own pi is named first (tests/integration/test_first_hour.py)
    hint = f"export PISUB_PI_BIN={launcher}" if launcher else "npm install -g @earendil-works/pi-coding-agent"
    assert len(lines) == 1 and hint in lines[0], lines
    monkeypatch.delenv("PISUB_PI_BIN")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    proc = pisub_cli("run", "--agent", "pi", "hello")
    assert proc.returncode == 1 and "not found on PATH" in proc.stderr
    assert not (pi_home / "runs").exists() or not os.listdir(pi_home / "runs")
