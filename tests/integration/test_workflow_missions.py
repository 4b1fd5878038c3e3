"""Missions in workflow launches (spec/protocol.md, Workflow runs, "Missions"): every
workflow belongs to a default enclosing mission unless ``mission: false``; ``missionId`` attaches
a later workflow, which shares the mission's ``state``; explicit mission options are strict
(nothing starts when they fail), a default mission that cannot be made only warns. Real
coordinators, real child runs, real mission files."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch, launch_parallel, launch_workflow, resume_workflow
from pisub.api.launch import start
from pisub.errors import InvalidInput, MissionNotFound, PisubError
from pisub.protocol.status import Status
from pisub.store.missions import MissionStore
from pisub.store.paths import open_home
from pisub.store.runs import RunStore
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import write_script
from tests.integration.test_workflows import WORKER

SESSION = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def workers(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The counted, gated ``worker`` of tests/integration/test_workflows.py; returns its gate."""
    count = tmp_path / "starts.txt"
    count.touch()
    gate = tmp_path / "gate"
    monkeypatch.setenv("PISUB_TEST_COUNT", str(count))
    monkeypatch.setenv("PISUB_TEST_GATE", str(gate))
    make_agent("worker", python=WORKER)
    return gate


def _mission(run: pisub.Run) -> Any:
    """The mission record of workflow run ``run`` (from its manifest's project)."""
    spec = run.manifest().workflow
    assert spec is not None and spec.mission_id is not None and spec.mission_project is not None
    return MissionStore(open_home(), spec.mission_project).get(spec.mission_id)


def _run_ids(mission: Any) -> list[str]:
    return [r.run_id for r in mission.runs]


def _nothing_started(home: Path) -> None:
    assert RunStore(open_home()).ids() == []


# == the default mission =========================================================================


def test_a_workflow_gets_a_default_mission_that_lists_it(home: Path, workers: Path, tmp_path: Path) -> None:
    text = '// Review the release notes\nawait state.set("seen", true);\nreturn await state.get("seen");'
    run = launch_workflow(text=text)
    result = run.wait(timeout=60)
    assert result.state == "complete" and result.content[0].text == "true", result.content[0].text
    mission = _mission(run)
    assert run.status().mission_id == mission.id
    assert json.loads(run.paths.status.read_text())["missionId"] == mission.id
    assert _run_ids(mission) == [run.id] and mission.runs[0].mode == "workflow"
    assert mission.title == "workflow (inline javascript): Review the release notes"
    assert mission.owner_session is None
    assert run.manifest().workflow.mission_warning is None  # type: ignore[union-attr]
    # its state is the mission's own
    assert MissionStore(open_home(), mission.project).state(mission.id).get("seen") is True

    shown = pisub_cli("status", run.id, check=True).stdout
    assert f"mission  {mission.id} (completed)" in shown, shown  # it followed its run
    status = json.loads(pisub_cli("status", run.id, "--json", check=True).stdout)
    assert status["missionId"] == mission.id

    # a label names it; a session key owns it; every shape gets one (here: parallel)
    labelled = launch_parallel(
        [{"agent": "worker", "task": "hello"}], label="nightly-sweep", session_key=SESSION
    )
    assert labelled.wait(timeout=60).state == "complete"
    other = _mission(labelled)
    assert other.id != mission.id and other.title == "nightly-sweep" and other.owner_session == SESSION
    assert _run_ids(other) == [labelled.id]


def test_a_secret_in_the_first_line_is_not_the_missions_title(home: Path, workers: Path) -> None:
    key = "sk-" + "a1b2c3d4" * 5
    run = launch_parallel([{"agent": "worker", "task": f"deploy with api_key={key} now\nmore"}])
    assert run.wait(timeout=60).state == "complete"
    title = _mission(run).title
    assert key not in title and title.startswith("parallel: 1 tasks: deploy with"), title
    assert len(title) <= 80


