"""Helpers the tests share: a run's files read as a test sees them, requests published the way a
shell script publishes them, the fake model's requests, a workflow script on disk.

Fixtures and waiting (``wait_for``, ``wait_no_processes``) live in :mod:`tests.conftest`; a
helper that two test files need belongs here, not in each of them."""

from __future__ import annotations

import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pisub
from pisub.core.locks import is_held
from pisub.store.paths import RunPaths
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for

SLEEPER = """
import os, subprocess, time
g = subprocess.Popen(["sleep", "300"], start_new_session=True)
open(os.environ["PISUB_RUN_DIR"] + "/pids.json", "w").write("[%d, %d]" % (os.getpid(), g.pid))
print("working", flush=True)
time.sleep(300)
"""
"""A child (``python=`` of an agent) that starts a grandchild in a session of its own, records
both pids in the run's ``pids.json`` and sleeps."""

SIGNED: dict[str, Any] = {"type": "thinking", "thinking": "a private plan", "thinkingSignature": "SIG-abc123"}
"""A signed thinking block as pi keeps it in a session (a fork leaves it out)."""
REDACTED: dict[str, Any] = {
    "type": "thinking",
    "thinking": "[Reasoning redacted]",
    "thinkingSignature": "RED-xyz",
    "redacted": True,
}
"""A redacted thinking block as pi keeps it (a fork leaves it out)."""
UNSIGNED: dict[str, Any] = {"type": "thinking", "thinking": "an open musing"}
"""Thinking without a signature (a fork keeps it)."""

Where = pisub.Run | RunPaths | Path
"""A run: the run, its paths, or its directory."""


def _dir(where: Where) -> Path:
    if isinstance(where, pisub.Run):
        return where.dir
    return where.root if isinstance(where, RunPaths) else where


def run_events(where: Where, kind: str | None = None) -> list[dict[str, Any]]:
    """The events of a run in ``events.jsonl``, of type ``kind`` when given. Complete lines
    only: a line the runner is still writing is not read."""
    lines = (_dir(where) / "events.jsonl").read_bytes().split(b"\n")[:-1]
    found = [json.loads(line) for line in lines if line.strip()]
    return found if kind is None else [e for e in found if e.get("type") == kind]


def run_event_types(where: Where) -> list[str]:
    """The types of a run's events, in order."""
    return [str(e["type"]) for e in run_events(where)]


def run_receipts(where: Where) -> dict[str, dict[str, Any]]:
    """The run's receipts (``outbox/*.json``) by request id."""
    return {p.stem: json.loads(p.read_bytes()) for p in (_dir(where) / "outbox").glob("*.json")}


GATED_WORKER = """
import os, sys, time
task = sys.stdin.read().strip()
with open(os.environ["PISUB_TEST_COUNT"], "a") as fh:
    fh.write(task.splitlines()[0] + "\\n")
words = task.split()
if words[:1] == ["gate"]:
    gate = os.path.join(os.environ["PISUB_TEST_GATES"], words[1])
    deadline = time.monotonic() + 60
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            sys.exit("the gate never opened")
        time.sleep(0.02)
if words[:1] == ["sleep"]:
    time.sleep(float(words[1]))
print("did:", task)
"""
"""A child that appends its task's first line to $PISUB_TEST_COUNT (one line per start); a task
"gate NAME" waits until $PISUB_TEST_GATES/NAME exists, "sleep S" sleeps S seconds; then it
echoes its task."""


def gated_worker(make_agent: AgentMaker, tmp_path: Path, monkeypatch: Any) -> Path:
    """The ``worker`` agent (:data:`GATED_WORKER`); the folder of its gates (its starts are in
    ``../starts.txt``, :func:`gated_starts`)."""
    folder = tmp_path / "gates"
    folder.mkdir()
    (tmp_path / "starts.txt").touch()
    monkeypatch.setenv("PISUB_TEST_COUNT", str(tmp_path / "starts.txt"))
    monkeypatch.setenv("PISUB_TEST_GATES", str(folder))
    make_agent("worker", python=GATED_WORKER)
    return folder


def gated_starts(gates: Path) -> list[str]:
    """What the :func:`gated_worker` children started with, in order."""
    return (gates.parent / "starts.txt").read_text().splitlines()


FINAL_RECEIPT_STATES = ("delivered", "failed", "partial", "recovered", "rejected")


