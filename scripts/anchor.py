"""The original pi-subagents 0.67.0, driven as a user drives it, for ``scripts/bench.py --only
anchor``: one parent ``pi --mode rpc -e <pi-subagents>/index.ts`` (pi 0.85.1, the only pi the
original supports), whose scripted model (pisub.testing.fake_model's ``CALLS:``) calls the
``subagent`` tool with an async ``workflowScript`` that fans ``runs.all`` out to N children.

The package is installed from npm (``npm install pi-subagents@0.67.0``) once into a cache folder
outside the repository (``$XDG_CACHE_HOME/pisub-bench``, else ``~/.cache/pisub-bench``), never
into the checkout. Nothing here is imported by pisub.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

VERSION = "0.67.0"
PI_VERSION = "0.85.1"
CHILD_MARK = "ANCHOR-CHILD"
"""In every child's task: tells the children's model requests from the parent's."""


class Unavailable(Exception):
    """The original cannot be run here (the reason is the message, one line)."""


class Busy(Unavailable):
    """The parent pi refused a prompt: it is in a turn (a completion notice woke it)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pisub-bench" / f"pi-subagents-{VERSION}"


def install() -> Path:
    """The installed package's folder (``…/node_modules/pi-subagents``), installed if missing."""
    folder = cache_dir()
    package = folder / "node_modules" / "pi-subagents"
    if (package / "index.ts").exists():
        return package
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not installed: the original pi-subagents cannot be installed")
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            npm,
            "--no-update-notifier",
            "install",
            "--prefix",
            str(folder),
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--legacy-peer-deps",  # its peers (pi's packages) are the host pi's own
            f"pi-subagents@{VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0 or not (package / "index.ts").exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        raise Unavailable(f"npm install pi-subagents@{VERSION} failed: {tail[0]}")
    return package


AGENT = """---
name: bench
description: A benchmark child.
tools: read, bash
---
You are a benchmark agent: answer the task.
"""


def workflow_script(n: int, task: str) -> str:
    """The seed's workflowScript body: ``runs.all`` of ``n`` children of agent ``bench``."""
    return (
        f"const calls = Array.from({{ length: {n} }}, (_, i) => "
        f"({{ key: 'c' + i, agent: 'bench', task: {json.dumps(task)} }}));\n"
        "const results = await runs.all(calls);\n"
        "return results.length;\n"
    )


def prompt(n: int, task: str) -> str:
    """The parent's prompt: the scripted model answers it with one ``subagent`` tool call."""
    args = {"workflowScript": workflow_script(n, task), "async": True}
    return "CALLS:" + json.dumps([["subagent", args]])


def stop_prompt(run_id: str) -> str:
    """The parent's prompt that stops a run: its ``subagent`` tool's ``stop`` action."""
    return "CALLS:" + json.dumps([["subagent", {"action": "stop", "id": run_id}]])


class Parent:
    """One parent pi in RPC mode with the original loaded; its events read by a thread."""

    def __init__(self, pi_bin: str, package: Path, agent_dir: Path, cwd: Path, env: dict[str, str]) -> None:
        (agent_dir / "agents").mkdir(parents=True, exist_ok=True)
        (agent_dir / "agents" / "bench.md").write_text(AGENT)
        self.proc = subprocess.Popen(
            [
                pi_bin,
                "--mode",
                "rpc",
                "--no-skills",
                "--no-prompt-templates",
                "-e",
                str(package / "index.ts"),
            ],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.lock = threading.Condition()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.events.append((time.perf_counter(), event))
                self.lock.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace"))
            del self.stderr[:-50]

    def send(self, command: dict[str, Any]) -> str:
        ident = command.setdefault("id", uuid.uuid4().hex[:8])
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()
        return str(ident)

    def wait_event(self, match: Any, timeout: float, since: int = 0) -> tuple[float, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                for at, event in self.events[since:]:
                    if match(event):
                        return at, event
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    why = "exited" if self.proc.poll() is not None else f"no such event in {timeout:g} s"
                    err = "".join(self.stderr[-5:]).strip().replace("\n", " | ")[-400:]
                    raise Unavailable(f"the original's parent pi: {why} ({err or 'no stderr'})")
                self.lock.wait(left)

    def call(self, command: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        since = len(self.events)
        ident = self.send(command)
        _, event = self.wait_event(
            lambda e: e.get("type") == "response" and e.get("id") == ident, timeout, since
        )
        if not event.get("success", False):
            if "already processing" in str(event.get("error")):
                raise Busy(str(event.get("error")))
            raise Unavailable(f"the original's parent pi refused {command.get('type')}: {event.get('error')}")
        return event

    def prompt(self, message: str) -> tuple[float, int]:
        """Prompt the parent once it is idle (a completion notice of an earlier fan-out may
        have started a turn): the ``perf_counter`` time it was sent, and the event index."""
        for _ in range(20):
            self.wait_idle(120)
            since, start = len(self.events), time.perf_counter()
            try:
                self.call({"type": "prompt", "message": message})
            except Busy:
                continue
            return start, since
        raise Unavailable("the original's parent pi stayed busy")

    def wait_idle(self, timeout: float) -> None:
        """Until the parent is not streaming (a completion notice may have started a turn)."""
        deadline = time.monotonic() + timeout
        while self.call({"type": "get_state"}).get("data", {}).get("isStreaming"):
            if time.monotonic() >= deadline:
                raise Unavailable(f"the original's parent pi still busy after {timeout:g} s")
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            with_suppress_kill(self.proc.pid)
        self.proc.wait(timeout=30)


def with_suppress_kill(pid: int) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def runs_root(temp_root: Path) -> Path:
    return temp_root / "async-subagent-runs"


def run_dirs(temp_root: Path) -> set[str]:
    try:
        return set(os.listdir(runs_root(temp_root)))
    except FileNotFoundError:
        return set()


def status_of(temp_root: Path, run_id: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads((runs_root(temp_root) / run_id / "status.json").read_bytes()))
    except (OSError, ValueError):
        return None
