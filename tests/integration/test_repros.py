"""Issue 10 (hardening): one test per repro and per "Also found" item, asserting the fixed behaviour.

Each test names what it proves and cites its repro. Repro 2 (a root-owned request in an ordinary
user's run) is covered elsewhere. Everything runs for real: runners, children, signals, files;
the clock steps and the full disk need root and are skipped without it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.core.redact import redact
from pisub.protocol import encode_pretty
from pisub.protocol.control import ReceiptState
from pisub.store.results import make_result
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import ROOT, AgentMaker, pid_alive, pisub_cli, processes_of, wait_for
from tests.helpers import (
    drop_request,
    launch_sleeper,
    run_events,
    run_receipts,
    sent_with,
    wait_runner_dead,
)

GITHUB_TOKEN = "ghp_" + "Zq7x" * 9
OPENAI_KEY = "sk-" + "Ab3d" * 8
ONE_LINE_ERROR = re.compile(r"pisub: .+ \[[A-Z_]+\]")


# -- helpers -------------------------------------------------------------------------------


def _runner_pid(run: pisub.Run) -> int:
    pid = run.status().pid
    assert pid is not None
    return pid


def _assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    """No traceback: at most one line on stderr, and a failure is the one documented line."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 1, proc.stderr
    if proc.returncode != 0 and lines:
        assert ONE_LINE_ERROR.fullmatch(lines[0]), lines[0]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``pisub_cli`` where a hang past ``timeout`` is a test failure, not a stuck suite."""
    try:
        return pisub_cli(*args, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pisub {' '.join(args)} hung for more than {timeout:g}s")


def _alive_or_fail(run: pisub.Run, runner: int) -> None:
    if not pid_alive(runner):
        log = (run.dir / "runner.log").read_bytes().decode("utf-8", "replace")[-3000:]
        pytest.fail(f"the runner died; runner.log ends with:\n{log}")


@contextlib.contextmanager
def _frozen(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def _clock_stepped(offset: float) -> Iterator[None]:
    """Step the wall clock by ``offset`` seconds; step it back (plus the time spent) afterwards."""
    if os.geteuid() != 0:
        pytest.skip("stepping the wall clock needs root")
    real = time.clock_gettime(time.CLOCK_REALTIME)
    mono = time.monotonic()
    try:
        time.clock_settime(time.CLOCK_REALTIME, real + offset)
    except OSError as exc:
        pytest.skip(f"cannot step the wall clock: {exc}")
    try:
        yield
    finally:
        time.clock_settime(time.CLOCK_REALTIME, real + (time.monotonic() - mono))


# A stand-in for ``pi --mode rpc``: answers every command, writes its session file, and on each
# prompt prints the lines of $FAKE_PI_HOSTILE (raw) before a normal answer and ``agent_end``.
FAKE_PI = """
import json, os, sys
argv = sys.argv[1:]
if argv == ["--version"]:  # a supported version, as the launcher checks
    print("1.6.0")
    sys.exit(0)
session = argv[argv.index("--session") + 1]
hostile = os.environ.get("FAKE_PI_HOSTILE")

def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()

for raw in sys.stdin:
    cmd = json.loads(raw)
    kind = cmd.get("type")
    data = {"isStreaming": False, "pendingMessageCount": 0} if kind == "get_state" else None
    emit({"type": "response", "id": cmd.get("id"), "command": kind, "success": True, "data": data})
    if kind != "prompt":
        continue
    text = cmd["message"]
    with open(session, "a") as fh:
        fh.write(json.dumps({"type": "message", "role": "user", "text": text}) + "\\n")
    emit({"type": "agent_start"})
    emit({"type": "message_end", "message": {"role": "user", "content": [{"type": "text", "text": text}]}})
    if hostile:
        with open(hostile, "rb") as fh:
            sys.stdout.write(fh.read().decode())
        sys.stdout.flush()
    answer = {"type": "text", "text": "done: " + text}
    emit({"type": "message_end", "message": {"role": "assistant", "content": [answer], "stopReason": "stop"}})
    emit({"type": "agent_end"})
