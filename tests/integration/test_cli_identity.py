"""Telling runs apart from the command line (issue 26, items 2, 8, 11, 13): ``--label``; ``list``,
``status`` and ``fleet`` showing the label, the task's head and the cwd; ``status`` without RUN;
4-character prefixes, ambiguity and ``@LABEL``; ``--version``; colour on a terminal only;
``logs --tail``/``--stderr``; what ``gc`` says it kept. Every test drives the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pisub
from pisub.cli.render import columns_of
from pisub.errors import InvalidInput
from pisub.protocol import Status, decode, encode_pretty
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import on_a_terminal

GREEN, RED, RESET = "\x1b[32m", "\x1b[31m", "\x1b[0m"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    env.update(extra)
    return env


def terminal(*args: str, columns: int = 80, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The CLI with stdout on a terminal ``columns`` wide, without ``NO_COLOR``."""
    return on_a_terminal(*args, columns=columns, env=_env(**(env or {})))


def piped(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return pisub_cli(*args, env=_env(**env))


def launch_cli(*args: str) -> str:
    """``pisub run ... --json``: the new run's id."""
    proc = pisub_cli("run", *args, "--json", check=True)
    return str(json.loads(proc.stdout)["runId"])


def _rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.strip()]


# -- labels, task heads, cwd -----------------------------------------------------------------------


