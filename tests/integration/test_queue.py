"""Groups with a parallel limit and a queue, without a daemon (issue 26; ``spec/queue.md``),
driven through the real CLI and real runners.

Every child appends ``start``/``end`` lines (under ``flock``) to one log, so the order in which
children ran is read from one file written in the order it happened: how many ran at once is
never guessed from timestamps. A child named in its task waits for its gate file
(``<gates>/<name>``) when gated, so a test decides when a slot frees.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from pisub.core.locks import is_held
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for
from tests.helpers import run_events, run_receipts
from tests.nonroot import Unprivileged

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import fcntl, json, os, sys, time
name, _, how = sys.stdin.read().strip().splitlines()[0].partition(":")
log, gates = os.environ["PISUB_TEST_LOG"], os.environ["PISUB_TEST_GATES"]
def note(kind):
    with open(log, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps([kind, name]) + "\\n")
note("start")
if how == "gate":
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(gates, name)) and time.monotonic() < deadline:
        time.sleep(0.02)
elif how == "fail":
    note("end")
    sys.exit(3)
else:
    time.sleep(float(how or 0))
note("end")
print("did", name)
"""


@pytest.fixture
def queue_env(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker agent; its log and gates live in the returned folder."""
    (tmp_path / "gates").mkdir()
    (tmp_path / "log.jsonl").touch()
    monkeypatch.setenv("PISUB_TEST_LOG", str(tmp_path / "log.jsonl"))
    monkeypatch.setenv("PISUB_TEST_GATES", str(tmp_path / "gates"))
    make_agent("worker", python=WORKER)
    return tmp_path


def cli(*args: str) -> str:
    return pisub_cli(*args, check=True).stdout


def launch(name: str, how: str = "gate", *opts: str) -> str:
    """A worker run named ``name`` (``how``: ``gate``, seconds, ``fail``); its id."""
    line = json.loads(cli("run", "--agent", "worker", "--json", *opts, f"{name}:{how}"))
    return str(line["runId"])


def status(run_id: str) -> dict[str, object]:
    st: dict[str, object] = json.loads(cli("status", run_id, "--json"))
    return st


def state(run_id: str) -> str:
    return str(status(run_id)["state"])


def open_gate(env: Path, name: str) -> None:
    (env / "gates" / name).touch()


def log(env: Path) -> list[tuple[str, str]]:
    return [tuple(json.loads(line)) for line in (env / "log.jsonl").read_text().splitlines()]


def started(env: Path) -> list[str]:
    return [name for kind, name in log(env) if kind == "start"]


def most_at_once(env: Path) -> int:
    """How many children ran at once at most (read from the log, in the order it happened)."""
    running, most = 0, 0
    for kind, _name in log(env):
        running += 1 if kind == "start" else -1
        most = max(most, running)
    return most


def wait_state(run_id: str, wanted: str, timeout: float = 20) -> None:
    wait_for(lambda: state(run_id) == wanted, timeout, interval=0.1, what=f"run {run_id[:8]} {wanted}")


def group(name: str) -> dict[str, object]:
    for line in cli("group", "list", "--json").splitlines():
        view: dict[str, object] = json.loads(line)
        if view["name"] == name:
            return view
    raise AssertionError(f"no group {name}")


def runner_pid(run_id: str) -> int:
    pid = status(run_id)["pid"]
    assert isinstance(pid, int)
    return pid


def test_queued_run_is_shown_and_starts_when_a_slot_frees(queue_env: Path) -> None:
    assert "limit 1" in cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    line = json.loads(cli("run", "--agent", "worker", "--json", "--group", "g", "b:0"))
    b = line["runId"]
    assert (line["state"], line["group"]) == ("queued", "g")
    text = cli("status", b)
    assert "queued" in text and "group    g" in text and "position 1 of 1 waiting in group g" in text
    assert b[:8] in cli("list") and "queued" in cli("list")
    assert group("g") == {"name": "g", "limit": 1, "paused": False, "running": 1, "queued": 1, "error": None}
    assert started(queue_env) == ["a"]
    open_gate(queue_env, "a")
    wait_state(b, "complete")
    assert state(a) == "complete" and started(queue_env) == ["a", "b"] and most_at_once(queue_env) == 1
    assert [e["type"] for e in run_events(_dir(b))].count("run.admitted") == 1
    assert group("g")["running"] == 0 and group("g")["queued"] == 0


def _dir(run_id: str) -> Path:
    return Path(os.environ["PISUB_HOME"]) / "runs" / run_id


def test_stop_of_a_queued_run_ends_it_without_starting_its_child(queue_env: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    b = launch("b", "0", "--group", "g")
    assert "delivered" in cli("stop", b)
    wait_state(b, "stopped")
    assert "child.started" not in [e["type"] for e in run_events(_dir(b))]
    assert "stopped while queued" in str(status(b)["error"])
    assert group("g")["queued"] == 0
    open_gate(queue_env, "a")
    wait_state(a, "complete")
    assert started(queue_env) == ["a"]


@pytest.mark.pi
@pytest.mark.pi_versions
def test_a_steer_to_a_queued_pi_run_is_delivered_when_it_starts(queue_env: Path, pi_home: Path) -> None:
    """The queue's smoke test with the real pi: a steer sent while the run waits stays in its
    inbox, unanswered, and pi takes it as its next turn once the run is admitted."""
    tag = uuid.uuid4().hex[:8]
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    b = json.loads(cli("run", "--agent", "pi", "--group", "g", "--json", f"SLOW:20 story {tag}"))["runId"]
    assert state(b) == "queued"
    proc = pisub_cli("steer", b, f"EARLY {tag}", "--wait", "0")
    assert proc.returncode == 0, proc.stderr
    assert run_receipts(_dir(b)) == {}  # kept in the inbox while the run waits
    open_gate(queue_env, "a")
    wait_state(b, "complete", timeout=60)
    (receipt,) = run_receipts(_dir(b)).values()
    assert (receipt["type"], receipt["state"]) == ("steer", "delivered")
    result = json.loads(cli("result", b, "--json"))
    assert result["details"]["results"][0]["output"] == f"Hello from the fake LLM. You said: EARLY {tag}"
    assert state(a) == "complete"


def test_pause_holds_the_queue_and_resume_starts_it(queue_env: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "0.2", "--group", "g")
    assert "paused" in cli("group", "pause", "g")
    b = launch("b", "0", "--group", "g")
    wait_state(a, "complete")
    # paused: b is not admitted by a's end, nor by its own checks (a few of them)
    with pytest.raises(AssertionError):
        wait_for(lambda: state(b) != "queued", 3, interval=0.2)
    assert group("g")["paused"] is True
    cli("group", "resume", "g")
    wait_state(b, "complete")
    assert started(queue_env) == ["a", "b"]


def test_priority_then_launch_order(queue_env: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    others = [
        launch("b", "0", "--group", "g"),
        launch("c", "0", "--group", "g", "--priority", "-1"),
        launch("d", "0", "--group", "g", "--priority", "5"),
        launch("e", "0", "--group", "g"),
    ]
    open_gate(queue_env, "a")
    for run in others:
        wait_state(run, "complete")
    assert state(a) == "complete"
    assert started(queue_env) == ["a", "d", "b", "e", "c"]
    assert most_at_once(queue_env) == 1


def test_after_waits_for_complete_and_fails_on_a_failed_one(queue_env: Path) -> None:
    a = launch("a", "gate")  # in no group: the default group is not configured
    bad = launch("bad", "fail")
    b = launch("b", "0", "--after", a[:8])
    c = launch("c", "0", "--after", bad, "--after", a)
    wait_state(c, "failed")
    assert f"run {bad} it waits for (--after) ended failed" in str(status(c)["error"])
    assert state(b) == "queued" and status(b)["group"] == "default"
    open_gate(queue_env, "a")
    wait_state(b, "complete")
    assert sorted(started(queue_env)) == ["a", "b", "bad"]


def test_runs_start_at_once_without_a_configured_default_group(queue_env: Path) -> None:
    runs = [launch(name, "gate") for name in "abc"]
    wait_for(lambda: len(started(queue_env)) == 3, what="every child to start")
    assert all(status(r)["group"] is None for r in runs)
    for name in "abc":
        open_gate(queue_env, name)
    cli("group", "set-limit", "default", "1")  # from now on: top-level runs queue in `default`
    d = launch("d", "0")
    e = launch("e", "gate")
    assert status(d)["group"] == "default"
    wait_state(d, "complete")
    open_gate(queue_env, "e")
    wait_state(e, "complete")


def test_a_dead_holder_is_repaired_by_a_reader_and_its_slot_given(queue_env: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    b = launch("b", "0", "--group", "g")
    pid = runner_pid(a)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid) and not is_held(_dir(a) / "runner.lock"), what="the runner to die")
    assert state(a) == "failed"  # the reader's repair, which gives the slot to b
    wait_state(b, "complete", timeout=10)
    assert started(queue_env) == ["a", "b"]


def test_a_queued_runner_killed_while_waiting_holds_no_slot(queue_env: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    b = launch("b", "0", "--group", "g")
    c = launch("c", "0", "--group", "g")
    pid = runner_pid(b)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid) and not is_held(_dir(b) / "runner.lock"), what="the runner to die")
    assert state(b) == "failed"
    assert group("g")["queued"] == 1
    open_gate(queue_env, "a")
    wait_state(c, "complete")
    assert started(queue_env) == ["a", "c"] and state(a) == "complete"


@pytest.mark.parametrize("point", ["queue.locked", "queue.left", "queue.admitted", "queue.rung"])
def test_kill_at_each_promotion_step(
    queue_env: Path, point: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The runner that frees the slot dies (SIGKILL) at ``point`` of its promotion: the next run
    still starts (its own check), exactly one at a time, and every run ends."""
    latch, arm = tmp_path / "latch", tmp_path / "arm"
    latch.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "faultinject"), str(ROOT)]))
    monkeypatch.setenv("PISUB_FAULT_QUEUE_AT", point)
    monkeypatch.setenv("PISUB_FAULT_QUEUE_ARM", str(arm))
    monkeypatch.setenv("PISUB_FAULT_LATCH", str(latch))
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    b = launch("b", "gate", "--group", "g")
    c = launch("c", "0", "--group", "g")
    arm.touch()
    open_gate(queue_env, "a")
    wait_for(lambda: (latch / point).is_file(), 20, what=f"a process to die at {point}")
    arm.unlink()
    wait_state(b, "running", timeout=10)
    assert state(c) == "queued"
    open_gate(queue_env, "b")
    wait_state(c, "complete", timeout=15)
    assert [state(r) for r in (a, b)] == ["complete", "complete"]
    assert started(queue_env) == ["a", "b", "c"] and most_at_once(queue_env) == 1
    assert group("g")["running"] == 0 and group("g")["queued"] == 0


