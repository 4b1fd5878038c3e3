"""Every bad input gets one clear line, a non-zero exit, and leaves nothing running."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import AgentMaker, pisub_cli, wait_no_processes


def _no_runs(home: Path) -> None:
    runs = home / "runs"
    assert not runs.exists() or not os.listdir(runs)
    # nothing stays: a process that names the home (once seen in CI, never reproduced) must go
    wait_no_processes(home, timeout=10)


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["run", "--agent", "nope", "task"], "UNKNOWN_AGENT", "Unknown agent: nope. Available agents: "),
        (
            ["run", "--agent", "ghost", "task"],
            "SUBAGENT_FAILED",
            "command not found on PATH: no-such-cmd-xyz",
        ),
        (["run", "--agent", "echo", ""], "INVALID_INPUT", "the task is empty"),
        (["run", "--agent", "echo", "   "], "INVALID_INPUT", "the task is empty"),
        (["run", "--agent", "echo", "--timeout", "0", "x"], "INVALID_INPUT", "timeout must be a positive"),
        (["run", "--agent", "echo", "--cwd", "/does/not/exist", "x"], "INVALID_INPUT", "does not exist"),
    ],
)
def test_a_bad_launch_fails_in_one_line_with_its_code(
    home: Path, make_agent: AgentMaker, args: list[str], code: str, text: str
) -> None:
    make_agent("echo", command="cat")
    make_agent("ghost", command="no-such-cmd-xyz")
    proc = pisub_cli(*args)
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and code in lines[0] and text in lines[0], proc.stderr
    _no_runs(home)


@pytest.mark.parametrize("ref", ["../x", "/abs", "", "abc", "../../etc/passwd", "0123456g", "a" * 37])
@pytest.mark.parametrize("command", ["status", "wait", "result", "logs", "path"])
def test_bad_run_ids_refused_before_disk(home: Path, ref: str, command: str) -> None:
    proc = pisub_cli(command, ref)
    assert proc.returncode == 1
    assert "INVALID_INPUT" in proc.stderr, proc.stderr
    assert not home.exists(), "the home was touched before the id was checked"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_non_finite_limits_refused(home: Path, make_agent: AgentMaker, value: str) -> None:
    make_agent("echo", command="cat")
    for option in ("--timeout", "--idle-timeout"):
        proc = pisub_cli("run", "--agent", "echo", option, value, "x")
        assert proc.returncode == 1 and "INVALID_INPUT" in proc.stderr, proc.stderr
    _no_runs(home)


def test_child_that_cannot_start_leaves_a_failed_run(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    script = tmp_path / "broken-interpreter"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    make_agent("broken", command=str(script))
    proc = pisub_cli("run", "--agent", "broken", "x")
    assert proc.returncode == 1
    assert "cannot start" in proc.stderr and "SUBAGENT_FAILED" in proc.stderr
    (run_id,) = os.listdir(home / "runs")
    raw = (home / "runs" / run_id / "status.json").read_text()
    assert '"state": "failed"' in raw, "the runner itself marks a failed start"
    wait_no_processes(home, timeout=10)


@pytest.mark.root  # chattr +i needs CAP_LINUX_IMMUTABLE
def test_unwritable_runs_dir_is_one_line(home: Path, make_agent: AgentMaker) -> None:
    make_agent("echo", command="cat")
    (home / "runs").mkdir(mode=0o700)
    if subprocess.run(["chattr", "+i", str(home / "runs")], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        proc = pisub_cli("run", "--agent", "echo", "x")
    finally:
        subprocess.run(["chattr", "-i", str(home / "runs")], check=True)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "HOME_UNUSABLE" in lines[0], proc.stderr
    assert os.listdir(home / "runs") == []


def test_unknown_and_ambiguous_prefix(home: Path) -> None:
    runs = home / "runs"
    runs.mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    for suffix in ("1", "2"):
        (runs / f"aaaaaaaa-0000-4000-8000-00000000000{suffix}").mkdir()
    proc = pisub_cli("status", "aaaaaaaa")
    assert proc.returncode == 1 and "AMBIGUOUS_RUN" in proc.stderr
    assert "aaaaaaaa-0000-4000-8000-000000000001" in proc.stderr
    assert "aaaaaaaa-0000-4000-8000-000000000002" in proc.stderr
    missing = pisub_cli("status", "bbbbbbbb")
    assert missing.returncode == 1 and "RUN_NOT_FOUND" in missing.stderr


def test_an_unusable_home_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("PISUB_HOME", str(afile))
    proc = pisub_cli("list")
    assert proc.returncode == 1 and "HOME_UNUSABLE" in proc.stderr and "not a directory" in proc.stderr
    monkeypatch.setenv("PISUB_HOME", str(tmp_path / "under-file" / "x"))
    (tmp_path / "under-file").write_text("")
    proc = pisub_cli("list")
    assert proc.returncode == 1 and "HOME_UNUSABLE" in proc.stderr


@pytest.mark.root  # only root can give a directory away
def test_a_home_of_another_user_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 12345, 12345)
    monkeypatch.setenv("PISUB_HOME", str(foreign))
    proc = pisub_cli("list")
    assert proc.returncode == 1 and "HOME_UNUSABLE" in proc.stderr and "uid 12345" in proc.stderr


def test_loose_home_is_tightened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    monkeypatch.setenv("PISUB_HOME", str(loose))
    proc = pisub_cli("list")
    assert proc.returncode == 0
    assert "tightened" in proc.stderr
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700


def test_bad_agent_file_is_reported(home: Path) -> None:
    agents = home / "agents"
    agents.mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    (agents / "typo.md").write_text("---\nname: typo\ncommand: cat\nargz: [1]\n---\n")
    proc = pisub_cli("run", "--agent", "typo", "x")
    assert proc.returncode == 1 and "UNKNOWN_AGENT" in proc.stderr
    assert "typo.md" in proc.stderr and "argz" in proc.stderr
    listing = pisub_cli("agents", "list")
    assert "argz" in listing.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000 (CI runs this as pisub-ci)")
@pytest.mark.parametrize("option", ["--parallel", "--chain", "--lanes", "--workflow"])
def test_an_unreadable_file_option_is_one_line_with_a_code(home: Path, tmp_path: Path, option: str) -> None:
    """Outside attack: click's own check printed its three-line usage error, with no code."""
    unreadable = tmp_path / "file.json"
    unreadable.write_text("[]")
    unreadable.chmod(0)
    proc = pisub_cli("run", option, str(unreadable))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].endswith("[INVALID_INPUT]"), proc.stderr
