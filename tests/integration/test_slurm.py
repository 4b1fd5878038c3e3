"""Runs placed on the one-node Slurm cluster (``scripts/slurm-up.sh``): the real pi against the
scripted model, steered through the inbox with the doorbell, stopped, resumed; ``scancel``; a
child that tries to escape the job; and no repair without proof."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import pisub
from pisub.backends import Liveness, liveness
from pisub.protocol.status import RunState
from pisub.store.runs import load_status
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for
from tests.slurm import need_slurm

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _slurm(home: Path) -> None:
    need_slurm()
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "config.toml").write_text("[placement]\nheartbeat_ttl = 6\n")


def _event_types(run: pisub.Run) -> list[str]:
    """Through the API: for a run an engine placed, a repairer's events are in a file of their own."""
    return [event.type for event in run.events()]


@pytest.mark.pi
def test_real_pi_on_slurm_is_steered_stopped_and_resumed(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    proc = pisub_cli("run", "--backend", "slurm", "--agent", "pi", "--json", f"SLOW:60 story {tag}")
    assert proc.returncode == 0, proc.stderr
    run = pisub.Run(json.loads(proc.stdout)["runId"])
    shown = pisub_cli("status", run.id, check=True).stdout
    assert "placed   slurm job" in shown
    wait_for(lambda: any(tag in json.dumps(r) for r in list(model_server.requests)), timeout=60, what="pi")
    steer = pisub_cli("steer", run.id, f"STEER {tag}", "--json", "--wait", "10", check=True)
    assert json.loads(steer.stdout)["state"] in ("queued", "delivered")
    result = run.wait(timeout=90)
    assert result.state == "complete"
    assert result.details.results[0].output == f"Hello from the fake LLM. You said: STEER {tag}"
    receipt = run.receipt(json.loads(steer.stdout)["requestId"])
    assert receipt is not None and receipt.state == "delivered"
    # Resumed like a local run: placed on Slurm again, the same session continued.
    again = pisub.resume(run.id, f"SLOW:60 more {tag}")
    assert again.placement().backend == "slurm" and again.placement().job_id != run.placement().job_id
    wait_for(lambda: again.status().state == RunState.RUNNING, timeout=60, what="the resumed run")
    stop = pisub_cli("stop", again.id, "--json", "--wait", "15", check=True)
    assert json.loads(stop.stdout)["state"] == "delivered"
    assert again.wait(timeout=60).state == "stopped"
    assert again.status().session_file == run.status().session_file


def test_scancel_is_a_stop(make_agent: AgentMaker) -> None:
    make_agent("ticker", python="import time\nwhile True:\n    print('t', flush=True); time.sleep(0.1)\n")
    run = pisub.launch("ticker", "go", backend="slurm")
    wait_for(lambda: run.status().state == RunState.RUNNING, timeout=60, what="running")
    job = run.placement().job_id
    assert job is not None
    subprocess.run(["scancel", job], check=True)
    assert run.wait(timeout=60).state == "stopped"
    # the runner's own end (run.finished follows the terminal status), not a reader's repair
    wait_for(lambda: "run.finished" in _event_types(run), timeout=30, what="the runner's run.finished")
    assert "run.repaired" not in _event_types(run)


def test_a_child_that_escapes_with_setsid_and_a_double_fork_dies_with_the_job(
    make_agent: AgentMaker, tmp_path: Path
) -> None:
    pidfile = tmp_path / "escaped.pid"
    escape = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "        os.environ.pop('PISUB_RUN_ID', None)\n"
        "        time.sleep(600)\n"
        "    os._exit(0)\n"
        "time.sleep(600)\n"
    )
    make_agent("escaper", python=escape)
    run = pisub.launch("escaper", "go", backend="slurm")
    wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=60, what="the escape")
    escaped = int(pidfile.read_text())
    assert pid_alive(escaped)
    subprocess.run(["scancel", run.placement().job_id or "none"], check=True)
    assert run.wait(timeout=60).state == "stopped"
    wait_for(lambda: not pid_alive(escaped), timeout=30, what="the escaped process to be gone")


