"""Regression tests for the outside attack on mission records (issue 28, findings F2-F17 of
``attack28-missions``): each reproduces the attack through the real CLI or API and checks
the fix (secrets redacted on the way out, no-op updates, bounded records and input, owner
checks, a clean git environment, a held lock that no longer stalls a listing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest

from pisub.api.client import launch
from pisub.api.missions import mission_attach_run, mission_create, mission_list, mission_next, mission_show
from pisub.errors import InvalidInput
from pisub.store.missions import MAX_OWN_BYTES, MissionStore, project_key
from pisub.store.paths import open_home
from tests.conftest import AgentMaker, pisub_cli

SESSION = "a123456789abcdef0123456789abcdef"
SK = "sk-ant-api03-" + "A" * 40
GH = "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij"


def _cli(
    *args: str, cwd: Path | None = None, stdin: IO[Any] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pisub", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        stdin=stdin,
        check=False,
    )


def _update(mid: str, update: object) -> subprocess.CompletedProcess[str]:
    """``pisub mission update MID --set -`` with ``update`` on stdin (an argv holds no megabyte)."""
    return subprocess.run(
        [sys.executable, "-m", "pisub", "mission", "update", mid, "--set", "-"],
        input=json.dumps(update),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line_error(proc: subprocess.CompletedProcess[str], code: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and f"[{code}]" in proc.stderr, proc.stderr


def _git_init(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    return path


def test_f2_secrets_in_mission_text_never_leave(home: Path) -> None:
    made = json.loads(
        pisub_cli(
            "mission",
            "create",
            "--title",
            f"deploy API_KEY={SK} now",
            "--goal",
            "--budget-tokens",
            "1000",
            "--session-key",
            SESSION,
            "--objective",
            f"token {GH}; PASSWORD=hunter2hunter2",
            "--label",
            f"MY_TOKEN={GH}",
            "--json",
            check=True,
        ).stdout
    )
    mid = made["id"]
    update = {
        "decisions": [{"title": f"use {SK}?"}],
        "receipts": [{"kind": "ci", "status": "ok", "url": f"https://user:{GH}@github.com/x?token={GH}"}],
        "artifacts": [{"kind": "log", "path": f"/tmp/API_KEY={SK}"}],
    }
    outs = [
        made,
        pisub_cli("mission", "update", mid, "--set", json.dumps(update), check=True).stdout,
        pisub_cli("mission", "show", mid, check=True).stdout,
        pisub_cli("mission", "show", mid, "--json", check=True).stdout,
        pisub_cli("mission", "list", check=True).stdout,
        pisub_cli("mission", "list", "--json", check=True).stdout,
    ]
    store = MissionStore(open_home(), made["project"])
    store.state(mid).set("nextAction", f"API_KEY={SK} {GH}")
    outs.append(pisub_cli("mission", "next", "--session-key", SESSION, "--json", check=True).stdout)
    text = json.dumps(outs)
    for secret in (SK, GH, "hunter2hunter2", "sk-ant-api03-AAAA"):
        assert secret not in text, secret
    assert "[REDACTED]" in outs[2] and "goal mission" in outs[2]
    notice = json.loads(outs[-1])
    assert notice["reason"] == "notice" and "[REDACTED]" in notice["notice"]
    # the record itself keeps what was given (private, 0600): nothing is lost
    record = home / "missions" / made["project"] / f"{mid}.json"
    assert SK in record.read_text() and oct(record.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("title", ["\u200b", "\u0301", "\ufeff", "\ue000", "a\u200bb"])
def test_f3_invisible_titles_are_refused(home: Path, title: str) -> None:
    _one_line_error(pisub_cli("mission", "create", "--title", title), "INVALID_INPUT")
    mid = pisub_cli("mission", "create", "--title", "seen", check=True).stdout.split()[0]
    proc = pisub_cli("mission", "update", mid, "--set", json.dumps({"title": title}))
    _one_line_error(proc, "INVALID_INPUT")
    assert "missionUpdate.title" in proc.stderr
    _one_line_error(pisub_cli("mission", "create", "--title", "t", "--label", title), "INVALID_INPUT")


def test_f4_an_update_that_changes_nothing_is_no_progress(home: Path) -> None:
    goal = mission_create(title="goal one", goal=True, budget_tokens=1000, session_key=SESSION)
    pisub_cli("mission", "update", goal.id, "--set", '{"decisions":[{"title":"pick db"}]}', check=True)
    first = mission_next(SESSION)
    assert first.reason == "notice" and first.notice is not None and "pick db" in first.notice
    assert mission_next(SESSION).reason == "no-progress"
    revision = mission_show(goal.id).mission.revision
    for same in (
        "{}",
        '{"title": null}',
        '{"title": "goal one"}',
        '{"decisions":[{"id":"d1","title":"pick db"}]}',
    ):
        pisub_cli("mission", "update", goal.id, "--set", same, check=True)
        assert mission_next(SESSION).reason == "no-progress", same
    assert mission_show(goal.id).mission.revision == revision
    pisub_cli("mission", "close", goal.id, "--status", "completed", check=True)
    revision = mission_show(goal.id).mission.revision
    pisub_cli("mission", "close", goal.id, "--status", "completed", check=True)
    assert mission_show(goal.id).mission.revision == revision


def test_f5_a_git_file_pointing_anywhere_does_not_pick_the_project(home: Path, tmp_path: Path) -> None:
    evil, gitdir = tmp_path / "evil", tmp_path / "evilgd"
    evil.mkdir()
    gitdir.mkdir()
    (evil / ".git").write_text(f"gitdir: {gitdir}\n")
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    for common in ("/", "../../../../../../../../etc"):
        (gitdir / "commondir").write_text(common + "\n")
        for path in (os.environ["PATH"], "/nonexistent"):
            proc = _cli("mission", "create", "--title", "evil", "--json", cwd=evil)
            assert proc.returncode == 0, proc.stderr
            made = json.loads(proc.stdout)
            assert made["project"] == project_key(evil) and made["cwd"] == str(evil.resolve()), path
            shown = json.loads(_cli("mission", "show", made["id"], "--json", cwd=evil).stdout)
            assert shown["projectRoot"] == str(evil.resolve())
    # a real repository still keys by its common dir
    repo = _git_init(tmp_path / "repo")
    (repo / "sub").mkdir()
    assert project_key(repo / "sub") == project_key(repo) != project_key(evil)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a store to another user")
def test_f7_a_store_of_another_user_is_refused_by_every_command(home: Path, tmp_path: Path) -> None:
    made = mission_create(title="a")
    goal = mission_create(title="g", goal=True, budget_tokens=10, session_key=SESSION)
    store = home / "missions" / made.project
    os.chown(store, 12345, 12345)
    for args in (
        ("create", "--title", "z2"),
        ("list",),
        ("show", made.id),
        ("update", made.id, "--set", "{}"),
        ("close", made.id, "--status", "completed"),
        ("resolve-decision", made.id, "d1", "--summary", "x"),
    ):
        proc = pisub_cli("mission", *args)
        _one_line_error(proc, "IO_ERROR")
        assert "belongs to uid 12345" in proc.stderr and "move it aside" in proc.stderr, args
    assert not any(
        p.name != "project.json" and made.id not in p.name and goal.id not in p.name for p in store.iterdir()
    )
    proc = pisub_cli("mission", "next", "--session-key", SESSION, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["reason"] == "no-goal-missions"
    proc = pisub_cli("mission", "list", "--scope", "global")
    assert proc.returncode == 0 and "belongs to uid 12345" in proc.stderr
    # a project store that is a symlink: the same, never followed
    os.chown(store, 0, 0)
    moved = store.with_name(store.name + "x")
    store.rename(moved)
    store.symlink_to(moved)
    proc = pisub_cli("mission", "show", made.id)
    _one_line_error(proc, "IO_ERROR")
    assert "never followed" in proc.stderr


def test_f16_open_mission_dirs_are_tightened(home: Path) -> None:
    made = mission_create(title="a")
    store = home / "missions" / made.project
    os.chmod(home / "missions", 0o777)
    os.chmod(store, 0o777)
    proc = pisub_cli("mission", "list", check=True)
    assert "tightened permissions" in proc.stderr
    assert oct((home / "missions").stat().st_mode & 0o777) == "0o700"
    assert oct(store.stat().st_mode & 0o777) == "0o700"


def test_f8_negative_usage_never_cancels_the_budget(home: Path, make_agent: AgentMaker) -> None:
    make_agent("echo", python="import sys; print(sys.stdin.read())")
    runs = []
    for usage in ({"input": 600, "output": 500}, {"input": -1000000, "output": 0}):
        run = launch("echo", "x")
        assert run.wait(timeout=120).state == "complete"
        path = home / "runs" / run.id / "result.json"
        data = json.loads(path.read_text())
        for single in data["details"]["results"]:
            single["usage"].update(usage)
        path.write_text(json.dumps(data))
        runs.append(run.id)
    goal = mission_create(title="b", goal=True, budget_tokens=1000, session_key=SESSION)
    for rid in runs:
        mission_attach_run(goal.id, rid)
    shown = mission_show(goal.id).mission
    assert shown.usage.tokens == 1100, shown.usage
    assert mission_next(SESSION).reason == "budget-exhausted"


def test_f9_a_record_cannot_outgrow_the_reader(home: Path, tmp_path: Path) -> None:
    mid = pisub_cli("mission", "create", "--title", "bloat", check=True).stdout.split()[0]
    refused = None
    for j in range(4):
        update = {"artifacts": [{"kind": f"k{j}", "path": f"{i}" + "x" * 4000} for i in range(50)]}
        proc = _update(mid, update)
        if proc.returncode != 0:
            refused = proc
            break
    assert refused is not None
    _one_line_error(refused, "INVALID_INPUT")
    assert str(MAX_OWN_BYTES) in refused.stderr
    record = next((home / "missions").glob(f"*/{mid}.json"))
    assert record.stat().st_size < 1024 * 1024
    proc = pisub_cli("mission", "show", mid, check=True)
    # counts are bounded, refused rather than silently dropped
    small = pisub_cli("mission", "create", "--title", "many", check=True).stdout.split()[0]
    arts = [{"kind": "k", "path": f"p{i}"} for i in range(200)]
    assert _update(small, {"artifacts": arts}).returncode == 0
    proc = pisub_cli("mission", "update", small, "--set", '{"artifacts":[{"kind":"k","path":"one more"}]}')
    _one_line_error(proc, "INVALID_INPUT")
    assert "at most 200" in proc.stderr
    # a record made too big elsewhere (1.3 MB, as the old limits allowed) is still read and changed
    data = json.loads(record.read_text())
    data["artifacts"] = [{"kind": "k", "path": f"{i}" + "x" * 4000} for i in range(200)]
    data["receipts"] = [
        {"kind": "ci", "status": "s", "url": f"https://x.y/{i}" + "a" * 2000} for i in range(100)
    ]
    data["decisions"] = [
        {"id": f"k{i}", "title": "t" * 200, "resolution": "r" * 2000, "status": "resolved"}
        for i in range(100)
    ]
    record.write_text(json.dumps(data))
    assert record.stat().st_size > 1024 * 1024
    pisub_cli("mission", "show", mid, check=True)
    pisub_cli("mission", "close", mid, "--status", "completed", check=True)
    # one beyond the read limit is quarantined with its reason, never bricks the listing
    with open(record, "ab") as fh:
        fh.truncate(5 * 1024 * 1024)
    proc = pisub_cli("mission", "list", check=True)
    assert "moved to" in proc.stderr
    moved = list(record.parent.glob(f".quarantine/*-{mid}.json"))
    assert len(moved) == 1 and moved[0].with_name(moved[0].name + ".reason").read_text().strip()


def test_f10_one_unreadable_state_does_not_silence_the_session(home: Path) -> None:
    bad = mission_create(title="bad first", goal=True, budget_tokens=100, session_key=SESSION)
    state_dir = home / "missions" / bad.project / "state"
    state_dir.mkdir(mode=0o700, exist_ok=True)
    (state_dir / f"{bad.id}.json").write_text('{"v":1,"values":{"x":"' + "y" * 300000 + '"}}')
    good = mission_create(title="good second", goal=True, budget_tokens=100, session_key=SESSION)
    pisub_cli("mission", "update", good.id, "--set", '{"decisions":[{"title":"pick"}]}', check=True)
    proc = pisub_cli("mission", "next", "--session-key", SESSION, "--json")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["missionId"] == good.id and answer["reason"] == "notice"
    assert f"skipped mission {bad.id}" in proc.stderr and "Traceback" not in proc.stderr
    shown = json.loads(pisub_cli("mission", "show", bad.id, "--json", check=True).stdout)
    assert shown["nextStep"].startswith("repair its state")


def test_f11_session_key_errors_are_readable(home: Path) -> None:
    for args in (("create", "--title", "x", "--session-key", "123"), ("next", "--session-key", "bad")):
        proc = pisub_cli("mission", *args)
        _one_line_error(proc, "INVALID_INPUT")
        assert "[REDACTED]" not in proc.stderr and "32 lower-case hex digits" in proc.stderr


def test_f12_a_record_in_the_wrong_store_is_skipped(home: Path, tmp_path: Path) -> None:
    made = mission_create(title="dup-origin", cwd=_git_init(tmp_path / "a"))
    other = tmp_path / "b"
    other.mkdir()
    mission_create(title="b's own", cwd=other)
    copy = home / "missions" / project_key(other) / f"{made.id}.json"
    data = json.loads((home / "missions" / made.project / f"{made.id}.json").read_text())
    data["title"] = "dup-copy"
    copy.write_text(json.dumps(data))
    os.chmod(copy, 0o600)
    listing = mission_list(cwd=other)
    assert made.id not in [m.id for m in listing.missions]
    assert any("names project" in s for s in listing.skipped)
    assert mission_show(made.id, cwd=tmp_path / "a").mission.title == "dup-origin"


def test_f14_an_endless_update_on_stdin_is_refused(home: Path) -> None:
    mid = pisub_cli("mission", "create", "--title", "t", check=True).stdout.split()[0]
    started = time.monotonic()
    with open("/dev/zero", "rb") as zero:
        proc = _cli("mission", "update", mid, "--set", "-", stdin=zero, timeout=60)
    _one_line_error(proc, "INVALID_INPUT")
    assert "more than" in proc.stderr and time.monotonic() - started < 30
    with pytest.raises(InvalidInput, match="more than"):
        from pisub.api.missions import mission_update

        mission_update(mid, '{"objective":"' + "x" * (5 * 1024 * 1024) + '"}')


def test_f15_git_variables_do_not_pick_the_project(home: Path, tmp_path: Path) -> None:
    a, b = _git_init(tmp_path / "repoA"), _git_init(tmp_path / "repoB")
    bare = tmp_path / "other.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, timeout=30)
    for extra in ({"GIT_DIR": str(bare)}, {"GIT_COMMON_DIR": str(bare)}, {"GIT_DIR": str(b / ".git")}):
        for path in (os.environ["PATH"], "/nonexistent"):
            env = {**os.environ, **extra, "PATH": path}
            proc = subprocess.run(
                [sys.executable, "-m", "pisub", "mission", "create", "--title", "t", "--json"],
                capture_output=True,
                text=True,
                cwd=a,
                env=env,
                timeout=60,
                check=False,
            )
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["project"] == project_key(a), (extra, path)


def test_f17_a_held_lock_does_not_stall_or_hide_a_listing(home: Path) -> None:
    made = mission_create(title="live1", goal=True, budget_tokens=100, session_key=SESSION)
    record = home / "missions" / made.project / f"{made.id}.json"
    data = json.loads(record.read_text())
    data["runs"] = [{"runId": "0" * 8 + "-0000-4000-8000-" + "0" * 12, "mode": "run", "status": "running"}]
    record.write_text(json.dumps(data))
    lock = record.with_suffix(".lock")
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"])
    try:
        from tests.conftest import wait_for

        def held() -> bool:
            return subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode != 0

        wait_for(held, timeout=10, what="the lock to be held")
        started = time.monotonic()
        proc = pisub_cli("mission", "list", "--json", timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert time.monotonic() - started < 15
        assert [m["id"] for m in json.loads(proc.stdout)] == [made.id]
        assert "not refreshed" in proc.stderr
        proc = pisub_cli("mission", "show", made.id, timeout=30)
        assert proc.returncode == 0 and "not refreshed" in proc.stderr
        # the goal notice (the pi extension asks on every idle turn): no 30 s stall, no failure
        started = time.monotonic()
        proc = pisub_cli("mission", "next", "--session-key", SESSION, "--json", timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["reason"] == "run-active" and time.monotonic() - started < 15
    finally:
        holder.kill()
        holder.wait()


def test_f6_a_cwd_pisub_cannot_use_names_the_fix(home: Path, tmp_path: Path) -> None:
    made = mission_create(title="findable")
    bad = os.path.join(os.fsencode(tmp_path), b"bad\xff")
    os.mkdir(bad)
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "mission", "list"],
        capture_output=True,
        text=True,
        cwd=bad,
        timeout=60,
        check=False,
    )
    _one_line_error(proc, "INVALID_INPUT")
    assert "--cwd" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "mission", "show", made.id],
        capture_output=True,
        text=True,
        cwd=bad,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and "findable" in proc.stdout, proc.stderr


def test_f6_a_cwd_too_deep_names_the_cwd_and_is_cut(home: Path, tmp_path: Path) -> None:
    made = mission_create(title="findable")
    deep = os.fsencode(_git_init(tmp_path / "repo"))
    fd = os.open(deep, os.O_RDONLY)
    try:
        for _ in range(25):  # deeper than PATH_MAX (4096)
            os.mkdir(b"d" * 200, dir_fd=fd)
            nxt = os.open(b"d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        for args, code in ((("list",), "INVALID_INPUT"), (("show", made.id), None)):
            proc = subprocess.run(
                [sys.executable, "-m", "pisub", "mission", *args],
                capture_output=True,
                text=True,
                pass_fds=(fd,),
                preexec_fn=lambda: os.fchdir(fd),
                timeout=60,
                check=False,
            )
            if code is None:
                assert proc.returncode == 0 and "findable" in proc.stdout, proc.stderr
                continue
            _one_line_error(proc, code)
            assert len(proc.stderr) < 400 and "PISUB_HOME" not in proc.stderr and "--cwd" in proc.stderr
    finally:
        os.close(fd)


def test_f13_a_closed_stdout_changes_nothing(home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "mission", "create", "--title", "closedout"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode != 0 and "[IO_ERROR]" in proc.stderr and "INTERNAL" not in proc.stderr
    assert "stdout is closed" in proc.stderr
    assert mission_list().missions == []