def test_mission_false_leaves_the_workflow_without_mission_or_state(
    home: Path, workers: Path, tmp_path: Path
) -> None:
    js = launch_workflow(text="return typeof state;", mission=False).wait(timeout=60)
    assert js.content[0].text == "undefined", js.content[0].text
    lonely = write_script(tmp_path, "async def main(runs, state, args):\n    return state is None\n", "n.py")
    run = launch_workflow(lonely, mission=False)
    assert run.wait(timeout=60).content[0].text == "true"
    assert run.status().mission_id is None and run.manifest().workflow.mission_id is None  # type: ignore[union-attr]
    assert not (home / "missions").exists()  # nothing was made for either
    assert "mission " not in pisub_cli("status", run.id, check=True).stdout
    # --state-ns still gives it a state, as before missions
    shared = launch_workflow(
        text='await state.set("k", 1); return await state.get("k");', mission=False, state_ns="ns1"
    )
    assert shared.wait(timeout=60).content[0].text == "1"
    assert json.loads((home / "state" / "ns1.json").read_text())["values"] == {"k": 1}
    # a schedule's fire: its pre-chosen run id, no mission (pisub/api/schedules.py)
    chosen = str(uuid.uuid4())
    fired = launch_workflow(text="return typeof state;", mission=False, run_id=chosen)
    assert fired.id == chosen and fired.wait(timeout=60).content[0].text == "undefined"
    assert fired.status().mission_id is None and not (home / "missions").exists()
    # the CLI's --no-mission is the same
    out = pisub_cli("run", "--workflow-script", "return typeof state;", "--no-mission", "--json", check=True)
    launched = json.loads(out.stdout)
    assert launched["missionId"] is None
    assert pisub.Run(launched["runId"]).wait(timeout=60).content[0].text == "undefined"


def test_with_a_state_namespace_the_state_is_the_namespaces_and_the_mission_lists_the_run(
    home: Path, workers: Path
) -> None:
    run = launch_workflow(text='await state.set("where", "ns"); return 1;', state_ns="team")
    assert run.wait(timeout=60).state == "complete"
    mission = _mission(run)
    assert _run_ids(mission) == [run.id]
    assert json.loads((home / "state" / "team.json").read_text())["values"] == {"where": "ns"}
    assert MissionStore(open_home(), mission.project).state(mission.id).get("where") is None


# == one mission across workflows ================================================================


