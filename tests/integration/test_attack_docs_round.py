"""What the last outside attack of issue 29 (from the docs only) found in the CLI: a workflow
child with no step yet crashed `--child` (INTERNAL_ERROR); `--json` with nothing selected printed
words; one usage line lacked its full stop; `pisub home` escaped a non-UTF-8 home it could print;
an undecodable label was called a control character."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pisub
from tests.conftest import pisub_cli
from tests.helpers import one_line_error


def test_a_child_of_a_workflow_that_started_none_is_named_not_a_crash(home: Path) -> None:
    run = pisub.launch_workflow(text="return 1")
    assert run.wait(timeout=60).state == "complete"
    for command in ("status", "logs", "result", "wait"):
        proc = pisub_cli(command, run.id, "--child", "0")
        line = one_line_error(proc, "INVALID_INPUT")
        assert f"child 0 of run {run.id} has no run (it never started)" in line, line
    live = pisub.launch_workflow(text="while (true) {}")
    try:
        proc = pisub_cli("status", live.id, "--child", "0")
        assert "has no run (it has not started yet)" in one_line_error(proc, "INVALID_INPUT")
    finally:
        live.stop()
        live.wait(timeout=60)


def test_a_json_selection_of_no_run_prints_no_line(home: Path) -> None:
    for argv in (("stop", "--all"), ("interrupt", "--agent", "nobody"), ("stop", "--label", "none")):
        proc = pisub_cli(*argv, "--json")
        assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", (argv, proc)
    words = pisub_cli("stop", "--all")
    assert words.returncode == 0 and words.stdout == "no live run\n"


def test_every_usage_line_ends_its_sentence_before_the_hint(home: Path) -> None:
    for argv, path in ((("list", "extra"), "pisub list"), (("gc", "a"), "pisub gc")):
        proc = pisub_cli(*argv)
        assert proc.returncode == 2, proc
        assert proc.stderr.endswith(f"(a). Try '{path} --help'. [USAGE]\n".replace("(a)", f"({argv[1]})")), (
            proc.stderr
        )


def test_an_undecodable_label_is_called_so(home: Path) -> None:
    env = {**os.environb, b"PISUB_HOME": os.fsencode(home)}
    for argv in ([b"status", b"@\xff"], [b"run", b"--agent", b"coder", b"--label", b"a\xff", b"x"]):
        proc = subprocess.run(
            [sys.executable.encode(), b"-m", b"pisub", *argv], env=env, capture_output=True, check=False
        )
        line = proc.stderr.decode()
        assert (
            proc.returncode == 1 and "is not valid UTF-8 text" in line and line.endswith("[INVALID_INPUT]\n")
        ), line


def test_a_home_whose_path_is_not_utf8_is_refused_by_every_command_in_one_line(tmp_path: Path) -> None:
    """A run's files are UTF-8 JSON that name files in the home (a session, a journal, an agent
    file, a gate's evidence): such a home cannot hold runs whole. An outside attack saw single runs
    in it crash their runner after the child had completed, and a schedule accepted that could
    never fire: every command refuses it, whether it exists or not, and makes nothing."""
    raw = os.fsencode(tmp_path) + b"/x\xffhome"
    env = {**os.environb, b"PISUB_HOME": raw}
    for argv in (
        [b"home"],
        [b"doctor"],
        [b"list"],
        [b"run", b"--agent", b"hello", b"hi"],
        [b"run", b"--task", b"hello=a", b"--task", b"hello=b"],
        [b"schedule", b"create", b"--workflow-script", b"return 1", b"--at", b"+1h"],
        [b"status", b"0123abcd"],
    ):
        proc = subprocess.run(
            [sys.executable.encode(), b"-m", b"pisub", *argv], env=env, capture_output=True, check=False
        )
        assert proc.returncode == 1 and proc.stdout == b"", (argv, proc)
        assert proc.stderr.decode() == (
            f"pisub: the pisub home path {tmp_path}/x\\udcffhome is not valid UTF-8, and a run's files "
            "(UTF-8 JSON) name files in it: set PISUB_HOME to a path that is UTF-8 [HOME_UNUSABLE]\n"
        ), argv
    assert not os.path.lexists(raw)


def test_every_json_input_from_outside_refuses_a_key_given_twice(home: Path, tmp_path: Path) -> None:
    """A tasks or lanes file, ``--args``, ``--mission``: strict input, which kept the last of a
    key given twice without a word (which one was meant?)."""
    tasks = tmp_path / "tasks.json"
    tasks.write_text('[{"agent":"hello","task":"a","task":"b"}]')
    lanes = tmp_path / "lanes.json"
    lanes.write_text('{"lanes":[{"key":"a","key":"b","stages":[]}]}')
    for argv, line in (
        (("run", "--parallel", str(tasks)), f"{tasks}: `task` is given twice - at `$[0].task`"),
        (("run", "--chain", str(tasks)), f"{tasks}: `task` is given twice - at `$[0].task`"),
        (("run", "--lanes", str(lanes)), f"{lanes}: `key` is given twice - at `$.lanes[0].key`"),
        (
            ("run", "--workflow-script", "return args", "--args", '{"a":1,"a":2}'),
            "--args: `a` is given twice",
        ),
        (
            ("run", "--agent", "hello", "--mission", '{"title":"x","title":"y"}', "hi"),
            "--mission: `title` is",
        ),
    ):
        proc = pisub_cli(*argv)
        assert proc.returncode == 1 and proc.stderr.startswith(f"pisub: {line}"), (argv, proc.stderr)
        assert proc.stderr.endswith("[INVALID_INPUT]\n"), proc.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
