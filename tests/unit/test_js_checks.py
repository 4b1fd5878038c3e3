"""``validate_js``: the static checks of a JavaScript workflow script, rule by rule, on hostile
text, and on every JavaScript example of seed 001 (which must validate)."""

from __future__ import annotations

import pytest

from pisub.workflow.js.checks import (
    _WRAP_HEAD,
    _WRAP_TAIL,
    NESTED_ASYNC,
    NO_CWD,
    _parse,
    _structure_problem,
    validate_js,
)
from pisub.workflow.validate import Problem, Report, validate_source

AGENTS = {"scout", "worker", "reviewer"}

# Seed 001 ("执行示例", "并行顺序泳道", "引导", "保留的子智能体", "单命令门槛", "会话分享"): each
# workflowScript verbatim. The rolling example's "\n" is written as the model sends it in a JSON
# tool call (a backslash and an n: the script's string literal holds the escape, not a newline).
SEED_SCRIPTS = {
    "one child": """return runs.run("main", { agent: "scout", task: "Analyze the auth flow" })""",
    "sequential": """
  const scan = await runs.run("scan", { agent: "scout", task: "Analyze auth" });
  return (await runs.run("implement", { agent: "worker", task: "Implement from: " + scan.output })).output;
""",
    "parallel": """
  const results = await runs.all([
    { key: "backend", agent: "reviewer", task: "Review backend" },
    { key: "frontend", agent: "reviewer", task: "Review frontend" }
  ]);
  return results.map(result => result.output);
""",
    "lanes": """
  const board = await runs.lanes([
    { key: "api", stages: [
      { key: "writer", agent: "worker", task: "Implement the API change" },
      { key: "challenge", resume: "previous", task: "Challenge the implementation" },
      { key: "review", agent: "reviewer", task: "Review the API lane" }
    ] },
    { key: "ui", stages: [
      { key: "writer", agent: "worker", task: "Implement the UI change" },
      { key: "review", agent: "reviewer", task: "Review the UI lane" }
    ] }
  ]);
  return board.map((lane) => ({
    key: lane.key,
    state: lane.state,
    failedStage: lane.failedStage,
    stages: lane.stages.map((stage) => ({
      key: stage.key,
      state: stage.state,
      ok: stage.ok,
      runId: stage.runId,
      outputReference: stage.outputReference,
      verdict: stage.verdict
    }))
  }));
""",
    "rolling": """
  let pending = [
    { key: "writer", promise: runs.run("writer", { agent: "worker", task: "Draft the fix" }).then((result) => ({ key: "writer", result })) },
    { key: "reviewer", promise: runs.run("reviewer", { agent: "reviewer", task: "Review likely risks" }).then((result) => ({ key: "reviewer", result })) }
  ];
  const first = await Promise.race(pending.map((child) => child.promise));
  pending = pending.filter((child) => child.key !== first.key);
  const target = pending[0];
  const receipt = await runs.steer(target.key, "Use this early review:\\n" + first.result.output, { mode: "auto" });
  const rest = await Promise.all(pending.map((child) => child.promise));
  return { first: first.key, rest: rest.map((child) => child.key), receipt };
""",  # noqa: E501
    "retained": """
  let writer = await runs.run("implement", { agent: "worker", task: "Implement the accepted contract" });
  for (const pass of [1, 2]) {
    if (!writer.runId) throw new Error("writer did not return a retained run id");
    writer = await runs.run("followup-" + pass, { resume: writer.runId, task: "Revisit pass " + pass + ": " + writer.output });
  }
  return writer;
""",  # noqa: E501
    "gate": """return runs.run("impl", { agent: "worker", task: "Implement the fix", gate: "npm test" })""",
    "share": """return runs.run("main", { agent: "scout", task: "..." })""",
}  # fmt: skip


def check(source: str, *, agents: set[str] | None = AGENTS, max_spawns: int | None = 64) -> Report:
    return validate_js(source, agents, max_spawns=max_spawns)


def kinds(report: Report) -> list[str | None]:
    return [p.kind for p in report.errors]


def only(report: Report, kind: str) -> Problem:
    assert kinds(report) == [kind], report.as_json()
    return report.errors[0]