def final_receipt(where: Where, request_id: str) -> dict[str, Any]:
    """Request ``request_id``'s receipt once it is final (its one file in the outbox)."""
    return dict(
        wait_for(
            lambda: (
                (r := run_receipts(where).get(request_id)) is not None
                and r["state"] in FINAL_RECEIPT_STATES
                and r
            ),
            60,
            what=f"the final receipt of {request_id}",
        )
    )


def control_json(*args: str) -> tuple[int, dict[str, Any]]:
    """``pisub ARGS --json``: its exit code and its one receipt (or ``{"stderr": …}``)."""
    proc = pisub_cli(*args, "--json")
    return proc.returncode, json.loads(proc.stdout or "null") or {"stderr": proc.stderr}


def one_line_error(proc: subprocess.CompletedProcess[str], code: str) -> str:
    """The one line ``pisub: … [CODE]`` a failed command printed (never a traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pisub: ") and lines[0].endswith(f"[{code}]"), proc.stderr
    return lines[0]


def drop_request(where: Where, name: str, data: bytes | dict[str, Any]) -> Path:
    """Publish a request file the way a shell script does: written in ``inbox/tmp/``, renamed
    into ``inbox/new/<name>``; the published file."""
    inbox = _dir(where) / "inbox"
    tmp = inbox / "tmp" / f"drop-{uuid.uuid4().hex}"
    tmp.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    target = inbox / "new" / name
    os.rename(tmp, target)
    return target


def wait_runner_dead(run: pisub.Run, pid: int) -> None:
    """SIGKILL is asynchronous: wait until the runner is gone and its lock released (a
    multi-threaded process holds its files until its last thread has exited)."""
    wait_for(lambda: not pid_alive(pid) and not is_held(run.dir / "runner.lock"), what="the runner to die")


def sent_with(server: FakeModelServer, marker: str) -> list[dict[str, Any]]:
    """The requests the fake model was sent that mention ``marker``."""
    return [r for r in list(server.requests) if marker in json.dumps(r)]


def write_script(tmp_path: Path, body: str, name: str = "wf.py") -> Path:
    """A workflow script ``name`` in ``tmp_path`` (``body`` dedented)."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def child_pids(where: Where) -> list[int]:
    """The pids of the run's child processes, once the runner has recorded them (``pids.json``)."""
    path = _dir(where) / "pids.json"
    pids: list[int] = wait_for(
        lambda: path.exists() and json.loads(path.read_text() or "null"), what="the child to start"
    )
    return pids


def stop_and_end(run: pisub.Run) -> None:
    """Ask the run to stop and wait until it ended."""
    run.send_stop()
    run.wait_until_terminal(20)


def cmdline(pid: int) -> str:
    """The command line of process ``pid`` (words joined by spaces), or "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def launch_sleeper(make_agent: AgentMaker, **limits: float) -> pisub.Run:
    """A run of the :data:`SLEEPER` agent ``sleeper``, once its child has started."""
    make_agent("sleeper", python=SLEEPER)
    run = pisub.launch("sleeper", "x", **limits)  # type: ignore[arg-type]
    child_pids(run)
    return run


def first_and_later(tmp_path: Path, agent: str, first: str, later: str) -> Path:
    """A workflow script of two children of ``agent`` — ``first`` (task ``first``) and ``later``
    (task ``later``), called together — that returns ``[[key, state, ok, output], ...]``."""
    calls = [{"key": "first", "agent": agent, "task": first}, {"key": "later", "agent": agent, "task": later}]
    return write_script(
        tmp_path,
        f"""
        async def main(runs, state, args):
            results = await runs.all({calls!r})
            return [[r.key, r.state, r.ok, r.output] for r in results]
        """,
    )


def on_a_terminal(
    *args: str,
    stdout_too: bool = True,
    columns: int = 80,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run the CLI (``python -m pisub ARGS``) with stderr — and, with ``stdout_too``, stdout — on a
    pseudo-terminal ``columns`` wide; its exit code and what the terminal got (CRLF made LF)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pisub", *args],
        stdout=slave if stdout_too else subprocess.DEVNULL,
        stderr=slave,
        env=env if env is not None else dict(os.environ),
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"pisub {' '.join(args)} still ran after {timeout:g}s: {seen!r}"
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break  # the terminal closed: the command exited
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=10), seen.decode("utf-8", "replace").replace("\r\n", "\n")
