"""Nothing outside pisub's own error tree escapes a command.

Every CLI command is run against a home where every file a command reads has been corrupted
in a different way: garbage, a FIFO, a symlink, a directory, deep nesting, wrong types, a
missing file, a symlinked run directory, a file where a folder belongs. Each command must
finish (no hang), never print a traceback, and report an error as exactly one line
``pisub: <message> [<CODE>]``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, pisub_cli

HANG = 20.0
DEEP = b"[" * 100_000 + b"]" * 100_000


def _clone(src: Path, runs: Path) -> Path:
    dest = runs / str(uuid.uuid4())
    shutil.copytree(src, dest, symlinks=True)
    return dest


def _corrupt(path: Path, how: str, tmp: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if how == "garbage":
        path.write_bytes(b"\x00\xff{not json")
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "symlink":
        (tmp / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp / "elsewhere.json")
    elif how == "directory":
        path.mkdir()
    elif how == "deep":
        path.write_bytes(DEEP)
    elif how == "wrong-types":
        path.write_text('{"v": "one", "runId": 5, "state": ["running"], "steps": {}}')
    elif how == "file":
        path.write_text("a file where a folder belongs")
    elif how != "missing":
        raise AssertionError(how)


@pytest.fixture
def corrupted_home(home: Path, make_agent: AgentMaker, tmp_path: Path) -> list[str]:
    """A home full of broken runs; returns their ids."""
    make_agent("quick", command="true")
    good = pisub.launch("quick", "x")
    good.wait(timeout=30)
    runs = home / "runs"
    (home / "worktrees").symlink_to(tmp_path)  # planted: never listed through
    broken: list[str] = []
    cases = [
        ("status.json", "garbage"),
        ("status.json", "fifo"),
        ("status.json", "symlink"),
        ("status.json", "directory"),
        ("status.json", "deep"),
        ("status.json", "wrong-types"),
        ("status.json", "missing"),
        ("manifest.json", "garbage"),
        ("manifest.json", "fifo"),
        ("manifest.json", "missing"),
        ("result.json", "fifo"),
        ("result.json", "deep"),
        ("output-0.log", "fifo"),
        ("runner.lock", "directory"),
        ("repair.lock", "fifo"),
        ("inbox/new", "file"),
        ("inbox", "missing"),
        ("outbox", "file"),
        ("events.jsonl", "fifo"),
    ]
    for name, how in cases:
        run_dir = _clone(good.dir, runs)
        _corrupt(run_dir / name, how, tmp_path)
        broken.append(run_dir.name)
    # A symlinked run directory, and a file named like a run.
    (runs / str(uuid.uuid4())).symlink_to(good.dir)
    (runs / str(uuid.uuid4())).write_text("not a run")
    agents = home / "agents"
    os.mkfifo(agents / "fifo.md")
    (agents / "dir.md").mkdir()
    (agents / "garbage.md").write_bytes(b"\xff\xfe---")
    (agents / "deep.md").write_text("---\nname: deep\nargs: " + "[" * 5000 + "]" * 5000 + "\n---\n")
    leases = home / "leases"
    leases.mkdir(mode=0o700, exist_ok=True)
    (leases / ("0" * 32 + ".json")).write_bytes(b"garbage")
    os.mkfifo(leases / ("1" * 32 + ".json"))
    (leases / ("1" * 32 + ".gen")).write_text("not a number")
    return [good.id, *broken]


def _run(*args: str) -> None:
    proc = pisub_cli(*args, timeout=HANG)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, (args, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    for line in lines:
        assert line.startswith("pisub: "), (args, proc.stderr)
    if proc.returncode == 1 and args[0] not in ("list", "doctor", "wait", "agents", "workflow"):
        assert len(lines) == 1 and lines[0].endswith("]"), (args, proc.stderr)


RUN_COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["status", "--view", "fleet"],
    ["status", "--view", "transcript"],
    ["status", "--child", "key"],
    ["stop", "--child", "key", "--wait", "0.5"],
    ["logs"],
    ["wait", "--timeout", "1"],
    ["result"],
    ["path"],
    ["steer", "--wait", "0.5"],
    ["follow-up", "--wait", "0.5"],
    ["interrupt", "--wait", "0.5"],
    ["stop", "--wait", "0.5"],
    ["resume"],
    ["lease", "break", "--force"],
    ["lane", "status"],
    ["lane", "record-supersession", "--by-lane", "nope", "--by", "x"],
    ["worktree", "apply"],
    ["worktree", "discard", "--force"],
]


def _run_all(calls: list[list[str]]) -> None:
    """Run the commands four at a time (each is a fresh process; most of the time is start-up)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(_run, *args) for args in calls]:
            future.result()


@pytest.mark.parametrize("part", range(3))  # three tests: xdist spreads the ~50 s of commands
def test_every_command_on_every_broken_run_fails_in_one_line(corrupted_home: list[str], part: int) -> None:
    calls = []
    for run_id in corrupted_home:
        for command in RUN_COMMANDS[part::3]:
            grouped = command[0] in ("lease", "lane", "worktree")
            args = [*command[:2], run_id, *command[2:]] if grouped else [command[0], run_id]
            if command[0] in ("steer", "follow-up", "resume"):
                args.append("a message")
            if not grouped:
                args += command[1:]
            calls.append(args)
    _run_all(calls)


def test_every_home_wide_command_survives_the_broken_home(corrupted_home: list[str]) -> None:
    for args in (
        ["list"],
        ["list", "--json"],
        ["list", "--state", "running"],
        ["doctor"],
        ["lease", "list"],
        ["lease", "list", "--json"],
        ["agents", "list"],
        ["agents", "list", "--json"],
        ["agents", "show", "fifo"],
        ["agents", "show", "deep"],
        ["run", "--agent", "garbage", "x"],
        ["gc", "--dry-run"],
        ["gc", "--older-than", "0s"],
        ["list"],
        ["list", "--all"],
        ["fleet"],
        ["fleet", "--json"],
        ["run", "--task", "garbage=x"],
        ["run", "--parallel", "/dev/null"],
        ["workflow", "validate", "/dev/zero"],
        ["workflow", "validate", "/nonexistent.py", "--json"],
        ["run", "--lanes", "/dev/zero"],
        ["run", "--lanes", "/nonexistent.json"],
        ["run", "--task", "garbage=x", "--isolation", "worktree"],
        ["children", "list"],
        ["children", "list", "--json", "--limit", "0"],
        ["worktree", "list"],
        ["worktree", "list", "--json"],
        ["worktree", "cleanup", "--plan"],
        ["worktree", "cleanup", "--apply", "--json"],
    ):
        _run(*args)


def test_the_workflow_apis_answer_wrong_types_and_odd_files_in_one_line(home: Path) -> None:
    from pisub.errors import InvalidInput

    # the attack: validate_workflow(cwd=5) raised a raw TypeError; bytes text was "empty";
    # /dev/zero was shown as "zero"; a file as cwd "does not exist"
    with pytest.raises(InvalidInput, match="cwd: give a path, not int"):
        pisub.validate_workflow(text="return 1", cwd=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="text: give the script as a string, not bytes"):
        pisub.validate_workflow(text=b"return 1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="must be text, not bytes"):
        pisub.launch_workflow(text=b"return 1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="working directory /etc/passwd is not a directory"):
        pisub.launch_resource("run-ci", {}, cwd="/etc/passwd")
    proc = pisub_cli("workflow", "validate", "/dev/zero")
    assert proc.returncode == 1 and proc.stderr.startswith("pisub: /dev/zero: a workflow script is"), proc
