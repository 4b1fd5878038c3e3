"""The console script's entry (``pisub.__main__:main``): a launching command starts its warm
runner before it imports the command line (typer, click), the protocol records or :mod:`typing`,
and it exits without the interpreter's teardown, keeping what an ordinary exit does."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pisub.__main__ import launching
from pisub.backends import warm
from pisub.core.fast_exit import exit_now
from pisub.protocol.env import RUN_MARKERS

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_script_is_the_early_entry() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["pisub"] == "pisub.__main__:main"


def test_the_old_entry_still_works() -> None:
    from pisub.cli import entry

    assert entry.main is __import__("pisub.__main__", fromlist=["main"]).main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--agent", "a", "x"], True),
        (["resume", "RUN", "more"], True),
        (["--json", "run", "x"], True),
        (["run", "--help"], False),
        (["status", "x"], False),
        ([], False),
    ],
)
def test_which_commands_launch(argv: list[str], expected: bool) -> None:
    assert launching(argv) is expected


def test_starting_a_warm_runner_imports_no_parser_protocol_or_typing() -> None:
    code = (
        "import sys\n"
        "import pisub.__main__, pisub.api.warm, pisub.backends.warm\n"
        "heavy = ('typer', 'click', 'typing', 'msgspec', 'pisub.protocol', 'pisub.store', 'pisub.cli',"
        " 'dataclasses', 'json')\n"
        "light = ('pisub.protocol', 'pisub.protocol.lazy')  # the package's lazy names: no struct\n"
        "print(sorted(m for m in sys.modules if (m.split('.')[0] in heavy or m.startswith(heavy))"
        " and m not in light))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_the_launchers_marker_list_is_the_protocols() -> None:
    assert warm._RUN_MARKERS == RUN_MARKERS


EXIT = """
import atexit, sys, threading, time
from pisub.core.fast_exit import exit_now
atexit.register(lambda: sys.stdout.write("[handler]"))
sys.stdout.write("[buffered]")
if sys.argv[1] == "thread":
    def work():
        time.sleep(0.2)
        sys.stdout.write("[thread done]")
    threading.Thread(target=work).start()
try:
    raise SystemExit(3)
except SystemExit as done:
    exit_now(done)
    sys.stdout.write("[ordinary]")
    raise
"""


def _exit(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", EXIT, mode], capture_output=True, text=True, timeout=60)


def test_the_fast_exit_keeps_the_code_the_handlers_and_the_buffered_output() -> None:
    done = _exit("plain")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "[buffered][handler]"


def test_a_live_non_daemon_thread_gets_the_ordinary_exit() -> None:
    done = _exit("thread")
    assert done.returncode == 3, done.stderr
    assert "[ordinary]" in done.stdout and "[thread done]" in done.stdout and "[handler]" in done.stdout


def test_a_message_exit_is_left_to_the_ordinary_exit() -> None:
    exit_now(SystemExit("a message"))  # (returns: this process goes on)
    exit_now(SystemExit(True))


def test_the_next_spare_starts_at_the_handoff_only_back_to_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    calls: list[str] = []
    monkeypatch.setattr(warm, "refill", lambda: calls.append("refill"))
    monkeypatch.setattr(warm, "_last_launched", float("-inf"))
    warm.refill_back_to_back()  # the first launch of a process: its runner keeps the machine
    assert calls == []
    warm.launched()  # its commit: the spare starts now
    assert calls == ["refill"]
    warm.refill_back_to_back()  # the next launch, right after: its spare starts at the handoff
    assert calls == ["refill", "refill"]
    monkeypatch.setattr(warm, "_last_launched", time.monotonic() - 2 * warm.BACK_TO_BACK_S)
    warm.refill_back_to_back()  # after a pause: after the commit again
    assert calls == ["refill", "refill"]
