"""The home's cache of ended runs (``cache/ended-runs``, :mod:`pisub.runs.ended_cache`): a
listing takes an ended run's status from it only while the run's own files are as they were;
a cache that is missing, broken, foreign or not a plain private file is ignored and rebuilt;
and a request written into an ended run's inbox is still answered (promise 2)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import msgspec
import pytest

import pisub
from pisub.core.fsio import atomic_write
from pisub.protocol import AgentSpec, Limits, Manifest, RunState, now_iso
from pisub.protocol.codec import encode_pretty
from pisub.protocol.status import Status
from pisub.runs import ended_cache
from pisub.store.mailbox import mark_answered, new_mtime
from pisub.store.paths import open_home
from pisub.store.runs import RunStore, load_status, write_status
from tests.conftest import AgentMaker, pisub_cli
from tests.helpers import drop_request


def _ended(home: Path, count: int, *, label: str | None = None) -> list[str]:
    """``count`` ended runs as a runner leaves them (a terminal status, a quiet inbox)."""
    store = RunStore(open_home(home))
    spec = AgentSpec(name="fake", runner="external-cli", command="true")
    limits = Limits(timeout=1, idle_timeout=None, grace=1, output_cap=1, output_hard_cap=1)
    ids = []
    for _ in range(count):
        manifest = Manifest(
            v=1, run_id=str(uuid.uuid4()), created_at=now_iso(), agent=spec, task="t", cwd="/", umask=0o022,
            limits=limits,
        )  # fmt: skip
        paths, fd = store.create(manifest)
        os.close(fd)
        status = load_status(paths)
        status.state = RunState.COMPLETE
        status.ended_at = now_iso()
        status.label = label
        write_status(paths, status, durable=False)
        mark_answered(paths, new_mtime(paths))
        ids.append(manifest.run_id)
    return ids


def _listed(problems: list[str] | None = None) -> dict[str, Status]:
    return {st.run_id: st for st in pisub.list_runs(children=True, problems=problems)}


def _cache(home: Path) -> Path:
    return home / "cache" / "ended-runs"


def _cached_names(home: Path) -> set[str]:
    runs = os.stat(home / "runs")
    return set(ended_cache.load(open_home(home), runs))


def _status_file(home: Path, run_id: str) -> Path:
    return home / "runs" / run_id / "status.json"


def _relabel(home: Path, run_id: str, label: str) -> None:
    changed = msgspec.json.decode(_status_file(home, run_id).read_bytes(), type=Status)
    changed.label = label
    atomic_write(_status_file(home, run_id), encode_pretty(changed))


def test_ended_runs_are_cached_and_every_change_to_their_files_is_seen(home: Path) -> None:
    ids = _ended(home, 3, label="a")
    assert set(_listed()) == set(ids)
    info = os.stat(_cache(home), follow_symlinks=False)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert _cached_names(home) == set(ids)
    assert {st.label for st in _listed().values()} == {"a"}

    # replaced atomically (another inode)
    _relabel(home, ids[0], "b")
    assert _listed()[ids[0]].label == "b"
    # rewritten in place, same size, its mtime put back: the ctime still differs
    path = _status_file(home, ids[1])
    before = os.stat(path)
    data = path.read_bytes().replace(b'"a"', b'"c"')
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _listed()[ids[1]].label == "c"
    # made unreadable garbage, then 0 bytes: a problem, never the cached row
    for broken in (b"{", b""):
        _status_file(home, ids[2]).write_bytes(broken)
        problems: list[str] = []
        assert ids[2] not in _listed(problems)
        assert len(problems) == 1 and ids[2] in problems[0]
    # removed: forgotten by the cache too
    shutil.rmtree(home / "runs" / ids[2])
    assert set(_listed()) == set(ids[:2])
    assert _cached_names(home) == set(ids[:2])


def test_a_replaced_run_directory_is_read_anew(home: Path) -> None:
    first, other = _ended(home, 2, label="first")
    _relabel(home, other, "other")
    _listed()
    assert _cached_names(home) == {first, other}
    # the folder of `first` replaced by a copy of `other`'s, renamed (same size of status)
    runs = home / "runs"
    shutil.copytree(runs / other, runs / "copy", symlinks=True)
    text = (runs / "copy" / "status.json").read_bytes().replace(other.encode(), first.encode())
    (runs / "copy" / "status.json").write_bytes(text)
    shutil.rmtree(runs / first)
    os.rename(runs / "copy", runs / first)
    assert _listed()[first].label == "other"


def test_a_request_into_an_ended_cached_run_is_answered_by_the_next_list(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    _listed()
    _listed()
    assert run.id in _cached_names(home)
    drop_request(run, "by-hand.json", b'{"v":1,"type":"follow_up","message":"late"}')
    assert pisub_cli("list", "--json", check=True).stdout.count(run.id) == 1
    receipt = run.receipt("by-hand")
    assert receipt is not None and receipt.state == "failed"
    assert receipt.reason == "the run finished before the request was consumed"
    _listed()
    assert run.id in _cached_names(home)  # quiet again: cached again


def _fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def _symlink_to_a_good_cache(path: Path) -> None:
    good = path.with_name("good")
    os.rename(path, good)
    os.symlink(good, path)


def _directory(path: Path) -> None:
    path.mkdir()


def _huge(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(ended_cache.MAX_BYTES + 1)


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x93\xff\x00garbage" * 100)


def _deep(path: Path) -> None:
    path.write_bytes(b"\x91" * 100_000)


def _group_readable(path: Path) -> None:
    os.chmod(path, 0o640)


def _other_version(path: Path) -> None:
    found = msgspec.msgpack.decode(path.read_bytes())
    found[1] = ended_cache.VERSION + 1
    path.write_bytes(msgspec.msgpack.encode(found))


def _other_records(path: Path) -> None:
    """Written by a pisub whose status records differ (a field this one knows is missing)."""
    found = msgspec.msgpack.decode(path.read_bytes())
    found[2] += 1
    path.write_bytes(msgspec.msgpack.encode(found))


def _another_runs_folder(path: Path) -> None:
    found = msgspec.msgpack.decode(path.read_bytes())
    found[4] += 1
    path.write_bytes(msgspec.msgpack.encode(found))


def _foreign_owner(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, 65534, 65534)


def _lie(path: Path) -> None:
    """Every entry, its keys kept, now says its run's label is ``lie``."""
    found = msgspec.msgpack.decode(path.read_bytes())
    for entry in found[5]:
        entry[3]["label"] = "lie"
    path.write_bytes(msgspec.msgpack.encode(found))


