"""What an outside attack found after the hardening (issue 10's closing attack), one test each.

The attacker knew pisub only from its documentation; each test below failed before its fix.
(Root's ``stop.sh`` following a planted symlink is in ``test_nonroot.py``.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.store.leases import acquire, release
from pisub.store.mailbox import new_request_id
from tests.conftest import AgentMaker, pisub_cli, wait_for

TOKEN = "ghp_" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _one_line(proc: subprocess.CompletedProcess[str], code: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pisub: ") and lines[0].endswith(f"[{code}]"), proc.stderr


def test_a_secret_straddling_the_kept_tail_is_redacted_whole(home: Path, make_agent: AgentMaker) -> None:
    """The result keeps the last 64 KiB of output, cut after redaction: a token whose prefix
    falls before the cut must not leak as a headless fragment; nor one cut by the 500-character
    limit of ``recentOutput``."""
    body = TOKEN[len("ghp_") :]
    script = f"import sys; print('x' * 490 + ' ' + {TOKEN!r}); sys.stdout.write({TOKEN!r} + 'w' * 65500)"
    make_agent("leak", command="/usr/bin/env", args=["python3", "-c", script])
    run = pisub.launch("leak", "x")
    result = run.wait(timeout=30)
    assert body[:20] not in json.dumps(pisub_cli("result", run.id, "--json").stdout)
    assert body[:20] not in (result.details.results[0].output or "")
    status = pisub_cli("status", run.id, "--json").stdout
    assert "ghp_" not in status and body[:10] not in status


def test_gc_keeps_a_run_whose_session_a_live_run_drives(home: Path, make_agent: AgentMaker) -> None:
    """A finished run whose session a live resume drives (its lease held) is not removed."""
    make_agent("quick", command="true")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    session = run.dir / "session.jsonl"
    session.write_text("")
    owner = acquire(home / "leases", session, "0" * 8 + "-0000-4000-8000-" + "0" * 12, run.id)
    try:
        proc = pisub_cli("gc", "--older-than", "0s")
        assert proc.returncode == 0, proc.stderr
        assert run.dir.is_dir(), "gc removed a run whose session is being driven"
    finally:
        release(home / "leases", owner)
    assert pisub_cli("gc", "--older-than", "0s").returncode == 0
    assert not run.dir.exists(), "once the lease is free the run goes"


def test_one_writers_request_ids_keep_their_order() -> None:
    first = new_request_id()
    second = new_request_id()
    assert sorted([second, first]) == [first, second]


@pytest.mark.root  # the wall clock is the machine's: stepped alone
@pytest.mark.serial
def test_one_writers_request_ids_keep_its_order_across_a_backward_clock_step() -> None:
    if os.geteuid() != 0:
        pytest.skip("stepping the wall clock needs root")
    first = new_request_id()
    with _step_back():
        second = new_request_id()
    assert sorted([second, first]) == [first, second]


@contextlib.contextmanager
def _step_back() -> Iterator[None]:
    before, mono = time.clock_gettime(time.CLOCK_REALTIME), time.monotonic()
    time.clock_settime(time.CLOCK_REALTIME, before - 120)
    try:
        yield
    finally:
        time.clock_settime(time.CLOCK_REALTIME, before + (time.monotonic() - mono))


def test_a_home_too_deep_for_the_paths_inside_it_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path
    while len(os.fsencode(deep)) < 3000:
        deep = deep / ("d" * 200)
    monkeypatch.setenv("PISUB_HOME", str(deep / "home"))
    _one_line(pisub_cli("list"), "HOME_UNUSABLE")


def test_undecodable_arguments_are_invalid_input_not_a_bug(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    bad = os.fsdecode(b"a\xffb")
    _one_line(pisub_cli("run", "--agent", "sleeper", bad), "INVALID_INPUT")
    _one_line(pisub_cli("steer", run.id, bad), "INVALID_INPUT")  # the message before the run's kind
    _one_line(pisub_cli("follow-up", run.id, bad), "INVALID_INPUT")
    assert not list((run.dir / "inbox" / "new").iterdir()), "nothing was written"


def test_nan_waits_are_refused_at_once(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    for value in ("nan", "inf", "-5"):  # the parser refuses them all alike: a usage error, exit 2
        proc = pisub_cli("stop", run.id, "--wait", value, timeout=20)
        _one_line(proc, "USAGE")
        assert proc.returncode == 2 and "'--wait'" in proc.stderr, proc.stderr
        proc = pisub_cli("wait", run.id, "--timeout", value, timeout=20)  # (attack 31: was INVALID_INPUT)
        _one_line(proc, "USAGE")
        assert proc.returncode == 2 and "'--timeout'" in proc.stderr, proc.stderr
    assert not list((run.dir / "inbox" / "new").iterdir()), "nothing was written"


def test_gc_removes_symlinked_leftovers_themselves_and_says_only_what_it_did(home: Path) -> None:
    runs = home / "runs"
    runs.mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    target = home.parent / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("not pisub's")
    for name in (".deleting-" + "1" * 8 + "-0000-4000-8000-" + "1" * 12 + "-abcd", ".creating-x"):
        (runs / name).symlink_to(target)
        os.utime(runs / name, (0, 0), follow_symlinks=False)
    proc = pisub_cli("gc")
    assert proc.returncode == 0, proc.stderr
    assert not [p for p in runs.iterdir() if p.is_symlink()], "the links themselves are removed"
    assert (target / "keep").read_text() == "not pisub's", "what they point to is not"


def test_terminal_escapes_in_names_are_escaped_on_output(home: Path) -> None:
    agents = home / "agents"
    agents.mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    (agents / "evil\n\x1b[31mred.md").write_text("not frontmatter")
    proc = pisub_cli("agents", "list")
    assert "\x1b" not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_reserved_id_in_content_cannot_take_another_files_receipt(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    bad_name = "bad name.json"
    squatted = "invalid-" + hashlib.sha256(bad_name.encode()).hexdigest()[:16]
    new, tmp = run.dir / "inbox" / "new", run.dir / "inbox" / "tmp"
    (tmp / "a.json").write_text(json.dumps({"v": 1, "type": "stop", "id": squatted}))
    os.rename(tmp / "a.json", new / "a.json")
    (tmp / "b").write_text('{"v":1,"type":"steer","message":"hi"}')
    os.rename(tmp / "b", new / bad_name)
    wait_for(lambda: {p.stem for p in (run.dir / "outbox").glob("*.json")} >= {"a", squatted})
    a = json.loads((run.dir / "outbox" / "a.json").read_bytes())
    assert a["state"] == "rejected" and "reserved" in a["reason"]
    squat = json.loads((run.dir / "outbox" / f"{squatted}.json").read_bytes())
    assert "not a valid request id" in squat["reason"], "the badly named file got its own receipt"
