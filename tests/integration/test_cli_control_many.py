"""Acting on several runs from the real CLI (issue 26): ``stop A B``, ``stop --all|--agent|--label``,
``interrupt A B``, ``wait A B``; one error style (usage errors, RUN_CLOSED); ``--on-done``
checked at launch; external CLIs refused steer and interrupt up front."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest
import typer
import typer.main

import pisub
from pisub.children.pi.steers import CLEARED_REASON
from pisub.protocol import RunState
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import SLEEPER, child_pids


def _sleeper(make_agent: AgentMaker, name: str = "sleeper", label: str | None = None) -> pisub.Run:
    make_agent(name, python=SLEEPER)
    run = _launch(name, label)
    child_pids(run)
    return run


def _launch(name: str, label: str | None) -> pisub.Run:
    """A run of ``name``, labelled ``label`` when given."""
    return pisub.launch(name, "x", label=label)


def _lines(text: str) -> dict[str, str]:
    """``<run id>  <rest>`` lines by run id."""
    return dict(line.split("  ", 1) for line in text.splitlines())


def test_stop_several_runs_each_once_and_refuse_a_finished_one(home: Path, make_agent: AgentMaker) -> None:
    a, b, c = (_sleeper(make_agent) for _ in range(3))
    proc = pisub_cli("stop", a.id, a.id[:8], b.id)
    assert proc.returncode == 0, proc.stderr
    lines = _lines(proc.stdout)
    assert sorted(lines) == sorted([a.id, b.id]), proc.stdout  # A named twice: stopped once
    assert all(line.startswith("delivered: stop ") for line in lines.values())
    assert a.wait(timeout=30).state == "stopped" and b.wait(timeout=30).state == "stopped"
    assert c.status().state == RunState.RUNNING
    again = pisub_cli("stop", a.id)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.strip() == f"pisub: run {a.id} has finished; it takes no more requests [RUN_CLOSED]"
    mixed = pisub_cli("stop", a.id, c.id)
    assert mixed.returncode == 1, mixed.stdout
    lines = _lines(mixed.stdout)
    assert lines[a.id].startswith("refused: stop: run ") and lines[a.id].endswith("[RUN_CLOSED]")
    assert lines[c.id].startswith("delivered: stop ")
    assert c.wait(timeout=30).state == "stopped"


def test_a_bad_reference_refuses_the_whole_command(home: Path, make_agent: AgentMaker) -> None:
    run = _sleeper(make_agent)
    for bad, code in (("00000000", "RUN_NOT_FOUND"), ("../../etc", "INVALID_INPUT")):
        proc = pisub_cli("stop", run.id, bad)
        assert proc.returncode == 1 and proc.stdout == "" and f"[{code}]" in proc.stderr, proc.stderr
    assert run.status().state == RunState.RUNNING  # nothing was written to it
    assert not list((run.dir / "outbox").glob("*.json"))
    usage = pisub_cli("stop", run.id, "--all")
    assert usage.returncode == 2 and usage.stderr.endswith("[USAGE]\n"), usage.stderr
    child = pisub_cli("stop", run.id, run.id[:9], "--child", "0")
    assert child.returncode == 1 and "give one run" in child.stderr
    pisub_cli("stop", run.id, check=True)


def test_stop_by_agent_label_and_all(home: Path, make_agent: AgentMaker) -> None:
    s1, s2 = _sleeper(make_agent), _sleeper(make_agent)
    other = _sleeper(make_agent, "other")
    named = _sleeper(make_agent, "other", label="night job")
    make_agent("quick", command="true")
    done = pisub.launch("quick", "x")
    done.wait(timeout=30)
    proc = pisub_cli("stop", "--label", "night job", "--json")
    assert proc.returncode == 0, proc.stderr
    [receipt] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert receipt["runId"] == named.id and receipt["state"] == "delivered"
    proc = pisub_cli("stop", "--agent", "other")  # the labelled one may still be ending: "ended"
    assert proc.returncode == 0, proc.stdout
    lines = _lines(proc.stdout)
    assert lines.pop(other.id).startswith("delivered: stop ")
    assert lines in ({}, {named.id: lines.get(named.id, "")}), lines
    assert all(line.startswith("ended: stop") for line in lines.values()), lines
    none = pisub_cli("stop", "--agent", "nobody")
    assert none.returncode == 0 and none.stdout == "no live run of agent 'nobody'\n"
    proc = pisub_cli("stop", "--all", "--reason", "closing time")  # the stopped two may still be ending
    assert proc.returncode == 0, proc.stdout
    lines = _lines(proc.stdout)
    assert lines.pop(s1.id).startswith("delivered: stop ") and lines.pop(s2.id).startswith("delivered: stop ")
    assert set(lines) <= {other.id, named.id}, lines  # never the finished one
    assert all(line.startswith("ended: stop") for line in lines.values()), lines
    for run in (s1, s2, other, named):
        assert run.wait(timeout=30).state == "stopped"
    again = pisub_cli("stop", "--all")
    assert again.returncode == 0 and again.stdout == "no live run\n"


def test_stop_all_racing_runs_that_end_meanwhile(home: Path, make_agent: AgentMaker) -> None:
    """A run of the selection that ends between the listing and its request is reported ended
    (not a failure); one that ends just after its request was written is answered by its runner."""
    from pisub.api.many import ENDED, live_runs, stop_runs

    runs = [_sleeper(make_agent) for _ in range(3)]
    selected = live_runs()
    assert [r.id for r in selected] == [r.id for r in runs]
    pisub_cli("stop", runs[1].id, check=True)
    runs[1].wait(timeout=30)
    outcomes = stop_runs(selected, selected=True)
    assert [o.state for o in outcomes] == ["delivered", ENDED, "delivered"]
    assert all(o.ok for o in outcomes)
    for run in runs:
        assert run.wait(timeout=30).state == "stopped"


def test_wait_for_several_runs_waits_for_all(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", command="true")
    make_agent("slowish", command="sleep", args=["1"])
    a, b = pisub.launch("quick", "x"), pisub.launch("slowish", "x")
    proc = pisub_cli("wait", a.id, b.id[:8], "--timeout", "30")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{a.id}  complete", f"{b.id}  complete"]


def test_usage_errors_are_one_line(home: Path) -> None:
    cases = [
        (["stauts"], "No such command 'stauts'. Did you mean 'status'? Try 'pisub --help'."),
        (["stop"], "give a run id (or several), or --all / --agent A / --label L. Try 'pisub stop --help'."),
        (["stop", "--bogus", "x"], "No such option '--bogus'. Try 'pisub stop --help'."),
        (["wait", "--timeout", "soon", "x"], "Invalid value for '--timeout'"),
        (["agents", "lsit"], "Did you mean 'list'? Try 'pisub agents --help'."),
    ]
    for argv, expected in cases:
        proc = pisub_cli(*argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        line = proc.stderr.strip()
        assert line.startswith("pisub: ") and line.endswith(" [USAGE]") and expected in line, line
        assert line.count("Did you mean") <= 1 and "Usage:" not in line


def _every_group(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Group]]:
    """``group`` and every group under it, each with its words on the command line."""
    found = [(path, group)]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _every_group(command, (*path, name))
    return found


def test_help_never_cuts_a_description(home: Path) -> None:
    """Every group's ``--help`` (the root, agents, lease, …, and any group added later: the walk
    finds them) lists each command's whole first sentence, wrapped, never cut with ``...``."""
    from pisub.cli import app

    groups = _every_group(typer.main.get_group(app))
    known = {("agents",), ("worktree",), ("config",), ("group",), ("pi-extension",)}
    assert known <= {path for path, _ in groups}
    for path, group in groups:
        proc = pisub_cli(*path, "--help")
        assert proc.returncode == 0, proc.stderr
        commands = proc.stdout.split("Commands:", 1)[1]
        assert not [line for line in commands.splitlines() if line.rstrip().endswith("...")], (path, commands)
        listed = "".join(commands.split())  # wrapping may break a line after a hyphen
        for name, command in group.commands.items():
            if not command.hidden:
                whole = "".join(command.get_short_help_str(limit=10_000).split())
                assert name + whole in listed, (path, name, whole)
    stop = pisub_cli("--help").stdout.split("Commands:", 1)[1]
    assert "End one or more runs and everything they started; each ends stopped." in " ".join(stop.split())


