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
    """The counted ``worker`` of tests/integration/test_workflows.py."""
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
    const name = ["scan"][0];
    return results[name].output;
    """
    said = _failed(text)
    assert "runs.all resolves to an ordered array" in said and "workflowScript:" in said, said


def test_an_unawaited_launch_fails_the_workflow_with_the_seeds_message(home: Path, counted: Path) -> None:
    said = _failed('runs.run("lost", { agent: "worker", task: "x" }); return 1;')
    assert "unawaited runs.run launch(es): 'lost'" in said, said


def test_script_errors_name_the_line_and_keep_codes(home: Path, counted: Path) -> None:
    said = _failed('const x = 1;\nthrow new RangeError("nope");')
    assert "workflowScript:2: RangeError: nope" in said, said
    said = _failed('return runs.run(["bad key!"][0], { agent: "worker", task: "x" });')
    assert "must match" in said, said
    said = _failed('return runs.run("k", { agent: "worker", task: "x", chain: [] });')
    assert "chain is not a runs.run parameter" in said, said
    said = _failed("const f = [() => 1][0];\nreturn { f };")
    assert "not JSON" in said, said
    said = _failed("return [NaN][0];")
    assert "finite" in said, said


def test_the_sandbox_has_the_seeds_globals_only(home: Path, counted: Path) -> None:
    text = """
    const kinds = [typeof require, typeof process, typeof setTimeout, typeof fetch, typeof eval,
                   typeof state, typeof runs.host, typeof emit, typeof console.log, typeof args];
    let fn = "ran";
    try { fn = (function () {}).constructor("return 1")(); } catch (e) { fn = e.name; }
    let nf = "ran";
    try { nf = new Function("return 1")(); } catch (e) { nf = e.name; }
    let ev = "ran";
    try { ev = eval("1"); } catch (e) { ev = e.name; }
    emit({ step: 1 });
    return { kinds, fn, nf, ev, args, r: [Math.random(), Math.random()] };
    """
    run = launch_workflow(text=text, args={"x": 1})
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    # state: the workflow's default mission's (spec/missions.md)
    assert value["kinds"] == ["undefined"] * 4 + ["function", "object"] + ["function"] * 3 + ["object"]
    assert value["fn"] == "EvalError" and value["nf"] == "EvalError" and value["ev"] == "EvalError"
    assert value["args"] == {"x": 1}
    events = [json.loads(line) for line in run.paths.events.read_text().splitlines()]
    assert any(e["type"] == "workflow.emit" and e["data"]["value"] == {"step": 1} for e in events)


def test_a_script_that_waits_for_nothing_fails_instead_of_hanging(home: Path, counted: Path) -> None:
    said = _failed("await new Promise(() => {}); return 1;")
    assert "waits for something that never comes" in said, said


def test_boundary_json_is_checked_at_every_door(home: Path, counted: Path) -> None:
    text = """
    const said = [];
    const tries = [
      () => emit({ a: [1, , 3] }),
      () => { const o = {}; o.self = o; emit(o); },
      () => emit({ s: [Symbol][0]("x") }),
      () => emit(new Map()),
      () => { let v = 0; for (let i = 0; i < 150; i++) v = [v]; emit(v); },
      () => runs.run("k", { agent: "worker", task: "x", timeoutMs: 1 / [0][0] }),
      () => runs.steer("k", "m", { colour: 1 }),
      () => runs.all("not an array"),
    ];
    for (const t of tries) {
      try { t(); said.push("ran"); } catch (e) { said.push(e.name + ": " + e.message); }
    }
    return said;
    """
    result = launch_workflow(text=text).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    said = json.loads(result.content[0].text)
    assert "sparse array" in said[0] and "cycle" in said[1] and "symbol" in said[2]
    assert "Map, not a plain object" in said[3] and "deeper than 100" in said[4]
    assert "finite" in said[5] and "unknown option" in said[6] and "array" in said[7]


def test_state_console_args_and_promises_given_to_runs_all(home: Path, counted: Path) -> None:
    text = """
    const before = await state.get("n");
    await state.set("n", (before || 0) + 1);
    const a = runs.run("a", { agent: "worker", task: "one" });
    const b = runs.run("b", { agent: "worker", task: "two" });
    const both = await runs.all([a, b]);
    console.log("seen", both.length, args.who);
    console.error("to stderr");
    return { before: before === undefined ? "undefined" : before, after: await state.get("n"),
             outs: both.map((r) => r.output) };
    """
    run = launch_workflow(text=text, args={"who": "me"}, state_ns="js-ns")
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == {
        "before": "undefined",
        "after": 1,
        "outs": ["did: one\n", "did: two\n"],
    }
    log = run.paths.script_log.read_text()
    assert "seen 2 me" in log and "to stderr" in log and "runs.all was given runs.run promises" in log
    second = launch_workflow(text='return await state.get("n");', state_ns="js-ns").wait(timeout=60)
    assert second.content[0].text == "1"


def test_a_js_file_and_its_copy(home: Path, counted: Path, tmp_path: Path) -> None:
    script = tmp_path / "review.js"
    script.write_text('return (await runs.run("main", { agent: "worker", task: "x" })).output;\n')
    run = launch_workflow(script)
    script.write_text("throw new Error('edited after launch');\n")
    result = run.wait(timeout=60)
    assert result.state == "complete" and result.content[0].text == "did: x\n"
    spec = run.manifest().workflow
    assert spec is not None and spec.language == "javascript"
    assert (run.dir / "workflow.js").stat().st_mode & 0o777 == 0o600
    assert not (run.dir / "workflow.py").exists()


def test_a_relative_script_path_is_found_in_the_runs_cwd(home: Path, counted: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "workflows").mkdir(parents=True)
    (project / "workflows" / "review.js").write_text('return "from the project";\n')
    result = launch_workflow("workflows/review.js", cwd=project).wait(timeout=60)
    assert result.state == "complete" and result.content[0].text == "from the project"


def test_launch_refuses_what_validate_finds_in_one_line(home: Path, counted: Path) -> None:
    from tests.conftest import pisub_cli

    for text, said in (
        ("const f = async () => 1;\nreturn 1;", "async"),
        ('return runs.run("bad key!", { agent: "worker", task: "x" });', "bad key!"),
        ("return runs.run('k', { agent: 'nobody', task: 'x' });", "nobody"),
        ("return (;", "SyntaxError"),
    ):
        done = pisub_cli("run", "--workflow-script", text)
        assert done.returncode != 0 and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert not list((home / "runs").glob("*-*-*")), "a refused launch created a run"


def test_deep_data_fails_the_script_and_never_the_coordinator(home: Path, counted: Path) -> None:
    said = _failed("let o = [];\nfor (let i = 0; i < 30000; i++) o = [o];\nreturn JSON.stringify(o).length;")
    assert "nested deeper than 10000 levels" in said, said
    deep = "let o = [];\nfor (let i = 0; i < 1000000; i++) o = [o];\nconsole.log(o);\nreturn 1;"
    run = launch_workflow(text=deep)
    assert run.wait(timeout=60).state == "complete"
    assert "a value JSON cannot show" in run.paths.script_log.read_text()


def test_a_race_waits_for_its_losers_and_state_writes_are_never_lost(home: Path, counted: Path) -> None:
    text = """
    const fast = runs.run("fast", { agent: "worker", task: "quick" });
    const slow = runs.run("slow", { agent: "worker", task: "slow sleep 1" });
    const first = await Promise.race([fast, slow]);
    for (let i = 0; i < 20; i++) state.set("u" + i, i);
    return first.key;
    """
    run = launch_workflow(text=text, state_ns="race-ns")
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert [r.state for r in result.details.results] == ["complete", "complete"]
    read = "const v = []; for (let i = 0; i < 20; i++) v.push(await state.get('u' + i)); return v;"
    again = launch_workflow(text=read, state_ns="race-ns").wait(timeout=60)
    assert json.loads(again.content[0].text) == list(range(20))


def test_hostile_values_and_replaced_intrinsics_are_reported_not_hung(home: Path, counted: Path) -> None:
    said = _failed("throw { get message() { throw new Error('no'); } };")
    assert "its message cannot be read" in said, said
    text = """
    JSON.parse = () => { throw new Error("mine"); };
    Promise.prototype.then = function () { throw new Error("mine too"); };
    Array.isArray = () => false;
    const r = await runs.run("a", { agent: "worker", task: "x" });
    return [1, 2, 3].at(-1) + r.output.length + [4, 5].findLast((x) => x > 4);
    """
    result = launch_workflow(text=text).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert result.content[0].text == str(3 + len("did: x\n") + 5)
    counter = "let n = 0;\nconst o = { get x() { n += 1; return n === 1 ? 1 : NaN; } };\nemit(o);\nreturn n;"
    result = launch_workflow(text=counter).wait(timeout=60)
    assert result.content[0].text == "1", result.content[0].text  # each getter is read once


def test_emit_is_capped_per_run_so_a_loop_cannot_fill_the_disk(home: Path) -> None:
    # the attack: an emit loop grew events.jsonl to 2.6 GB; now the 1001st emit (or the one past
    # 1 MiB in all) throws INVALID_INPUT, which the script may catch
    text = """
    let n = 0, said = "";
    try { for (;;) { emit({ i: n }); n++; } } catch (e) { said = e.message; }
    return { n, said };
    """
    run = launch_workflow(text=text)
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    assert value["n"] == 1000, value
    assert "at most 1000 emits and 1048576 bytes in all per workflow run" in value["said"], value
    events = [json.loads(line) for line in run.paths.events.read_text().splitlines()]
    assert sum(e["type"] == "workflow.emit" for e in events) == 1000
    sized = launch_workflow(
        text="""
        let n = 0, said = "";
        try { for (;;) { emit({ s: "y".repeat(16000) }); n++; } } catch (e) { said = e.message; }
        return { n, said };
        """
    )
    result = sized.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    value = json.loads(result.content[0].text)
    assert value["n"] == 65 and "(this one has emitted 65, " in value["said"], value
    assert sized.paths.events.stat().st_size < 2 * 1024 * 1024


def test_a_tool_budget_is_a_runs_run_parameter_in_both_languages(
    home: Path, counted: Path, tmp_path: Path
) -> None:
    js = 'return (await runs.run("a", { agent: "worker", task: "x", toolBudget: { hard: 5 } })).ok;'
    assert launch_workflow(text=js).wait(timeout=60).content[0].text == "true"
    script = tmp_path / "budget.py"
    script.write_text(
        "async def main(runs, state, args):\n"
        "    return (await runs.run('a', agent='worker', task='x', tool_budget={'hard': 5})).ok\n"
    )
    assert launch_workflow(script).wait(timeout=60).content[0].text == "true"


def test_a_result_over_16_mib_names_its_size_and_the_file_keeping_it_in_both_languages(
    home: Path, tmp_path: Path
) -> None:
    """Attack 32, F6: a script's result over 16 MiB was cut at 16 MiB first — the marker gave
    16777216 as its size, named no file, and the complete run had no error code. Now (a string in
    JavaScript, a JSON value in Python — which failed the workflow over 16 MiB) the marker gives
    the real size and names the run's `result.txt`, which keeps its first output-cap bytes (8 MiB);
    details.error is SUBAGENT_OUTPUT_TRUNCATED. A smaller cut one is kept whole."""
    run = launch_workflow(text='return "ab\\n".repeat(6000000);')
    result = run.wait(timeout=120)
    keep = run.dir / "result.txt"
    assert result.state == "complete", result.content[0].text[-300:]
    text = result.content[0].text
    assert text.endswith(
        "[TRUNCATED: showing first 5000 of 6000000 lines, 14999 of 18000000 bytes - its first "
        f"8388608 bytes (the run's output cap) at {keep}]"
    ), text[-300:]
    assert keep.stat().st_size == 8388608 and keep.read_bytes()[:6] == b"ab\nab\n"
    assert result.details.error is not None and result.details.error.code == "SUBAGENT_OUTPUT_TRUNCATED"
    script = tmp_path / "big.py"
    script.write_text("async def main(runs, state, args):\n    return {'big': 'y' * (17 << 20)}\n")
    run = launch_workflow(script)
    result = run.wait(timeout=120)
    assert result.state == "complete", result.content[0].text[-300:]
    size = len('{"big":""}') + (17 << 20)
    cap = f"its first 8388608 bytes (the run's output cap) at {run.dir / 'result.txt'}]"
    assert result.content[0].text.endswith(f"204800 of {size} bytes - {cap}")
    script.write_text("async def main(runs, state, args):\n    return 'z' * 300_000\n")
    run = launch_workflow(script)
    result = run.wait(timeout=60)
    assert result.content[0].text.endswith(
        f"204800 of 300000 bytes - full output at {run.dir / 'result.txt'}]"
    )
    assert (run.dir / "result.txt").read_text() == "z" * 300_000
    assert result.details.error is not None and result.details.error.code == "SUBAGENT_OUTPUT_TRUNCATED"


def test_a_long_failure_text_is_cut_with_its_marker_and_kept_in_result_txt(home: Path) -> None:
    """Attack 33, F5: a script's failure over 8,000 characters was cut there silently (no marker,
    no file, no size); its text is cut as a result's text is, the whole kept in result.txt.
    The status's error keeps its first 8,000 characters (errors are that long)."""
    run = launch_workflow(text='throw new Error("E".repeat(300000) + "end");')
    result = run.wait(timeout=120)
    assert result.state == "failed"
    text = result.content[0].text
    assert text.startswith("SUBAGENT_FAILED: the workflow failed: workflowScript:1: Error: EEE"), text[:100]
    assert text.endswith(f"bytes - full output at {run.dir / 'result.txt'}]"), text[-300:]
    assert " of 300" in text.rsplit("[TRUNCATED", 1)[1]  # the real size
    assert (run.dir / "result.txt").read_text().rstrip().endswith("end")
    error = run.status().error
    assert error is not None and len(error.message) <= 8000
