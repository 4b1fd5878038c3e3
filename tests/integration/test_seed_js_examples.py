# ruff: noqa: E501, RUF003  (the seed's examples verbatim: their long lines; its section titles)
"""Seed conformance for JavaScript workflows (issue 27): every JavaScript example of seed 001 (the
tool reference's "执行示例", lanes, "工作流引导", retained children, the gate and share examples)
and of pi-subagents-orchestration.md §1-§2, VERBATIM, run through the CLI (``pisub run
--workflow-script -`` with the script on stdin, a ``.js`` file, ``pisub workflow validate``,
``pisub run --resource``) against the seed's agents ``scout``, ``worker`` and ``reviewer``, with
the results the seed documents. Where no model is needed the agents are external CLIs that echo
their task (``NAME: TASK``); the examples that resume or steer a child use pi agents against the
scripted model. The same examples through the tool in a real pi: test_pi_workflows_js.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.protocol.codec import encode
from tests.conftest import AgentMaker, pisub_cli
from tests.unit.test_js_checks import SEED_SCRIPTS

# ---- seed 001 (shared/seeds/001_*.txt), each script exactly as written between the backticks.

# seed 001 line 24: { workflowScriptPath: "workflows/review.js", cwd: "/path/to/project" }
# (and line 25: { action: "validate", workflowScriptPath: "workflows/review.js" })
REVIEW_JS_PATH = "workflows/review.js"

# The scripts, each exactly as written between the backticks, are kept once, in
# tests/unit/test_js_checks.py (its SEED_SCRIPTS, which validate checks); here, where each is:
ONE_CHILD = SEED_SCRIPTS["one child"]  # seed 001 line 30 (一个子智能体；显式返回子 Promise)
SEQUENTIAL = SEED_SCRIPTS["sequential"]  # seed 001 lines 35-38 (顺序工作流)
PARALLEL = SEED_SCRIPTS["parallel"]  # seed 001 lines 43-51 (并行工作流)
LANES = SEED_SCRIPTS["lanes"]  # seed 001 lines 57-82 (并行顺序泳道)
ROLLING = SEED_SCRIPTS["rolling"]  # seed 001 lines 155-165 (工作流引导: race, steer the sibling, collect)
RESUME_LOOP = SEED_SCRIPTS[
    "retained"
]  # seed 001 lines 184-190 (保留的子智能体: resume from the latest runId)
GATE = SEED_SCRIPTS["gate"]  # seed 001 line 415 (单命令门槛)
SHARE = SEED_SCRIPTS["share"]  # seed 001 line 507 (会话分享; the call adds share: true)

# seed 001 lines 19-20 (named resources)
REVIEW_RESOURCE: dict[str, Any] = {"workflow": "review", "args": {"task": "Review the auth flow"}}
RUN_CI_RESOURCE: dict[str, Any] = {"workflow": "run-ci", "args": {"command": "npm test"}}

# ---- pi-subagents-orchestration.md: its JavaScript, each with the result it documents (where the
# original's result is a hole, pisub's: the line says which).
RESEARCH_RULES: list[tuple[str, str, str]] = [
    # §1.3: "runs.run.constructor('return process')()" returns the real `process` in the
    # original (its vm is not a boundary); pisub's engine has no `process` and no code from strings.
    (
        "constructor-escape",
        "return runs.run.constructor('return process')()",
        "code generation from strings is not allowed",
    ),
    # §1.3: "Not available: require, process, timers (`setTimeout` is undefined), fetch".
    ("no-timers", "return typeof setTimeout", ""),
    # §1.3: nested async functions are rejected (async function, async arrows, async methods).
    (
        "nested-async",
        "const f = async () => 1; return f()",
        "workflowScript does not support nested async functions",
    ),
    # §1.4: "Reading a non-index property such as `results.backend` throws an explanatory error".
    (
        "keyed-access",
        'const results = await runs.all([{ key: "backend", agent: "reviewer", task: "Review backend" }]);'
        " return results.backend.output",
        "runs.all resolves to an ordered array",
    ),
    # §1.4: "completed with unawaited runs.run launch(es): 'k'".
    (
        "unawaited",
        'runs.run("k", { agent: "scout", task: "x" }); return 1',
        "unawaited runs.run launch(es): 'k'",
    ),
    # §1.4: "Duplicate workflow key … incompatible launch params".
    (
        "duplicate-key",
        'await runs.run("k", { agent: "scout", task: "x" }); return await runs.run("k", { agent: "scout", task: "y" })',
        "Duplicate workflow key 'k' with incompatible launch params",
    ),
    # §1.10: "Raw public scripts get no runs.host" (the doc's `return await runs.host("ci", {…,
    # role:"ci"})`, its "…" filled in with run-ci's own fields): `runs.host` refuses, in words.
    (
        "raw-host",
        'return await runs.host("ci", { kind: "command", command: "npm test", timeoutMs: 120000, role:"ci"})',
        "runs.host is only available to named workflow resources",
    ),
]


def echo_agent(name: str) -> str:
    """An external CLI that answers ``NAME: TASK`` (the task on its stdin)."""
    return f"import sys\nprint({name!r} + ': ' + sys.stdin.read().strip())\n"


@pytest.fixture
def seed_agents(home: Path, make_agent: AgentMaker) -> Path:
    """The seed's ``scout``, ``worker`` and ``reviewer`` as echoing external CLIs (user scope)."""
    for name in ("scout", "worker", "reviewer"):
        make_agent(name, python=echo_agent(name), acceptance={"level": "none", "reason": "an echo"})
    return home