def test_a_bad_on_done_is_refused_at_launch(home: Path, make_agent: AgentMaker, tmp_path: Path) -> None:
    make_agent("quick", command="true")
    not_exec = tmp_path / "hook.sh"
    not_exec.write_text("#!/bin/sh\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for hook, why in (
        ("no-such-command-pisub-26 --flag", "command not found on PATH: no-such-command-pisub-26"),
        (str(not_exec), f"command not found or not executable: {not_exec}"),
        ("./hook.sh", "command not found or not executable: ./hook.sh"),
        (str(tmp_path), "not executable"),
        (str(fifo), "not executable"),
        ("''", "the command is empty"),
    ):
        proc = pisub_cli("run", "--agent", "quick", "--on-done", hook, "x")
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        line = proc.stderr.strip()
        assert len(proc.stderr.splitlines()) == 1 and line.endswith("[INVALID_INPUT]"), line
        assert line.startswith("pisub: --on-done: ") and why in line, line
    assert not list((home / "runs").glob("*")) if (home / "runs").exists() else True
    not_exec.chmod(0o755)
    proc = pisub_cli("run", "--agent", "quick", "--on-done", "./hook.sh", "--cwd", str(tmp_path), "x")
    assert proc.returncode == 0, proc.stderr


def test_an_external_cli_run_is_refused_steer_and_interrupt_up_front(
    home: Path, make_agent: AgentMaker
) -> None:
    run = _sleeper(make_agent)
    steer = pisub_cli("steer", run.id, "change course")
    assert steer.returncode == 1, steer.stderr
    assert steer.stderr.startswith(f"pisub: run {run.id} is an external-cli run") and steer.stderr.endswith(
        "[NOT_STEERABLE]\n"
    )
    follow = pisub_cli("follow-up", run.id, "later")
    assert follow.returncode == 1 and "[NOT_STEERABLE]" in follow.stderr
    interrupt = pisub_cli("interrupt", run.id)
    assert interrupt.returncode == 1 and "[NOT_RESUMABLE]" in interrupt.stderr
    assert f"pisub stop {run.id[:8]}" in interrupt.stderr
    assert run.status().steering.requested == 0 and not list((run.dir / "outbox").glob("*.json"))
    assert run.status().state == RunState.RUNNING
    pisub_cli("stop", run.id, check=True)
    assert run.wait(timeout=30).state == "stopped"
    closed = pisub_cli("steer", run.id, "too late", "--json")
    assert closed.returncode == 1 and json.loads(closed.stdout)["code"] == "RUN_CLOSED"
    for verb in ("interrupt", "follow-up"):
        args = [verb, run.id] + (["x"] if verb == "follow-up" else [])
        proc = pisub_cli(*args)
        assert proc.returncode == 1, proc.stderr
        code = "[RUN_CLOSED]" if verb == "interrupt" else "[NOT_RESUMABLE]"
        assert code in proc.stderr, proc.stderr
    bare = pisub_cli("resume", run.id)  # no message: refused for what it is, not for no follow-up
    assert bare.returncode == 1 and "[NOT_RESUMABLE]" in bare.stderr and "follow-up" not in bare.stderr