"""


@pytest.fixture
def fake_pi(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An agent ``fakepi`` (runner ``pi``) whose pi is the scripted stand-in above."""
    script = tmp_path / "fake-pi"
    script.write_text(f"#!{sys.executable}\n" + FAKE_PI)
    script.chmod(0o755)
    monkeypatch.setenv("PISUB_PI_BIN", str(script))
    agents = home / "agents"
    agents.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(home, 0o700)
    (agents / "fakepi.md").write_text(
        "---\nname: fakepi\nrunner: pi\ndescription: scripted\n---\nBe terse.\n"
    )
    return script


# -- the repros ------------------------------------------------------------------------------


def test_directory_named_json_in_inbox_is_rejected_and_the_stop_still_works(
    home: Path, make_agent: AgentMaker
) -> None:
    """Repro 1: ``mkdir inbox/new/x.json; pisub stop RUN; pisub status RUN``."""
    run = launch_sleeper(make_agent)
    (run.dir / "inbox" / "new" / "x.json").mkdir()
    stop = _cli("stop", run.id, "--json", "--wait", "10")
    _assert_no_traceback(stop)
    assert stop.returncode == 0 and json.loads(stop.stdout)["state"] == "delivered", stop.stdout
    assert run.wait(timeout=30).state == "stopped"
    rejected = run_receipts(run.dir)["x"]
    assert rejected["state"] == "rejected" and rejected["reason"], rejected
    assert not (run.dir / "inbox" / "new" / "x.json").exists()
    status = _cli("status", run.id, "--json")
    _assert_no_traceback(status)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "stopped"
    listed = _cli("list", "--json")
    _assert_no_traceback(listed)
    assert listed.returncode == 0 and run.id in listed.stdout


def test_kill9_mid_scan_leaves_no_rejected_request_without_a_receipt(
    home: Path, make_agent: AgentMaker
) -> None:
    """Repro 3: freeze the runner, drop 2,000 requests (every other one invalid), thaw, kill -9
    it in the middle of the scan; after the repair every request, rejected ones included, has its
    receipt and nothing sits in ``inbox/rejected`` without one."""
    run = launch_sleeper(make_agent)
    runner = _runner_pid(run)
    names = [f"r-{n:04d}" for n in range(2000)]
    with _frozen(runner):
        for n, name in enumerate(names):
            data = b'{"v":1,"type":"steer","message":"m"}' if n % 2 == 0 else b"{"
            drop_request(run.dir, f"{name}.json", data)
    rejected, new = run.dir / "inbox" / "rejected", run.dir / "inbox" / "new"
    wait_for(
        lambda: len(os.listdir(rejected)) >= 40 or not os.listdir(new),
        interval=0.001,
        what="the scan to be under way",
    )
    os.kill(runner, signal.SIGKILL)
    wait_runner_dead(run, runner)
    status = _cli("status", run.id, "--json")
    _assert_no_traceback(status)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "failed"
    receipts = run_receipts(run.dir)
    missing = [name for name in names if name not in receipts]
    assert not missing, f"{len(missing)} requests have no receipt, e.g. {missing[:5]}"
    for n, name in enumerate(names):
        if n % 2:
            assert receipts[name]["state"] == "rejected", receipts[name]
    for entry in os.listdir(rejected):
        if entry.endswith(".json"):
            rid = entry[: -len(".json")].split("~")[0]
            assert rid in receipts, f"inbox/rejected/{entry} has no receipt"


def test_request_file_name_at_the_255_byte_limit_is_rejected_and_the_runner_lives(
    home: Path, make_agent: AgentMaker
) -> None:
    """Repro 4: a 255-byte request file name (ENAMETOOLONG for any name derived from it) is
    rejected as ``invalid-<hash>``; the request rejected in the same scan keeps its receipt."""
    run = launch_sleeper(make_agent)
    runner = _runner_pid(run)
    long_name = "b" * 250 + ".json"
    long_id = "invalid-" + hashlib.sha256(long_name.encode()).hexdigest()[:16]
    with _frozen(runner):
        drop_request(run.dir, "a-bad.json", b"{")
        drop_request(run.dir, long_name, b'{"v":1,"type":"stop"}')

    def answered() -> bool:
        _alive_or_fail(run, runner)
        return {"a-bad", long_id} <= set(run_receipts(run.dir))

    wait_for(answered, what="both receipts")
    receipts = run_receipts(run.dir)
    assert receipts[long_id]["state"] == "rejected" and receipts["a-bad"]["state"] == "rejected"
    assert not (run.dir / "inbox" / "new" / long_name).exists()
    assert run.status().state == "running"
    stop = _cli("stop", run.id, "--json")
    assert stop.returncode == 0, stop.stderr
    assert run.wait(timeout=30).state == "stopped"