def test_a_label_task_and_cwd_are_shown_by_list_status_and_fleet(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("quick", python="print('done')")
    make_agent("sleepy", command="sleep", args=["600"])
    user_home = tmp_path / "user"
    project = user_home / "src" / "proj"
    project.mkdir(parents=True)
    env = {"HOME": str(user_home)}
    out = pisub_cli(
        "run",
        "--agent",
        "quick",
        "--label",
        "fix login",
        "--cwd",
        str(project),
        "--json",
        "Summarise the open issues\nand more detail on a second line",
        check=True,
        env=_env(**env),
    )
    started = json.loads(out.stdout)
    assert started["label"] == "fix login"
    done = pisub.Run(started["runId"])
    done.wait(timeout=30)
    live = pisub.launch("sleepy", "wait for the deploy", label="deploy watch")
    try:
        listed = piped("list", **env).stdout
        assert "LABEL" in listed and "TASK" in listed and "CWD" in listed
        row = next(line for line in listed.splitlines() if line.startswith(done.id[:8]))
        assert "fix login" in row and "~/src/proj" in row and "Summarise the open issues" in row
        assert "second line" not in listed  # the head of the task: its first line
        status = piped("status", done.id, **env).stdout
        assert "label    fix login" in status and "task     Summarise the open issues" in status
        assert "cwd      ~/src/proj" in status
        fleet = piped("fleet", **env).stdout
        assert "deploy watch" in fleet and "wait for the deploy" in fleet and done.id[:8] not in fleet
        as_json = [json.loads(line) for line in piped("list", "--json").stdout.splitlines()]
        mine = next(row for row in as_json if row["runId"] == done.id)
        assert (mine["label"], mine["task"], mine["cwd"]) == (
            "fix login",
            "Summarise the open issues",
            str(project),
        )
        fleet_json = [json.loads(line) for line in piped("fleet", "--json").stdout.splitlines()]
        assert [(r["label"], r["task"]) for r in fleet_json] == [("deploy watch", "wait for the deploy")]
        assert json.loads(piped("status", live.id, "--json").stdout)["label"] == "deploy watch"
    finally:
        live.stop()


def test_a_label_is_found_with_an_at_and_a_shared_one_is_ambiguous(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("quick", python="print('done')")
    one = launch_cli("--agent", "quick", "--label", "cafe", "x")
    assert piped("path", "@cafe").stdout.strip().endswith(one)
    assert piped("status", "@cafe").stdout.startswith(f"run      {one}")
    launch_cli("--agent", "quick", "--label", "cafe", "y")
    both = piped("status", "@cafe")
    assert both.returncode == 1 and "[AMBIGUOUS_RUN]" in both.stderr
    assert len(both.stderr.splitlines()) == 1 and one in both.stderr and "@cafe" in both.stderr
    missing = piped("status", "@nobody")
    assert missing.returncode == 1 and "[RUN_NOT_FOUND]" in missing.stderr
    blank = piped("status", "@\u200b")
    assert blank.returncode == 1 and "[INVALID_INPUT]" in blank.stderr
    assert "invisible character (U+200B)" in blank.stderr
    word = piped("status", "mylabel")
    assert "[INVALID_INPUT]" in word.stderr and "@mylabel" in word.stderr


@pytest.mark.parametrize(
    ("label", "why"),
    [
        ("a\x1b[31mred", "control character"),
        ("two\nlines", "control character"),
        ("x" * 300, "at most 80"),
        ("   ", "empty"),
        ("\u202eevil", "control character"),
        (" padded", "space"),
        ("\u200b", "invisible character (U+200B)"),  # attack 1, finding 13: it showed blank
        ("fix\u200blogin", "invisible character (U+200B)"),  # would pass for "fixlogin"
        ("\ufeff\u2060", "invisible character (U+FEFF)"),
        ("\u0301\u0301", "shows nothing (U+0301 U+0301)"),  # combining marks alone
        ("\ue000", "shows nothing (U+E000)"),  # private use
    ],
)
def test_a_hostile_label_is_refused_and_nothing_starts(
    home: Path, make_agent: AgentMaker, label: str, why: str
) -> None:
    make_agent("quick", python="print('done')")
    proc = pisub_cli("run", "--agent", "quick", "--label", label, "x")
    assert proc.returncode == 1 and "[INVALID_INPUT]" in proc.stderr and why in proc.stderr
    assert proc.stderr.startswith("pisub: label: ") and len(proc.stderr.splitlines()) == 1
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
    assert not (home / "runs").exists() or not os.listdir(home / "runs")


def test_the_api_takes_a_label_for_a_run_and_a_workflow(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x", label="api run")
    flow = pisub.launch_parallel([{"agent": "quick", "task": "a"}], label="api flow")
    assert run.manifest().label == "api run" and run.status().label == "api run"
    assert flow.manifest().label == "api flow" and flow.status().label == "api flow"
    with pytest.raises(InvalidInput, match="label: must be text"):
        pisub.launch("quick", "x", label=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=r"^label: holds an invisible character \(U\+200B\)"):
        pisub.launch("quick", "x", label="\u200b")
    with pytest.raises(InvalidInput, match=r"^label: shows nothing"):
        pisub.launch_parallel([{"agent": "quick", "task": "a"}], label="\u0301")
    flow.wait(timeout=60)


def test_a_task_with_escape_sequences_is_shown_escaped_in_list(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    pisub.launch("quick", "\x1b]0;pwned\x07 \x1b[31mred \u202eevil").wait(timeout=30)
    for code, screen in [terminal("list", columns=200), (0, piped("list").stdout)]:
        assert code == 0
        assert "\x1b]" not in screen and "\x1b[31m" not in screen and "\u202e" not in screen
        assert "\\x1b]0;pwned\\x07" in screen and "\\u202eevil" in screen


def test_list_fits_80_columns_and_cuts_the_task(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    long_task = "refactor the whole authentication module " * 5
    pisub.launch("quick", long_task, label="a fairly long label here").wait(timeout=30)
    code, screen = terminal("list", columns=80)
    assert code == 0
    lines = [line.replace(GREEN, "").replace(RESET, "") for line in _rows(screen)]
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines), lines
    assert lines[1].endswith("…") and "refactor the" in lines[1]
    wide = piped("list").stdout  # a pipe gets every character
    assert long_task[:119] + "…" in wide  # the status keeps 120 characters of the task
    pisub.launch("quick", "修复登录页面的错误并添加测试用例 " * 4).wait(timeout=30)
    _, screen = terminal("list", columns=80)
    lines = [line.replace(GREEN, "").replace(RESET, "") for line in _rows(screen)]
    assert len(lines) == 3 and all(columns_of(line) <= 80 for line in lines), lines
    assert lines[2].endswith("…") and "修复登录" in lines[2]


# -- status without RUN ----------------------------------------------------------------------------


def test_status_without_run_lists_the_recent_runs_newest_first(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", command="true")
    empty = piped("status")
    assert empty.returncode == 0 and "no runs" in empty.stdout and "pisub run" in empty.stdout
    ids = [pisub.launch("quick", f"task number {n}").id for n in range(22)]
    wait_for(lambda: all(pisub.Run(i).status().state.is_terminal for i in ids), timeout=60)
    proc = piped("status")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split()[0] for line in _rows(proc.stdout)[1:] if not line.startswith("the ")]
    by_start = sorted(ids, key=lambda i: pisub.Run(i).status().started_at, reverse=True)
    assert rows == [i[:8] for i in by_start[:20]]
    assert "the 20 newest of 22 runs" in proc.stdout and "pisub list" in proc.stdout
    as_json = [json.loads(line)["runId"] for line in piped("status", "--json").stdout.splitlines()]
    assert as_json == by_start[:20]
    refused = piped("status", "--view", "fleet")
    assert refused.returncode == 1 and "give RUN" in refused.stderr


# -- short ids -------------------------------------------------------------------------------------


def _twin(home: Path, run: pisub.Run) -> str:
    """A copy of ``run``'s directory under an id sharing its first 4 characters (a run made
    another way could share them: 1 in 65536 per pair)."""
    rest = "f" if run.id[4] != "f" else "e"
    twin = run.id[:4] + rest + run.id[5:]
    shutil.copytree(run.dir, home / "runs" / twin, symlinks=True)
    status = decode((home / "runs" / twin / "status.json").read_bytes(), Status, "status")
    status.run_id = twin
    (home / "runs" / twin / "status.json").write_bytes(encode_pretty(status))
    return twin


def test_a_4_character_prefix_names_a_run_and_an_ambiguous_one_lists_them(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x", label="first")
    run.wait(timeout=30)
    assert piped("path", run.id[:4]).stdout.strip() == str(run.dir)
    assert piped("status", run.id[:4].upper()).returncode == 0
    short = piped("status", run.id[:3])
    assert short.returncode == 1 and "at least 4" in short.stderr and "[INVALID_INPUT]" in short.stderr
    twin = _twin(home, run)
    both = piped("status", run.id[:4])
    assert both.returncode == 1 and both.stderr.count("\n") == 1 and "[AMBIGUOUS_RUN]" in both.stderr
    assert run.id in both.stderr and twin in both.stderr and "quick, complete" in both.stderr
    assert piped("path", run.id[:5]).stdout.strip() == str(run.dir)


@pytest.mark.parametrize("ref", ["../x", "abc", "zzzz", "1234/..", "12\n34", "@", "/etc"])
def test_a_bad_run_reference_is_refused_in_one_line(home: Path, ref: str) -> None:
    proc = piped("status", ref)
    assert proc.returncode == 1 and "[INVALID_INPUT]" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_completion_offers_labels_after_an_at(home: Path, make_agent: AgentMaker) -> None:
    from pisub.api.completion import run_ids

    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x", label="nightly")
    assert run_ids("@nig") == ["@nightly"] and run_ids(run.id[:4]) == [run.id]
    run.wait(timeout=30)


# -- version ---------------------------------------------------------------------------------------


def test_version_as_an_option_and_a_command(home: Path) -> None:
    for args in (["--version"], ["version"]):
        proc = piped(*args)
        assert proc.returncode == 0 and proc.stdout == f"pisub {pisub.__version__}\n"
    shown = json.loads(piped("version", "--json").stdout)
    assert shown["version"] == pisub.__version__ and shown["python"]
    assert "--version" in piped("--help").stdout


# -- colour ----------------------------------------------------------------------------------------


def test_states_are_coloured_on_a_terminal_only(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    make_agent("broken", python="import sys; sys.exit(3)")
    ok = pisub.launch("quick", "fine \x1b[32mfake green")
    bad = pisub.launch("broken", "will fail")
    ok.wait(timeout=30)
    bad.wait(timeout=30)
    code, screen = terminal("list")
    assert code == 0 and f"{GREEN}complete{RESET}" in screen and f"{RED}failed{RESET}" in screen
    assert "\\x1b[32mfake" in screen  # a task's own sequence stays escaped
    code, screen = terminal("status", ok.id)
    assert f"{GREEN}complete{RESET}" in screen
    code, screen = terminal("status")
    assert f"{RED}failed{RESET}" in screen
    for args, env in [
        (("list",), {"NO_COLOR": "1"}),
        (("status", ok.id), {"NO_COLOR": "1"}),
        (("list", "--json"), {}),
        (("status", ok.id, "--json"), {}),
        (("list",), {"TERM": "dumb"}),
    ]:
        code, screen = terminal(*args, env=env)
        assert code == 0 and "\x1b[" not in screen, (args, env, screen)
    for args in (("list",), ("status", ok.id), ("status",), ("fleet",)):
        assert "\x1b" not in piped(*args).stdout
    make_agent("sleepy", command="sleep", args=["600"])
    live = pisub.launch("sleepy", "x")
    try:
        for args in (("fleet",), ("list",)):
            _, screen = terminal(*args)
            assert "\x1b[36mrunning\x1b[0m" in screen, screen
        assert "\x1b" not in piped("fleet").stdout
    finally:
        live.stop()


def test_doctor_colours_its_checks_on_a_terminal_only(home: Path) -> None:
    _, screen = terminal("doctor")
    assert (GREEN + "ok" + RESET) in screen
    assert (GREEN + "healthy" + RESET in screen) or (RED + "problems found" + RESET in screen)
    assert "\x1b[" not in piped("doctor").stdout
    _, screen = terminal("doctor", env={"NO_COLOR": "1"})
    assert "\x1b[" not in screen


def test_a_plain_list_into_a_pipe_does_not_import_rich(home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pisub", "list"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=True,
    )
    assert " rich" not in proc.stderr


def test_an_unknown_state_is_shown_uncoloured() -> None:
    from pisub.cli.render import paint

    assert paint("queued", "queued", True) == "\x1b[36mqueued\x1b[0m"
    assert paint("later", "some-newer-state", True) == "later"
    assert paint("complete", "complete", False) == "complete"


# -- logs --tail / --stderr ------------------------------------------------------------------------

PRINTER = (
    "import sys\n"
    "for n in range(10):\n"
    "    print(f'out {n}', flush=True)\n"
    "    print(f'err {n}', file=sys.stderr, flush=True)\n"
)


def test_logs_tail_and_stderr(home: Path, make_agent: AgentMaker) -> None:
    make_agent("printer", python=PRINTER)
    run = pisub.launch("printer", "x")
    run.wait(timeout=30)
    assert piped("logs", run.id, "-n", "3").stdout == "out 7\nout 8\nout 9\n"
    assert piped("logs", run.id, "--tail", "0").stdout == ""
    assert piped("logs", run.id, "--tail", "99").stdout.count("\n") == 10
    assert piped("logs", run.id, "--stderr", "-n", "2").stdout == "err 8\nerr 9\n"
    assert "err 0" in piped("logs", run.id, "--stderr").stdout
    negative = piped("logs", run.id, "-n", "-1")
    assert negative.returncode == 2
    quiet = pisub.launch("printer", "x", artifacts=False)
    quiet.wait(timeout=30)
    none = piped("logs", quiet.id, "--stderr")
    assert none.returncode == 1 and "--no-artifacts" in none.stderr and "[INVALID_INPUT]" in none.stderr


def test_logs_tail_then_follow_prints_what_comes(home: Path, make_agent: AgentMaker) -> None:
    make_agent(
        "slow",
        python="import time\nfor n in range(6):\n    print(f'line {n}', flush=True)\n    time.sleep(0.3)\n",
    )
    run = pisub.launch("slow", "x")
    wait_for(lambda: b"line 2" in (run.dir / "output-0.log").read_bytes(), timeout=20)
    proc = piped("logs", run.id, "-n", "1", "-f")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[-1] == "line 5" and "line 0" not in lines and len(lines) <= 4, lines


def test_logs_of_a_workflow_tail_and_stderr(home: Path, make_agent: AgentMaker) -> None:
    make_agent("printer", python=PRINTER)
    flow = pisub.launch_parallel([{"key": "a", "agent": "printer", "task": "x"}])
    flow.wait(timeout=60)
    assert piped("logs", flow.id, "-n", "2").stdout == "[a] out 8\n[a] out 9\n"
    refused = piped("logs", flow.id, "--stderr")
    assert refused.returncode == 1 and "--child" in refused.stderr
    assert piped("logs", flow.id, "--child", "a", "--stderr", "-n", "1").stdout == "err 9\n"


# -- gc --------------------------------------------------------------------------------------------


def test_gc_says_why_it_kept_runs(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", command="true")
    make_agent("sleepy", command="sleep", args=["600"])
    for _ in range(2):
        pisub.launch("quick", "x").wait(timeout=30)
    said = piped("gc", "--older-than", "7d").stdout
    assert said.endswith("kept 2 run(s) that ended less than 7d ago\n") and "live" not in said
    live = pisub.launch("sleepy", "x")
    try:
        said = piped("gc", "--older-than", "0s", "--json").stdout
        shown = json.loads(said)
        assert shown["keptLive"] == [live.id] and len(shown["removed"]) == 2 and shown["keptRecent"] == []
        assert piped("gc", "--older-than", "1h").stdout.endswith("kept 1 live run(s)\n")
    finally:
        live.stop()
    wait_for(lambda: live.status().state.is_terminal, timeout=30)
    said = piped("gc", "--older-than", "3600").stdout
    assert said.endswith("kept 1 run(s) that ended less than 3600s ago\n")


@pytest.mark.pi_versions
def test_a_labelled_pi_run_is_told_apart_and_gc_never_calls_it_live(pi_home: Path) -> None:
    run_id = launch_cli("--agent", "pi", "--label", "pi smoke", "say hello\nthen stop")
    assert piped("wait", "@pi smoke").returncode == 0
    status = piped("status", run_id[:4]).stdout
    assert "label    pi smoke" in status and "task     say hello" in status
    assert piped("logs", "@pi smoke", "-n", "1").stdout.strip()
    shown = json.loads(piped("gc", "--json").stdout)
    assert shown["keptLive"] == [] and shown["keptRecent"] == [run_id]
    assert piped("gc").stdout.endswith("kept 1 run(s) that ended less than 30d ago\n")
    resumed = json.loads(piped("resume", "@pi smoke", "and again", "--json").stdout)
    assert json.loads(piped("status", resumed["runId"], "--json").stdout)["label"] is None
    assert piped("path", "@pi smoke").stdout.strip().endswith(run_id)  # still the one run
    assert piped("wait", resumed["runId"]).returncode == 0


def test_a_resumed_workflow_starts_without_its_label(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleepy", command="sleep", args=["600"])
    flow = pisub.launch_parallel([{"key": "s", "agent": "sleepy", "task": "x"}], label="nightly")
    wait_for(lambda: [s.status for s in flow.status().steps] == ["running"], timeout=30)
    assert pisub_cli("interrupt", "@nightly").returncode == 0
    assert flow.wait(timeout=60).state == "paused"
    again = json.loads(piped("resume", "@nightly", "--json").stdout)
    assert json.loads(piped("status", again["runId"], "--json").stdout)["label"] is None
    assert piped("path", "@nightly").stdout.strip() == str(flow.dir)
    assert piped("stop", again["runId"]).returncode == 0
    wait_for(lambda: pisub.Run(again["runId"]).status().state.is_terminal, timeout=30)
