"""Every directory pisub lists, against every kind of entry an attacker (or a crash) can leave.

The matrix: each kind of entry — a directory, symlinks to a file / a directory / a FIFO /
nothing, a FIFO, a socket, a device, 0 bytes, a huge sparse file, an unreadable file, another
uid's file, a 255-byte name, an undecodable name — is planted at once in every folder pisub
lists: ``inbox/new``, ``inbox/cur``, ``inbox/rejected``, ``outbox``, ``briefs`` of a run, and
``runs/`` and ``leases/`` of the home. Then, for a live run and for a run whose runner is
killed: no command hangs or prints a traceback, a valid request still gets its one receipt
and is carried out, the dead run is repaired, ``list`` still shows every other run, and
every request-shaped entry gets exactly one receipt.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pisub
from pisub.api.client import Run
from pisub.protocol import RunState
from pisub.store.mailbox import new_key
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for

ROOT_ONLY = {"device", "foreign"}
FAKE_RUN = "00000000-0000-4000-8000-000000000000"
LEASE_KEY = "0123456789abcdef0123456789abcdef"
STEER = b'{"v":1,"type":"steer","message":"planted"}'
HANG = 20.0
"""Seconds after which a command counts as hung."""


def _fifo_elsewhere(tmp: Path) -> Path:
    fifo = tmp / "elsewhere.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    return fifo


def _socket(path: Path) -> None:
    # AF_UNIX paths are limited to 108 bytes: bind relative to the folder.
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path.name)
        sock.close()
    finally:
        os.chdir(here)


def _huge(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB that occupies no disk


def _regular(path: Path, tmp: Path) -> None:
    path.write_bytes(STEER)


def _made_then_moved(path: Path, tmp: Path, finish: Callable[[Path], None]) -> None:
    """Made aside, finished, then renamed into place: a live runner never sees it half made."""
    aside = tmp / f"aside-{uuid.uuid4().hex}.json"
    aside.write_bytes(STEER)
    finish(aside)
    os.rename(aside, path)


def _unreadable(path: Path, tmp: Path) -> None:
    _made_then_moved(path, tmp, lambda p: p.chmod(0))


def _foreign(path: Path, tmp: Path) -> None:
    _made_then_moved(path, tmp, lambda p: os.chown(p, 12345, 12345))


PLANTERS: dict[str, Callable[[Path, Path], None]] = {
    "directory": lambda p, t: p.mkdir(),
    "symlink-to-file": lambda p, t: p.symlink_to(t / "target.json"),
    "symlink-to-directory": lambda p, t: p.symlink_to(t),
    "symlink-to-fifo": lambda p, t: p.symlink_to(_fifo_elsewhere(t)),
    "dangling-symlink": lambda p, t: p.symlink_to(t / "nothing-here"),
    "fifo": lambda p, t: os.mkfifo(p),
    "socket": lambda p, t: _socket(p),
    "device": lambda p, t: os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
    "empty": lambda p, t: p.touch(mode=0o600),
    "huge-sparse": lambda p, t: _huge(p),
    "unreadable": _unreadable,
    "foreign": _foreign,
    "255-byte-name": _regular,
    "undecodable-name": _regular,
}


def _name(kind: str, stem: str) -> str:
    if kind == "255-byte-name":
        return stem + "x" * (255 - len(stem) - len(".json")) + ".json"
    if kind == "undecodable-name":
        return os.fsdecode(stem.encode() + b"-\xff\xfe.json")
    return f"{stem}.json"


def _plant(kind: str, folder: Path, stem: str, tmp: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / _name(kind, stem)
    PLANTERS[kind](path, tmp)
    return path


def _plant_in_run(kind: str, run: Run, tmp: Path) -> list[Path]:
    """One entry of ``kind`` in every folder of ``run`` that pisub lists; inbox/new's first."""
    (tmp / "target.json").write_bytes(STEER)
    # inbox/new last: a live runner claims from it at once (into inbox/cur, planted before).
    folders = ["inbox/cur", "inbox/rejected", "outbox", "briefs"]
    others = [_plant(kind, run.dir / folder, "hostile", tmp) for folder in folders]
    return [_plant(kind, run.dir / "inbox" / "new", "hostile", tmp), *others]


def _plant_in_home(kind: str, home: Path, tmp: Path) -> None:
    """One entry of ``kind`` in ``runs/`` (named like a run) and in ``leases/``."""
    if kind in ("255-byte-name", "undecodable-name"):
        _plant(kind, home / "runs", "hostile", tmp)
    else:
        PLANTERS[kind](home / "runs" / FAKE_RUN, tmp)
    _plant(kind, home / "leases", LEASE_KEY, tmp)


def _cli(*args: str) -> tuple[int, str, str]:
    proc = pisub_cli(*args, timeout=HANG)
    assert "Traceback" not in proc.stderr, f"pisub {' '.join(args)}: {proc.stderr}"
    if proc.returncode not in (0,):
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert all(line.startswith("pisub: ") for line in lines), f"pisub {' '.join(args)}: {proc.stderr}"
    return proc.returncode, proc.stdout, proc.stderr


def _every_reader_copes(home: Path, runs: list[Run]) -> None:
    code, out, err = _cli("list", "--json")
    assert code == 0, err
    listed = {json.loads(line)["runId"] for line in out.splitlines()}
    assert {run.id for run in runs} <= listed, "list still works for every run"
    calls = [["list"], ["doctor"], ["lease", "list"], ["gc", "--dry-run"], ["agents", "list"]]
    for run in runs[:2]:
        calls += [
            ["status", run.id],
            ["result", run.id, "--json"],
            ["wait", run.id, "--timeout", "1"],
            ["logs", run.id],
        ]
    with ThreadPoolExecutor(max_workers=4) as pool:  # fresh processes: mostly start-up time
        for future in [pool.submit(_cli, *args) for args in calls]:
            future.result()


