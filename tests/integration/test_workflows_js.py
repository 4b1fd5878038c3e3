"""JavaScript workflow scripts: the seed's statement bodies, run by the coordinator's engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pisub.api.client import launch_workflow
from tests.conftest import AgentMaker
from tests.integration.test_workflows import WORKER


@pytest.fixture
def counted(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    count = tmp_path / "starts.txt"
    count.touch()
    monkeypatch.setenv("PISUB_TEST_COUNT", str(count))
    make_agent("worker", python=WORKER)
    return count


def test_a_js_workflow_gathers_then_fans_out(home: Path, counted: Path) -> None:
    text = """
    const first = await runs.all([
      { key: "a", agent: "worker", task: "one" },
      { key: "b", agent: "worker", task: "two" },
    ]);
    const c = runs.run("c", { agent: "worker", task: "three after " + first[0].output.trim() });
    const d = runs.run("d", { agent: "worker", task: "four" });
    const winner = await Promise.race([c, d]);
    const rest = await Promise.all([c, d]);
    const again = await runs.run("a", { agent: "worker", task: "one" });
    console.log("hello", { n: 1 });
    return { first: first.map((r) => r.output), n: rest.length,
             same: again.runId === first[0].runId, w: typeof winner.output };
    """
    run = launch_workflow(text=text)
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    assert value == {"first": ["did: one\n", "did: two\n"], "n": 2, "same": True, "w": "string"}
    assert [r.key for r in result.details.results] == ["a", "b", "c", "d"]


def _failed(text: str, timeout: float = 60) -> str:
    result = launch_workflow(text=text).wait(timeout=timeout)
    assert result.state == "failed", result.content[0].text
    return result.content[0].text


def test_a_failed_child_rejects_runs_run_and_resolves_in_runs_all(home: Path, counted: Path) -> None:
    text = """
    const all = await runs.all([
      { key: "a", agent: "worker", task: "fail now" }, { key: "b", agent: "worker", task: "ok" },
    ]);
    let caught = null;
    try { await runs.run("c", { agent: "worker", task: "fail too" }); } catch (e) { caught = e.message; }
    return { all: all.map((r) => [r.ok, r.state]), caught };
    """
    result = launch_workflow(text=text).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    assert value["all"] == [[False, "failed"], [True, "complete"]]
    assert value["caught"].startswith("Run 'c' failed: ")


def test_keyed_access_on_runs_all_names_the_ordered_array(home: Path, counted: Path) -> None:
    text = """
    const results = await runs.all([{ key: "scan", agent: "worker", task: "x" }]);
    return results.scan.output;
    """
    said = _failed(text)
    assert "runs.all resolves to an ordered array" in said and "workflowScript:" in said, said


def test_an_unawaited_launch_fails_the_workflow_with_the_seeds_message(home: Path, counted: Path) -> None:
    said = _failed('runs.run("lost", { agent: "worker", task: "x" }); return 1;')
    assert "unawaited runs.run launch(es): 'lost'" in said, said


def test_script_errors_name_the_line_and_keep_codes(home: Path, counted: Path) -> None:
    said = _failed('const x = 1;\nthrow new RangeError("nope");')
    assert "workflowScript:2: RangeError: nope" in said, said
    said = _failed('return runs.run("bad key!", { agent: "worker", task: "x" });')
    assert "must match" in said, said
    said = _failed('return runs.run("k", { agent: "worker", task: "x", chain: [] });')
    assert "chain is not a runs.run parameter" in said, said
    said = _failed("return { f: () => 1 };")
    assert "not JSON" in said, said
    said = _failed("return NaN;")
    assert "finite" in said, said


def test_the_sandbox_has_the_seeds_globals_only(home: Path, counted: Path) -> None:
    text = """
    const kinds = [typeof require, typeof process, typeof setTimeout, typeof fetch, typeof eval,
                   typeof state, typeof runs.host, typeof emit, typeof console.log, typeof args];
    let fn = "ran";
    try { fn = (function () {}).constructor("return 1")(); } catch (e) { fn = e.name; }
    let nf = "ran";
    try { nf = new Function("return 1")(); } catch (e) { nf = e.name; }
    emit({ step: 1 });
    return { kinds, fn, nf, args, r: [Math.random(), Math.random()] };
    """
    run = launch_workflow(text=text, args={"x": 1})
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    assert value["kinds"] == ["undefined"] * 7 + ["function", "function", "object"]
    assert value["fn"] == "EvalError" and value["nf"] == "EvalError"
    assert value["args"] == {"x": 1}
    events = [json.loads(line) for line in run.paths.events.read_text().splitlines()]
    assert any(e["type"] == "workflow.emit" and e["data"]["value"] == {"step": 1} for e in events)


def test_a_script_that_waits_for_nothing_fails_instead_of_hanging(home: Path, counted: Path) -> None:
    said = _failed("await new Promise(() => {}); return 1;")
    assert "waits for something that never comes" in said, said