@pytest.mark.pi
def test_follow_up_then_resume_without_a_message(pi_home: Path, model_server: FakeModelServer) -> None:
    import uuid

    from tests.helpers import sent_with

    tag = uuid.uuid4().hex[:8]
    source = pisub.launch("pi", f"start {tag}")
    assert source.wait(timeout=60).state == "complete"
    bare = pisub_cli("resume", source.id)
    assert bare.returncode == 1 and "[INVALID_INPUT]" in bare.stderr
    assert f"pisub resume {source.id[:8]} MESSAGE" in bare.stderr
    assert f"pisub follow-up {source.id[:8]} MESSAGE" in bare.stderr
    proc = pisub_cli("follow-up", source.id, f"also check docs {tag}")
    assert proc.returncode == 0 and proc.stdout.startswith("scheduled: follow_up"), proc.stderr
    proc = pisub_cli("resume", source.id)
    assert proc.returncode == 0, proc.stderr
    new = pisub.Run(proc.stdout.strip())
    assert new.wait(timeout=60).state == "complete"
    turn = json.dumps(sent_with(model_server, f"also check docs {tag}")[0]["messages"][-1])
    assert f"also check docs {tag}" in turn and "Carry on with the follow-ups above." in turn
    again = pisub_cli("resume", source.id)
    assert again.returncode == 1 and "holds no follow-up" in again.stderr  # delivered: gone