def _fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; its path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


def _end_processes(root: Path) -> None:
    import psutil

    procs = []
    for pid in processes_of(root):
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)


@pytest.mark.root  # a tmpfs mount
def test_full_disk_keeps_the_runner_supervising_and_the_cli_fails_in_one_line(
    home: Path, make_agent: AgentMaker
) -> None:
    """Repro 5: PISUB_HOME on a full 4 MiB tmpfs. ``pisub steer`` fails in one ``IO_ERROR`` line
    and leaves no temp file; the runner, failing to write a receipt, lives on, ends its child at
    ``--timeout``, says in runner.log what it could not write, and the run ends once space is free."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
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
        make_agent("sleepy", command="sleep", args=["600"])
        run = pisub.launch("sleepy", "x", timeout=3)
        child = wait_for(lambda: run.status().steps[0].pid)
        runner = _runner_pid(run)
        with _frozen(runner):
            drop_request(run.dir, "by-hand.json", b'{"v":1,"type":"steer","message":"hello"}')
            filler = _fill(home)
            steer = _cli("stop", run.id, "--wait", "1")  # an external CLI takes a stop, not a steer
            _assert_no_traceback(steer)
            assert steer.returncode == 1 and "[IO_ERROR]" in steer.stderr, steer.stderr
            assert not os.listdir(run.dir / "inbox" / "tmp"), "a temp file was left in inbox/tmp"
        wait_for(lambda: not pid_alive(child), timeout=12, what="the child to be ended at --timeout")
        log = run.dir / "runner.log"
        wait_for(
            lambda: b"No space left" in log.read_bytes() or b"ENOSPC" in log.read_bytes(),
            timeout=5,
            what="runner.log to say what could not be written",
        )
        status = _cli("status", run.id)
        _assert_no_traceback(status)
        filler.unlink()
        final = wait_for(
            lambda: (st := run.status()).state.is_terminal and st, timeout=20, what="the run to end"
        )
        assert final.state == "failed"
        receipt = run.receipt("by-hand")
        assert receipt is not None and receipt.state.is_final
    finally:
        _end_processes(home)
        if subprocess.run(["umount", str(home)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(home)], capture_output=True, check=False)


@pytest.mark.pi
@pytest.mark.root  # the wall clock is the machine's: stepped alone
@pytest.mark.serial
def test_live_lease_owner_is_not_reclaimed_after_the_wall_clock_steps(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    """Repro 6: a resume that drives a session holds its lease; after the wall clock steps forward
    an hour, a second ``pisub resume`` of the same session is refused (one line) and the live
    owner keeps its lease."""
    source = pisub.launch("pi", "hello")
    assert source.wait(timeout=60).state == "complete"
    driver = pisub.resume(source.id, "SLOW:150 keep going")
    (record,) = (pi_home / "leases").glob("*.json")
    assert json.loads(record.read_bytes())["runId"] == driver.id
    with _clock_stepped(3600):
        second = _cli("resume", source.id, "a second driver", timeout=60)
    _assert_no_traceback(second)
    assert second.returncode != 0, f"a second run took the live lease: {second.stdout}"
    assert json.loads(record.read_bytes())["runId"] == driver.id
    assert driver.status().state == "running"


def test_hostile_pi_events_never_kill_the_runner(
    home: Path, fake_pi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 7: pi's stdout carries a tool call whose arguments nest 5,000 levels deep, one at
    1,000 levels, and events of the wrong shape (``"text": 5``, ``"steering": 5``,
    ``"args": [[[...]]]``); the run goes on and completes."""
    deep = "[" * 5000 + "]" * 5000
    lines = [
        '{"type":"tool_execution_start","toolCallId":"t1","toolName":"bash","args":{"command":' + deep + "}}",
        '{"type":"tool_execution_start","toolCallId":"t2","toolName":"bash","args":'
        + "[" * 1000
        + "]" * 1000
        + "}",
        '{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":5}]}}',
        '{"type":"queue_update","steering":5,"followUp":7}',
        '{"type":"tool_execution_start","toolCallId":"t3","toolName":{"x":1},"args":[[[[1]]]]}',
        '{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":[1]}]}}',
        '{"type":"message_end","message":5}',
        '{"type":"turn_start","x":' + deep + "}",
    ]
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("FAKE_PI_HOSTILE", str(hostile))
    run = pisub.launch("fakepi", "survive this")
    result = run.wait(timeout=30)
    assert result.state == "complete", result.content[0].text
    output = result.details.results[0].output or ""
    assert output.startswith("done: survive this")  # the fake pi echoes the task (and its acceptance section)
    assert b"Traceback" not in (run.dir / "runner.log").read_bytes()


