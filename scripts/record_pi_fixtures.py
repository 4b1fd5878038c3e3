#!/usr/bin/env python3
"""Re-record ``fixtures/pi/*.jsonl``: raw stdout of the real pi CLI talking to the fake model server.

Usage::

    scripts/install_pi.sh all                  # once; installs the pinned pi versions into .pi-cli/
    python3 scripts/record_pi_fixtures.py      # all, with the default pi, into fixtures/pi/<version>/
    python3 scripts/record_pi_fixtures.py --pi .pi-cli/0.85.1/bin/pi
    python3 scripts/record_pi_fixtures.py rpc-steer json-plain --out /tmp/fx

Each recording runs in a fresh temporary directory ``<tmp>/<name>/`` holding ``agent/`` (the
``PI_CODING_AGENT_DIR`` written by :func:`pisub.testing.fake_model.write_pi_agent_dir`), ``work/``
(pi's cwd) and ``session.jsonl`` (passed with ``--session``). The JSON files are pi's stdout byte
for byte; timings and other observations go to stderr. The script checks each recording for the
events it is meant to show and exits 1 if one is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _load_fake_model() -> ModuleType:
    """Import pisub.testing.fake_model; if the pisub package itself cannot be imported (its
    dependencies are missing or it is mid-edit), load the stdlib-only file directly."""
    try:
        from pisub.testing import fake_model as module
    except Exception as exc:
        path = ROOT / "pisub" / "testing" / "fake_model.py"
        spec = importlib.util.spec_from_file_location("_pisub_fake_model", path)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        print(f"note: importing pisub failed ({exc!r}); loaded {path} directly", file=sys.stderr)
    return module


if TYPE_CHECKING:
    from pisub.testing import fake_model
else:
    fake_model = _load_fake_model()

FakeModelServer = fake_model.FakeModelServer
PI_HERMETIC_ARGS = fake_model.PI_HERMETIC_ARGS
pi_env = fake_model.pi_env
write_pi_agent_dir = fake_model.write_pi_agent_dir

FIXTURES: Final = ROOT / "fixtures" / "pi"


def _default_pi() -> Path:
    """The launcher of the default pin (the first of scripts/pi-pins.sh)."""
    import re

    pins = (ROOT / "scripts" / "pi-pins.sh").read_text()
    match = re.search(r'"@[^"]+@(\d+\.\d+\.\d+)"', pins)
    return ROOT / ".pi-cli" / (match[1] if match else "?") / "bin" / "pi"


TIMEOUT: Final = 60.0

Msg = dict[str, Any]


class RecordingError(Exception):
    """A recording did not show what it is meant to show."""


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise RecordingError(what)


@dataclass(frozen=True)
class Recording:
    name: str
    mode: str  # "json" or "rpc"
    prompt: str
    action: str | None = None  # rpc only: "steer" or "abort"
    steer_text: str = "STEER: now say hi"


RECORDINGS: Final[tuple[Recording, ...]] = (
    Recording("json-plain", "json", "hello"),
    Recording("json-toolcall", "json", "please run TOOL: echo hi"),
    Recording("json-error500", "json", "ERROR500 please"),
    Recording("rpc-plain", "rpc", "hello"),
    Recording("rpc-toolcall", "rpc", "please run TOOL: echo hi"),
    Recording("rpc-error500", "rpc", "ERROR500 please"),
    Recording("rpc-steer", "rpc", "SLOW:8 tell me a story", action="steer"),
    Recording("rpc-abort", "rpc", "SLOW tell me a long story", action="abort"),
)


@dataclass
class Result:
    stdout: bytes
    stderr: bytes
    returncode: int
    notes: dict[str, object] = field(default_factory=dict)


def _parse_lines(data: bytes) -> list[Msg]:
    out: list[Msg] = []
    for raw in data.split(b"\n"):
        if raw.strip():
            obj = json.loads(raw)
            expect(isinstance(obj, dict), f"non-object line: {raw[:80]!r}")
            out.append(obj)
    return out


def _workspace(base: Path, name: str, base_url: str) -> tuple[Path, Path, Path, dict[str, str]]:
    tmp = base / name
    agent, work = tmp / "agent", tmp / "work"
    work.mkdir(parents=True)
    write_pi_agent_dir(agent, base_url)
    env = {**os.environ, **pi_env(agent)}
    return agent, work, tmp / "session.jsonl", env


# --------------------------------------------------------------------------- json mode


def record_json(pi: Path, rec: Recording, base: Path, base_url: str) -> Result:
    _agent, work, session, env = _workspace(base, rec.name, base_url)
    argv = [str(pi), "--mode", "json", *PI_HERMETIC_ARGS, "--session", str(session), "-p", rec.prompt]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr = bytearray()
    err_thread = threading.Thread(target=lambda s=proc.stderr: stderr.extend(s.read()), daemon=True)
    err_thread.start()
    # Read everything through the same buffered reader: proc.communicate() after readline() would
    # bypass the reader's buffer and silently drop lines that arrived together with the first one.
    first = proc.stdout.readline()
    t_first = time.monotonic() - t0
    out = first + proc.stdout.read()
    proc.wait(timeout=TIMEOUT)
    t_exit = time.monotonic() - t0
    err_thread.join(TIMEOUT)
    err = bytes(stderr)
    msgs = _parse_lines(out)
    expect(msgs[0].get("type") == "session", "first line is the session header")
    # 0.80.4 and later end with agent_settled after agent_end
    expect(msgs[-1].get("type") in ("agent_end", "agent_settled"), "last line is agent_end or agent_settled")
    expect([m.get("type") for m in msgs[1:3]] == ["agent_start", "turn_start"], "agent_start, turn_start")
    return Result(
        out,
        err,
        proc.returncode,
        {
            "first_line_s": round(t_first, 3),
            "exit_s": round(t_exit, 3),
            "session_file_exists": session.exists(),
        },
    )


# --------------------------------------------------------------------------- rpc mode


class RpcPi:
    """Minimal RPC driver: LF framing, every stdout line kept raw, waits that look at all lines so far."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self.raw: list[bytes] = []
        self.msgs: list[Msg] = []
        self.stderr = bytearray()
        self._cond = threading.Condition()
        self._eof = False
        self._out_thread = threading.Thread(target=self._read_stdout, args=(self.proc.stdout,), daemon=True)
        self._err_thread = threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True)
        self._out_thread.start()
        self._err_thread.start()

    def _read_stdout(self, stream: IO[bytes]) -> None:
        for line in stream:  # binary iteration splits on b"\n" only
            msg = json.loads(line)
            with self._cond:
                self.raw.append(line)
                self.msgs.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _read_stderr(self, stream: IO[bytes]) -> None:
        self.stderr += stream.read()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def send(self, obj: Msg) -> int:
        """Write one command; returns the number of stdout lines seen before it."""
        with self._cond:
            mark = len(self.msgs)
        self.stdin.write(json.dumps(obj).encode() + b"\n")
        self.stdin.flush()
        return mark

    def wait_for(self, pred: Callable[[Msg], bool], what: str, since: int = 0) -> Msg:
        deadline = time.monotonic() + TIMEOUT
        with self._cond:
            i = since
            while True:
                while i < len(self.msgs):
                    if pred(self.msgs[i]):
                        return self.msgs[i]
                    i += 1
                remaining = deadline - time.monotonic()
                if self._eof or remaining <= 0:
                    raise RecordingError(f"timed out / EOF waiting for {what}")
                self._cond.wait(remaining)

    def response(self, cmd_id: str, since: int = 0) -> Msg:
        msg = self.wait_for(lambda m: m.get("type") == "response" and m.get("id") == cmd_id, cmd_id, since)
        expect(msg.get("success") is True, f"{cmd_id} succeeded: {msg}")
        return msg

    def close(self) -> tuple[int, float]:
        """Close stdin, wait for exit; returns (returncode, seconds from close to exit)."""
        t = time.monotonic()
        self.stdin.close()
        rc = self.proc.wait(timeout=TIMEOUT)
        took = time.monotonic() - t
        self._out_thread.join(TIMEOUT)
        self._err_thread.join(TIMEOUT)
        return rc, took

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def record_rpc(pi: Path, rec: Recording, base: Path, base_url: str) -> Result:
    _agent, work, session, env = _workspace(base, rec.name, base_url)
    argv = [str(pi), "--mode", "rpc", *PI_HERMETIC_ARGS, "--session", str(session)]
    rpc = RpcPi(argv, work, env)
    notes: dict[str, object] = {}
    try:
        rpc.send({"id": "s0", "type": "get_state"})
        state0 = rpc.response("s0")
        notes["ready_s"] = round(rpc.elapsed(), 3)
        notes["session_file_named"] = state0["data"].get("sessionFile") == str(session)
        rpc.send({"id": "r1", "type": "set_auto_retry", "enabled": False})
        rpc.response("r1")

        mark = rpc.send({"id": "p1", "type": "prompt", "message": rec.prompt})
        rpc.response("p1", mark)

        if rec.action == "steer":
            rpc.send({"id": "st1", "type": "steer", "message": rec.steer_text})
            rpc.wait_for(
                lambda m: m.get("type") == "queue_update" and rec.steer_text in m.get("steering", []),
                "queue_update listing the steer",
                mark,
            )
            rpc.response("st1", mark)
        elif rec.action == "abort":
            rpc.wait_for(
                lambda m: (
                    m.get("type") == "message_update"
                    and m["assistantMessageEvent"].get("type") == "text_delta"
                ),
                "first text_delta",
                mark,
            )
            t_abort = rpc.elapsed()
            rpc.send({"id": "a1", "type": "abort"})
            rpc.response("a1", mark)
            notes["abort_to_response_s"] = round(rpc.elapsed() - t_abort, 3)

        rpc.wait_for(lambda m: m.get("type") == "agent_end", "agent_end", mark)
        notes["agent_end_s"] = round(rpc.elapsed(), 3)
        for attempt in range(1, 51):
            sid = f"s{attempt}"
            rpc.send({"id": sid, "type": "get_state"})
            data = rpc.response(sid)["data"]
            if data["isStreaming"] is False and data["pendingMessageCount"] == 0:
                break
            time.sleep(0.1)
        else:
            raise RecordingError("pi never became idle")
        notes["session_file_exists_before_close"] = session.exists()
        rc, exit_s = rpc.close()
        notes["exit_after_stdin_close_s"] = round(exit_s, 3)
    finally:
        rpc.kill()
    return Result(b"".join(rpc.raw), bytes(rpc.stderr), rc, notes)