def test_many_freers_racing_never_exceed_the_limit(queue_env: Path) -> None:
    """Ten short runs queued in a paused group of two, then resumed: runs end (and free their
    slots) at nearly the same moments; each run is admitted exactly once, by one decision, never
    more than two children run at once, every run ends complete."""
    cli("group", "add", "g", "--limit", "2")
    cli("group", "pause", "g")
    runs = [launch(f"r{n}", "0.1", "--group", "g") for n in range(10)]
    assert {state(r) for r in runs} == {"queued"}
    cli("group", "resume", "g")
    for run in runs:
        wait_state(run, "complete", timeout=60)
    assert most_at_once(queue_env) <= 2
    assert sorted(started(queue_env)) == sorted(f"r{n}" for n in range(10))
    given = []  # whom each leaving run's decision admitted
    for run in runs:
        types = [e["type"] for e in run_events(_dir(run))]
        assert types.count("run.admitted") == 1 and types.count("run.started") == 1
        for event in run_events(_dir(run), "run.left"):
            given += event["data"]["admitted"]
    assert len(given) == len(set(given)) == 10 - 2  # one per freed slot (the resume admitted two)
    assert group("g")["running"] == 0 and group("g")["queued"] == 0


def test_a_queued_runs_directory_removed(queue_env: Path) -> None:
    import shutil

    cli("group", "add", "g", "--limit", "1")
    launch("a", "gate", "--group", "g")
    b = launch("b", "0", "--group", "g")
    c = launch("c", "0", "--group", "g")
    pid = runner_pid(b)
    shutil.rmtree(_dir(b))
    wait_for(lambda: not pid_alive(pid), 10, what="the orphaned runner to leave")
    open_gate(queue_env, "a")
    wait_state(c, "complete")
    assert started(queue_env) == ["a", "c"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["group", "add", "a/b"], "name: 'a/b' is not a group name"),
        (["group", "add", "x" * 255], "is not a group name"),
        (["group", "add", ".."], "is not a group name"),
        (["group", "add", "-"], "is not a group name"),
        (["group", "add", "ok", "--limit", "0"], "limit: 0 is out of range"),
        (["group", "add", "ok", "--limit", "-1"], "limit: -1 is out of range"),
        (["group", "add", "ok", "--limit", str(10**9)], "out of range"),
        (["group", "set-limit", "nope", "2"], "no group 'nope'"),
        (["group", "rm", "nope"], "no group 'nope'"),
        (["run", "--agent", "worker", "--group", "nope", "x"], "group: no group 'nope'"),
        (["run", "--agent", "worker", "--group", "a\nb", "x"], "is not a group name"),
        (["run", "--agent", "worker", "--priority", str(10**9), "x"], "priority: 1000000000 is out of range"),
        (["run", "--agent", "worker", "--after", "ffffffff", "x"], "no run matches"),
    ],
)
def test_hostile_names_and_values_are_refused(queue_env: Path, args: list[str], message: str) -> None:
    proc = pisub_cli(*args)
    assert proc.returncode == 1, proc.stdout
    assert message in proc.stderr and proc.stderr.startswith("pisub: ") and "Traceback" not in proc.stderr
    assert not (Path(os.environ["PISUB_HOME"]) / "runs").exists() or not os.listdir(
        Path(os.environ["PISUB_HOME"]) / "runs"
    )


