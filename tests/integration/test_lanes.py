"""Lanes with external-cli children: real coordinators, real child runs."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch_lanes, launch_workflow, resume_workflow
from pisub.errors import InvalidInput
from tests.conftest import AgentMaker, pisub_cli, wait_for

# Appends its task to $PISUB_TEST_COUNT; "fail" exits 3; "blocked" ends with a fenced verdict;
# "prose" says blocked in prose only; "... sleep N" sleeps.
WORKER = """
import os, sys, time
task = sys.stdin.read().strip()
with open(os.environ["PISUB_TEST_COUNT"], "a") as fh:
    fh.write(task + "\\n")
words = task.split()
if len(words) >= 2 and words[-2] == "sleep":
    time.sleep(float(words[-1]))
if "fail" in words:
    print("failing on purpose", file=sys.stderr)
    sys.exit(3)
print("did:", task)
if "blocked" in words:
    print("I cannot go on.\\n```json\\n{\\"verdict\\": \\"blocked\\", \\"why\\": \\"no access\\"}\\n```")
if "prose" in words:
    print('The verdict is "blocked", says the prose; the block says otherwise.')
    print('```json\\n{"verdict": "approved"}\\n```')
"""


@pytest.fixture
def counted(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    count = tmp_path / "starts.txt"
    count.touch()
    monkeypatch.setenv("PISUB_TEST_COUNT", str(count))
    make_agent("worker", python=WORKER)
    make_agent("other", python=WORKER)
    return count


def _lane(key: str, *tasks: str, **defaults: Any) -> dict[str, Any]:
    lane: dict[str, Any] = {
        "key": key,
        "stages": [{"key": f"s{i + 1}", "task": task} for i, task in enumerate(tasks)],
    }
    lane["defaults"] = {"agent": "worker", **defaults}
    return lane


def _board(run: pisub.Run) -> tuple[str, list[dict[str, Any]]]:
    result = run.wait(timeout=90)
    text = result.content[0].text
    board = json.loads(text[text.index("[") :])
    return result.state, board


def test_a_failing_stage_blocks_its_lane_and_the_other_lane_completes(home: Path, counted: Path) -> None:
    run = launch_lanes([_lane("a", "a1", "a2 fail", "a3"), _lane("b", "b1", "b2", "b3")])
    state, board = _board(run)
    assert state == "failed"
    a, b = board
    assert a["key"] == "a" and a["state"] == "blocked" and a["failedStage"] == "s2"
    assert [s["state"] for s in a["stages"]] == ["completed", "failed", "skipped"]
    assert a["stages"][1]["ok"] is False and a["stages"][1]["runId"]
    assert "runId" not in a["stages"][2]
    assert b["state"] == "complete" and "failedStage" not in b
    assert [s["state"] for s in b["stages"]] == ["completed"] * 3
    assert sorted(counted.read_text().split()) == sorted(["a1", "a2", "fail", "b1", "b2", "b3"])
    keys = [r.key for r in run.wait(timeout=5).details.results]
    assert set(keys) == {"a.s1", "a.s2", "a.s3", "b.s1", "b.s2", "b.s3"}
    assert run.wait(timeout=5).details.mode == "lanes"
    assert {s.key for s in run.status().steps} >= {"a.s1", "b.s3"}


def test_a_blocked_verdict_in_a_fenced_block_blocks_and_prose_never_does(home: Path, counted: Path) -> None:
    run = launch_lanes([_lane("x", "x1 blocked", "x2"), _lane("y", "y1 prose", "y2")])
    state, board = _board(run)
    x, y = board
    assert x["state"] == "blocked" and x["failedStage"] == "s1"
    assert x["stages"][0]["state"] == "blocked" and x["stages"][0]["verdict"] == "blocked"
    assert x["stages"][0]["ok"] is True and x["stages"][1]["state"] == "skipped"
    assert y["state"] == "complete" and y["stages"][0]["verdict"] == "approved"
    assert state == "failed"


def test_lane_defaults_apply_and_a_stage_overrides_them(home: Path, counted: Path) -> None:
    lane = _lane("d", "d1", "d2")
    lane["stages"][1]["agent"] = "other"
    run = launch_lanes([lane])
    state, board = _board(run)
    assert state == "complete", board
    agents = {r.key: r.agent for r in run.wait(timeout=5).details.results}
    assert agents == {"d.s1": "worker", "d.s2": "other"}


def _refused(lanes: Any, *needles: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        launch_lanes(lanes)
    for needle in needles:
        assert needle in caught.value.message, caught.value.message


@pytest.mark.parametrize(
    ("build", "needles"),
    [
        (lambda: [], ["0 lanes"]),
        (lambda: [_lane(f"l{i}", "t") for i in range(33)], ["33 lanes"]),
        (lambda: [_lane("big", *["t"] * 17)], ["lanes[0] (big).stages", "17 stages"]),
        (lambda: [_lane(f"l{i}", *["t"] * 13) for i in range(5)], ["65 stages in all"]),
        (
            lambda: [
                {"key": "k", "defaults": {"agent": "worker"}, "stages": [{"key": "a", "task": "t"}] * 2}
            ],
            ["lanes[0] (k).stages[1] (a).key", "used twice"],
        ),
        (
            lambda: [
                {"key": "k", "stages": [{"key": "a", "task": "t", "agent": "worker", "resume": "previous"}]}
            ],
            ["lanes[0] (k).stages[0] (a).resume", "first stage"],
        ),
        (
            lambda: [{"key": "k", "stages": [{"key": "a", "task": "t", "agent": "worker", "resume": "abc"}]}],
            ["runs.run(key, resume=RUN_ID"],
        ),
        (
            lambda: [
                _lane("k", "a", "b")
                | {"stages": [{"key": "a", "task": "t"}, {"key": "b", "task": "t", "resume": "last"}]}
            ],
            ["lanes[0] (k).stages[1] (b)", "resume"],
        ),
        (
            lambda: [_lane("k" * 80, "t") | {"stages": [{"key": "s" * 60, "task": "t"}]}],
            ["child key", "must match"],
        ),
        (
            lambda: [{"key": "k", "stages": [{"key": "a", "task": "t"}]}],
            ["lanes[0] (k).stages[0] (a).agent", "no agent"],
        ),
        (
            lambda: [{"key": "k", "stages": [{"key": "a", "task": "t", "agent": "worker", "colour": 1}]}],
            ["colour"],
        ),
        (lambda: [{"key": "k", "stagez": []}], ["lanes[0]"]),
        (lambda: [_lane("k", "x" * 70_000)], ["canonical JSON", "65536"]),
        (
            lambda: [_lane("a.b", "t"), _lane("a", "t") | {"stages": [{"key": "b.s1", "task": "t"}]}],
            ["another lane"],
        ),
        (lambda: [_lane("k", "t", "u")] * 2, ["lane key 'k' is used twice"]),
        (lambda: {"key": "k"}, ["a list of lanes"]),
        (lambda: [_lane("k", "t") | {"defaults": {"agent": "nobody"}}], ["nobody"]),
    ],
)
def test_every_manifest_limit_is_refused_before_anything_starts(
    home: Path, counted: Path, build: Any, needles: list[str]
) -> None:
    if "nobody" in needles:
        with pytest.raises(pisub.PisubError, match="nobody"):
            launch_lanes(build())
    else:
        _refused(build(), *needles)
    assert not list(pisub.list_runs(children=True))
    assert counted.read_text() == ""


def test_every_problem_is_named_at_once_and_the_cli_prints_one_line(
    home: Path, counted: Path, tmp_path: Path
) -> None:
    bad = [
        {"key": "k", "stages": [{"key": "a", "task": "t", "resume": "previous"}, {"key": "a", "task": ""}]},
        {"key": "-bad", "stages": [{"key": "a", "task": "t", "agent": "worker"}]},
    ]
    with pytest.raises(InvalidInput) as caught:
        launch_lanes(bad)
    message = caught.value.message
    assert "stages[0] (a).resume" in message and "stages[1]" in message and "lanes[1]" in message
    path = tmp_path / "lanes.json"
    path.write_text(json.dumps(bad))
    done = pisub_cli("run", "--lanes", str(path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "INVALID_INPUT" in done.stderr
    assert not list(pisub.list_runs(children=True))


def test_the_cli_runs_a_lanes_file(home: Path, counted: Path, tmp_path: Path) -> None:
    path = tmp_path / "lanes.json"
    path.write_text(json.dumps([_lane("a", "a1", "a2"), _lane("b", "b1")], indent=2))
    started = pisub_cli("run", "--lanes", str(path), "--json", check=True)
    run_id = json.loads(started.stdout)["runId"]
    state, board = _board(pisub.Run(run_id))
    assert state == "complete" and [lane["state"] for lane in board] == ["complete", "complete"]


def test_a_script_runs_lanes_and_a_resume_skips_settled_stages(
    home: Path, counted: Path, tmp_path: Path
) -> None:
    script = tmp_path / "wf.py"
    script.write_text(
        textwrap.dedent(
            """
            async def main(runs, state, args):
                board = await runs.lanes([
                    {"key": "p", "defaults": {"agent": "worker"},
                     "stages": [{"key": "one", "task": "p1"}, {"key": "two", "task": "p2 sleep 4"}]},
                    {"key": "q", "defaults": {"agent": "worker", "idle_timeout": 60},
                     "stages": [{"key": "one", "task": "q1"}]},
                ])
                return board
            """
        )
    )
    assert pisub_cli("workflow", "validate", str(script), check=True).returncode == 0
    run = launch_workflow(script)
    wait_for(lambda: any(s.key == "p.two" and str(s.status) == "running" for s in run.status().steps), 30)
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 15)
    again = resume_workflow(run.id)
    result = again.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    board = json.loads(result.content[0].text)
    assert [lane["state"] for lane in board] == ["complete", "complete"]
    assert sorted(counted.read_text().splitlines()) == ["p1", "p2 sleep 4", "q1"]  # each once


def test_validate_checks_a_literal_lanes_manifest(home: Path, counted: Path, tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text(
        textwrap.dedent(
            """
            async def main(runs, state, args):
                return await runs.lanes([
                    {"key": "k",
                     "stages": [{"key": "a", "task": "t", "agent": "ghost", "resume": "previous"}]},
                ])
            """
        )
    )
    done = pisub_cli("workflow", "validate", str(script), "--json")
    assert done.returncode == 1
    errors = json.loads(done.stdout)["errors"]
    assert any("first stage" in e["message"] for e in errors)


def test_children_list_names_why_a_child_cannot_be_resumed(home: Path, counted: Path) -> None:
    run = launch_lanes([_lane("a", "a1", "a2"), _lane("b", "b1 sleep 30")])
    # Lane a goes on while lane b's first stage still runs.
    wait_for(lambda: any(s.key == "a.s2" and str(s.status) == "complete" for s in run.status().steps), 30)
    listed = pisub.retained_children(parent=run.id)
    assert [c.key for c in listed] == ["a.s2", "a.s1"]  # newest first, finished only
    assert all(not c.resumable and c.reason and "not a pi run" in c.reason for c in listed)
    assert len(pisub.retained_children(limit=1)) == 1
    with pytest.raises(InvalidInput):
        pisub.retained_children(limit=0)
    text = pisub_cli("children", "list", "--parent", run.id, check=True).stdout
    assert "a.s1" in text and "not resumable: not a pi run" in text
    run.send_stop()
    run.wait(timeout=30)
    assert "b.s1" in {c.key for c in pisub.retained_children(parent=run.id)}
    assert pisub_cli("children", "list", "--parent", "nope").returncode != 0