def test_symlinked_receipt_does_not_block_crash_repair_or_list(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    """Repro 8: a symlink planted at ``outbox/x.json``, then kill -9 of the runner: the next
    ``status`` repairs the run and ``list`` still shows every run."""
    make_agent("quick", python="print('done')")
    other = pisub.launch("quick", "x")
    other.wait(timeout=30)
    run = launch_sleeper(make_agent)
    planted = tmp_path / "planted.json"
    planted.write_text("{}")
    os.symlink(planted, run.dir / "outbox" / "x.json")
    runner = _runner_pid(run)
    os.kill(runner, signal.SIGKILL)
    wait_runner_dead(run, runner)
    status = _cli("status", run.id, "--json")
    _assert_no_traceback(status)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "failed"
    assert [e["type"] for e in run_events(run.dir)].count("run.repaired") == 1
    listed = _cli("list", "--json")
    _assert_no_traceback(listed)
    assert listed.returncode == 0
    assert {json.loads(line)["runId"] for line in listed.stdout.splitlines()} == {run.id, other.id}


def test_fifo_in_place_of_status_json_hangs_no_command(home: Path, make_agent: AgentMaker) -> None:
    """Repro 9: a FIFO in place of ``status.json``: ``status``, ``list``, ``doctor`` and ``gc``
    each return (one line at most on stderr, no traceback) instead of blocking for ever."""
    make_agent("quick", python="print('done')")
    healthy = pisub.launch("quick", "x")
    healthy.wait(timeout=30)
    run = pisub.launch("quick", "y")
    run.wait(timeout=30)
    os.unlink(run.dir / "status.json")
    os.mkfifo(run.dir / "status.json", 0o600)
    status = _cli("status", run.id, timeout=10)
    _assert_no_traceback(status)
    assert status.returncode != 0
    listed = _cli("list", "--json", timeout=10)
    _assert_no_traceback(listed)
    assert listed.returncode == 0 and healthy.id in listed.stdout
    doctor = _cli("doctor", timeout=30)
    assert "Traceback" not in doctor.stderr and doctor.returncode in (0, 1), doctor.stderr
    gc = _cli("gc", "--older-than", "0s", timeout=10)
    _assert_no_traceback(gc)
    assert gc.returncode == 0


def test_status_error_message_is_redacted_everywhere_it_is_shown(home: Path, make_agent: AgentMaker) -> None:
    """Repro 10: a child that writes ``GITHUB_TOKEN=ghp_...`` to stderr and fails: the token is in
    neither ``status.json`` nor ``pisub status``, ``status --json`` or ``list --json``."""
    make_agent("leaky", python=f"import sys; sys.stderr.write('GITHUB_TOKEN={GITHUB_TOKEN}\\n'); sys.exit(3)")
    run = pisub.launch("leaky", "x")
    assert run.wait(timeout=30).state == "failed"
    assert GITHUB_TOKEN in (run.dir / "stderr-0.log").read_text(), "the raw log stays raw"
    on_disk = json.loads((run.dir / "status.json").read_bytes())
    assert on_disk["error"]["code"] == "SUBAGENT_FAILED"
    assert GITHUB_TOKEN not in (run.dir / "status.json").read_text()
    for args in (("status", run.id), ("status", run.id, "--json"), ("list", "--json")):
        proc = _cli(*args)
        assert proc.returncode == 0, proc.stderr
        assert GITHUB_TOKEN not in proc.stdout, f"pisub {' '.join(args)} printed the token"


def test_receipt_reasons_are_redacted(home: Path, make_agent: AgentMaker) -> None:
    """Repro 11: an unknown field named ``OPENAI_API_KEY=sk-...`` and a file named
    ``GITHUB_TOKEN=ghp_....json`` are rejected without quoting the secrets in their receipts."""
    run = launch_sleeper(make_agent)
    field = f"OPENAI_API_KEY={OPENAI_KEY}"
    drop_request(run.dir, "unknown-field.json", json.dumps({"v": 1, "type": "stop", field: 1}).encode())
    bad_name = f"GITHUB_TOKEN={GITHUB_TOKEN}.json"
    drop_request(run.dir, bad_name, b'{"v":1,"type":"stop"}')
    name_id = "invalid-" + hashlib.sha256(bad_name.encode()).hexdigest()[:16]
    wait_for(lambda: {"unknown-field", name_id} <= set(run_receipts(run.dir)), what="both receipts")
    receipts = run_receipts(run.dir)
    assert receipts["unknown-field"]["state"] == "rejected" and receipts[name_id]["state"] == "rejected"
    assert "unknown field" in receipts["unknown-field"]["reason"]
    for path in (run.dir / "outbox").iterdir():
        text = path.read_text()
        assert OPENAI_KEY not in text and GITHUB_TOKEN not in text, f"{path.name}: {text}"
    shown = _cli("status", run.id, "--json")
    assert OPENAI_KEY not in shown.stdout and GITHUB_TOKEN not in shown.stdout
    assert run.status().state == "running"


def _clone_finished_run(run: pisub.Run, count: int) -> list[str]:
    """``count`` copies of a finished run directory under new ids (real files, as a reader sees them)."""
    ids = []
    old = run.id.encode()
    for _ in range(count):
        new_id = str(uuid.uuid4())
        dest = run.dir.parent / new_id
        shutil.copytree(run.dir, dest, symlinks=True)
        for name in ("status.json", "manifest.json", "result.json", "events.jsonl"):
            path = dest / name
            path.write_bytes(path.read_bytes().replace(old, new_id.encode()))
        ids.append(new_id)
    return ids


def test_concurrent_gc_list_and_doctor_never_traceback(home: Path, make_agent: AgentMaker) -> None:
    """Repro 12: two ``gc --older-than 0s`` beside ``list`` and ``doctor`` over 150 finished runs:
    no command tracebacks (a busy gc may refuse in one line), and in the end every run is gone."""
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    _clone_finished_run(run, 150)
    commands = [
        ["gc", "--older-than", "0s"],
        ["gc", "--older-than", "0s"],
        ["list", "--json"],
        ["doctor"],
        ["list"],
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pisub", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for args in commands
    ]
    for args, proc in zip(commands, procs, strict=True):
        try:
            out, errs = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"pisub {' '.join(args)} hung")
        done = subprocess.CompletedProcess(args, proc.returncode, out, errs)
        if args[0] == "gc":
            _assert_no_traceback(done)
        else:  # a run removed under a reader's feet may be reported, one line each
            assert "Traceback" not in errs, errs
            assert all(line.startswith("pisub: ") for line in errs.splitlines()), errs
            assert proc.returncode in ((0,) if args[0] == "list" else (0, 1)), errs
    final = _cli("gc", "--older-than", "0s")
    assert final.returncode == 0, final.stderr
    assert not [n for n in os.listdir(home / "runs") if not n.startswith(".")]