@pytest.mark.parametrize("name", sorted(SEED_SCRIPTS))
def test_every_javascript_example_of_the_seed_validates(name: str) -> None:
    report = check(SEED_SCRIPTS[name])
    assert report.ok, report.as_json()
    assert report.as_json() == {"ok": True, "errors": [], "warnings": []} or name == "retained"


def test_the_retained_children_loop_warns_that_its_count_is_dynamic() -> None:
    report = check(SEED_SCRIPTS["retained"])
    assert report.ok and [w.kind for w in report.warnings] == ["dynamic-spawn-count"]


# --- syntax ------------------------------------------------------------------------------------


def test_a_syntax_error_is_the_engines_on_the_scripts_own_line() -> None:
    problem = only(check("const a = 1;\nlet x = ;\nreturn a"), "syntax")
    assert problem.message == "SyntaxError: unexpected token in expression: ';'"
    assert (problem.line, problem.col) == (2, 9)


def test_an_unterminated_template_is_a_syntax_error_on_a_line_of_the_script() -> None:
    problem = only(check("return `abc"), "syntax")
    assert problem.line == 1 and problem.message.startswith("SyntaxError")


def test_early_errors_are_the_engines_too() -> None:
    assert only(check("let a = 1; let a = 2;"), "syntax").message.startswith(
        "SyntaxError: invalid redefinition"
    )
    assert "break must be inside loop" in only(check("break;"), "syntax").message
    assert only(check("function f() { await 1 }"), "syntax").line == 1


def test_top_level_await_and_return_are_a_statement_bodys() -> None:
    assert check("const x = await Promise.resolve(1);\nreturn x").ok


ESCAPES = {
    "one level, a loop": "}); while (true) {}; (function(){",
    "one level, a global": "}); globalThis.x = 1; (function(){",
    "the engine's wrapper, a loop": "})()); while (true) {}; f((function(){",
    "two levels, a global": "}) }); globalThis.x = 1; (function(){ (function(){",
    "three levels, a loop": "}) }) }); while (true) {}; (function(){ (function(){ (function(){",
}
"""Bodies that close their wrapper (1, 2, 3 levels) to run code outside it."""


@pytest.mark.parametrize("body", ESCAPES.values(), ids=ESCAPES.keys())
def test_a_body_that_closes_its_wrapper_is_refused_and_never_run(body: str) -> None:
    problem = only(check(body), "syntax")
    # The engine's compile throws before any statement of the text: an escaped loop never runs,
    # so the refusal is a syntax problem, never "the engine takes more than 10 s".
    assert problem.message.startswith("SyntaxError"), problem
    assert "takes more than" not in problem.message


@pytest.mark.parametrize("body", [ESCAPES["one level, a loop"], ESCAPES["one level, a global"]])
def test_tree_sitter_refuses_an_escape_before_the_engine_is_asked(body: str) -> None:
    problem = _structure_problem(body, _parse(_WRAP_HEAD + body + _WRAP_TAIL))
    assert problem is not None and "does not parse as one statement body" in problem.message


def test_an_escape_is_shown_where_the_wrapper_closes() -> None:
    problem = only(check("const é = 1;\n  return 1 }); x(); (function(){"), "syntax")
    assert (problem.line, problem.col) == (2, 12), problem


@pytest.mark.parametrize(
    "body", ["return 1", "// }); x(); (function(){\nreturn 1", "/* }) */ return `})`", "<!-- c\nreturn 1"]
)
def test_tree_sitter_takes_one_wrapper(body: str) -> None:
    assert _structure_problem(body, _parse(_WRAP_HEAD + body + _WRAP_TAIL)) is None


AGREED = {
    "an HTML-like open comment": ("<!-- a comment\nreturn 1", True),
    "an HTML-like close comment": ("const a = 1;\n--> a comment\nreturn a", True),
    "a closing script tag in a string": ('const tag = "</script>";\nreturn tag', True),
    "a template literal closing braces": ("return `${`})`}`", True),
    "a unicode escape in a name": ("const \\u0061b = 1;\nreturn ab", True),
    "characters beyond the BMP": ('/* 😀 */ const s = "é😀";\nreturn `😀${s}`', True),
    "a regex literal holding })": ("const r = /})/g;\nreturn 1", False),
    "a hashbang": ("#!/usr/bin/env node\nreturn 1", False),
}
"""Where tree-sitter and the engine might read a text differently, and what both say."""