def test_a_queued_job_and_a_live_lease_are_never_repaired(make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done', flush=True)\n")
    (Path(os.environ["PISUB_HOME"]) / "agents" / "held.md").write_text(
        '---\nname: held\nrunner: external-cli\ncommand: "true"\nslurm: {sbatch: [--hold]}\n---\n'
    )
    run = pisub.launch("held", "go", backend="slurm")
    # Held in the queue: starting, no runner, a free lock — and still not repaired.
    for _ in range(3):
        assert run.status().state == RunState.STARTING
        assert liveness(run.paths, load_status(run.paths)) == Liveness.ALIVE
        time.sleep(0.2)
    subprocess.run(["scontrol", "release", run.placement().job_id or "none"], check=True)
    assert run.wait(timeout=60).state == "complete"


def test_a_job_that_ended_while_its_lease_is_fresh_is_unknown_until_it_expires(
    make_agent: AgentMaker,
) -> None:
    make_agent("ticker", python="import time\nwhile True:\n    print('t', flush=True); time.sleep(0.1)\n")
    home = Path(os.environ["PISUB_HOME"])
    (home / "config.toml").write_text("[placement]\nheartbeat_ttl = 20\n")
    run = pisub.launch("ticker", "go", backend="slurm")
    wait_for(lambda: run.status().state == RunState.RUNNING, timeout=60, what="running")
    status = load_status(run.paths)
    assert status.pid is not None
    os.kill(status.pid, 9)
    wait_for(lambda: not pid_alive(status.pid or 0), timeout=10, what="the runner to die")
    wait_for(
        lambda: liveness(run.paths, load_status(run.paths)) == Liveness.UNKNOWN,
        timeout=30,
        what="the job to end (liveness unknown while the lease is fresh)",
    )
    assert run.status().state == RunState.RUNNING  # no proof yet: not repaired
    # The lease expires 20 s after the last renewal by the file server's clock: age it.
    beat = run.paths.heartbeat
    old = os.stat(beat).st_mtime - 60
    os.utime(beat, (old, old))
    assert run.status().state == RunState.FAILED
    assert "run.repaired" in _event_types(run)
    # The repairer wrote into a file of its own, never into the runner's events.jsonl.
    assert "run.repaired" not in (run.dir / "events.jsonl").read_text()
    assert "run.repaired" in (run.dir / "events.repair.jsonl").read_text()
    fenced = json.loads(beat.read_text())
    assert fenced["owner"] == "repair"


@pytest.mark.root  # unshare --uts
def test_a_local_run_is_not_repaired_from_another_host(make_agent: AgentMaker) -> None:
    """The split-brain rule for local runs: a reader on another host (here: another UTS and pid
    namespace, so another host name and no view of the runner's pid) cannot prove a local runner
    dead and repairs nothing."""
    if subprocess.run(["unshare", "--uts", "--pid", "--fork", "true"], check=False).returncode != 0:
        pytest.skip("unshare is not permitted here")
    make_agent(
        "ticker", python="import time\nfor i in range(40):\n    print(i, flush=True); time.sleep(0.1)\n"
    )
    run = pisub.launch("ticker", "go")
    wait_for(lambda: run.status().state == RunState.RUNNING, timeout=30, what="running")
    # The reader on "node2" also finds runner.lock free, as through a second mount (FUSE, or an
    # NFS client whose lease expired): the lock proves nothing there.
    code = (
        "import socket, sys\n"
        "import pisub.backends.local as local\n"
        "local.is_held = lambda path: False\n"
        "from pisub.backends import liveness\n"
        "from pisub.store.paths import open_home\n"
        "from pisub.store.runs import load_status\n"
        "p = open_home().run(sys.argv[1])\n"
        "print(socket.gethostname(), liveness(p, load_status(p)))\n"
    )
    shell = 'hostname node2 && exec "$@"'
    unshare = ["unshare", "--uts", "--pid", "--fork", "--mount-proc"]
    other = subprocess.run(
        [*unshare, "sh", "-c", shell, "sh", sys.executable, "-c", code, run.id],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == ["node2", "unknown"]
    assert run.wait(timeout=60).state == "complete"


def test_a_runner_whose_lease_was_taken_over_fences_itself(make_agent: AgentMaker) -> None:
    """A runner that meets a generation not its own (a repairer's) writes nothing more: it ends
    its child and exits 75 without a terminal status; a reader's repair then ends the run."""
    make_agent("ticker", python="import time\nwhile True:\n    print('t', flush=True); time.sleep(0.1)\n")
    run = pisub.launch("ticker", "go", backend="slurm")
    # `running` is committed before the child starts (its pid follows): wait for the child's pid
    wait_for(
        lambda: run.status().state == RunState.RUNNING and run.status().steps[0].pid,
        timeout=60,
        what="running",
    )
    status = load_status(run.paths)
    child = status.steps[0].pid
    assert status.pid is not None and child is not None
    beat = json.loads(run.paths.heartbeat.read_text())
    taken = {**beat, "generation": beat["generation"] + 1, "owner": "repair"}
    tmp = run.paths.heartbeat.with_name(".takeover")
    tmp.write_text(json.dumps(taken))
    os.rename(tmp, run.paths.heartbeat)
    wait_for(lambda: not pid_alive(status.pid or 0), timeout=10, what="the runner to fence itself")
    wait_for(lambda: not pid_alive(child), timeout=10, what="its child to be ended")
    assert "fenced: the run's heartbeat lease was taken over" in (run.dir / "runner.log").read_text()
    assert "run.finished" not in _event_types(run)  # it wrote nothing more
    wait_for(lambda: run.status().state.is_terminal, timeout=30, what="the repair")
    assert run.status().state == RunState.FAILED


def test_fifty_runs_at_once(make_agent: AgentMaker) -> None:
    """50 concurrent Slurm runs on the one node (2 cores): all start, all are stopped through
    their inboxes, every request answered exactly once."""
    make_agent("ticker", python="import time\nwhile True:\n    print('t', flush=True); time.sleep(1)\n")
    runs = [pisub.launch("ticker", f"go {i}", backend="slurm") for i in range(50)]
    wait_for(
        lambda: all(r.status().state == RunState.RUNNING for r in runs), timeout=150, what="all 50 running"
    )
    requests = [r.send_stop() for r in runs]
    for run, rid in zip(runs, requests, strict=True):
        assert run.wait(timeout=120).state == "stopped"
        receipt = run.receipt(rid)
        assert receipt is not None and receipt.state == "delivered"
        assert sorted(os.listdir(run.dir / "outbox")) == [f"{rid}.json"]


def test_workflow_children_placed_on_slurm_while_the_coordinator_runs_here(make_agent: AgentMaker) -> None:
    make_agent("quick", python="import sys\nprint('done', sys.argv[-1], flush=True)\n")
    tasks = [
        {"key": "a", "agent": "quick", "task": "one", "backend": "slurm"},
        {"key": "b", "agent": "quick", "task": "two"},
    ]
    run = pisub.launch_parallel(tasks)
    assert run.placement().backend == "local"
    result = run.wait(timeout=120)
    assert result.state == "complete", result
    steps = {s.key: s for s in run.status().steps}
    child_a = pisub.Run(steps["a"].run_id or "")
    child_b = pisub.Run(steps["b"].run_id or "")
    assert child_a.placement().backend == "slurm" and child_a.placement().job_id is not None
    assert child_b.placement().backend == "local"


def test_list_asks_slurm_once_for_all_its_runs(home: Path, tmp_path: Path) -> None:
    (home / "agents").mkdir(mode=0o700, exist_ok=True)
    (home / "agents" / "held.md").write_text(
        '---\nname: held\nrunner: external-cli\ncommand: "true"\nslurm: {sbatch: [--hold]}\n---\n'
    )
    runs = [pisub.launch("held", f"go {i}", backend="slurm") for i in range(5)]
    # The real squeue, behind a wrapper that counts its calls.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "squeue.calls"
    real = subprocess.run(["sh", "-c", "command -v squeue"], capture_output=True, text=True, check=True)
    wrapper = bin_dir / "squeue"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real.stdout.strip()} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    listed = pisub_cli("list", "--json", env=env, check=True)
    states = [json.loads(line)["state"] for line in listed.stdout.splitlines()]
    assert states == ["starting"] * 5
    assert len(calls.read_text().splitlines()) == 1, calls.read_text()
    subprocess.run(["scancel", *[r.placement().job_id or "" for r in runs]], check=True)


def test_a_runner_paused_past_half_its_lease_fences_itself_when_it_wakes(make_agent: AgentMaker) -> None:
    """A runner that was frozen (SIGSTOP here; a paused VM, a stalled node) for longer than half
    its lease may have lost it: on waking it writes nothing more and fences itself."""
    make_agent("ticker", python="import time\nwhile True:\n    print('t', flush=True); time.sleep(0.1)\n")
    run = pisub.launch("ticker", "go", backend="slurm")  # heartbeat_ttl 6: fenced after 3 s
    wait_for(lambda: run.status().state == RunState.RUNNING, timeout=60, what="running")
    status = load_status(run.paths)
    assert status.pid is not None
    os.kill(status.pid, signal.SIGSTOP)
    time.sleep(3.5)  # the pause under test (longer than ttl/2), not a wait for a condition
    before = run.paths.status.stat().st_mtime_ns
    os.kill(status.pid, signal.SIGCONT)
    wait_for(lambda: not pid_alive(status.pid or 0), timeout=10, what="the runner to fence itself")
    assert "fenced: the heartbeat lease may have lapsed" in (run.dir / "runner.log").read_text()
    assert run.paths.status.stat().st_mtime_ns == before  # it wrote nothing after waking
    wait_for(lambda: run.status().state.is_terminal, timeout=30, what="the repair")
    assert run.status().state == RunState.FAILED


def test_what_stands_at_the_heartbeat_or_the_clock_probe_never_wedges_or_hangs_a_repair(
    make_agent: AgentMaker, home: Path
) -> None:
    """A garbage heartbeat.json and a FIFO at the clock probe: a dead run is still repaired (by
    the entry's mtime and the manifest's ttl), and no reader blocks."""
    make_agent("ticker", python="import time\nwhile True:\n    print('t', flush=True); time.sleep(0.1)\n")
    run = pisub.launch("ticker", "go", backend="slurm")
    wait_for(lambda: run.status().state == RunState.RUNNING, timeout=60, what="running")
    status = load_status(run.paths)
    assert status.pid is not None
    os.kill(status.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(status.pid or 0), timeout=10, what="the runner to die")
    beat = run.paths.heartbeat
    beat.unlink()
    os.mkfifo(beat)  # neither readable as a lease nor renewable
    probe = home / "cache" / "clock-probe"
    probe.parent.mkdir(mode=0o700, exist_ok=True)
    probe.unlink(missing_ok=True)
    os.mkfifo(probe)
    old = time.time() - 60
    os.utime(beat, (old, old))
    wait_for(lambda: run.status().state.is_terminal, timeout=60, what="the repair")
    assert run.status().state == RunState.FAILED
    assert json.loads(beat.read_text())["owner"] == "repair"  # the FIFO quarantined, the fence written
    assert any(p.name.startswith(".clock-probe.bad-") for p in probe.parent.iterdir())


def test_a_bad_job_id_in_one_placement_leaves_the_other_runs_listed(make_agent: AgentMaker) -> None:
    make_agent("ticker", python="import time\nwhile True:\n    print('t', flush=True); time.sleep(0.1)\n")
    good, bad = (pisub.launch("ticker", f"go {i}", backend="slurm") for i in range(2))
    placement = json.loads(bad.paths.placement.read_text())
    job = placement["jobId"]
    placement["jobId"] = "1;id"
    bad.paths.placement.write_text(json.dumps(placement))
    listed = pisub_cli("list", "--json", check=True)
    ids = {json.loads(line)["runId"] for line in listed.stdout.splitlines()}
    assert {good.id, bad.id} <= ids  # the bad one still listed: its liveness is only unknown
    shown = pisub_cli("status", bad.id)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr
    subprocess.run(["scancel", job, good.placement().job_id or ""], check=True)


@pytest.mark.serial  # bounds the elapsed time
def test_a_queued_run_is_steered_without_waiting_on_slurm(home: Path) -> None:
    (home / "agents").mkdir(mode=0o700, exist_ok=True)
    (home / "agents" / "held.md").write_text(
        '---\nname: held\nrunner: external-cli\ncommand: "true"\nslurm: {sbatch: [--hold]}\n---\n'
    )
    run = pisub.launch("held", "go", backend="slurm")
    started = time.monotonic()
    # The CLI refuses to steer an external CLI up front; a stop's path is the same (no doorbell
    # for a job that has no runner yet), so a hand-written steer stands for any request.
    proc = pisub_cli("status", run.id)
    assert proc.returncode == 0, proc.stderr
    run.send_steer("hi")
    assert time.monotonic() - started < 10  # no doorbell for a job that has no runner yet
    subprocess.run(["scontrol", "release", run.placement().job_id or ""], check=True)
    assert run.wait(timeout=60).state == "complete"


def test_stopping_a_queued_run_cancels_its_job_and_the_run_ends_stopped(home: Path) -> None:
    (home / "agents").mkdir(mode=0o700, exist_ok=True)
    (home / "agents" / "held.md").write_text(
        '---\nname: held\nrunner: external-cli\ncommand: "true"\nslurm: {sbatch: [--hold]}\n---\n'
    )
    run = pisub.launch("held", "go", backend="slurm")
    steer_id = run.send_steer("before the stop")
    request_id, receipt = run.stop(wait=1)  # no runner to answer: the job is cancelled
    assert receipt is None or receipt.state == "pending"
    wait_for(lambda: run.status().state.is_terminal, timeout=60, what="the run to end")
    status = run.status()
    assert status.state == RunState.STOPPED
    assert status.error is not None and "Stopped while queued" in status.error.message
    for rid in (steer_id, request_id):  # every request answered, exactly once
        answered = run.receipt(rid)
        assert answered is not None and answered.state == "failed"
        assert answered.reason == "the run was stopped before its runner started"
    assert sorted(os.listdir(run.dir / "outbox")) == sorted([f"{steer_id}.json", f"{request_id}.json"])


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="submitting a job as another user needs root")
def test_a_job_of_another_user_named_as_a_runs_job_is_never_taken_for_it() -> None:
    """Anyone may submit a job called ``pisub-<run id>`` (job names, run ids in them, are visible
    to every user): the lookups by name — an sbatch that timed out, a launcher that died before
    it recorded its job — see only this user's jobs, never follow or cancel a stranger's."""
    from pisub.backends.slurm import SlurmBackend, _job_by_name
    from pisub.protocol.placement import BackendName, Placement

    name = f"pisub-{uuid.uuid4()}"
    foreign = (
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--uid=nobody",
                "--gid=nogroup",
                f"--job-name={name}",
                "--chdir=/tmp",
                "--output=/dev/null",
                "--wrap",
                "sleep 60",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .partition(";")[0]
    )
    try:
        wait_for(
            lambda: (
                foreign
                in subprocess.run(
                    ["squeue", "--noheader", "--format=%i", f"--name={name}"], capture_output=True, text=True
                ).stdout.split()
            ),
            timeout=30,
            what="the stranger's job to be listed",
        )
        assert _job_by_name(name) is None
        placement = Placement(v=1, backend=BackendName.SLURM, launcher_host="here", job_name=name)
        assert SlurmBackend()._state_by_name(placement).is_terminal  # GONE: not its run's job
    finally:
        subprocess.run(["scancel", foreign], check=False)
