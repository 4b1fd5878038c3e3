"""The runner's exit without the interpreter's teardown keeps what an ordinary exit does: its
exit code, its exit handlers, its buffered output, and a live non-daemon thread's work."""

from __future__ import annotations

import subprocess
import sys

EXIT = """
import atexit, sys, threading, time
from pisub.runner.__main__ import exit_now
atexit.register(lambda: sys.stdout.write("[handler]"))
sys.stdout.write("[buffered]")
if sys.argv[1] == "thread":
    def work():
        time.sleep(0.2)
        sys.stdout.write("[thread done]")
    threading.Thread(target=work).start()
exit_now(3)
"""


def _exit(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", EXIT, mode], capture_output=True, text=True, timeout=60)


def test_it_keeps_the_code_the_handlers_and_the_buffered_output() -> None:
    done = _exit("plain")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "[buffered][handler]"


def test_a_live_non_daemon_thread_gets_the_ordinary_exit() -> None:
    done = _exit("thread")
    assert done.returncode == 3, done.stderr
    assert "[thread done]" in done.stdout and "[handler]" in done.stdout
