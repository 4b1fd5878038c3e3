"""Terminal injection: a child, a task, an agent file and a workflow script that print escape
sequences (OSC title and clipboard, clear screen, SGR conceal, 8-bit CSI), bidi controls and
bytes that are not UTF-8 — and every human output of every command shows them escaped, never
raw; ``logs --raw`` stays byte-exact."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.integration.test_top import Tmux

ESC_TITLE = b"\x1b]0;pwned-title\x1b\\"
OSC52 = b"\x1b]52;c;cm0gLXJmIH4=\x07"
CLEAR = b"\x1b[2J\x1b[H"
CONCEAL = b"\x1b[8mconcealed\x1b[0m"
CSI8 = b"\x9b2J"  # an 8-bit CSI: not UTF-8 on its own
C1 = "\u009b31m".encode()  # the same as a (valid UTF-8) C1 character
BIDI = "\u202etxt.exe\u2066\u200f".encode()
NOT_UTF8 = b"\xff\xfe\xc3"
CONTROLS = b"\r\x08\x07\x00"
HOSTILE = ESC_TITLE + OSC52 + CLEAR + CONCEAL + CSI8 + C1 + BIDI + NOT_UTF8 + CONTROLS
HOSTILE_TEXT = HOSTILE.replace(b"\x00", b"").decode("utf-8", "replace")  # what argv and JSON can carry

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def assert_clean(what: str, data: bytes) -> None:
    """``data`` (a command's stdout or stderr) reaches a terminal harmlessly: valid UTF-8
    without a control character other than newline and tab, an ESC, a C1 or a bidi control."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AssertionError(f"{what}: bytes that are not UTF-8 reached the terminal: {data!r}") from exc
    found = UNSAFE.search(text)
    assert found is None, f"{what}: {found[0]!r} reached the terminal raw: {text!r}"


def human(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """A human command (no --json): both of its streams must be clean."""
    proc = subprocess.run([sys.executable, "-m", "pisub", *args], capture_output=True, timeout=timeout)
    assert_clean(f"pisub {' '.join(args)!r} stdout", proc.stdout)
    assert_clean(f"pisub {' '.join(args)!r} stderr", proc.stderr)
    assert b"Traceback" not in proc.stderr, proc.stderr
    return proc


PRINTER = f"""
import sys
sys.stdin.read()
hostile = {HOSTILE!r}
sys.stdout.buffer.write(b"line one " + hostile + b"\\nline two\\n")
sys.stdout.buffer.write(b"task was: " + {HOSTILE_TEXT.encode()!r} + b"\\n")
sys.stderr.buffer.write(b"stderr " + hostile + b"\\n")
sys.stdout.flush()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def _make_failer(make_agent: AgentMaker) -> None:
    """An agent that prints the same and exits 3 (a failed run); its description is hostile."""
    make_agent("failer", command=sys.executable, args=["-c", PRINTER, "3"], description=HOSTILE_TEXT)


def test_a_hostile_child_is_shown_escaped_by_every_command(home: Path, make_agent: AgentMaker) -> None:
    make_agent("printer", python=PRINTER)
    _make_failer(make_agent)
    good = pisub.launch("printer", HOSTILE_TEXT)
    bad = pisub.launch("failer", HOSTILE_TEXT)
    assert good.wait(timeout=60).state == "complete"
    assert bad.wait(timeout=60).state == "failed"
    log = good.paths.output_log(0).read_bytes()
    assert HOSTILE in log  # the file itself keeps the bytes
    for run in (good, bad):
        shown = human("status", run.id).stdout
        assert run.id.encode() in shown
        transcript = human("status", run.id, "--view", "transcript").stdout
        assert b"\\x1b]0;pwned-title\\x1b\\\\" in transcript and b"\\u202e" in transcript
        human("wait", run.id)
        human("result", run.id)
        logs = human("logs", run.id).stdout
        assert b"\\x1b[2J" in logs and b"\\udc9b2J" in logs and b"\\x9b31m" in logs
        assert b"\\u202etxt.exe" in logs and b"\\udcff\\udcfe" in logs and b"line two\n" in logs
        human("logs", "-f", run.id, timeout=30)
        raw = subprocess.run(
            [sys.executable, "-m", "pisub", "logs", "--raw", run.id], capture_output=True, timeout=60
        )
        assert raw.returncode == 0 and raw.stdout == run.paths.output_log(0).read_bytes()
        refused = human("status", run.id, "--child", HOSTILE_TEXT)  # an error line quoting it
        assert refused.returncode == 1 and refused.stderr.count(b"\n") == 1, refused.stderr
        human("wait", run.id, run.id, "--all")
    human("list")
    human("list", "--all")
    human("fleet")
    human("agents", "list")
    human("agents", "show", "failer")
    human("children", "list")
    human("doctor")
    human("status", HOSTILE_TEXT)  # RUN_NOT_FOUND quoting the argument


WORKFLOW = f"""
import sys
HOSTILE = {HOSTILE_TEXT!r}

async def main(runs, state, args):
    print("script says " + HOSTILE)
    sys.stdout.flush()
    a = await runs.run("kid", agent="printer", task=HOSTILE)
    if args.get("fail"):
        raise RuntimeError("script error " + HOSTILE)
    return "result " + HOSTILE + str(len(a or ""))
"""


def test_a_hostile_workflow_is_shown_escaped_by_every_command(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("printer", python=PRINTER)
    script = tmp_path / "wf.py"
    script.write_text(WORKFLOW)
    ids = []
    for extra in ([], ["--arg", "fail=1"]):
        proc = pisub_cli("run", "--workflow", str(script), *extra, "--json")
        assert proc.returncode == 0, proc.stderr
        ids.append(json.loads(proc.stdout)["runId"])
    for run_id in ids:
        pisub.Run(run_id).wait(timeout=90)
        human("status", run_id)
        human("status", run_id, "--view", "fleet")
        human("status", run_id, "--child", "kid", "--view", "transcript")
        human("wait", run_id)
        human("result", run_id)
        human("result", run_id, "--child", "kid")
        logs = human("logs", run_id).stdout
        assert b"[kid] line one" in logs and b"\\x1b[8mconcealed" in logs and b"\\u202e" in logs
        human("logs", "-f", run_id, timeout=30)
        human("logs", run_id, "--child", "kid")
        raw = subprocess.run(
            [sys.executable, "-m", "pisub", "logs", "--raw", run_id], capture_output=True, timeout=60
        )
        assert raw.returncode == 0 and ESC_TITLE in raw.stdout and b"[kid] " in raw.stdout
    failed = human("status", ids[1]).stdout
    assert b"script error" in failed and b"\\u202e" in failed
    human("children", "list")
    human("children", "list", "--parent", ids[0])
    human("list", "--all")
    human("worktree", "list")
    human("lane", "status", ids[0])


LIVE_PRINTER = f"""
import sys, time
sys.stdin.read()
sys.stdout.buffer.write(b"first line\\n" + {HOSTILE!r} + b"\\n")
sys.stdout.buffer.write(b"[link=http://e.x/]click[/link] " + {ESC_TITLE + OSC52 + CONCEAL + CSI8!r} + b"\\n")
sys.stdout.flush()
time.sleep(600)
"""


TOP = f"env -u COLUMNS -u LINES {sys.executable} -m pisub top"  # the pane's own size, not the test's


@pytest.fixture
def tmux(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/test.sh installs it)")
    monkeypatch.setenv("SHELL", "/bin/sh")  # (pisub-ci's login shell is nologin: tmux runs commands with it)
    t = Tmux()
    yield t
    t("kill-server")


def test_top_shows_a_hostile_child_escaped(home: Path, make_agent: AgentMaker, tmux: Tmux) -> None:
    """The rows (the last output line) and the log pane: no title change, no clipboard write,
    no rich markup taken for a hyperlink; the escaped text is on the screen instead."""
    make_agent("live", python=LIVE_PRINTER)
    run = pisub.launch("live", HOSTILE_TEXT)
    wait_for(lambda: b"click" in run.paths.output_log(0).read_bytes(), timeout=30, what="the child's output")
    tmux("new-session", "-d", "-s", "top", "-x", "200", "-y", "40", TOP)
    tmux("set-option", "-g", "set-clipboard", "on")  # an OSC 52 that reached tmux would make a buffer
    tmux("set-option", "-g", "allow-rename", "on")
    title = tmux("display", "-p", "-t", "top", "#{host}")  # a pane's title until an OSC sets one
    short = run.id[:8]
    try:
        wait_for(lambda: short in tmux.screen() and "pwned" in tmux.screen(), timeout=30)
    except AssertionError:
        raise AssertionError(f"no row with the child's output: {tmux.screen()}") from None
    row = next(line for line in tmux.screen().splitlines() if short in line)
    assert "[link=http://e.x/]click[/link] \\x1b]0;pwned-title" in row, row
    tmux.keys("Enter")
    wait_for(lambda: f"log of {short}" in tmux.screen(), timeout=10, what="the log view")
    wait_for(lambda: "\\x1b[2J" in tmux.screen(), timeout=10, what="the escaped log lines")
    screen = tmux.screen()
    assert "\\u202etxt.exe" in screen and "\\x1b[8mconcealed" in screen and "first line" in screen, screen
    styled = tmux("capture-pane", "-e", "-p", "-t", "top")
    assert "\x1b[8m" not in styled and "\x1b]" not in styled, styled  # no concealed text, no OSC
    assert tmux("display", "-p", "-t", "top", "#{pane_title}") == title
    assert tmux("list-buffers") == "", "an OSC 52 clipboard write reached the terminal"
    tmux.keys("q")
    tmux.keys("q")
    run.send_stop(source="test")
    assert run.wait(timeout=30).state == "stopped"


def _node_of_pi() -> str:
    """The Node that runs the pinned pi (≥ 22: it loads the extension's TypeScript itself)."""
    import os

    from tests.conftest import PI_BIN_DEFAULT

    launcher = Path(os.environ.get("PISUB_PI_BIN") or PI_BIN_DEFAULT)
    if not launcher.is_file():
        pytest.skip(f"pi is not installed at {launcher}: run scripts/install_pi.sh")
    exec_line = next(line for line in launcher.read_text().splitlines() if line.startswith("exec "))
    return exec_line.split()[1]


def _extension(tmp_path: Path, calls: list[list[object]]) -> list[object]:
    """Call the extension's exported functions (``[name, *args]`` each) in pi's Node; their answers."""
    from pisub.api.pi_integration import extension_path

    module = tmp_path / "subagent.mts"
    module.write_text(extension_path().read_text())
    (tmp_path / "calls.json").write_text(json.dumps(calls))
    calls_file = json.dumps(str(tmp_path / "calls.json"))
    script = (
        "import { readFileSync } from 'node:fs';"
        f"const m = await import({json.dumps(str(module))});"
        f"const calls = JSON.parse(readFileSync({calls_file}, 'utf8'));"
        "const out = calls.map(([name, ...args]) => m[name](...args));"
        "process.stdout.write(JSON.stringify(out));"
    )
    node = [_node_of_pi(), "--experimental-transform-types", "--no-warnings", "--input-type=module"]
    proc = subprocess.run([*node, "-e", script], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    result: list[object] = json.loads(proc.stdout)
    return result


def test_the_extension_escapes_the_same_set_as_pisub(tmp_path: Path) -> None:
    """termSafe (TypeScript) and printable (Python) agree on every hostile class and on random
    text mixing them with letters of every script and emoji."""
    import random

    from pisub.termsafe import printable

    rng = random.Random(23)
    pool = [*map(chr, range(0x00, 0xA0)), "\u061c", "\u200d", "\u200e", "\u200f", "\u2028", "\u2029"]
    pool += [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), "\ud800", "\udcff", "\udfff"]
    pool += ["é", "日", "🧑", "👍🏽", "Ω", "ع", "\\", "[", "]"]
    samples = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(400)]
    samples += [HOSTILE_TEXT, "\ud83e\udd16"[0] + "x"]  # (a high surrogate alone)
    answers = _extension(tmp_path, [["termSafe", s, one] for s in samples for one in (False, True)])
    expected = [printable(s, one_line=one) for s in samples for one in (False, True)]
    assert answers == expected


WRONG_TYPES: list[object] = [
    None,
    [],
    "a string",
    42,
    {"agent": "pi", "task": 5},
    {"agent": ["pi"], "task": "x"},
    {"agent": {"name": "pi"}, "task": "x"},
    {"agent": None, "task": "x"},
    {"agent": "pi", "task": "x" * 200_000},
    {"agent": "pi", "task": "x", "cwd": 7},
    {"agent": "pi", "task": "x", "timeoutMs": "60000"},
    {"agent": "pi", "task": "x", "toolBudget": {"hard": ["x" * 60_000, "y" * 60_000]}},
    {"action": 3},
    {"action": ["status"]},
    {"action": "status", "id": 12345678},
    {"action": "status", "id": {"$ne": None}},
    {"action": "status", "id": "a" * 8, "lines": "all"},
    {"action": "steer", "id": "a" * 8, "message": {"text": "hi"}},
    {"action": "resume", "id": "a" * 8, "index": "0"},
    {"action": "guide", "topic": ["x"]},
    {"action": "list", "capabilities": "yes"},
    {"action": "status", "\x1b]0;pwned\x07": 1},
    {"agent": "pi", "task": "x", "async": "false"},
    {"agent": "pi\u202e\u009b[2J", "task": 5, "cwd": "\u2066\x1b]52;c;eA==\x07"},  # an echo would be hostile
]


def test_the_extension_answers_arguments_of_wrong_types_in_one_line(tmp_path: Path) -> None:
    answers = _extension(tmp_path, [["plan", p] for p in WRONG_TYPES])
    for params, answer in zip(WRONG_TYPES, answers, strict=True):
        assert isinstance(answer, dict), (params, answer)  # a failure, not an argv
        text = answer["content"][0]["text"]
        assert text.startswith("INVALID_INPUT: ") and "\n" not in text and len(text) < 300, (params, text)
        assert_clean(f"plan({params!r:.60})", text.encode())


def test_the_extension_escapes_what_pisub_printed(tmp_path: Path) -> None:
    """Tool results of every shape (a result, a receipt, a listing, an error line, nothing at
    all where a run id belongs): hostile text comes back escaped, never a crash."""
    result = json.dumps({"state": "complete", "content": [{"type": "text", "text": HOSTILE_TEXT}]})
    receipt = json.dumps({"id": "r1", "state": "failed", "reason": HOSTILE_TEXT})
    calls: list[list[object]] = [
        ["shape", {}, ["result", "--json"], 0, result, ""],
        ["shape", {}, ["wait"], 1, result, ""],
        ["shape", {"id": "a" * 8}, ["steer", "--json"], 2, receipt, ""],
        [
            "shape",
            {},
            ["agents", "list", "--json"],
            0,
            json.dumps({"name": "x", "description": HOSTILE_TEXT}),
            "",
        ],
        ["shape", {"capabilities": True}, ["agents", "list"], 0, json.dumps({"name": HOSTILE_TEXT}), ""],
        ["shape", {}, ["status", "--json"], 1, "", f"pisub: no run {HOSTILE_TEXT} [RUN_NOT_FOUND]\n"],
        ["shape", {}, ["status", "--json"], 2, "", f"Usage: x\nError: bad value {HOSTILE_TEXT}\n"],
        ["shape", {}, ["doctor"], 0, HOSTILE_TEXT, ""],
        ["shape", {}, ["guide"], 0, HOSTILE_TEXT, ""],
        ["shape", {}, ["fleet", "--json"], 0, HOSTILE_TEXT + "\n" + json.dumps({"tool": HOSTILE_TEXT}), ""],
        ["shape", {}, ["run", "--json"], 0, "", ""],
        ["shape", {}, ["run", "--json"], 0, HOSTILE_TEXT, ""],
        ["shape", {}, ["resume", "--json"], 0, "[1, 2]", ""],
        ["shape", {}, ["result", "--json"], 0, "null", ""],
    ]
    for call, answer in zip(calls, _extension(tmp_path, calls), strict=True):
        assert isinstance(answer, dict), (call, answer)
        text = answer["content"][0]["text"]
        assert_clean(f"shape({call[2]})", text.encode())
        assert "\x1b" not in json.dumps(answer["details"].get("error", {})), (call, answer)


DRIPPED = HOSTILE + "é🧑".encode() + HOSTILE + b"\n"
DRIP = f"""
import sys, time
sys.stdin.read()
time.sleep(1)
for byte in {DRIPPED!r}:
    sys.stdout.buffer.write(bytes([byte]))
    sys.stdout.flush()
    time.sleep(0.01)
"""


def test_logs_follow_escapes_a_live_child_byte_by_byte(home: Path, make_agent: AgentMaker) -> None:
    """``logs -f`` on a run still printing, one byte at a time (a UTF-8 character split across
    reads is shown whole); the command ends with the run (its timeout is the deadline)."""
    make_agent("drip", python=DRIP)
    run = pisub.launch("drip", "x")
    followed = human("logs", "-f", run.id, timeout=60)
    assert run.status().state == "complete"
    assert followed.returncode == 0 and "é🧑".encode() in followed.stdout, followed.stdout
    assert followed.stdout.count(b"\\x1b]0;pwned-title\\x1b\\\\") == 2
    raw = subprocess.run(
        [sys.executable, "-m", "pisub", "logs", "--raw", run.id], capture_output=True, timeout=60
    )
    assert raw.stdout == run.paths.output_log(0).read_bytes() and HOSTILE in raw.stdout