@pytest.mark.parametrize("case", AGREED.values(), ids=AGREED.keys())
def test_validate_says_what_the_engine_says(case: tuple[str, bool]) -> None:
    import quickjs

    body, runs = case
    report = check(body)
    assert report.ok is runs, report.as_json()
    try:
        quickjs.Context().eval("(async function(){\n" + body + "\n})")
        compiled = True
    except quickjs.JSException:
        compiled = False
    assert compiled is runs
    if not runs:
        assert only(report, "syntax").message.startswith("SyntaxError")


# --- nested async --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "helper",
    [
        "async function helper() { return 1 }",
        "const helper = async () => 1;",
        "const helper = async x => x;",
        "const helper = async function () { return 1 };",
        "const o = { async helper() { return 1 } };",
        "class C { async helper() { return 1 } }",
        "const o = { async *helper() { yield 1 } };",
        "runs.run('a', {agent: 'scout', task: 't'}).then(async (r) => r);",
    ],
)
def test_nested_async_functions_are_refused_with_the_seeds_hint(helper: str) -> None:
    problem = only(check(helper + "\nreturn 1"), "nested-async")
    assert problem.message == NESTED_ASYNC and problem.line == 1
    assert "plain helper functions that return runs.run(...)" in problem.message


def test_plain_helpers_then_chains_and_a_property_named_async_are_fine() -> None:
    source = """
    function start(key) { return runs.run(key, { agent: "scout", task: "t" }); }
    const o = { async: 1, async() { return 2 } };
    const seen = await start("a").then((r) => r.output);
    return seen
    """
    report = check(source)
    assert report.ok, report.as_json()


# --- keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        'await runs.run("bad key", { agent: "scout", task: "t" })',
        'await runs.run("", { agent: "scout", task: "t" })',
        'await runs.run("-flag", { agent: "scout", task: "t" })',
        'await runs.all([{ key: "a/b", agent: "scout", task: "t" }])',
        'await runs.host("x y", { kind: "command", command: "npm test", timeoutMs: 1000 })',
        'await runs.steer("k\\n", "hi")',
        'await runs.run(`${"x"}y z`, { agent: "scout", task: "t" })',
        'await runs.run("' + "k" * 200 + '", { agent: "scout", task: "t" })',
    ],
)
def test_a_literal_key_that_is_no_key_is_refused(call: str) -> None:
    errors = [p for p in check(call).errors if p.kind == "key"]
    assert len(errors) == 1 or "${" in call, check(call).as_json()
    if errors:
        assert "is not a key: it must match ^[A-Za-z0-9]" in errors[0].message


def test_a_key_spelled_with_escapes_is_read_as_the_engine_reads_it() -> None:
    assert check('await runs.run("a\\x41", { agent: "scout", task: "t" })').ok
    assert kinds(check('await runs.run("a\\u0020b", { agent: "scout", task: "t" })')) == ["key"]


def test_one_batch_names_each_key_once() -> None:
    source = """await runs.all([
      { key: "a", agent: "scout", task: "t" },
      { key: "b", agent: "scout", task: "t" },
      { key: "a", agent: "scout", task: "u" },
    ])"""
    problem = only(check(source), "duplicate-key")
    assert problem.line == 4 and "the key 'a' is item 0's too" in problem.message


def test_a_lanes_manifest_is_checked_as_runs_lanes_checks_it() -> None:
    stage = '{ key: "w", agent: "worker", task: "t" }'
    bad = f'await runs.lanes([{{ key: "api", stages: [{stage}, {stage}] }}])'
    assert "the stage key 'w' is used twice" in only(check(bad), "lanes").message
    bad_key = 'await runs.lanes([{ key: "a b", stages: [{ key: "w", agent: "worker", task: "t" }] }])'
    assert kinds(check(bad_key)) == ["lanes"]
    partly = 'await runs.lanes([{ key: "a b", stages: [{ key: "w x", agent: "worker", task: args.task }] }])'
    assert kinds(check(partly)) == ["key", "key"]


