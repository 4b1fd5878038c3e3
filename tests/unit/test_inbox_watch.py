"""The runner's inbox watch: one inotify descriptor in its loop's selector (no thread), woken by
arrivals only, falling back to polling (and saying why) when inotify cannot be had."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from pisub.core import inotify
from pisub.runner.inbox import POLL_WITH_INOTIFY_S, POLL_WITHOUT_INOTIFY_S, InboxWatcher

linux = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="inotify is Linux's")


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@linux
def test_an_arrival_wakes_it_and_a_drain_quiets_it(tmp_path: Path) -> None:
    new, tmp = tmp_path / "new", tmp_path / "tmp"
    new.mkdir()
    tmp.mkdir()
    fd = inotify.watch_dir(new)
    try:
        assert not _readable(fd)
        (tmp / "a.json").write_bytes(b"{}")
        os.rename(tmp / "a.json", new / "a.json")  # published by rename: IN_MOVED_TO
        assert select.select([fd], [], [], 5)[0]
        inotify.drain(fd)
        assert not _readable(fd)
        (new / "b.json").write_bytes(b"{}")  # created in place: IN_CREATE
        assert select.select([fd], [], [], 5)[0]
        inotify.drain(fd)
        os.unlink(new / "a.json")  # a claim or a deletion is no arrival
        os.rename(new / "b.json", tmp / "b.json")
        assert not _readable(fd)
    finally:
        os.close(fd)


@linux
def test_a_flood_past_the_kernel_queue_still_wakes_it_once_drained(tmp_path: Path) -> None:
    new = tmp_path / "new"
    new.mkdir()
    fd = inotify.watch_dir(new)
    try:
        for i in range(20_000):  # past the default 16,384 queued events: IN_Q_OVERFLOW
            (new / f"{i:05d}").write_bytes(b"")
        assert _readable(fd)
        inotify.drain(fd)
        assert not _readable(fd)
        (new / "late").write_bytes(b"")
        assert select.select([fd], [], [], 5)[0]
    finally:
        os.close(fd)


@linux
def test_no_descriptor_for_a_missing_directory_a_file_or_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    for name in ("missing", "file", "link"):
        with pytest.raises(OSError):
            inotify.watch_dir(tmp_path / name)


@linux
def test_the_watcher_hands_its_descriptor_to_the_loop_and_closes_it(tmp_path: Path) -> None:
    watcher = InboxWatcher(tmp_path)
    info = watcher.start()
    assert info.watch == "inotify" and watcher.fd is not None
    assert watcher.poll_interval == POLL_WITH_INOTIFY_S
    fd = watcher.fd
    (tmp_path / "x.json").write_bytes(b"{}")
    assert select.select([fd], [], [], 5)[0]
    watcher.drain()
    assert not _readable(fd)
    watcher.stop()
    assert watcher.fd is None
    with pytest.raises(OSError):
        os.fstat(fd)


def test_without_inotify_it_polls_and_says_why(tmp_path: Path) -> None:
    watcher = InboxWatcher(tmp_path / "missing")
    info = watcher.start()
    assert info.watch == "polling" and info.reason and "inotify unavailable" in info.reason
    assert watcher.fd is None and watcher.poll_interval == POLL_WITHOUT_INOTIFY_S
    watcher.drain()
    watcher.stop()
