"""The low-severity leftovers of issue 29's outside attack (docs only), one test each; each
failed before its fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_parallel
from pisub.api.views import open_home, open_home_to_read
from pisub.children.pi.versions import supported_version
from pisub.cli.top import Top
from pisub.errors import UnsupportedPi
from pisub.protocol.codec import encode, now_iso
from pisub.protocol.control import Stop
from pisub.protocol.status import RunState, Status
from pisub.store.mailbox import claim, write_request
from pisub.workflow.calls import MAX_TASKS_FILE
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import one_line_error, wait_runner_dead

RUN_ID = "0123abcd-0000-4000-8000-000000000000"


def _empty_run_folder(home: Path) -> Path:
    (home / "runs").mkdir(mode=0o700, parents=True)
    home.chmod(0o700)
    folder = home / "runs" / RUN_ID
    folder.mkdir(mode=0o700)
    return folder


def test_control_of_an_empty_run_folder_answers_as_status_does(home: Path) -> None:
    """F10: a run folder with no files is a broken run for ``stop`` (and every request) as for
    ``status``: the same one line, not a storage failure — a damaged folder, never "no such
    run" (``list`` names it)."""
    folder = _empty_run_folder(home)
    status = one_line_error(pisub_cli("status", RUN_ID), "PROTOCOL_ERROR")
    assert "status.json is missing: the run's folder is damaged" in status
    for command in (["stop"], ["interrupt"], ["stop", "--wait", "0"]):
        proc = pisub_cli(*command, RUN_ID, timeout=20)
        assert proc.returncode == 1
        line = one_line_error(proc, "PROTOCOL_ERROR")
        assert line == status or (command == ["interrupt"] and "manifest.json is missing" in line)
    assert sorted(p.name for p in folder.iterdir()) == [], "nothing was written"


def test_a_request_to_a_run_folder_without_its_inbox_names_the_problem(home: Path) -> None:
    """F10: a readable status but no inbox: a protocol problem naming the folder, not IO_ERROR."""
    folder = _empty_run_folder(home)
    now = now_iso()
    status = Status(
        v=1, run_id=RUN_ID, state=RunState.RUNNING, agent="x", runner="external", host="h",
        started_at=now, updated_at=now,
    )  # fmt: skip
    (folder / "status.json").write_bytes(encode(status))
    proc = pisub_cli("stop", "--wait", "0", RUN_ID, timeout=20)
    assert "has no inbox" in one_line_error(proc, "PROTOCOL_ERROR"), proc.stderr


def test_a_coordinator_killed_mid_stop_says_how_far_the_stop_got(home: Path, make_agent: AgentMaker) -> None:
    """F2: a coordinator killed -9 while it handled a stop of the whole workflow (it answers
    only once every running child was asked) left the request claimed without a receipt; the
    repair answered "the runner died before the request was consumed" although the stops it had
    already written into children's inboxes ended them. The one receipt now counts them.

    The coordinator's state at the kill is made by hand (the stop claimed into its ``inbox/cur``,
    copies from ``workflow <id>`` in two of its three children's inboxes): the moment between
    two of its parallel writes cannot be hit on purpose."""
    make_agent("sleeper", command="sleep", args=["300"])
    run = launch_parallel([{"key": f"c{i}", "agent": "sleeper", "task": "x"} for i in range(3)])
    wait_for(lambda: [str(s.status) for s in run.status().steps].count("running") == 3, 30)
    status = run.status()
    assert status.pid is not None
    children = [pisub.Run(str(s.run_id)) for s in status.steps]
    os.kill(status.pid, signal.SIGKILL)
    wait_runner_dead(run, status.pid)
    rid = write_request(run.paths, Stop(v=1, reason="enough"))
    assert claim(run.paths, f"{rid}.json") is not None
    source = f"workflow {run.id}"
    for child in children[:2]:
        write_request(child.paths, Stop(v=1, reason=f"{source} is ending", source=source))
    pisub_cli("status", run.id)  # a reader repairs the dead coordinator's run
    assert run.status().state == "failed"
    receipt = run.receipt(rid)
    assert receipt is not None and receipt.state == "failed", receipt
    assert receipt.reason == "the coordinator died after forwarding the stop to 2 of its 3 running children"
    assert [p.name for p in (run.dir / "outbox").iterdir() if p.name.startswith(rid)] == [f"{rid}.json"]
    for child in children[:2]:
        assert child.wait_until_terminal(20).state == "stopped"
    assert not children[2].status().state.is_terminal  # never reached: it goes on
    children[2].send_stop()