# --- baseRef -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["-rf", "", "a\\u0001b", "x" * 1100])
def test_a_literal_base_ref_is_checked_by_the_ref_rule(ref: str) -> None:
    source = f'await runs.run("a", {{ agent: "scout", task: "t", isolation: "worktree", baseRef: "{ref}" }})'
    problem = only(check(source), "base-ref")
    assert "is not a usable git ref" in problem.message


def test_good_base_refs_and_computed_ones_pass() -> None:
    for ref in ("HEAD", "origin/main", "refs/tags/v1", "abc1234"):
        assert check(f'await runs.run("a", {{ agent: "scout", task: "t", baseRef: "{ref}" }})').ok
    assert check('await runs.run("a", { agent: "scout", task: "t", baseRef: args.ref })').ok
    assert kinds(check('await runs.all([{ key: "a", agent: "scout", task: "t", baseRef: 5 }])')) == [
        "base-ref"
    ]


# --- runs.host -----------------------------------------------------------------------------------


def host(params: str) -> Report:
    return check(f'return await runs.host("ci", {params})')


def test_a_complete_host_call_passes() -> None:
    assert host(
        '{ kind: "command", command: "npm test", timeoutMs: 120000, output: "ci/report.txt", role: "ci" }'
    ).ok


def test_a_host_cwd_is_refused_with_the_hint() -> None:
    problem = only(host('{ kind: "command", command: "npm test", timeoutMs: 1000, cwd: "/repo" }'), "host")
    assert problem.message == NO_CWD and "cd dir && npm test" in problem.message


def test_host_fields_are_the_allowed_ones_and_the_required_ones_are_given() -> None:
    report = host('{ kind: "command", command: "npm test", timeoutMs: 1000, shell: true }')
    assert "unknown field 'shell'" in only(report, "host").message
    report = host('{ command: "npm test" }')
    assert sorted(p.message for p in report.errors) == [
        'runs.host needs kind ({kind: "command", command, timeoutMs})',
        'runs.host needs timeoutMs ({kind: "command", command, timeoutMs})',
    ]
    assert host("{ ...base, command: 'npm test' }").ok  # the rest is known at run time


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ('kind: "shell"', 'must be "command"'),
        ('command: ""', "non-empty string"),
        ("timeoutMs: 0", "from 1 to 86400000"),
        ("timeoutMs: 86400001", "from 1 to 86400000"),
        ('timeoutMs: "5"', "from 1 to 86400000"),
        ('output: "/etc/passwd"', "relative"),
        ('output: "../escape.txt"', "'..'"),
        ('output: "a/../../b"', "'..'"),
        ('output: "' + "o" * 241 + '"', "at most 240 bytes"),
        ('output: "a\\nb"', "control character"),
        ('role: "admin"', "one of ci, gate"),
    ],
)
def test_literal_host_values_are_checked(field: str, message: str) -> None:
    fields = {"kind": 'kind: "command"', "command": 'command: "npm test"', "timeoutMs": "timeoutMs: 1000"}
    fields[field.split(":")[0]] = field
    problem = only(host("{ " + ", ".join(fields.values()) + " }"), "host")
    assert message in problem.message, problem.message


def test_a_long_host_command_is_refused() -> None:
    problem = only(host('{ kind: "command", command: "' + "x" * 16385 + '", timeoutMs: 1 }'), "host")
    assert "16385 bytes; at most 16384" in problem.message


# --- JSON values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("emit(() => 1)", "a function"),
        ("emit({ f: function () {} })", "a function"),
        ("emit({ m() { return 1 } })", "a function"),
        ("emit([1, NaN])", "NaN"),
        ("await state.set('k', { x: Infinity })", "Infinity"),
        ("await state.set('k', -Infinity)", "Infinity"),
        ("return Symbol('x')", "a symbol"),
        ("return { s: Symbol.iterator }", "a symbol"),
        ("return 10n", "a BigInt"),
        ("return [/re/g]", "a regular expression"),
        ("return class {}", "a function"),
        ('await runs.run("a", { agent: "scout", task: () => "t" })', "a function"),
    ],
)
def test_values_that_are_definitely_not_json_are_refused(source: str, what: str) -> None:
    problem = only(check(source), "json")
    assert f"{what} is not JSON" in problem.message