@pytest.mark.parametrize("bad", ["garbage", "directory", "symlink", "huge"])
def test_a_bad_group_file_admits_nothing_until_rewritten(queue_env: Path, bad: str) -> None:
    cli("group", "add", "g", "--limit", "1")
    config = Path(os.environ["PISUB_HOME"]) / "groups" / "g" / "group.json"
    config.unlink()
    if bad == "garbage":
        config.write_bytes(b"\x00{not json")
    elif bad == "directory":
        config.mkdir()
    elif bad == "symlink":
        (queue_env / "elsewhere.json").write_text('{"v": 1, "name": "g", "limit": 100}')
        config.symlink_to(queue_env / "elsewhere.json")
    else:
        config.write_text('{"v": 1, "name": "g", "limit": 1, "pad": "' + "x" * 100_000 + '"}')
    b = launch("b", "0", "--group", "g")
    assert state(b) == "queued"  # fail closed: an unreadable limit admits nothing
    view = group("g")
    assert view["paused"] is True and view["error"]
    cli("group", "set-limit", "g", "1")
    wait_state(b, "complete")


def test_slurm_and_inner_runs_are_in_no_group(queue_env: Path) -> None:
    from pisub.errors import InvalidInput
    from pisub.runs.queue import request_for
    from pisub.store.paths import open_home

    h = open_home()
    cli("group", "add", "g", "--limit", "1")
    with pytest.raises(InvalidInput, match="Slurm"):
        request_for(h, "g", None, None, top_level=True, backend="slurm")
    with pytest.raises(InvalidInput, match="inside a run"):
        request_for(h, "g", None, None, top_level=False, backend=None)
    assert request_for(h, None, None, None, top_level=False, backend=None) is None