def test_two_workflows_with_one_mission_id_share_its_state(home: Path, workers: Path, tmp_path: Path) -> None:
    first = launch_workflow(
        text='const r = await runs.run("a", { agent: "worker", task: "one" });\n'
        'await state.set("found", r.output.trim()); return "set";'
    )
    assert first.wait(timeout=60).state == "complete"
    mission_id = first.status().mission_id
    assert mission_id is not None
    reader = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            found = await state.get("found")
            await state.set("count", 2)
            return found
        """,
        "reader.py",
    )
    out = pisub_cli("run", "--workflow", str(reader), "--mission-id", mission_id, "--json", check=True)
    launched = json.loads(out.stdout)
    assert launched["missionId"] == mission_id
    second = pisub.Run(launched["runId"])
    result = second.wait(timeout=60)
    assert result.state == "complete" and result.content[0].text == "did: one", result.content[0].text
    third = launch_workflow(text='return await state.get("count");', mission_id=mission_id)
    assert third.wait(timeout=60).content[0].text == "2"
    mission = _mission(first)
    assert _run_ids(mission) == [first.id, second.id, third.id]
    assert {_mission(r).id for r in (second, third)} == {mission_id}


def test_a_mission_id_that_does_not_exist_starts_nothing(home: Path, workers: Path, tmp_path: Path) -> None:
    with pytest.raises(MissionNotFound):
        launch_workflow(text="return 1;", mission_id="0123456789ab")
    proc = pisub_cli("run", "--workflow-script", "return 1;", "--mission-id", "0123456789ab")
    assert proc.returncode != 0 and "MISSION_NOT_FOUND" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    _nothing_started(home)


def test_a_closed_mission_takes_no_more_workflows(home: Path, workers: Path) -> None:
    run = launch_workflow(text="return 1;")
    assert run.wait(timeout=60).state == "complete"
    mission_id = run.status().mission_id
    assert mission_id is not None
    closed = pisub_cli("mission", "close", mission_id, "--status", "completed")
    assert closed.returncode == 0, closed.stderr
    before = len(RunStore(open_home()).ids())
    with pytest.raises(InvalidInput, match="closed"):
        launch_workflow(text="return 2;", mission_id=mission_id)
    assert len(RunStore(open_home()).ids()) == before


def test_an_explicit_mission_is_made_as_given(home: Path, workers: Path) -> None:
    given = {
        "title": "Ship the release",
        "objective": "every check green",
        "goal": True,
        "budget": {"tokens": 5000},
        "labels": ["release", "q4"],
    }
    run = launch_workflow(text='await state.set("a", 1); return 1;', mission=given, session_key=SESSION)
    assert run.wait(timeout=60).state == "complete"
    mission = _mission(run)
    assert (mission.title, mission.objective, mission.goal) == ("Ship the release", "every check green", True)
    assert mission.budget.tokens == 5000 and mission.labels == ["release", "q4"]
    assert mission.owner_session == SESSION and _run_ids(mission) == [run.id]
    # a summary is a title too
    out = pisub_cli(
        "run", "--workflow-script", "return 1;", "--mission", '{"summary": "Tidy up"}', "--json", check=True
    )
    assert _mission(pisub.Run(json.loads(out.stdout)["runId"])).title == "Tidy up"


# == strict inputs ===============================================================================

BAD_MISSIONS: list[tuple[Any, str]] = [
    ({}, "mission: give exactly one of title and summary"),
    ({"title": "a", "summary": "b"}, "mission: give exactly one of title and summary"),
    ({"title": ""}, "mission.title: is empty"),
    ({"title": 3}, "mission.title: Expected `str"),
    ({"title": "two\nlines"}, "mission.title: holds a control character or line break"),
    ({"summary": "  "}, "mission.summary: is empty"),
    ({"title": "t", "colour": "red"}, "mission: Object contains unknown field `colour`"),
    ({"title": "t", "goal": False}, "mission.goal: may only be true"),
    ({"title": "t", "goal": "yes"}, "mission.goal: Expected `bool"),
    ({"title": "t", "goal": True}, "mission.budget.tokens: a goal mission needs a token budget"),
    ({"title": "t", "budget": {}}, "mission.budget: Object missing required field `tokens`"),
    ({"title": "t", "budget": {"tokens": 0}}, "mission.budget.tokens: Expected `int` >= 1"),
    ({"title": "t", "budget": {"tokens": True}}, "mission.budget.tokens: Expected `int`"),
    ({"title": "t", "budget": {"tokens": 5, "usd": 1}}, "mission.budget: Object contains unknown field"),
    ({"title": "t", "budget": 5}, "mission.budget: Expected `object"),
    ({"title": "t", "labels": "one"}, "mission.labels: Expected `array"),
    ({"title": "t", "labels": ["ok", ""]}, "mission.labels[1]: is empty"),
    ({"title": "t", "objective": 7}, "mission.objective: Expected `str"),
    ([1], "mission: Expected `object`, got `array`"),
    (True, "mission: Expected `object`, got `bool`"),
]


@pytest.mark.parametrize(("given", "said"), BAD_MISSIONS, ids=[s for _, s in BAD_MISSIONS])
def test_a_bad_mission_is_refused_naming_the_field(home: Path, given: Any, said: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        launch_workflow(text="return 1;", mission=given)
    assert said in caught.value.message, caught.value.message
    _nothing_started(home)
    assert not (home / "missions").exists()


def test_the_cli_refuses_bad_mission_flags_in_one_line(home: Path) -> None:
    cases = [
        (["--mission", '{"title": "a",'], "--mission: not JSON"),
        (["--mission", "[1]"], "--mission: give a JSON object"),
        (["--mission", '{"title": "t", "goal": true}'], "mission.budget.tokens"),
        (["--mission", '{"title": "t"}', "--no-mission"], "--mission and --no-mission"),
        (["--mission-id", "0123456789ab", "--no-mission"], "--mission-id and --no-mission"),
        (["--mission-id", "0123456789ab", "--mission", '{"title": "t"}'], "--mission-id and --mission"),
        (["--mission-id", "0123456789ab", "--state-ns", "x"], "--mission-id and --state-ns"),
        (["--mission-id", "0123456789ab", "--session-key", SESSION], "--session-key and --mission-id"),
        (["--no-mission", "--session-key", SESSION], "--session-key and --no-mission"),
        (["--session-key", "ABC"], "--session-key"),
        (["--mission-id", "../x"], "--mission-id"),
    ]
    for flags, said in cases:
        proc = pisub_cli("run", "--workflow-script", "return 1;", *flags)
        assert proc.returncode != 0, flags
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0] and "INVALID_INPUT" in lines[0], (flags, proc.stderr)
    proc = pisub_cli("run", "--agent", "worker", "hello", "--mission-id", "0123456789ab")
    assert proc.returncode != 0 and "--mission-id is for workflows" in proc.stderr, proc.stderr
    with pytest.raises(InvalidInput, match="--mission is for workflows"):
        start("worker", "hello", mission={"title": "t"})
    _nothing_started(home)


def test_a_default_mission_that_cannot_be_made_only_warns(home: Path, workers: Path) -> None:
    (home / "missions").write_text("not a directory\n")
    run = launch_workflow(text="return typeof state;")
    assert run.wait(timeout=60).content[0].text == "undefined"  # no mission, no state
    spec = run.manifest().workflow
    assert spec is not None and spec.mission_id is None and run.status().mission_id is None
    assert spec.mission_warning and "default mission could not be made" in spec.mission_warning
    proc = pisub_cli("run", "--workflow-script", "return 1;", check=True)
    assert "pisub: warning: the workflow's default mission could not be made" in proc.stderr, proc.stderr
    shown = pisub_cli("status", run.id, check=True).stdout
    assert "note     the workflow's default mission could not be made" in shown, shown
    # an explicit one is strict: nothing starts
    before = len(RunStore(open_home()).ids())
    with pytest.raises(PisubError):
        launch_workflow(text="return 1;", mission={"title": "needed"})
    assert len(RunStore(open_home()).ids()) == before


# == resume and nested workflows ==================================================================

STATEFUL = {
    "python": """
