"""A symlink planted in place of a run's folder is never followed (outside attack, issue 23).

``O_NOFOLLOW`` guards only the last component of a path: with ``outbox`` (or ``inbox/new``,
``inbox``, ...) replaced by a symlink to a folder outside the home, a receipt was written and a
request "delivered" through it. For every control folder of a live run replaced by a symlink
to a folder outside the home, the commands that write or list there (``status``, ``steer``,
``follow-up``, ``stop``, ``interrupt``) and the runner answering them: nothing is written into
or read from the target (it stays exactly as it was), every command answers without a
traceback (an error in one ``pisub:`` line), the runner quarantines the symlink and makes the
folder again, and the run then gets exactly one receipt per request. The run directory itself
replaced by a symlink: every command refuses in one line and the runner writes nothing through it.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import pisub
from pisub.api.client import Run
from pisub.protocol import RunState
from tests.conftest import ROOT, AgentMaker, pid_alive, pisub_cli, wait_for

FOLDERS = ["inbox", "inbox/new", "inbox/tmp", "inbox/cur", "inbox/rejected", "outbox"]
WRITTEN = {"inbox", "inbox/new", "inbox/tmp"}
"""The folders a writer publishes a request through: it is refused there."""
HANG = 30.0


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry below ``root`` (without following links) with a file's content."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            found[rel] = path.read_bytes() if path.is_file() and not path.is_symlink() else None
    return found


def _victim(tmp: Path) -> Path:
    """A folder outside the home shaped like the one it replaces (so a followed path works)."""
    victim = tmp / "victim"
    for box in ("new", "tmp", "cur", "rejected"):
        (victim / box).mkdir(parents=True)
    (victim / "keep.txt").write_text("untouched\n")
    return victim


def _cli(*args: str) -> tuple[int, str]:
    proc = pisub_cli(*args, timeout=HANG)
    assert "Traceback" not in proc.stderr, f"pisub {' '.join(args)}: {proc.stderr}"
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        # a refusal is one line; a request answered "rejected" or "failed" has its receipt on stdout
        assert len(lines) <= 1 and all(line.startswith("pisub: ") for line in lines), (
            f"pisub {' '.join(args)}: {proc.stderr}"
        )
    return proc.returncode, proc.stdout + proc.stderr


def _request_id(out: str) -> str | None:
    for line in out.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("requestId"), str):
            return str(obj["requestId"])
    return None


def _by_hand(run_id: str, kind: str) -> tuple[int, str]:
    """A steer or follow-up written through the API, as the CLI writes one for a pi run (the CLI
    refuses both up front for an external CLI's run): ``(0, its id as JSON)`` or ``(1, the
    one-line error)``."""
    from pisub.errors import PisubError

    run = Run(run_id)
    try:
        rid = run.send_steer("planted?") if kind == "steer" else run.send_follow_up("more")
    except PisubError as exc:
        return 1, f"pisub: {exc.message} [{exc.code}]"
    return 0, json.dumps({"requestId": rid})


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_symlinked_run_folder_is_never_followed(
    folder: str, home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    runner = wait_for(lambda: run.status().pid, timeout=HANG, what="the runner started")
    os.kill(runner, signal.SIGSTOP)  # the readers and writers meet the symlink before the runner does
    victim = _victim(tmp_path)
    before = _snapshot(victim)
    planted = run.dir / folder
    os.rename(planted, planted.with_name(planted.name + ".bak"))
    planted.symlink_to(victim, target_is_directory=True)

    sent: list[str] = []
    commands = [
        ["status", run.id, "--json"],
        ["steer", run.id, "planted?"],
        ["follow-up", run.id, "more"],
        ["status", run.id],
    ]
    for args in commands:
        code, out = _cli(*args) if args[0] == "status" else _by_hand(run.id, args[0])
        assert _snapshot(victim) == before, f"pisub {' '.join(args)} went through the symlinked {folder}"
        if args[0] != "status" and folder in WRITTEN:
            assert code != 0 and "symlink" in out, f"pisub {' '.join(args)}: not refused: {out}"
        rid = _request_id(out) if args[0] != "status" else None
        if rid is not None:
            sent.append(rid)
    os.kill(runner, signal.SIGCONT)

    # The runner quarantines the symlink (never following it) and makes the folder again.
    wait_for(lambda: not planted.is_symlink() and planted.is_dir(), timeout=HANG, what=f"{folder} made again")
    quarantined = [p for p in (run.dir / "quarantine").iterdir() if p.is_symlink()]
    assert quarantined and all(os.readlink(p) == str(victim) for p in quarantined)

    interrupt = Run(run.id).send_interrupt()  # by hand: the CLI refuses to pause an external CLI
    assert Run(run.id).wait_for_receipt(interrupt, timeout=10) is not None
    sent.append(interrupt)
    assert RunState(Run(run.id).wait(timeout=HANG).state).is_terminal
    code, _ = _cli("stop", run.id, "--json")  # closed now: refused in one line
    assert _snapshot(victim) == before, f"the runner went through the symlinked {folder}"

    outbox = run.dir / "outbox"
    receipts = {p.stem: json.loads(p.read_bytes()) for p in outbox.glob("*.json")}
    for rid in sent:
        assert rid in receipts, f"request {rid} got no receipt"
        assert receipts[rid]["requestId"] == rid
    assert not [p for p in (run.dir / "inbox" / "new").iterdir() if p.name.endswith(".json")]


def test_a_symlinked_run_directory_is_never_followed(
    home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run directory itself replaced by a symlink: no command (nor the runner) goes
    through it; each answers in one line."""
    # The runner, unable to write its end, retries for FINAL_WRITE_S (30 s) before it gives up:
    # what is tested here is that it never writes through the symlink, not how long it tries.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "faultinject"), str(ROOT)]))
    monkeypatch.setenv("PISUB_FAULT_WHO", "runner")
    monkeypatch.setenv("PISUB_FAULT_FINAL_WRITE_S", "2")
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    runner = wait_for(lambda: run.status().pid, timeout=HANG, what="the runner started")
    os.kill(runner, signal.SIGSTOP)
    victim = _victim(tmp_path)
    for box in ("inbox", "outbox"):
        (victim / box).mkdir()
    before = _snapshot(victim)
    os.rename(run.dir, run.dir.with_name(run.id + ".bak"))
    run.dir.symlink_to(victim, target_is_directory=True)
    for args in (
        ["status", run.id],
        ["steer", run.id, "planted?", "--wait", "1"],
        ["follow-up", run.id, "more", "--wait", "1"],
        ["interrupt", run.id, "--wait", "1"],
        ["stop", run.id, "--wait", "1"],
    ):
        code, out = _cli(*args)
        assert code != 0 and "symlink" in out, f"pisub {' '.join(args)}: {out}"
        assert _snapshot(victim) == before, f"pisub {' '.join(args)} went through the symlinked run"
    os.kill(runner, signal.SIGCONT)
    os.kill(runner, signal.SIGTERM)
    wait_for(lambda: not pid_alive(runner), timeout=HANG, what="the runner ended")
    assert _snapshot(victim) == before, "the runner went through the symlinked run"