def test_undefined_and_computed_values_are_not_judged() -> None:
    assert check("emit({ a: undefined, b: args.x, c: [1, 'two', null, true, -3.5] }); return undefined").ok
    assert check("function f() { return () => 1 }\nreturn f()").ok  # a helper's return is no result


# --- runs.all results ----------------------------------------------------------------------------


def test_keyed_access_on_a_runs_all_result_is_refused_with_the_fix() -> None:
    source = """const results = await runs.all([
      { key: "backend", agent: "reviewer", task: "Review backend" },
    ]);
    return [results.backend, results["frontend"], results[0], results.length, results.map((r) => r.output)]"""
    report = check(source)
    assert kinds(report) == ["keyed-access", "keyed-access"]
    first = report.errors[0].message
    assert first.startswith("results.backend: runs.all resolves to an ordered array, not a key map")
    assert "results[0]" in first and "array destructuring" in first and ".map(" in first
    assert report.errors[1].message.startswith("results['frontend']")


def test_object_destructuring_of_a_runs_all_result_is_refused() -> None:
    source = 'const { backend } = await runs.all([{ key: "backend", agent: "scout", task: "t" }]);'
    assert "ordered array" in only(check(source), "keyed-access").message
    array = 'const [b] = await runs.all([{ key: "b", agent: "scout", task: "t" }]);\nreturn b.output'
    assert check(array).ok


def test_a_helpers_parameter_of_the_same_name_is_not_the_result() -> None:
    source = """const results = await runs.all([{ key: "a", agent: "scout", task: "t" }]);
    function pick(results) { return results.backend }
    return pick({ backend: results[0].output })"""
    assert check(source).ok, check(source).as_json()


# --- spawn budget ------------------------------------------------------------------------------


def spawns(count: int) -> str:
    return "\n".join(f'await runs.run("k{i}", {{ agent: "scout", task: "t" }});' for i in range(count))


def test_more_literal_keys_than_the_budget_is_an_error() -> None:
    assert check(spawns(3), max_spawns=3).ok
    problem = only(check(spawns(4), max_spawns=3), "spawn-budget")
    assert problem.line == 4 and "starts 4 children" in problem.message and "budget is 3" in problem.message


def test_a_key_used_twice_is_one_child_and_host_steps_are_none() -> None:
    source = spawns(2) + '\nawait runs.run("k0", { agent: "scout", task: "t" });'
    source += '\nawait runs.host("ci", { kind: "command", command: "npm test", timeoutMs: 1000 });'
    assert check(source, max_spawns=2).ok


def test_lanes_and_batches_count_their_children() -> None:
    batch = (
        'await runs.all([{ key: "a", agent: "scout", task: "t" }, { key: "b", agent: "scout", task: "t" }]);'
    )
    assert kinds(check(batch, max_spawns=1)) == ["spawn-budget"]
    assert kinds(check(SEED_SCRIPTS["lanes"], max_spawns=4)) == ["spawn-budget"]  # 5 stages
    assert check(SEED_SCRIPTS["lanes"], max_spawns=5).ok


@pytest.mark.parametrize(
    "source",
    [
        'for (const k of ["a", "b"]) { await runs.run(k, { agent: "scout", task: "t" }) }',
        'let i = 0; while (i++ < 3) { await runs.run("k", { agent: "scout", task: "t" }) }',
        'await Promise.all(["a", "b"].map((k) => runs.run(k, { agent: "scout", task: "t" })))',
        "await runs.all(args.items)",
        'await runs.run("k-" + args.n, { agent: "scout", task: "t" })',
    ],
)
def test_a_count_known_only_at_run_time_warns(source: str) -> None:
    report = check(source, max_spawns=1)
    assert report.ok, report.as_json()
    assert [w.kind for w in report.warnings] == ["dynamic-spawn-count"]
    assert "known only at run time" in report.warnings[0].message