@pytest.fixture
def fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``npm`` first on PATH: ``npm test`` passes and is recorded in the returned file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "npm-calls.txt"
    npm = bin_dir / "npm"
    npm.write_text(f'#!/bin/sh\necho "npm $*" >> {calls}\necho "3 passing"\n')
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def start(script: str, *options: str) -> str:
    """``pisub run --json --workflow-script -`` with ``script`` on stdin: the run id."""
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "run", "--json", *options, "--workflow-script", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    run_id: str = json.loads(proc.stdout.splitlines()[0])["runId"]
    return run_id


def finished(run_id: str, timeout: float = 120) -> pisub.Result:
    return pisub.Run(run_id).wait(timeout=timeout)


def value(result: pisub.Result) -> Any:
    """What the script returned: the result's text is its JSON (a string returned is the text)."""
    return json.loads(result.content[0].text)


def text(result: pisub.Result) -> str:
    """The result's text: a string the script returned, as it is."""
    return result.content[0].text


def test_one_child_returns_the_childs_result(seed_agents: Path) -> None:
    result = finished(start(ONE_CHILD))
    assert result.state == "complete", result.content[0].text
    child = value(result)
    assert child["key"] == "main" and child["agent"] == "scout" and child["ok"] is True
    assert child["output"] == "scout: Analyze the auth flow\n" and child["runId"]
    assert [r.key for r in result.details.results] == ["main"]


def test_a_sequential_workflow_feeds_the_first_output_to_the_second(seed_agents: Path) -> None:
    result = finished(start(SEQUENTIAL))
    assert result.state == "complete", result.content[0].text
    assert text(result) == "worker: Implement from: scout: Analyze auth\n"
    assert [r.key for r in result.details.results] == ["scan", "implement"]


def test_a_parallel_workflow_resolves_to_an_ordered_array(seed_agents: Path) -> None:
    result = finished(start(PARALLEL))
    assert result.state == "complete", result.content[0].text
    assert value(result) == ["reviewer: Review backend\n", "reviewer: Review frontend\n"]


def test_the_same_script_from_a_js_file_resolved_against_cwd(seed_agents: Path, tmp_path: Path) -> None:
    """``{workflowScriptPath: "workflows/review.js", cwd}``: a relative file under the cwd."""
    project = tmp_path / "project"
    (project / "workflows").mkdir(parents=True)
    (project / REVIEW_JS_PATH).write_text(PARALLEL)
    checked = pisub_cli("workflow", "validate", "--json", str(project / REVIEW_JS_PATH))
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"] is True, (
        checked.stdout + checked.stderr
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "run", "--json", "--workflow", REVIEW_JS_PATH],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    result = finished(json.loads(proc.stdout.splitlines()[0])["runId"])
    assert result.state == "complete", result.content[0].text
    assert value(result) == ["reviewer: Review backend\n", "reviewer: Review frontend\n"]