def test_group_rm_refuses_while_runs_are_in_it(queue_env: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    proc = pisub_cli("group", "rm", "g")
    assert proc.returncode == 1 and "has 1 run(s) waiting or running" in proc.stderr
    open_gate(queue_env, "a")
    wait_state(a, "complete")
    assert "removed group g" in cli("group", "rm", "g")
    assert [json.loads(line)["name"] for line in cli("group", "list", "--json").splitlines()] == ["default"]


@pytest.mark.root
def test_a_user_queues_and_stops_runs_of_a_group(unprivileged: Unprivileged) -> None:
    """As the unprivileged user: a group of one, a queued run stopped, the next one started."""
    user = unprivileged
    user.make_agent("napper", python="import sys, time\ntime.sleep(float(sys.stdin.read()))\nprint('ok')")
    user.pisub("group", "add", "g", "--limit", "1", check=True)
    ids = [
        user.pisub("run", "--agent", "napper", "--group", "g", seconds, check=True).stdout.strip()
        for seconds in ("60", "0", "0")  # the holder outlasts the launches, however slow
    ]

    def user_state(run_id: str) -> str:
        return str(json.loads(user.pisub("status", run_id, "--json", check=True).stdout)["state"])

    assert user_state(ids[1]) == "queued"
    assert "delivered" in user.pisub("stop", ids[1], check=True).stdout
    assert user_state(ids[2]) == "queued"
    assert "delivered" in user.pisub("stop", ids[0], check=True).stdout  # frees the slot
    wait_for(lambda: user_state(ids[2]) == "complete", 30, interval=0.2, what="the third run")
    assert [user_state(r) for r in ids] == ["stopped", "stopped", "complete"]


@pytest.mark.parametrize("bad", ["garbage", "directory", "symlink", "fifo"])
def test_a_waiting_runs_entry_replaced_is_set_aside_and_written_again(queue_env: Path, bad: str) -> None:
    cli("group", "add", "g", "--limit", "1")
    a = launch("a", "gate", "--group", "g")
    b = launch("b", "0", "--group", "g")
    directory = Path(os.environ["PISUB_HOME"]) / "groups" / "g"
    (entry,) = [p for p in directory.iterdir() if p.name.startswith("q-")]
    entry.unlink()
    if bad == "garbage":
        entry.write_bytes(b"\xff" * 100_000)
    elif bad == "directory":
        entry.mkdir()
    elif bad == "symlink":
        entry.symlink_to("/etc/passwd")
    else:
        os.mkfifo(entry)
    (directory / "q-junk").write_text("not an entry")  # a name that is no entry: left aside
    open_gate(queue_env, "a")
    wait_state(b, "complete", timeout=20)
    assert started(queue_env) == ["a", "b"] and state(a) == "complete"
    assert group("g")["queued"] == 0


def test_a_groups_folder_that_is_a_symlink_is_refused_in_one_line(queue_env: Path, tmp_path: Path) -> None:
    home = Path(os.environ["PISUB_HOME"])
    home.mkdir(exist_ok=True, mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (home / "groups").symlink_to(tmp_path / "elsewhere")
    proc = pisub_cli("group", "add", "g", "--limit", "1")
    assert proc.returncode == 1 and proc.stderr.startswith("pisub: ") and "Traceback" not in proc.stderr
    assert not list((tmp_path / "elsewhere").iterdir())


def test_a_workflow_waits_in_its_group_and_its_children_are_in_none(queue_env: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    launch("a", "gate", "--group", "g")
    line = json.loads(cli("run", "--task", "worker=w1:0", "--task", "worker=w2:0", "--group", "g", "--json"))
    workflow = str(line["runId"])
    assert line["state"] == "queued"
    open_gate(queue_env, "a")
    wait_state(workflow, "complete", timeout=30)
    assert sorted(started(queue_env)) == ["a", "w1", "w2"] and started(queue_env)[0] == "a"
    steps: list[dict[str, str]] = status(workflow)["steps"]  # type: ignore[assignment]
    children = [s["runId"] for s in steps]
    assert children and all(status(c)["group"] is None for c in children)


def test_a_holders_directory_removed_under_a_dead_runner_frees_its_slot(queue_env: Path) -> None:
    """The waiting runner's own check counts holders as a decision does: the ``a-`` entry of a
    run whose directory is gone and whose runner is dead holds nothing (no jam)."""
    import shutil

    cli("group", "add", "rd", "--limit", "1")
    h = launch("h", "gate", "--group", "rd")
    wait_for(lambda: started(queue_env) == ["h"], what="h to start")
    w = launch("w", "0", "--group", "rd")
    assert state(w) == "queued"
    pid = runner_pid(h)
    shutil.rmtree(_dir(h))
    os.kill(pid, signal.SIGKILL)
    open_gate(queue_env, "h")
    wait_for(lambda: not pid_alive(pid), what="h's runner to die")
    wait_state(w, "complete", timeout=15)
    assert started(queue_env) == ["h", "w"]
    assert group("rd")["running"] == 0 and group("rd")["queued"] == 0


@pytest.mark.parametrize("where", [[], ["--group", "g"]], ids=["default", "named"])
def test_an_after_run_whose_directory_is_removed_fails_the_dependant(
    queue_env: Path, where: list[str]
) -> None:
    import shutil

    cli("group", "add", "g", "--limit", "2")
    a = launch("a", "gate")
    wait_for(lambda: started(queue_env) == ["a"], what="a to start")
    b = launch("b", "0", "--after", a, *where)
    assert state(b) == "queued"
    pid = runner_pid(a)
    os.kill(pid, signal.SIGKILL)
    shutil.rmtree(_dir(a))
    open_gate(queue_env, "a")
    wait_state(b, "failed", timeout=15)
    assert f"run {a} it waits for (--after) no longer exists" in str(status(b)["error"])
    assert started(queue_env) == ["a"]


def test_a_missing_group_json_admits_nothing_until_rewritten(queue_env: Path) -> None:
    cli("group", "add", "x", "--limit", "1")
    a = launch("a", "gate", "--group", "x")
    wait_for(lambda: started(queue_env) == ["a"], what="a to start")
    b = launch("b", "0", "--group", "x")
    (Path(os.environ["PISUB_HOME"]) / "groups" / "x" / "group.json").unlink()
    open_gate(queue_env, "a")
    wait_state(a, "complete")
    view = group("x")
    assert "group.json is missing" in str(view["error"]) and view["paused"] is True
    assert state(b) == "queued" and started(queue_env) == ["a"]
    cli("group", "set-limit", "x", "1")
    wait_state(b, "complete")


def test_a_groups_folder_that_is_a_symlink_refuses_a_plain_launch(queue_env: Path, tmp_path: Path) -> None:
    cli("group", "set-limit", "default", "1")
    home = Path(os.environ["PISUB_HOME"])
    (home / "groups").rename(tmp_path / "moved")
    (tmp_path / "empty").mkdir()
    (home / "groups").symlink_to(tmp_path / "empty")
    proc = pisub_cli("run", "--agent", "worker", "--json", "a:0")
    assert proc.returncode != 0 and proc.stderr.startswith("pisub: groups/ is not a directory")
    assert "Traceback" not in proc.stderr and not list(home.joinpath("runs").glob("*"))


@pytest.mark.parametrize("args", [["set-limit", "A", "10"], ["pause", "nosuch"], ["rm", "nosuch"]])
def test_a_command_on_a_missing_group_creates_nothing(queue_env: Path, args: list[str]) -> None:
    proc = pisub_cli("group", *args)
    assert proc.returncode != 0 and f"no group '{args[1]}'" in proc.stderr
    assert not (Path(os.environ["PISUB_HOME"]) / "groups" / args[1]).exists()
    assert [json.loads(line)["name"] for line in cli("group", "list", "--json").splitlines()] == ["default"]


def test_a_run_registered_into_a_removed_group_is_refused_cleanly(queue_env: Path) -> None:
    from pisub.errors import InvalidInput
    from pisub.protocol.queue import QueueRequest
    from pisub.runs.queue import register
    from pisub.store.paths import open_home

    cli("group", "add", "rmr", "--limit", "1")
    cli("group", "rm", "rmr")
    home = open_home(Path(os.environ["PISUB_HOME"]))
    with pytest.raises(InvalidInput, match="no group 'rmr'"):
        register(home, str(uuid.uuid4()), QueueRequest(group="rmr", priority=0, after=[]))
    assert not (home.root / "groups" / "rmr").exists()


def test_a_group_that_is_a_symlink_is_shown_with_its_error(queue_env: Path, tmp_path: Path) -> None:
    cli("group", "add", "g", "--limit", "1")
    (tmp_path / "elsewhere").mkdir()
    (Path(os.environ["PISUB_HOME"]) / "groups" / "y").symlink_to(tmp_path / "elsewhere")
    views = {v["name"]: v for v in map(json.loads, cli("group", "list", "--json").splitlines())}
    assert views["g"]["error"] is None and "groups/y is not a directory" in str(views["y"]["error"])
    proc = pisub_cli("group", "add", "y")
    assert proc.returncode != 0 and "not a plain directory" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((tmp_path / "elsewhere").iterdir())


def test_a_configured_default_whose_group_json_is_deleted_admits_nothing(queue_env: Path) -> None:
    cli("group", "set-limit", "default", "2")
    (Path(os.environ["PISUB_HOME"]) / "groups" / "default" / "group.json").unlink()
    a = launch("a", "0")
    assert status(a)["group"] == "default" and state(a) == "queued"
    assert "group.json is missing" in str(group("default")["error"])
    cli("group", "set-limit", "default", "2")
    wait_state(a, "complete")