@pytest.mark.pi
def test_abandoned_pause_and_revive_neither_pauses_the_run_later_nor_loses_the_steer(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    """Repro 13: SIGSTOP a pi runner, ``pisub steer RUN ...`` gives up its pause-and-revive; after
    SIGCONT the run is not paused by the interrupt the recovery wrote, the steer is delivered and
    the recovery claim is released. (The recovery's 15 s pause wait is cut to 1.5 s for speed.)"""
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"SLOW:50 story {tag}")
    wait_for(lambda: sent_with(model_server, tag), timeout=30, what="pi to call the model")
    runner = _runner_pid(run)
    steer_text = f"STEER {tag}: now say hi"
    fast = (
        "import sys, pisub.api.revive; pisub.api.revive.PAUSE_TIMEOUT_S = 1.5; "
        "from pisub.cli import main; main()"
    )
    with _frozen(runner):
        proc = subprocess.run(
            [sys.executable, "-c", fast, "steer", run.id, steer_text, "--wait", "0.5"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert "Traceback" not in proc.stderr, proc.stderr
    result = run.wait(timeout=60)
    assert result.state == "complete", f"the run ended {result.state}: {result.content[0].text}"
    assert result.details.results[0].output == f"Hello from the fake LLM. You said: {steer_text}"
    steers = [r for r in run_receipts(run.dir).values() if r["type"] == "steer"]
    assert [r["state"] for r in steers] == ["delivered"], steers
    assert not (run.dir / "recovery" / "claim.json").exists(), "the recovery claim was not released"


@pytest.mark.root  # the wall clock is the machine's: stepped alone
@pytest.mark.serial
def test_hand_written_request_in_a_finished_run_is_answered_after_a_backward_clock_step(
    home: Path, make_agent: AgentMaker
) -> None:
    """Repro 14: the wall clock steps back an hour, a request is written by hand into a finished
    run's inbox; the next ``pisub status`` answers it."""
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    assert run.wait(timeout=30).state == "complete"
    assert (run.dir / "inbox" / "answered").exists()
    with _clock_stepped(-3600):
        drop_request(run.dir, "by-hand.json", b'{"v":1,"type":"follow_up","message":"late"}')
    status = _cli("status", run.id)
    assert status.returncode == 0, status.stderr
    receipt = run.receipt("by-hand")
    assert receipt is not None, "the request written after the clock step was never answered"
    assert receipt.state == "failed" and receipt.reason == "the run finished before the request was consumed"


def test_gc_never_removes_a_run_whose_runner_is_alive_after_writing_its_result(
    home: Path, make_agent: AgentMaker
) -> None:
    """Repro 15: the runner has written ``result.json`` but not yet its terminal status (the window
    is held open by writing the result for it while it runs): ``gc --older-than 0s`` keeps the run."""
    run = launch_sleeper(make_agent)
    runner = _runner_pid(run)
    result = make_result(
        run_id=run.id, state="complete", agent="sleeper", task="x", exit_code=0, output="done"
    )
    tmp = run.dir / ".result.json.test.tmp"
    tmp.write_bytes(encode_pretty(result))
    os.rename(tmp, run.dir / "result.json")
    gc = _cli("gc", "--older-than", "0s")
    _assert_no_traceback(gc)
    assert gc.returncode == 0
    assert run.dir.exists(), "gc removed the directory of a live runner"
    assert f"removed run {run.id}" not in gc.stdout
    assert pid_alive(runner)
    assert json.loads((run.dir / "status.json").read_bytes())["state"] == "running"


# -- Also found --------------------------------------------------------------------------------


def test_rejected_request_files_are_named_after_their_receipt_id(home: Path, make_agent: AgentMaker) -> None:
    """Also found 1: a rejected request lies in ``inbox/rejected/<id>.json`` with its reason in
    ``<id>.reason`` (not ``<name>.json.reason``); a second one of that id gets ``<id>~<6 hex>``."""
    run = launch_sleeper(make_agent)
    rejected = run.dir / "inbox" / "rejected"
    drop_request(run.dir, "bad.json", b"{")
    wait_for(lambda: (rejected / "bad.reason").exists(), timeout=5, what="inbox/rejected/bad.reason")
    assert (rejected / "bad.json").exists()
    drop_request(run.dir, "bad.json", b"{")
    clash = re.compile(r"bad~[0-9a-f]{6}\.json")
    second = wait_for(lambda: [n for n in os.listdir(rejected) if clash.fullmatch(n)], what="the clash")
    assert (rejected / (second[0][: -len(".json")] + ".reason")).exists()
    assert not [n for n in os.listdir(rejected) if n.endswith(".json.reason")]
    assert run_receipts(run.dir)["bad"]["state"] == "rejected"


def test_external_cli_status_shows_the_last_50_output_lines_redacted(
    home: Path, make_agent: AgentMaker
) -> None:
    """Also found 2: ``steps[0].recentOutput`` of an external-cli run holds the last 50 non-empty
    stdout lines, redacted."""
    secret_line = f"GITHUB_TOKEN={GITHUB_TOKEN}"
    make_agent(
        "chatty",
        python=f"""
        for i in range(59):
            print(f"line {{i}}")
        print()
        print({secret_line!r}, flush=True)
        """,
    )
    run = pisub.launch("chatty", "x")
    assert run.wait(timeout=30).state == "complete"
    recent = run.status().steps[0].recent_output
    assert recent == [f"line {i}" for i in range(10, 59)] + [redact(secret_line)]
    assert GITHUB_TOKEN not in json.dumps(recent)


@pytest.mark.pi_versions
@pytest.mark.pi
def test_pi_session_file_is_private_whatever_the_launcher_umask(pi_home: Path) -> None:
    """Also found 3: pi's ``session.jsonl`` is 0600 even when the launcher's umask is 022."""
    old = os.umask(0o022)
    try:
        run = pisub.launch("pi", "hello")
    finally:
        os.umask(old)
    assert run.wait(timeout=60).state == "complete"
    session = run.dir / "session.jsonl"
    assert stat.S_IMODE(os.stat(session).st_mode) == 0o600


def test_interrupted_external_cli_reports_exit_code_143(home: Path, make_agent: AgentMaker) -> None:
    """Also found 4: an interrupted external CLI that SIGTERM killed reports ``exitCode`` 143
    (128 + 15) in both its status and its result."""
    make_agent("sleepy", command="sleep", args=["600"])
    run = pisub.launch("sleepy", "x")
    wait_for(lambda: run.status().steps[0].pid)
    # The CLI refuses to interrupt an external CLI (it cannot be resumed); a request written by
    # hand is still carried out by the runner.
    run.send_interrupt()
    result = run.wait(timeout=30)
    assert result.state == "paused"
    assert result.details.results[0].exit_code == 143
    assert run.status().steps[0].exit_code == 143


def _protocol_paragraphs() -> list[str]:
    return (ROOT / "spec" / "protocol.md").read_text().split("\n\n")


def test_every_event_type_and_ending_reason_a_run_writes_is_documented(
    home: Path, make_agent: AgentMaker, fake_pi: Path
) -> None:
    """Also found 5: every event type written by a pi run, a resume with a brief, a stop and an
    interrupt (``lease.acquired``, ``lease.released``, ``resume.briefs``, ...) is named in
    spec/protocol.md, and so is every ``child.ending`` reason (``stop``, ``interrupt``, ...)."""
    source = pisub.launch("fakepi", "first")
    assert source.wait(timeout=30).state == "complete"
    brief = _cli("follow-up", source.id, "a brief for later")
    assert brief.returncode == 0, brief.stderr
    resumed = pisub.resume(source.id, "go on")
    assert resumed.wait(timeout=30).state == "complete"
    make_agent("sleepy", command="sleep", args=["600"])
    stopped, paused = pisub.launch("sleepy", "x"), pisub.launch("sleepy", "y")
    assert _cli("stop", stopped.id).returncode == 0
    paused.send_interrupt()  # written by hand: the CLI refuses to pause a run it cannot resume
    stopped.wait(timeout=30)
    paused.wait(timeout=30)
    events = [e for run in (source, resumed, stopped, paused) for e in run_events(run.dir)]
    types = {e["type"] for e in events if not e["type"].startswith("pi.")}
    reasons = {e["data"]["reason"] for e in events if e["type"] == "child.ending"}
    assert {"lease.acquired", "lease.released", "resume.briefs"} <= types
    assert {"stop", "interrupt"} <= reasons
    spec = "\n\n".join(_protocol_paragraphs())
    assert not [t for t in sorted(types) if f"`{t}`" not in spec], "event types missing from the spec"
    ending = "\n\n".join(p for p in _protocol_paragraphs() if "`child.ending`" in p)
    assert not [r for r in sorted(reasons) if f"`{r}`" not in ending], "child.ending reasons missing"


def test_request_schema_matches_the_prose_and_scheduled_is_not_final() -> None:
    """Also found 6: the request schema refuses a blank message and one over 131,072 characters,
    as the prose does; ``scheduled`` (later ``delivered``) is not a final receipt state."""
    schema = json.loads((ROOT / "spec" / "schemas" / "request.json").read_text())
    for name in ("Steer", "FollowUp"):
        message = schema["$defs"][name]["properties"]["message"]
        assert message.get("maxLength") == 131072, (name, message)
        pattern = message.get("pattern")
        assert pattern, f"{name}.message accepts a blank message"
        assert re.search(pattern, " \t\n ") is None and re.search(pattern, "  x ") is not None
    assert not ReceiptState.SCHEDULED.is_final
    rows = [line for line in (ROOT / "spec" / "protocol.md").read_text().splitlines()]
    scheduled = [line for line in rows if line.startswith("| `scheduled` |")]
    assert scheduled and not scheduled[0].rstrip(" |").endswith("yes"), scheduled


def _with_extra_field(path: Path) -> None:
    data = json.loads(path.read_bytes())
    data["fieldFromTheFuture"] = {"added": [1, "in v1.1"]}
    path.write_text(json.dumps(data, indent=2) + "\n")


def test_readers_ignore_unknown_fields_in_files_pisub_writes(home: Path, make_agent: AgentMaker) -> None:
    """Also found 7: a newer pisub may add fields: status, result, manifest, receipts and lease
    records with an extra field are still read (requests stay strict: tested in test_control)."""
    run = launch_sleeper(make_agent)
    rid = run.send_steer("hi")  # by hand: the CLI refuses to steer an external CLI up front
    assert run.wait_for_receipt(rid, timeout=10) is not None
    assert _cli("stop", run.id).returncode == 0
    assert run.wait(timeout=30).state == "stopped"
    for path in (run.dir / "status.json", run.dir / "result.json", run.dir / "manifest.json"):
        _with_extra_field(path)
    _with_extra_field(run.dir / "outbox" / f"{rid}.json")
    leases = home / "leases"
    leases.mkdir(mode=0o700, exist_ok=True)
    owner = {
        "v": 1,
        "token": "ab" * 16,
        "generation": 1,
        "sessionFile": str(run.dir / "session.jsonl"),
        "runId": run.id,
        "sourceRunId": None,
        "pid": os.getpid(),
        "pidStartTime": None,
        "host": os.uname().nodename,
        "bootId": None,
        "acquiredAt": "2026-11-30T09:15:13.275Z",
        "fieldFromTheFuture": True,
    }
    (leases / f"{'0' * 32}.json").write_text(json.dumps(owner))
    status = _cli("status", run.id, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "stopped", status.stderr
    result = _cli("result", run.id, "--json")
    assert result.returncode == 0, result.stderr
    listed = _cli("list", "--json")
    assert listed.returncode == 0 and run.id in listed.stdout, listed.stderr
    lease_list = _cli("lease", "list", "--json")
    assert lease_list.returncode == 0, lease_list.stderr
    (info,) = [json.loads(line) for line in lease_list.stdout.splitlines()]
    assert info["owner"] is not None and info["owner"]["runId"] == run.id, info
    again = pisub.Run(run.id)
    assert again.manifest().task == "x"
    receipt = again.receipt(rid)
    assert receipt is not None and receipt.state == "failed"