def _receipts(run: Run) -> dict[str, dict[str, object]]:
    out = {}
    for path in (run.dir / "outbox").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            if path.is_file() and not path.is_symlink():
                out[path.stem] = json.loads(path.read_bytes())
    return out


@pytest.fixture(
    params=[
        pytest.param(name, marks=pytest.mark.root) if name in ROOT_ONLY else name for name in sorted(PLANTERS)
    ]
)
def kind(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    if name in ROOT_ONLY and os.geteuid() != 0:
        pytest.skip(f"planting a {name} needs root")
    return name


def test_live_and_crashed_runs_cope_with_every_kind_of_entry(
    kind: str, home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    make_agent("quick", command="true")
    other = pisub.launch("quick", "x")
    live, crashed = pisub.launch("sleeper", "x"), pisub.launch("sleeper", "x")
    runner = crashed.status().pid
    assert runner is not None
    os.kill(runner, signal.SIGSTOP)  # planted while this runner cannot look: its repair finds them
    for name in ("live", "crashed"):
        (tmp_path / name).mkdir()
    planted = _plant_in_run(kind, live, tmp_path / "live")
    _plant_in_run(kind, crashed, tmp_path / "crashed")
    _plant_in_home(kind, home, tmp_path)
    os.kill(runner, signal.SIGKILL)
    other.wait(timeout=30)

    # The live runner: a valid request behind the hostile one is carried out, with its receipt.
    code, out, err = _cli("stop", live.id, "--json")
    assert code == 0 and json.loads(out)["state"] == "delivered", err
    assert live.wait(timeout=30).state == "stopped"
    key = new_key(planted[0].name)
    receipts = _receipts(live)
    assert key in receipts, f"the {kind} planted in inbox/new got no receipt"
    assert receipts[key]["state"] in ("rejected", "failed")
    assert not [p for p in (live.dir / "inbox" / "new").iterdir() if p.name.endswith(".json")]

    # The dead runner: its run is repaired, every request-shaped entry answered.
    wait_for(lambda: not pid_alive(runner))
    code, out, err = _cli("status", crashed.id, "--json")
    assert code == 0, err
    assert json.loads(out)["state"] == RunState.FAILED, "the dead run is repaired"
    assert Run(crashed.id).status().state == RunState.FAILED
    for entry in (crashed.dir / "inbox" / "new").iterdir():  # only what can never be moved stays
        assert not entry.name.endswith(".json") or new_key(entry.name) in _receipts(crashed)

    _every_reader_copes(home, [live, crashed, other])


def test_a_copied_run_folder_is_a_problem_not_a_second_copy_of_the_run(
    home: Path, make_agent: AgentMaker
) -> None:
    """A run folder whose status names another run (``cp -a`` of a run) is listed as unreadable,
    never as that run twice (an outside attack saw it listed, and steered, as the original)."""
    import shutil

    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    copy = home / "runs" / str(uuid.uuid4())
    shutil.copytree(run.dir, copy, symlinks=True)
    for args in (("list", "--json"), ("list", "--all", "--json")):
        code, out, err = _cli(*args)
        assert code == 0, err
        ids = [json.loads(line)["runId"] for line in out.splitlines()]
        assert ids.count(run.id) == 1 and copy.name not in ids, ids
        assert "names another run" in err
    run.send_stop()
    run.wait(timeout=30)


def test_a_run_folder_whose_manifest_was_removed_is_named_damaged(home: Path, make_agent: AgentMaker) -> None:
    """A run appears whole, its manifest first: one that is gone from a folder that is there was
    removed since. The commands that need it say so in one line (they said the run does not
    exist, while ``list`` listed it); its status and result still read; doctor names it."""
    make_agent("quick", command="true")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    (run.dir / "manifest.json").unlink()
    for args in (("logs", run.id), ("resume", run.id, "more"), ("status", run.id)):
        code, _out, err = _cli(*args)
        assert code == 1, (args, err)
        assert err.strip().endswith(
            "manifest.json is missing: the run's folder is damaged (a run "
            "appears with its manifest, so it was removed since); its status "
            "and result can still be read, and `pisub gc` removes it once it "
            "has ended [PROTOCOL_ERROR]"
        ), (args, err)
    for args in (("status", run.id, "--json"), ("result", run.id)):
        code, _out, err = _cli(*args)
        assert code == 0, (args, err)
    code, out, _err = _cli("doctor")
    assert f"{run.id} (its manifest.json is missing" in out
    code, out, err = _cli("gc", "--older-than", "0s")
    assert code == 0 and not run.dir.exists(), (out, err)


@pytest.mark.parametrize("damage", ["status-garbage", "manifest-missing"])
def test_every_request_to_an_ended_run_is_refused_as_closed_whatever_else_is_damaged(
    home: Path, make_agent: AgentMaker, damage: str
) -> None:
    """The closed inbox says the run has ended and answers first: a steer or interrupt of an
    external CLI's run (which reads its manifest and status to tell a live run it cannot take
    one) is refused as a stop is, ``RUN_CLOSED``, not ``PROTOCOL_ERROR`` (outside attacks saw
    them differ with an unreadable status, then with a missing manifest)."""
    make_agent("quick", command="true")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    if damage == "status-garbage":
        (run.dir / "status.json").write_bytes(b"\x00garbage")
    else:
        (run.dir / "manifest.json").unlink()
    for args in (("stop", run.id), ("steer", run.id, "hi"), ("interrupt", run.id)):
        code, _out, err = _cli(*args)
        assert code == 1 and err.strip().endswith("takes no more requests [RUN_CLOSED]"), (args, err)