def test_no_budget_no_budget_check() -> None:
    report = check(
        spawns(5) + "\nfor (const k of ks) await runs.run(k, {agent: 'scout', task: 't'})", max_spawns=None
    )
    assert report.ok and not report.warnings


# --- agents ------------------------------------------------------------------------------------


def test_an_unknown_literal_agent_is_an_error_with_did_you_mean() -> None:
    problem = only(check('return runs.run("a", { agent: "scuot", task: "t" })'), "agent")
    assert problem.unknown_agent
    assert problem.message.startswith("unknown agent 'scuot'; Did you mean scout?")
    assert "agents: reviewer, scout, worker" in problem.message


def test_agents_in_batches_and_lanes_are_looked_up_and_none_means_not_checked() -> None:
    batch = 'await runs.all([{ key: "a", agent: "nobody", task: "t" }])'
    assert kinds(check(batch)) == ["agent"]
    lanes = 'await runs.lanes([{ key: "l", stages: [{ key: "s", agent: "nobody", task: "t" }] }])'
    assert kinds(check(lanes)) == ["agent"]
    assert check(batch, agents=None).ok


# --- hostile text --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x" * (1024 * 1024 + 1), "at most 1048576"),
        ("return 1;\n" + "é" * (512 * 1024), "at most 1048576"),
        ("return 1;\nlet a = 'a\0b'", "NUL character (line 2)"),
        ("return '\udcff'", "not UTF-8"),
        ("", "empty"),
        (" \n\t", "empty"),
        (b"return 1", "must be text, not bytes"),
    ],
)
def test_hostile_text_is_one_clean_error(source: str | bytes, message: str) -> None:
    report = check(source)  # type: ignore[arg-type]
    assert len(report.errors) == 1 and message in report.errors[0].message, report.as_json()


@pytest.mark.parametrize(
    "source",
    [
        "return " + "[" * 200_000 + "]" * 200_000,
        "x = " + "(" * 300_000 + "1" + ")" * 300_000,
        "emit(" + "{a:" * 100_000 + "1" + "}" * 100_000 + ")",
        "{" * 300_000 + "}" * 300_000,
        "function f(){ " * 50_000 + "}" * 50_000,
        "[" * 500_000,
    ],
)
def test_deep_nesting_is_one_clean_error(source: str) -> None:
    report = check(source)
    assert len(report.errors) == 1 and report.errors[0].kind in ("syntax", "input"), report.as_json()


def test_deep_but_compilable_nesting_is_walked_without_recursion() -> None:
    source = "{" * 400 + 'await runs.run("a", { agent: "nobody", task: "t" })' + "}" * 400
    assert kinds(check(source)) == ["agent"]
    fns = "function f(){ " * 300 + "return 1" + "}" * 300
    assert check(fns).ok


def test_a_flood_of_problems_is_cut_short() -> None:
    source = "const r = await runs.all([]);\n" + "\n".join(f"r.k{i};" for i in range(1000))
    report = check(source)
    assert len(report.errors) == 200 and report.error_count == 1000
    assert all(p.kind == "keyed-access" for p in report.errors)
    shown = report.as_json()
    assert shown["total"] == 1000 and len(shown["errors"]) == 200  # type: ignore[arg-type]
    assert "total" not in check("return 1").as_json()


# --- the report ----------------------------------------------------------------------------------


def test_the_report_is_the_seeds_shape_and_keeps_col() -> None:
    report = check("let x = ;\n", max_spawns=1)
    assert report.as_json() == {
        "ok": False,
        "errors": [
            {
                "message": "SyntaxError: unexpected token in expression: ';'",
                "line": 1,
                "column": 9,
                "col": 9,
                "kind": "syntax",
            }
        ],
        "warnings": [],
    }
    python = validate_source("def main(): pass\n", None).as_json()
    assert python["ok"] is False and "kind" not in python["errors"][0]  # type: ignore[index]
    assert python["errors"][0]["col"] == python["errors"][0]["column"]  # type: ignore[index]


def test_columns_count_characters_not_bytes() -> None:
    problem = only(check('const s = "ééé"; await runs.run("a b", { agent: "scout", task: "t" })'), "key")
    assert problem.col == 33