@pytest.mark.pi
@pytest.mark.pi_versions
def test_a_queued_steer_is_carried_to_the_next_resume_on_interrupt(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    import uuid

    from tests.helpers import sent_with

    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"SLOW:200 story {tag}")
    wait_for(lambda: sent_with(model_server, tag), timeout=30)
    queued = run.send_steer(f"KEEP {tag}")
    got = run.wait_for_receipt(queued, 10)
    assert got is not None and got.state == "queued"
    proc = pisub_cli("interrupt", run.id)
    assert proc.returncode == 0, proc.stderr
    assert run.wait(timeout=30).state == "paused"
    kept = run.receipt(queued)
    assert kept is not None and kept.state == "scheduled", kept
    # The queue is cleared before the abort (0.85 would start a new run with it): kept for the
    # next resume, saying why pi did not take it.
    assert kept.reason == f"carried to the next resume ({CLEARED_REASON})"
    assert (run.dir / "briefs" / f"{queued}.json").exists()
    ledger = run.status().steering
    assert ledger.carried == 1 and [e.state for e in ledger.recent] == ["scheduled", "delivered"]
    assert not sent_with(model_server, f"KEEP {tag}")
    status = pisub_cli("status", run.id)
    assert "steering 2 requests: 1 delivered, 1 carried to the next resume" in status.stdout
    assert f'steer kept for the next resume  "KEEP {tag}"' in status.stdout, status.stdout
    proc = pisub_cli("resume", run.id)  # the carried steer is the next turn
    assert proc.returncode == 0, proc.stderr
    new = pisub.Run(proc.stdout.strip())
    assert new.wait(timeout=60).state == "complete"
    assert sent_with(model_server, f"KEEP {tag}")
    done = run.receipt(queued)
    assert done is not None and done.state == "delivered" and done.replacement_run_id == new.id
    # The old run's status shows it so (read from the receipt; its status.json stays as written)
    written = (run.dir / "status.json").read_bytes()
    ledger = run.status().steering
    assert (ledger.delivered, ledger.carried) == (2, 0)
    assert [(e.state, e.replacement_run_id) for e in ledger.recent] == [
        ("delivered", new.id),
        ("delivered", None),
    ]
    status = pisub_cli("status", run.id)
    assert "steering 2 requests: 2 delivered" in status.stdout, status.stdout
    assert f'steer delivered by resume {new.id[:8]}  "KEEP {tag}"' in status.stdout, status.stdout
    assert (run.dir / "status.json").read_bytes() == written


@pytest.mark.pi
def test_interrupt_several_pi_runs(pi_home: Path) -> None:
    runs = [pisub.launch("pi", f"SLOW:200 story {n}") for n in range(2)]
    proc = pisub_cli("interrupt", *(r.id for r in runs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(_lines(proc.stdout)) == sorted(r.id for r in runs)
    for run in runs:
        assert run.wait(timeout=30).state == "paused"


def test_hostile_selectors_are_matched_exactly_and_printed_escaped(
    home: Path, make_agent: AgentMaker
) -> None:
    run = _sleeper(make_agent, label="nightly")
    for label in ("\x1b[31mnightly", "nightly\n", "night", "x" * 100_000, "*"):
        proc = pisub_cli("stop", "--label", label)
        assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1, proc.stdout[:200]
        assert proc.stdout.startswith("no live run labelled ") and "\x1b" not in proc.stdout
    for agent in ("sleeper\t", "../sleeper", "SLEEPER", "sleeper\u202e"):
        proc = pisub_cli("stop", "--agent", agent)
        assert proc.returncode == 0 and proc.stdout.startswith("no live run of agent "), proc.stdout
        assert "\u202e" not in proc.stdout
        assert run.status().state == RunState.RUNNING
    both = pisub_cli("stop", "--agent", "sleeper", "--label", "other")
    assert both.stdout == "no live run of agent 'sleeper' labelled 'other'\n"
    proc = pisub_cli("stop", "--agent", "sleeper", "--label", "nightly")
    assert list(_lines(proc.stdout)) == [run.id]


def test_a_request_the_run_finished_before_taking_is_run_closed(home: Path, make_agent: AgentMaker) -> None:
    from pisub.api.many import closed_meanwhile
    from tests.helpers import drop_request

    make_agent("quick", command="true")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    drop_request(run, "late.json", b'{"v":1,"type":"stop"}')  # as if written just before the end
    run.status()  # the reader answers it
    receipt = run.receipt("late")
    assert receipt is not None and closed_meanwhile(receipt)