# --------------------------------------------------------------------------- checks


def _events(msgs: list[Msg], kind: str) -> list[Msg]:
    return [m for m in msgs if m.get("type") == kind]


def _assistant_ends(msgs: list[Msg]) -> list[Msg]:
    return [m for m in _events(msgs, "message_end") if m["message"].get("role") == "assistant"]


def check(rec: Recording, result: Result) -> None:
    expect(result.returncode == 0, f"exit code 0 (got {result.returncode})")
    msgs = _parse_lines(result.stdout)
    ends = _assistant_ends(msgs)
    expect(bool(ends), "an assistant message_end")
    last = ends[-1]["message"]
    expect(len(_events(msgs, "agent_end")) == 1, "exactly one agent_end")
    expect(len(_events(msgs, "agent_start")) == 1, "exactly one agent_start")
    users = [m for m in _events(msgs, "message_end") if m["message"].get("role") == "user"]
    expect(
        bool(users) and users[0]["message"]["content"][0]["text"] == rec.prompt, "the prompt's message_end"
    )
    if "ERROR500" in rec.prompt:
        expect(last.get("stopReason") == "error", "stopReason error")
        # 0.73.1: "500 fake server error"; 0.85 and later: "500: <the raw body>"
        expect("fake server error" in str(last.get("errorMessage")), "errorMessage naming the server's error")
    elif "TOOL:" in rec.prompt:
        expect(len(_events(msgs, "tool_execution_end")) == 1, "one tool_execution_end")
        expect(last["content"][0]["text"] == "Tool said: hi", "final text 'Tool said: hi'")
    elif rec.action == "steer":
        expect(bool(_events(msgs, "queue_update")), "a queue_update")
        user_texts = [
            m["message"]["content"][0]["text"]
            for m in _events(msgs, "message_end")
            if m["message"].get("role") == "user"
        ]
        expect(rec.steer_text in user_texts, "the steer's user message_end")
        expect(last["content"][0]["text"].endswith(rec.steer_text), "final reply answers the steer")
    elif rec.action == "abort":
        expect(last.get("stopReason") == "aborted", "stopReason aborted")
    else:
        expect(last["content"][0]["text"] == "Hello from the fake LLM. You said: hello", "plain reply")


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="recordings to make (default: all)")
    parser.add_argument(
        "--pi", type=Path, default=Path(os.environ.get("PI_BIN", _default_pi())), help="pi binary"
    )
    parser.add_argument("--out", type=Path, help="output folder (default: fixtures/pi/<pi's version>)")
    parser.add_argument("--slow-delay", type=float, default=0.25, help="seconds between SLOW chunks")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the temporary folders")
    args = parser.parse_args(argv)

    by_name = {r.name: r for r in RECORDINGS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown recording(s) {unknown}; known: {sorted(by_name)}")
    selected = [by_name[n] for n in args.names] if args.names else list(RECORDINGS)
    if not args.pi.exists():
        parser.error(f"pi not found at {args.pi}; run scripts/install_pi.sh")
    version = subprocess.run(
        [str(args.pi), "--version"], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    got = (version.stdout + version.stderr).strip()  # pi 0.73.1 prints its version on stderr
    if args.out is None:
        args.out = FIXTURES / got
    args.out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="pi-fixtures-"))
    failed = 0
    try:
        with FakeModelServer(slow_delay=args.slow_delay) as server:
            for rec in selected:
                record = record_json if rec.mode == "json" else record_rpc
                try:
                    result = record(args.pi, rec, base, server.base_url)
                    check(rec, result)
                except (RecordingError, subprocess.TimeoutExpired, KeyError, IndexError, ValueError) as exc:
                    failed += 1
                    print(f"FAILED {rec.name}: {exc}", file=sys.stderr)
                    continue
                (args.out / f"{rec.name}.jsonl").write_bytes(result.stdout)
                lines = result.stdout.count(b"\n")
                print(f"{rec.name}: {lines} lines, rc={result.returncode}, {result.notes}", file=sys.stderr)
                if result.stderr.strip():
                    print(f"  pi stderr: {result.stderr.decode(errors='replace').strip()}", file=sys.stderr)
    finally:
        if args.keep_tmp:
            print(f"temporary folders kept in {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
