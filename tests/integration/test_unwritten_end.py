"""A run whose child ended but whose runner could not write its final files (a full disk) is
repaired ``failed`` with ``IO_ERROR`` naming the file, and keeps what is known: the child's exit
code and the output already on disk. Once on a real full tmpfs (root), once with writes made to
fail by ``tests/faultinject`` (any user)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.protocol.result import UNWRITTEN_END
from tests.conftest import ROOT, AgentMaker, processes_of, wait_for

# Prints a line, waits until its runner logged it, then makes the disk full (fills the file
# $PISUB_TEST_FILLER) or makes the runner's writes fail (creates $PISUB_FAULT_FILE); exits 0.
CHILD = """
import os, sys, time
print("the output already on disk", flush=True)
log = os.path.join(os.environ["PISUB_RUN_DIR"], "output-0.log")
deadline = time.monotonic() + 20
while b"the output already on disk" not in open(log, "rb").read():
    if time.monotonic() > deadline:
        sys.exit(9)
    time.sleep(0.01)
if os.environ.get("PISUB_TEST_FILLER"):
    fd = os.open(os.environ["PISUB_TEST_FILLER"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for size in (1 << 20, 1 << 16, 1 << 12, 1):
        while True:
            try:
                os.write(fd, b"\\0" * size)
            except OSError:
                break
    os.close(fd)
else:
    open(os.environ["PISUB_FAULT_FILE"], "w").write("ENOSPC")
"""


@contextlib.contextmanager
def _tmpfs(home: Path) -> Iterator[None]:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(home)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mount.stderr.strip()}")
    try:
        yield
    finally:
        for pid in processes_of(home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        if subprocess.run(["umount", str(home)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(home)], capture_output=True, check=False)


def _blocker(how: str, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What makes the disk full (removed again to free it)."""
    if how == "tmpfs":
        filler = home / "filler"
        monkeypatch.setenv("PISUB_TEST_FILLER", str(filler))
        return filler
    control = tmp_path / "fault"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "faultinject"), str(ROOT)]))
    monkeypatch.setenv("PISUB_FAULT_FILE", str(control))
    monkeypatch.setenv("PISUB_FAULT_DIR", str(home))
    monkeypatch.setenv("PISUB_FAULT_WHO", "runner")
    # What follows the runner's giving up is tested here; the tmpfs case waits the real 30 s.
    monkeypatch.setenv("PISUB_FAULT_FINAL_WRITE_S", "2")
    return control


@pytest.mark.parametrize("how", [pytest.param("tmpfs", marks=pytest.mark.root), "faultinject"])
def test_a_completed_run_whose_final_files_could_not_be_written_keeps_its_exit_and_output(
    how: str, home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "tmpfs" and os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mounted, which needs root (faultinject covers it)")
    blocker = _blocker(how, home, tmp_path, monkeypatch)
    with _tmpfs(home) if how == "tmpfs" else contextlib.nullcontext():
        make_agent("filler", python=CHILD)
        run = pisub.launch("filler", "x")
        log = run.dir / "runner.log"
        wait_for(
            lambda: UNWRITTEN_END.encode() in log.read_bytes(),
            timeout=90,
            what="the runner to give up on its final files and say what it knew",
        )
        wait_for(lambda: not processes_of(run.dir), timeout=20, what="the runner to exit")
        blocker.unlink()
        result = run.wait(timeout=30)  # the reader repairs the run
        assert result.state == "failed"
        error = result.details.error
        assert error is not None and error.code == "IO_ERROR", error
        assert str(run.dir / "result.json") in error.message or str(run.dir / "outbox") in error.message
        assert "exit code 0" in error.message
        single = result.details.results[0]
        assert single.exit_code == 0
        assert "the output already on disk" in (single.output or "")
        assert run.status().steps[0].exit_code == 0