async def main(runs, state, args):
    seen = (await state.get("seen") or 0) + 1
    await state.set("seen", seen)
    r = await runs.run("g", agent="worker", task="g gated")
    return [seen, r.output]
""",
    "javascript": """
const seen = ((await state.get("seen")) || 0) + 1;
await state.set("seen", seen);
const r = await runs.run("g", { agent: "worker", task: "g gated" });
return [seen, r.output];
""",
}


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_resumed_workflow_keeps_its_mission_and_state(
    home: Path, workers: Path, tmp_path: Path, language: str
) -> None:
    script = tmp_path / ("wf.py" if language == "python" else "wf.js")
    script.write_text(STATEFUL[language])
    run = launch_workflow(script)
    wait_for(lambda: [str(s.status) for s in run.status().steps] == ["running"], 30, what="the gated child")
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    repaired: Status = wait_for(lambda: (st := run.status()).state == "failed" and st, 20, what="the repair")
    assert repaired.mission_id is not None
    again = resume_workflow(run.id)
    assert again.status().mission_id == repaired.mission_id
    workers.touch()  # the gate opens
    result = again.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == [2, "did: g gated\n"]  # the first attempt's state
    mission = _mission(again)
    assert mission.id == repaired.mission_id and _run_ids(mission) == [run.id, again.id]


def test_a_workflow_started_inside_a_workflow_shares_its_mission(
    home: Path, workers: Path, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        import asyncio
        import pisub

        async def main(runs, state, args):
            await state.set("from", "outer")
            inner = await asyncio.to_thread(pisub.launch_workflow, text='return await state.get("from");')
            result = await asyncio.to_thread(inner.wait, 60)
            return [inner.id, result.content[0].text]
        """,
        "outer.py",
    )
    outer = launch_workflow(script)
    result = outer.wait(timeout=90)
    assert result.state == "complete", result.content[0].text
    inner_id, said = json.loads(result.content[0].text)
    assert said == "outer"
    mission = _mission(outer)
    assert pisub.Run(inner_id).status().mission_id == mission.id
    assert _run_ids(mission) == [outer.id, inner_id]


def test_a_single_run_is_in_no_mission(home: Path, workers: Path) -> None:
    run = launch("worker", "hello")
    assert run.wait(timeout=60).state == "complete"
    assert run.status().mission_id is None and not (home / "missions").exists()
    again = start("worker", "hello", mission=False)  # --no-mission: what a single run is anyway
    assert again.wait(timeout=60).state == "complete" and again.status().mission_id is None