def test_a_tasks_file_whose_manifest_would_be_too_large_is_refused_up_front(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    """F6: a tasks file just under its 16 MiB limit made a manifest over the 16 MiB a run's
    files may hold: the run was created and failed ("runner crashed"). Now: one line,
    INVALID_INPUT, the limit named, no run and no mission entry."""
    make_agent("echo", command="cat")
    count = 1000
    empty = len(json.dumps([{"agent": "echo", "task": ""}] * count, separators=(",", ":")))
    task = "x" * ((MAX_TASKS_FILE - 200 - empty) // count)
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"agent": "echo", "task": task}] * count, separators=(",", ":")))
    assert MAX_TASKS_FILE - 1000 < tasks.stat().st_size < MAX_TASKS_FILE
    proc = pisub_cli("run", "--parallel", str(tasks), "--max-spawns", str(count), timeout=120)
    line = one_line_error(proc, "INVALID_INPUT")
    assert proc.returncode == 1 and "16 MiB" in line, line
    runs = home / "runs"
    assert not runs.exists() or not list(runs.iterdir()), "nothing was created"
    assert pisub_cli("mission", "list", "--json").stdout.strip() in ("", "[]")


def test_a_pi_that_says_too_much_is_quoted_with_an_ellipsis(tmp_path: Path) -> None:
    """F11 (a): the end of what a would-be pi said is quoted, and the cut is marked."""
    said = " ".join(f"word{i}" for i in range(200))
    fake = tmp_path / "pi"
    fake.write_text(f"#!/bin/sh\necho 'error: {said} end'\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(UnsupportedPi) as raised:
        supported_version(str(fake), tmp_path / "cache")
    message = raised.value.message
    assert "(--version: …word" in message and "word199 end);" in message, message
    quoted = message.split("(--version: ", 1)[1].split(");", 1)[0]
    assert len(quoted) == 300, quoted


def _without_a_home(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose default home (``$HOME/.local/state/pisub``) does not exist."""
    env = {k: v for k, v in os.environ.items() if k not in ("PISUB_HOME", "XDG_STATE_HOME")}
    env["HOME"] = str(tmp_path / "nonexistent")
    return env, tmp_path / "nonexistent"


def test_top_never_creates_the_home(tmp_path: Path) -> None:
    """F11 (b), for ``top``: a home that does not exist is read as one with no runs, not made;
    with nothing to watch, its reader lists the runs often (a home made later is seen)."""
    missing = tmp_path / "nonexistent" / "pisub"
    top = Top(open_home_to_read(missing))
    try:
        top.refresh()
        assert top.state.rows == [] and top.state.problems == []
        assert not missing.parent.exists(), "top created the home"
        assert top.reader.polling
    finally:
        top.watch.close()


def test_reading_commands_never_create_the_home(tmp_path: Path) -> None:
    """F11 (b): ``HOME=/nonexistent pisub list`` made the default home; every read-only command
    answers as for an empty home instead (no runs), and creates nothing."""
    env, missing = _without_a_home(tmp_path)
    listed = pisub_cli("list", env=env)
    assert listed.returncode == 0 and listed.stdout == "no runs\n", listed
    assert pisub_cli("list", "--json", env=env).stdout == ""
    assert pisub_cli("list", "--state", "running", env=env).returncode == 0
    assert pisub_cli("status", env=env).returncode == 0
    for command in ("status", "logs", "result"):
        proc = pisub_cli(command, RUN_ID, env=env)
        assert proc.returncode == 1 and "RUN_NOT_FOUND" in one_line_error(proc, "RUN_NOT_FOUND")
    assert not missing.exists(), "a read-only command created the home"


READERS = (
    (("resources",), 0),
    (("agents", "list"), 0),
    (("agents", "show", "coder"), 0),
    (("lease", "list"), 0),
    (("children", "list"), 0),
    (("worktree", "list"), 0),
    (("config", "show"), 0),
    (("group", "list"), 0),
    (("schedule", "list"), 0),
    (("schedule", "show", "nightly"), 1),
    (("schedule", "history", "nightly"), 1),
    (("schedule", "timer"), 0),
    (("worktree", "cleanup"), 0),
    (("workflow", "validate", "--workflow-script", "return 1"), 0),
    (("mission", "list", "--scope", "global"), 0),
    (("mission", "show", "abcdefabcdef"), 1),
    (("gc", "--dry-run"), 0),
    (("gc",), 0),
    (("stop", "--all"), 0),
    (("interrupt", "--agent", "coder"), 0),
    (("fleet",), 0),
)


def test_every_other_reading_command_never_creates_the_home(tmp_path: Path) -> None:
    """The attack's F4 (issue 29): ``agents list``, ``config show``, ``schedule list``,
    ``gc --dry-run``, ``stop --all`` with nothing to stop… made a missing home; each answers as
    for an empty home (or names what it did not find) and creates nothing."""
    env, missing = _without_a_home(tmp_path)
    for argv, code in READERS:
        proc = pisub_cli(*argv, env=env)
        assert proc.returncode == code and "Traceback" not in proc.stderr, (argv, proc)
        assert not missing.exists(), f"pisub {' '.join(argv)} created the home"


def test_logs_follow_of_a_workflow_whose_coordinator_died_says_so(home: Path, make_agent: AgentMaker) -> None:
    """F11 (c): ``logs -f`` of a workflow whose coordinator was killed ended silently, exit 0,
    while its children went on: it now ends with the line ``status`` gives, exit 1."""
    make_agent("sleeper", command="sh", args=["-c", "echo hi; sleep 300"])
    run = launch_parallel([{"key": f"c{i}", "agent": "sleeper", "task": "x"} for i in range(2)])
    wait_for(lambda: [str(s.status) for s in run.status().steps].count("running") == 2, 30)
    following = subprocess.Popen(
        [sys.executable, "-m", "pisub", "logs", "-f", run.id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    stdout, stderr = following.communicate(timeout=60)
    assert following.returncode == 1, (stdout, stderr)
    proc = subprocess.CompletedProcess(following.args, 1, stdout, stderr)
    line = one_line_error(proc, "SUBAGENT_FAILED")
    assert f"run {run.id} failed: Runner process {pid} exited" in line and "Its children go on" in line
    error = run.status().error
    assert error is not None and line.split("failed: ", 1)[1].rsplit(" [", 1)[0] == error.message  # as status
    for step in run.status().steps:
        pisub.Run(str(step.run_id)).send_stop()


def test_s_in_top_on_an_external_run_says_at_once_it_cannot_be_steered(
    home: Path, make_agent: AgentMaker
) -> None:
    """F11 (d): ``s`` on an external CLI's run opened the steer prompt, and only the message
    typed was refused (a long line cut at 80 columns); now ``s`` says why at once, one line
    that fits 80 columns, and no prompt opens. A pi run or a workflow still gets the prompt."""
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    top = Top(open_home(home))
    try:
        top.refresh()
        assert top.state.current is not None and top.state.current.fleet.run_id == run.id
        top.key("s")
        assert top.state.mode == "table", "a steer prompt opened for a run that cannot take one"
        message = top.state.message
        assert message.startswith(f"steer {run.id[:8]}: NOT_STEERABLE — ") and len(message) <= 80, message
        assert "external-cli" in message and "x stops it" in message
    finally:
        top.watch.close()
        run.send_stop()


def test_stop_all_reaches_the_children_of_a_dead_coordinator(home: Path, make_agent: AgentMaker) -> None:
    """F4: the children of a workflow whose coordinator was killed -9 go on running (promise:
    a run outlives its launcher), but ``stop --all`` said "no live run": it took only top-level
    runs. A live run whose parent has ended is now in every selection (no live run above it
    would stop it); the children of a live workflow still are not (their workflow stops them)."""
    make_agent("sleeper", command="sleep", args=["300"])
    alive = launch_parallel([{"key": "a", "agent": "sleeper", "task": "x"}])
    dead = launch_parallel([{"key": f"c{i}", "agent": "sleeper", "task": "x"} for i in range(2)])

    def running(flow: pisub.Run, count: int) -> bool:
        return [str(s.status) for s in flow.status().steps].count("running") == count

    wait_for(lambda: running(alive, 1) and running(dead, 2), 30)
    status = dead.status()
    assert status.pid is not None
    children = [pisub.Run(str(s.run_id)) for s in status.steps]
    os.kill(status.pid, signal.SIGKILL)
    wait_runner_dead(dead, status.pid)
    pisub_cli("status", dead.id)  # a reader repairs the dead coordinator's run
    assert dead.status().state == "failed"
    proc = pisub_cli("stop", "--all", "--json", timeout=30)
    assert proc.returncode == 0, proc.stderr
    stopped = {json.loads(line)["runId"] for line in proc.stdout.splitlines()}
    assert stopped == {alive.id, *(c.id for c in children)}, proc.stdout
    for run in (alive, *children):
        assert run.wait_until_terminal(20).state == "stopped"


def test_stop_all_reaches_a_run_started_inside_a_single_run(home: Path, make_agent: AgentMaker) -> None:
    """Attack 31, F1: a single run's stop does not end the runs it started (a child run
    outlives its parent's end), so ``stop --all`` must select them too — it took only the
    outer run, and ``stop --agent sleeper`` said "no live run" while one ran."""
    make_agent("sleeper", command="sleep", args=["300"])
    make_agent("nester", python="import time, pisub\npisub.launch('sleeper', 'inner')\ntime.sleep(300)\n")
    outer = pisub.launch("nester", "outer")

    def inner() -> pisub.Run | None:
        found = [st for st in pisub.list_runs(children=True) if st.parent_run_id == outer.id]
        return pisub.Run(found[0].run_id) if found and found[0].state == "running" else None

    nested = wait_for(inner, 30, what="the nested run")
    proc = pisub_cli("stop", "--agent", "sleeper", "--json", timeout=30)
    assert {json.loads(line)["runId"] for line in proc.stdout.splitlines()} == {nested.id}, proc.stdout
    assert nested.wait_until_terminal(20).state == "stopped"
    assert not outer.status().state.is_terminal
    outer.send_stop()


def test_stop_all_leaves_a_resumed_workflows_children_to_it(home: Path, make_agent: AgentMaker) -> None:
    """Attack 31, F2: the children a resumed workflow re-attached still name the dead
    coordinator as their parent; they are the live workflow's (its status lists them), so
    ``stop --all`` stops the workflow alone, which stops them."""
    make_agent("sleeper", command="sleep", args=["300"])
    dead = launch_parallel([{"key": f"c{i}", "agent": "sleeper", "task": "x"} for i in range(2)])
    wait_for(lambda: [str(s.status) for s in dead.status().steps].count("running") == 2, 30)
    status = dead.status()
    assert status.pid is not None
    children = {str(s.run_id) for s in status.steps}
    os.kill(status.pid, signal.SIGKILL)
    wait_runner_dead(dead, status.pid)
    resumed = pisub_cli("resume", dead.id, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    again = pisub.Run(resumed.stdout.split()[0])
    wait_for(lambda: {str(s.run_id) for s in again.status().steps if s.run_id} == children, 30)
    proc = pisub_cli("stop", "--all", "--json", timeout=30)
    assert {json.loads(line)["runId"] for line in proc.stdout.splitlines()} == {again.id}, proc.stdout
    assert again.wait_until_terminal(30).state == "stopped"
    for child in children:
        assert pisub.Run(child).wait_until_terminal(20).state == "stopped"


def test_a_mistyped_option_is_one_clean_line() -> None:
    """Attack 31, F7: click's suggestion in parentheses left a stray ``()`` in the line."""
    proc = pisub_cli("list", "--agen", "x")
    line = one_line_error(proc, "USAGE")
    assert "()" not in line and "Did you mean one of: '--agent'" in line, line
    assert proc.returncode == 2
