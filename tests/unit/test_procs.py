"""The promises of ``procs.run_bounded``, with real processes: a timeout or a stop ends the whole
group (grandchildren too), nothing the command started outlives the call, output is capped,
and a command that cannot start or cannot write its output leaves nothing behind."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from pisub.core.procs import DRAIN_S, OutputUnwritable, is_alive, run_bounded
from tests.conftest import wait_for

BACKGROUND_SLEEPER = 'sleep 300 >/dev/null 2>&1 </dev/null & echo $! > "$1"'


def _pid_in(path: Path) -> int:
    return int(wait_for(lambda: path.read_text().strip() if path.exists() else "", what=str(path)))


def _gone(pid: int) -> bool:
    return not is_alive(pid)


def test_output_and_input_come_back_through_pipes() -> None:
    code = (
        "import sys; data = sys.stdin.read(); print(data.upper()); print('err', file=sys.stderr); sys.exit(3)"
    )
    done = run_bounded([sys.executable, "-c", code], timeout=30, stdin=b"hello")
    assert (done.returncode, done.stdout, done.stderr) == (3, b"HELLO\n", b"err\n")
    assert not done.timed_out and not done.stopped


def test_a_timeout_kills_the_whole_group_grandchildren_included(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    done = run_bounded(["sh", "-c", BACKGROUND_SLEEPER + "; sleep 300", "sh", str(pidfile)], timeout=0.5)
    assert done.timed_out and time.monotonic() - started < 10
    assert done.returncode < 0  # ended by a signal
    wait_for(lambda: _gone(_pid_in(pidfile)), what="the grandchild ended with its group")


def test_nothing_it_started_outlives_a_normal_exit(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    done = run_bounded(["sh", "-c", BACKGROUND_SLEEPER, "sh", str(pidfile)], timeout=30)
    assert done.returncode == 0 and not done.timed_out
    wait_for(lambda: _gone(_pid_in(pidfile)), what="the background sleeper ended with the call")


def test_should_stop_ends_it_with_a_grace_for_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "terminated"
    script = f"trap 'echo bye > {marker}; exit 0' TERM; while :; do sleep 0.05; done"
    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) >= 2

    done = run_bounded(["sh", "-c", script], timeout=60, should_stop=should_stop, grace=5.0)
    assert done.stopped and not done.timed_out
    assert marker.read_text() == "bye\n"  # it had its SIGTERM, and the grace to act on it


def test_output_to_a_file_is_capped_head_and_tail(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    code = "import sys; sys.stdout.write('a' * 5000 + 'b' * 5000); sys.stderr.write('END')"
    done = run_bounded([sys.executable, "-c", code], timeout=30, output=log, cap=1000)
    assert done.returncode == 0 and (done.stdout, done.stderr) == (b"", b"")
    text = log.read_bytes()
    assert text.startswith(b"a" * 1000 + b"\n[... 8003 bytes not kept ...]\n")
    assert text.endswith(b"b" * 997 + b"END")
    assert os.stat(log).st_mode & 0o777 == 0o600


def test_an_output_file_behind_a_symlink_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    target, link, ran = tmp_path / "target", tmp_path / "out.log", tmp_path / "ran"
    target.write_text("kept\n")
    link.symlink_to(target)
    with pytest.raises(OutputUnwritable):
        run_bounded(["touch", str(ran)], timeout=30, output=link)
    assert target.read_text() == "kept\n" and not ran.exists()


def test_a_command_that_cannot_start_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        run_bounded([str(tmp_path / "no-such-program")], timeout=30)


def test_cwd_and_env_are_the_commands(tmp_path: Path) -> None:
    done = run_bounded(
        ["sh", "-c", 'pwd; echo "$X"'], timeout=30, cwd=tmp_path, env={"X": "y", "PATH": "/bin"}
    )
    assert done.stdout == f"{tmp_path}\ny\n".encode()


def test_a_process_that_left_the_group_holding_the_pipe_does_not_hold_the_call(tmp_path: Path) -> None:
    """Outside attack: a ``setsid`` grandchild kept stdout open and the call waited for it."""
    pidfile = tmp_path / "escapee"
    started = time.monotonic()
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 30' & sleep 30"
    done = run_bounded(["sh", "-c", script], timeout=1)
    assert done.timed_out and time.monotonic() - started < 1 + DRAIN_S + 5
    escapee = wait_for(lambda: pidfile.read_text().strip() if pidfile.exists() else "", timeout=5, what="pid")
    os.kill(int(escapee), signal.SIGKILL)  # (it left the group: nothing can end it but its pid)


def test_a_fifo_as_the_output_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputUnwritable):
        run_bounded(["echo", "x"], timeout=2, output=fifo)