def test_the_cache_is_believed_only_while_the_run_is_the_same(home: Path) -> None:
    """The control for the test below: a cache of this user's, for this ``runs`` folder, is
    believed for runs whose files have not changed (it is the user's own file, like the runs)."""
    ids = _ended(home, 2, label="real")
    _listed()
    _lie(_cache(home))
    _relabel(home, ids[0], "changed")
    assert {st.run_id: st.label for st in _listed().values()} == {ids[0]: "changed", ids[1]: "lie"}


@pytest.mark.parametrize(
    "spoil",
    [
        _fifo,
        _symlink_to_a_good_cache,
        _directory,
        _huge,
        _garbage,
        _deep,
        _group_readable,
        _other_version,
        _other_records,
        _another_runs_folder,
        _foreign_owner,
    ],
)
def test_a_cache_that_cannot_be_trusted_is_ignored_and_rebuilt(home: Path, spoil: object) -> None:
    ids = _ended(home, 3, label="real")
    _listed()
    assert _cached_names(home) == set(ids)
    path = _cache(home)
    _lie(path)  # believed if the spoilt file were trusted
    if spoil in (_fifo, _directory):
        path.unlink()
    assert callable(spoil)
    spoil(path)
    _relabel(home, ids[0], "changed")
    listed = _listed()
    assert set(listed) == set(ids)
    labels = {st.run_id: st.label for st in listed.values()}
    assert labels == {ids[0]: "changed", ids[1]: "real", ids[2]: "real"}
    assert all(st.state == RunState.COMPLETE for st in listed.values())
    info = os.stat(path, follow_symlinks=False)
    if spoil is _directory:  # a folder is not renamed over: left, and ignored each time
        assert stat.S_ISDIR(info.st_mode)
        return
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    assert _cached_names(home) == set(ids)
    assert not [name for name in os.listdir(path.parent) if name.endswith(".tmp")]


def test_a_copied_home_does_not_trust_the_original_cache(home: Path, tmp_path: Path) -> None:
    ids = _ended(home, 2, label="orig")
    _listed()
    copy = tmp_path / "copy"
    shutil.copytree(home, copy, symlinks=True)
    _relabel(copy, ids[0], "in-the-copy")
    env = {**os.environ, "PISUB_HOME": str(copy)}
    out = pisub_cli("list", "--json", env=env, check=True).stdout
    shown = [msgspec.json.decode(line, type=Status) for line in out.splitlines()]
    labels = {st.run_id: st.label for st in shown}
    assert labels == {ids[0]: "in-the-copy", ids[1]: "orig"}


def test_concurrent_lists_write_the_cache_without_harm(home: Path) -> None:
    ids = set(_ended(home, 40))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pisub", "list", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(6)
    ]
    errors: list[str] = []

    def lister() -> None:
        for _ in range(5):
            if set(_listed()) != ids:
                errors.append("a run missing")

    threads = [threading.Thread(target=lister) for _ in range(3)]
    for thread in threads:
        thread.start()
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and not err
        assert {msgspec.json.decode(line, type=Status).run_id for line in out.splitlines()} == ids
    for thread in threads:
        thread.join(60)
    assert not errors
    assert _cached_names(home) == ids
    assert not [name for name in os.listdir(_cache(home).parent) if name.endswith(".tmp")]


def test_a_live_run_is_never_cached(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python="import time; time.sleep(60)")
    run = pisub.launch("sleeper", "x")
    try:
        assert _listed()[run.id].state == RunState.RUNNING
        assert run.id not in _cached_names(home)
    finally:
        run.send_stop()
        run.wait(timeout=30)
    assert _listed()[run.id].state == RunState.STOPPED


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_a_cache_folder_that_is_not_a_folder_is_left_alone(home: Path, tmp_path: Path, kind: str) -> None:
    ids = _ended(home, 2, label="real")
    _listed()
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(home / "cache", elsewhere)
    _lie(elsewhere / "ended-runs")
    shutil.rmtree(home / "cache")
    if kind == "file":
        (home / "cache").write_bytes(b"not a folder")
    else:
        os.symlink(elsewhere, home / "cache")
    for _ in range(2):
        assert {st.run_id: st.label for st in _listed().values()} == dict.fromkeys(ids, "real")
    assert (
        os.path.islink(home / "cache")
        if kind == "symlink"
        else (home / "cache").read_bytes() == b"not a folder"
    )
    assert sorted(os.listdir(elsewhere)) == ["ended-runs"]  # nothing written through the symlink