def test_the_gate_example_runs_npm_test_on_the_host(seed_agents: Path, fake_npm: Path) -> None:
    result = finished(start(GATE))
    assert result.state == "complete", result.content[0].text
    child = value(result)
    assert child["ok"] is True and child["output"] == "worker: Implement the fix\n", child
    assert "npm test" in fake_npm.read_text()


def test_every_seed_example_passes_validate(seed_agents: Path) -> None:
    """``{action: "validate", workflowScript}`` of every example: ok, nothing starts."""
    for name, script in SEED_SCRIPTS.items():
        proc = subprocess.run(
            [sys.executable, "-m", "pisub", "workflow", "validate", "--json", "--workflow-script", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=60,
        )
        report = json.loads(proc.stdout)
        assert proc.returncode == 0 and report["ok"] is True and report["errors"] == [], (name, report)
    assert list(pisub.list_runs()) == []


def test_a_failing_validate_answers_ok_false_with_the_line(seed_agents: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "workflow", "validate", "--json", "--workflow-script", "-"],
        input="const f = async () => 1;\nreturn f()",
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["ok"] is False, report
    assert report["errors"] and report["errors"][0]["line"] == 1, report


@pytest.mark.parametrize(("name", "script", "says"), RESEARCH_RULES, ids=[r[0] for r in RESEARCH_RULES])
def test_the_research_notes_rules(seed_agents: Path, name: str, script: str, says: str) -> None:
    """pi-subagents-orchestration.md §1's JavaScript: the result it documents — refused at the
    launch (what validate finds statically), or the workflow fails saying so."""
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "run", "--json", "--workflow-script", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        assert proc.stderr.startswith("pisub: ") and "[INVALID_INPUT]" in proc.stderr, proc.stderr
        assert says in proc.stderr and name in ("nested-async", "keyed-access"), proc.stderr
        assert list(pisub.list_runs()) == []
        return
    result = finished(json.loads(proc.stdout.splitlines()[0])["runId"], timeout=60)
    if name == "no-timers":
        assert result.state == "complete" and text(result) == "undefined", result.content[0].text
        return
    assert result.state == "failed", result.content[0].text
    error = encode(result).decode()
    assert says in error, error


def test_named_resources_review_and_run_ci(seed_agents: Path, fake_npm: Path, tmp_path: Path) -> None:
    """``{workflow: "review", args: {task}}`` runs one reviewer child; ``{workflow: "run-ci",
    args: {command: "npm test"}}`` runs the command on the host."""
    for call in (REVIEW_RESOURCE, RUN_CI_RESOURCE):
        proc = pisub_cli("run", "--json", "--resource", call["workflow"], "--args", json.dumps(call["args"]))
        assert proc.returncode == 0, proc.stderr
        result = finished(json.loads(proc.stdout.splitlines()[0])["runId"])
        assert result.state == "complete", (call, result.content[0].text)
    review = pisub.list_runs(children=True)
    assert any(s.agent == "reviewer" for s in review), review
    assert "npm test" in fake_npm.read_text()
    # run-ci takes only the commands its permit lists (npm test, npm run typecheck): another
    # never runs, refused at the launch or failing the workflow
    planted = tmp_path / "planted"
    refused = pisub_cli(
        "run", "--json", "--resource", "run-ci", "--args", json.dumps({"command": f"touch {planted}"})
    )
    assert "Traceback" not in refused.stderr, refused.stderr
    if refused.returncode == 0:
        assert finished(json.loads(refused.stdout.splitlines()[0])["runId"]).state == "failed"
    assert not planted.exists()


# ---- The examples that resume or steer a child: pi agents against the scripted model.

SAID = "Hello from the fake LLM. You said: "


@pytest.fixture
def seed_pi_agents(pi_home: Path) -> Path:
    """The seed's agents as pi agents (the scripted model echoes the task; no acceptance report)."""
    no_report = 'acceptance: {level: none, reason: "the scripted model echoes the task"}\n'
    for name in ("scout", "worker", "reviewer"):
        (pi_home / "agents" / f"{name}.md").write_text(
            f"---\nname: {name}\nrunner: pi\n{no_report}---\nBe terse.\n"
        )
    return pi_home


@pytest.mark.pi
def test_the_lanes_example_returns_the_board(seed_pi_agents: Path) -> None:
    result = finished(start(LANES), timeout=240)
    assert result.state == "complete", result.content[0].text
    board = value(result)
    assert [lane["key"] for lane in board] == ["api", "ui"]
    assert all(lane["state"] == "complete" and lane.get("failedStage") is None for lane in board), board
    api, ui = board
    assert [s["key"] for s in api["stages"]] == ["writer", "challenge", "review"]
    assert [s["key"] for s in ui["stages"]] == ["writer", "review"]
    for stage in api["stages"] + ui["stages"]:
        assert stage["state"] == "completed" and stage["ok"] is True and stage["runId"], stage
    # the challenge resumed the writer's retained session
    keys = {r.key: r for r in result.details.results}
    assert keys["api.challenge"].output == SAID + "Challenge the implementation"


@pytest.mark.pi
def test_the_rolling_example_races_steers_the_sibling_and_collects_the_rest(seed_pi_agents: Path) -> None:
    result = finished(start(ROLLING), timeout=180)
    assert result.state == "complete", result.content[0].text
    got = value(result)
    keys = {"writer", "reviewer"}
    assert got["first"] in keys and got["rest"] == list(keys - {got["first"]}), got
    receipt = got["receipt"]
    assert receipt["key"] == got["rest"][0], receipt
    assert receipt["state"] in ("queued", "delivered", "missed"), json.dumps(receipt)


@pytest.mark.pi
def test_the_resume_loop_continues_from_the_latest_run_id(seed_pi_agents: Path) -> None:
    result = finished(start(RESUME_LOOP), timeout=240)
    assert result.state == "complete", result.content[0].text
    writer = value(result)
    first = SAID + "Implement the accepted contract"
    second = SAID + "Revisit pass 1: " + first
    assert writer["key"] == "followup-2" and writer["output"] == SAID + "Revisit pass 2: " + second, writer
    ids = [r.run_id for r in result.details.results]
    assert [r.key for r in result.details.results] == ["implement", "followup-1", "followup-2"]
    assert len(set(ids)) == 3 and writer["runId"] == ids[-1]


def test_the_examples_are_the_seeds_verbatim() -> None:
    """Where the seed is at hand (the development checkout), each script above is in it as is."""
    seeds = (
        sorted(Path("/work/shared/seeds").glob("001_*.txt")) if Path("/work/shared/seeds").is_dir() else []
    )
    if not seeds:
        pytest.skip("the seed is not at hand here")
    text = seeds[0].read_text()
    for name, script in SEED_SCRIPTS.items():
        assert f"workflowScript: `{script}`" in text, name
    assert f'{{ workflowScriptPath: "{REVIEW_JS_PATH}", cwd: "/path/to/project" }}' in text
    assert '{ workflow: "review", args: { task: "Review the auth flow" } }' in text
    assert '{ workflow: "run-ci", args: { command: "npm test" } }' in text


def test_the_readme_fan_out_gives_the_same_result_in_both_languages(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    """README's workflow section: its JavaScript and its Python fan-out, verbatim, as files."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    make_agent("coder", python=echo_agent("coder"), acceptance={"level": "none", "reason": "an echo"})
    outputs = []
    for marker, fence, name in (
        ("workflow-js", "javascript", "review.js"),
        ("workflow-py", "python", "review.py"),
    ):
        found = re.search(rf"<!-- {marker} -->\n```{fence}\n(.*?)\n```\n", readme, re.S)
        assert found, marker
        (tmp_path / name).write_text(found.group(1) + "\n")
        proc = pisub_cli("run", "--json", "--workflow", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
        result = finished(json.loads(proc.stdout.splitlines()[0])["runId"])
        assert result.state == "complete", (name, result.content[0].text)
        outputs.append(value(result))
    assert outputs[0] == outputs[1] == ["coder: review the API\n", "coder: review the UI\n"]
    guide = pisub_cli("guide", "workflows").stdout
    assert PARALLEL.strip().splitlines()[0] in guide  # the guide shows the seed's fan-out
