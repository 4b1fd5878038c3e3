"""``pisub workflow validate`` for JavaScript scripts: a file, inline text, stdin, ``--json``, the
exit codes, and one line (never a traceback) for every path that cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pisub
from tests.conftest import pisub_cli

GOOD = """
  const results = await runs.all([
    { key: "backend", agent: "reviewer", task: "Review backend" },
    { key: "frontend", agent: "reviewer", task: "Review frontend" }
  ]);
  return results.map(result => result.output);
"""
BAD = """const results = await runs.all([{ key: "backend", agent: "reviewer", task: "t" }]);
return results.backend;
"""


def validate(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    if stdin is None:
        return pisub_cli("workflow", "validate", *args)
    done = subprocess.run(
        [sys.executable, "-m", "pisub", "workflow", "validate", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one problem line of a failed human-readable validate."""
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stdout + proc.stderr, proc
    lines = proc.stdout.splitlines()
    assert lines[-1] == "1 problem(s)", proc
    assert len(lines) == 2, proc
    return lines[0]


def test_a_good_file_is_ok_and_a_bad_one_lists_file_line_col(home: Path, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.js", tmp_path / "bad.js"
    good.write_text(GOOD)
    bad.write_text(BAD)
    ok = validate(str(good))
    assert ok.returncode == 0 and ok.stdout.strip() == "ok", ok
    line = one_line(validate(str(bad)))
    assert line.startswith(f"{bad}:2:8: results.backend: runs.all resolves to an ordered array"), line


def test_json_is_the_seeds_shape_with_exit_codes(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "w.js"
    script.write_text("let x = ;\n")
    proc = validate(str(script), "--json")
    assert proc.returncode == 1, proc
    report = json.loads(proc.stdout)
    assert sorted(report) == ["errors", "ok", "warnings"] and report["ok"] is False
    (error,) = report["errors"]
    assert (error["kind"], error["line"], error["column"], error["col"]) == ("syntax", 1, 9, 9)
    assert error["message"].startswith("SyntaxError: ")
    script.write_text(GOOD)
    proc = validate(str(script), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"ok": True, "errors": [], "warnings": []}


def test_inline_text_and_stdin(home: Path) -> None:
    inline = validate("--workflow-script", 'return runs.run("main", { agent: "scout", task: "x" })', "--json")
    assert inline.returncode == 0 and json.loads(inline.stdout)["ok"] is True, inline
    nested = validate("--workflow-script", "const f = async () => 1;\nreturn f")
    assert one_line(nested).startswith("<workflowScript>:1:11: workflowScript does not support nested async")
    piped = validate(
        "--workflow-script", "-", "--json", stdin=b'await runs.run("a b", {agent: "scout", task: "t"})'
    )
    assert piped.returncode == 1 and json.loads(piped.stdout)["errors"][0]["kind"] == "key", piped
    human = validate("--workflow-script", "-", stdin=b"let x = ;")
    assert one_line(human) == "<stdin>:1:9: SyntaxError: unexpected token in expression: ';'"


def test_an_unknown_agent_and_the_configured_spawn_budget(home: Path, tmp_path: Path) -> None:
    unknown = validate("--workflow-script", 'return runs.run("a", { agent: "scuot", task: "t" })', "--json")
    error = json.loads(unknown.stdout)["errors"][0]
    assert error["kind"] == "agent" and "Did you mean scout?" in error["message"], unknown
    config = tmp_path / "xdg-config" / "pisub" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("[workflow]\nmax_spawns = 2\n")
    three = "\n".join(f'await runs.run("k{i}", {{ agent: "scout", task: "t" }});' for i in range(3))
    over = json.loads(validate("--workflow-script", three, "--json").stdout)
    assert [e["kind"] for e in over["errors"]] == ["spawn-budget"], over
    looped = 'for (const k of ["a", "b", "c"]) await runs.run(k, { agent: "scout", task: "t" });'
    warned = json.loads(validate("--workflow-script", looped, "--json").stdout)
    assert warned["ok"] is True and [w["kind"] for w in warned["warnings"]] == ["dynamic-spawn-count"]
    human = validate("--workflow-script", looped)
    assert human.returncode == 0 and "warning: " in human.stdout, human


def test_python_scripts_are_still_python(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(
        'async def main(runs, state, args):\n    return await runs.run("k", agent="worker", task="x")\n'
    )
    assert validate(str(script)).returncode == 0
    inline = validate("--workflow-script", "def main(): pass", "--language", "python", "--json")
    assert inline.returncode == 1 and "async def main" in inline.stdout, inline


@pytest.mark.parametrize(
    "case", ["missing", "directory", "fifo", "symlink-to-dir", "not-utf8", "huge", "nul"]
)
def test_a_path_that_cannot_be_read_is_one_line(home: Path, tmp_path: Path, case: str) -> None:
    path = tmp_path / "w.js"
    expected = {
        "missing": "cannot read",
        "directory": "not a regular file",
        "fifo": "not a regular file (FIFO)",
        "symlink-to-dir": "not a regular file",
        "not-utf8": "not UTF-8",
        "huge": "larger than 1048576 bytes",
        "nul": "NUL character",
    }[case]
    if case == "directory":
        path.mkdir()
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "symlink-to-dir":
        (tmp_path / "dir").mkdir()
        path.symlink_to(tmp_path / "dir")
    elif case == "not-utf8":
        path.write_bytes(b"return '\xff\xfe'")
    elif case == "huge":
        path.write_bytes(b"x" * (1024 * 1024 + 1))
    elif case == "nul":
        path.write_bytes(b"return 1;\0")
    line = one_line(validate(str(path)))
    assert line.startswith(f"{path}:1:1: ") and expected in line, line


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_one_line(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "w.js"
    path.write_text(GOOD)
    path.chmod(0)
    assert "Permission denied" in one_line(validate(str(path)))


def test_bad_usage_is_one_line(home: Path, tmp_path: Path) -> None:
    for args in (
        [],
        [str(tmp_path / "w.js"), "--workflow-script", "return 1"],
        ["--workflow-script", "1", "--language", "cobol"],
    ):
        proc = validate(*args)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc
        assert len(proc.stderr.strip().splitlines()) == 1 and "INVALID_INPUT" in proc.stderr, proc
    unknown_suffix = tmp_path / "w.txt"
    unknown_suffix.write_text("return 1")
    proc = validate(str(unknown_suffix))
    assert "a workflow script is a .js (JavaScript) or .py (Python) file" in proc.stderr, proc
    assert validate(str(unknown_suffix), "--language", "javascript").returncode == 0
    stdin = validate("--workflow-script", "-", stdin=b"return '\xff'")
    assert "not UTF-8" in one_line(stdin)


def test_the_api_resolves_a_relative_script_against_cwd(home: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "workflows").mkdir(parents=True)
    (project / "workflows" / "review.js").write_text(BAD)
    report = pisub.validate_workflow("workflows/review.js", cwd=project)
    assert not report.ok and report.errors[0].kind == "keyed-access"
    assert pisub.validate_workflow(text=GOOD).ok
    assert not pisub.validate_workflow(text="def main(): pass", language="python").ok


@pytest.mark.parametrize(
    "text",
    [
        "<!-- an HTML-like comment\nconst a = 1;\n--> another\nreturn a",
        "return `${`})`}`.length === 2 ? 1 : 0",
        "const \\u0061b = 1;\nreturn ab",
    ],
    ids=["html-comments", "template", "unicode-escape"],
)
def test_a_script_validate_accepts_runs(home: Path, text: str) -> None:
    assert pisub.validate_workflow(text=text).ok
    result = pisub.launch_workflow(text=text).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == 1


def test_a_body_that_closes_its_wrapper_is_refused_by_validate_and_launch(home: Path) -> None:
    text = "}); while (true) {}; (function(){"
    line = one_line(validate("--workflow-script", text))
    assert "does not parse as one statement body" in line, line
    with pytest.raises(pisub.PisubError) as caught:
        pisub.launch_workflow(text=text)
    assert "does not parse as one statement body" in str(caught.value)


def test_a_flood_of_problems_is_counted_whole(home: Path) -> None:
    text = "\n".join(f'runs.run("bad key {i}", {{ task: NaN }});' for i in range(150))
    human = validate("--workflow-script", text)
    assert human.returncode == 1
    lines = human.stdout.splitlines()
    assert lines[-1] == "300 problem(s)" and lines[-2] == "(the first 200 problems are listed)", lines[-3:]
    assert len(lines) == 202
    shown = json.loads(validate("--workflow-script", text, "--json").stdout)
    assert shown["total"] == 300 and len(shown["errors"]) == 200
    assert {e["kind"] for e in shown["errors"]} == {"key", "json"}
