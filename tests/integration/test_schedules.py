"""Schedules (``spec/schedules.md``): a tick fires real detached workflow runs, each due slot
exactly once — under 50 concurrent ticks, across a tick killed mid-fire, past a run killed -9 —
and the slots a tick cannot fire are recorded (overlap skip, catchUp, pause).

Slots are made due by giving the API's ``now`` (the real path reads the clock), or, for the
CLI, by a one-shot ``at: +1s`` whose time is awaited."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pisub
from pisub.api.schedules import (
    schedule_create,
    schedule_delete,
    schedule_history,
    schedule_pause,
    schedule_resume,
    schedule_run,
    schedule_show,
    schedule_tick,
)
from pisub.core.procs import start_ticks
from pisub.errors import InvalidInput, RunNotFound, ScheduleNotFound
from pisub.protocol.schedule import DueReason, FireState, epoch
from pisub.store.paths import is_run_id, open_home
from pisub.store.schedules import ScheduleStore
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for
from tests.helpers import SLEEPER, child_pids, wait_runner_dead

ROOT = Path(__file__).resolve().parents[2]
QUICK = "async def main(runs, state, args):\n    return 'ok'\n"
SLOW = (
    "async def main(runs, state, args):\n"
    "    done = await runs.run('s', agent='sleeper', task='x')\n"
    "    return done.output\n"
)
KEY = "0123456789abcdef0123456789abcdef"


def script(tmp_path: Path, body: str = QUICK, name: str = "wf.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def runs_in(home: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(home / "runs") if is_run_id(n))
    except FileNotFoundError:
        return []


def settled(schedule_id: str, timeout: float = 30) -> None:
    """Wait until the schedule has no fire in progress (``show`` reconciles it)."""
    wait_for(
        lambda: schedule_show(schedule_id).schedule.active is None,
        timeout,
        interval=0.1,
        what=f"schedule {schedule_id}'s fire to end",
    )


def run_or_none(run_id: str) -> pisub.Run | None:
    try:
        return pisub.Run(run_id)
    except RunNotFound:
        return None


def slot(schedule_id: str) -> float:
    nxt = schedule_show(schedule_id).schedule.next_run_at
    assert nxt is not None
    return epoch(nxt)


def test_tick_fires_a_detached_workflow_and_records_its_end(home: Path, tmp_path: Path) -> None:
    made = schedule_create(workflow=script(tmp_path), every="1m", name="nightly", label="nightly")
    first = slot(made.id)
    assert first == pytest.approx(epoch(made.created_at) + 60)
    assert schedule_tick(now=first - 1).fired == []  # not due yet

    report = schedule_tick(now=first + 1)
    assert [f.state for f in report.fired] == [FireState.RUNNING]
    fire = report.fired[0]
    assert fire.due_reason is DueReason.TIMER and fire.planned_at == made.next_run_at
    assert fire.run_id == fire.id and runs_in(home) == [fire.run_id]
    assert pisub.Run(fire.run_id or "").wait_until_terminal(30).state == "complete"

    settled(made.id)
    rows = schedule_history(made.id)
    ended = [(r.state, r.run_state, r.run_id) for r in rows]
    assert ended == [(FireState.COMPLETED, "complete", fire.run_id)]
    shown = schedule_show(made.id).schedule
    assert shown.next_run_at is not None and epoch(shown.next_run_at) == pytest.approx(first + 60)  # no drift
    assert shown.fires == 1 and shown.last is not None and shown.last.state is FireState.COMPLETED
    tick = json.loads((home / "schedules" / "last-tick.json").read_text())
    assert tick["v"] == 1 and tick["source"] == "manual" and tick["pid"] == os.getpid()
    lines = (home / "schedules" / made.id / "events.jsonl").read_text().splitlines()
    events = [json.loads(line)["type"] for line in lines]
    assert events == ["schedule.created", "fire.claimed", "fire.started", "fire.ended"]
    # the files are private
    for name in ("schedule.json", "history.json", "events.jsonl", "workflow.py"):
        assert (home / "schedules" / made.id / name).stat().st_mode & 0o777 == 0o600

    # the CLI shows it as a person reads it, and as JSON
    listed = pisub_cli("schedule", "list", check=True).stdout
    assert made.id in listed and "every 1m" in listed and "completed" in listed
    history = json.loads(pisub_cli("schedule", "history", made.id, "--json", check=True).stdout)
    assert [h["state"] for h in history] == ["completed"] and history[0]["dueReason"] == "timer"
    shown_json = json.loads(pisub_cli("schedule", "show", made.id, "--json", check=True).stdout)
    assert shown_json["id"] == made.id and shown_json["recent"][0]["runId"] == fire.run_id
    # a fire is a workflow without a mission (the seed's), so no mission store appears
    assert pisub.Run(fire.run_id or "").status().mission_id is None
    assert not (home / "missions").exists()


def test_a_timer_tick_never_makes_a_removed_home_again(tmp_path: Path) -> None:
    gone = tmp_path / "removed home"
    done = pisub_cli(
        "schedule", "tick", "--from", "cron", "--quiet", env={**os.environ, "PISUB_HOME": str(gone)}
    )
    assert done.returncode == 1 and "does not exist" in done.stderr and "[HOME_UNUSABLE]" in done.stderr
    assert not gone.exists()


def test_overlap_skip_delete_refused_and_a_run_killed_dead_does_not_block(
    home: Path, tmp_path: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", python=SLEEPER)
    made = schedule_create(workflow=script(tmp_path, SLOW), every="1m")
    first = slot(made.id)
    fire = schedule_tick(now=first + 1).fired[0]
    workflow = pisub.Run(fire.run_id or "")
    steps = wait_for(lambda: workflow.status().steps, what="the workflow's child")
    child = wait_for(lambda: workflow.status().steps[0].run_id, what="the child's run id")
    assert steps
    child_run = wait_for(lambda: run_or_none(child), what="the child's run directory")
    grandchildren = child_pids(child_run)

    # the next slot falls while it runs: skipped, recorded
    report = schedule_tick(now=first + 61)
    assert report.fired == [] and [s.state for s in report.skipped] == [FireState.SKIPPED]
    assert schedule_show(made.id).schedule.active is not None
    with pytest.raises(InvalidInput, match=f"pisub stop {fire.run_id}"):
        schedule_delete(made.id)
    with pytest.raises(InvalidInput, match="has a fire running"):
        schedule_run(made.id)

    # kill -9 the workflow's runner, its child's runner and the child's processes
    pids = [workflow.status().pid, child_run.status().pid, *grandchildren]
    for pid in pids:
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(p) for p in pids if p is not None), what="the killed processes to go")
    for run in (workflow, child_run):
        wait_runner_dead(run, run.status().pid or 0)

    # the next tick proves the run dead (its normal repair), records it, and fires the slot
    report = schedule_tick(now=first + 121)
    assert [(e.run_id, e.state) for e in report.ended] == [(fire.run_id, FireState.FAILED_RUN)]
    assert len(report.fired) == 1 and report.fired[0].run_id != fire.run_id
    rows = schedule_history(made.id)
    assert [r.state for r in rows] == [FireState.RUNNING, FireState.SKIPPED, FireState.FAILED_RUN]
    assert len(runs_in(home)) == 3  # two workflows and the first one's child


def test_a_fire_whose_run_lost_its_status_waits_while_its_runner_lives(
    home: Path, tmp_path: Path, make_agent: AgentMaker
) -> None:
    """A run whose ``status.json`` is gone while its runner lives is not ended (an outside
    attack saw ``schedule show`` record it ``failed_run`` for good, then the run completed):
    the fire stays ``running``; once no runner of it is left, it ends ``failed_run`` naming the
    damage. ``schedule show`` never fails for it."""
    make_agent("sleeper", python=SLEEPER)
    made = schedule_create(workflow=script(tmp_path, SLOW), every="1m")
    fire = schedule_tick(now=slot(made.id) + 1).fired[0]
    workflow = pisub.Run(fire.run_id or "")
    child = wait_for(lambda: workflow.status().steps and workflow.status().steps[0].run_id, what="the child")
    child_run = wait_for(lambda: run_or_none(child), what="the child's run directory")
    runner = workflow.status().pid or 0
    (workflow.dir / "status.json").unlink()
    assert schedule_show(made.id).schedule.active is not None  # (its runner lives: still running)
    shown = pisub_cli("schedule", "show", made.id)
    assert shown.returncode == 0 and "running" in shown.stdout, shown

    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: not pid_alive(runner), what="the workflow's runner to go")
    wait_runner_dead(workflow, runner)
    (workflow.dir / "status.json").unlink(missing_ok=True)  # (gone for good)
    rows = wait_for(
        lambda: [r for r in schedule_history(made.id) if r.state is FireState.FAILED_RUN],
        what="the fire to end",
    )
    assert "status.json is missing: the run's folder is damaged" in (rows[0].error or ""), rows
    grandchildren = child_pids(child_run)
    child_run.send_stop()
    child_run.wait(timeout=30)
    for pid in grandchildren:  # (the sleeper's own session)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_catch_up_latest_and_none(home: Path, tmp_path: Path) -> None:
    schedule_create(workflow=script(tmp_path), every="1h", schedule_id="latest")
    schedule_create(workflow=script(tmp_path), every="1h", schedule_id="none", catch_up="none")
    first = min(slot("latest"), slot("none"))
    late = first + 2.5 * 3600  # three slots passed; the newest one 30 minutes ago

    report = schedule_tick(now=late)
    assert [f.schedule_id for f in report.fired] == ["latest"]
    assert report.fired[0].planned_at == schedule_history("latest")[0].planned_at
    assert epoch(report.fired[0].planned_at) == pytest.approx(slot("latest") - 3600)
    older = {(m.schedule_id, m.count, m.state) for m in report.missed}
    missed = FireState.MISSED
    assert older == {("latest", 2, missed), ("none", 2, missed), ("none", 1, missed)}
    for schedule_id in ("latest", "none"):  # no drift: the next slot stays on the grid
        created = epoch(schedule_show(schedule_id).schedule.created_at)
        assert (slot(schedule_id) - created) % 3600 == pytest.approx(0)
        assert slot(schedule_id) > late
    settled("latest")
    assert [r.state for r in schedule_history("none")] == [FireState.MISSED, FireState.MISSED]
    assert runs_in(home) == [report.fired[0].run_id]

    # a one-shot too late with catchUp none is missed and used up
    once = schedule_create(workflow=script(tmp_path), at="+1m", schedule_id="once", catch_up="none")
    report = schedule_tick(now=epoch(once.next_run_at or "") + 3600)
    assert [(m.schedule_id, m.state) for m in report.missed] == [("once", FireState.MISSED)]
    assert schedule_show("once").schedule.done


def test_pause_resume_manual_run_re_anchors(home: Path, tmp_path: Path) -> None:
    made = schedule_create(workflow=script(tmp_path), every="1h")
    first = slot(made.id)
    schedule_pause(made.id)
    assert schedule_tick(now=first + 2.5 * 3600).fired == []
    resumed = schedule_resume(made.id, now=first + 2.5 * 3600)
    assert not resumed.paused and epoch(resumed.next_run_at or "") == pytest.approx(first + 3 * 3600)
    missed = schedule_history(made.id)[0]
    assert (missed.state, missed.count) == (FireState.MISSED, 3) and "paused" in (missed.error or "")
    assert schedule_tick(now=first + 2.6 * 3600).fired == []

    # a manual fire (paused or not) re-anchors the interval at its launch
    moment = time.time()
    fire = schedule_run(made.id, now=moment)
    assert fire.due_reason is DueReason.MANUAL and fire.state is FireState.RUNNING
    assert slot(made.id) == pytest.approx(moment + 3600)
    settled(made.id)

    # a manual fire uses a one-shot up
    once = schedule_create(workflow=script(tmp_path), at="+1h")
    schedule_run(once.id)
    assert schedule_show(once.id).schedule.done
    settled(once.id)
    assert [f.schedule_id for f in schedule_tick(now=time.time() + 7200).fired] == [made.id]
    settled(made.id)
    schedule_delete(once.id)
    with pytest.raises(ScheduleNotFound):
        schedule_show(once.id)


def test_fifty_concurrent_ticks_start_exactly_one_run(home: Path, tmp_path: Path) -> None:
    made = schedule_create(workflow=script(tmp_path), at="+1s")
    due_at = epoch(made.next_run_at or "")
    wait_for(lambda: time.time() > due_at + 0.05, what="the slot to fall due")
    ticks = [
        subprocess.Popen(
            [sys.executable, "-m", "pisub", "schedule", "tick", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(50)
    ]
    fired = 0
    for tick in ticks:
        out, err = tick.communicate(timeout=180)
        assert tick.returncode == 0, err
        fired += len(json.loads(out)["fired"])
    assert fired == 1
    assert len(runs_in(home)) == 1
    settled(made.id)
    rows = schedule_history(made.id)
    assert [(r.state, r.run_id) for r in rows] == [(FireState.COMPLETED, runs_in(home)[0])]


@pytest.mark.parametrize("point", ["schedule.claimed", "schedule.created", "schedule.launched"])
def test_a_tick_killed_mid_fire_loses_no_slot_and_starts_nothing_twice(
    home: Path, tmp_path: Path, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of the tick with its claim on disk and no run yet (the next tick launches the
    claim with the same run id), with the run created and its runner never started (proven
    never-started by the repair: launched again under a new run id, the dead one ``failed``),
    or with the run started and not recorded (only reconciled)."""
    made = schedule_create(workflow=script(tmp_path), at="+1s", label="fault")
    latch = tmp_path / "latch"
    latch.mkdir()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "faultinject"), str(ROOT)]),
        PISUB_FAULT_AT=point,
        PISUB_FAULT_KEY="fault",
        PISUB_FAULT_LATCH=str(latch),
    )
    wait_for(lambda: time.time() > epoch(made.next_run_at or "") + 0.05, what="the slot to fall due")
    killed = pisub_cli("schedule", "tick", env=env)
    assert killed.returncode == -signal.SIGKILL and (latch / point).is_file()
    claim = ScheduleStore(open_home(home)).load(made.id).active  # as the killed tick left it
    assert claim is not None and claim.state is FireState.CLAIMED and claim.run_id is not None
    assert runs_in(home) == ([] if point == "schedule.claimed" else [claim.run_id])

    again = pisub_cli("schedule", "tick", "--json", check=True)
    fired = json.loads(again.stdout)["fired"]
    ran = claim.run_id
    if point == "schedule.claimed":
        assert [f["runId"] for f in fired] == [claim.run_id]  # the same run id
    elif point == "schedule.created":
        assert len(fired) == 1 and fired[0]["runId"] != claim.run_id and fired[0]["id"] == claim.id
        ran = fired[0]["runId"]
        never = pisub.Run(claim.run_id).status()
        assert never.state == "failed" and never.repaired == "never-started"
    else:
        assert fired == []
    settled(made.id)
    assert set(runs_in(home)) == {claim.run_id, ran}
    rows = schedule_history(made.id)
    assert [(r.state, r.run_id) for r in rows] == [(FireState.COMPLETED, ran)]
    assert pisub.Run(ran).status().pid is not None  # it ran: one run of the slot ran
    assert pisub_cli("schedule", "tick", "--json", check=True) and set(runs_in(home)) == {claim.run_id, ran}


def test_session_only_fires_while_its_session_is_open_and_notices(home: Path, tmp_path: Path) -> None:
    made = schedule_create(
        workflow=script(tmp_path), every="1m", session_only=True, session_key=KEY, quiet=True
    )
    first = slot(made.id)
    report = schedule_tick(now=first + 1)
    assert report.fired == [] and report.waiting == [made.id]
    presence = home / "notices" / KEY / "presence"
    presence.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = int(gone.stdout)
    (presence / f"{dead}.json").write_text(json.dumps({"v": 1, "pid": dead, "startTicks": 1}))
    assert schedule_tick(now=first + 61).waiting == [made.id]  # a dead pi is no session
    me = os.getpid()
    (presence / f"{me}.json").write_text(json.dumps({"v": 1, "pid": me, "startTicks": start_ticks(me)}))
    report = schedule_tick(now=first + 62)
    assert len(report.fired) == 1
    fire = report.fired[0]
    assert epoch(fire.planned_at) == pytest.approx(first + 60)  # the slot stayed due; the newest fires
    notice = json.loads((home / "notices" / KEY / f"{fire.run_id}.json").read_text())
    assert notice == {
        "v": 1,
        "runId": fire.run_id,
        "agent": None,
        "schedule": {"id": made.id, "name": made.name},
        "quiet": True,
    }
    settled(made.id)
    with pytest.raises(InvalidInput, match="quiet applies to intervals"):
        schedule_create(workflow=script(tmp_path), at="+1m", quiet=True)
    with pytest.raises(InvalidInput, match="session-only"):
        schedule_create(workflow=script(tmp_path), every="1m", session_only=True)


def test_hostile_entries_are_skipped_or_quarantined(home: Path, tmp_path: Path) -> None:
    made = schedule_create(workflow=script(tmp_path), every="1m", schedule_id="real")
    root = home / "schedules"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "schedule.json").write_bytes((root / "real" / "schedule.json").read_bytes())
    (root / "evil").symlink_to(elsewhere)
    os.mkfifo(root / "fifo")
    (root / "afile").write_text("x")
    os.mkdir(os.fsencode(root) + b"/bad\xffname")
    (root / "huge").mkdir()
    (root / "huge" / "schedule.json").write_bytes(b"{" + b" " * (2 << 20) + b"}")
    (root / "garbage").mkdir()
    (root / "garbage" / "schedule.json").write_text("not json")
    (root / "fifojson").mkdir()
    os.mkfifo(root / "fifojson" / "schedule.json")
    (root / "nojson").mkdir()
    (root / "real" / "lock").unlink(missing_ok=True)
    (root / "real" / "lock").mkdir()
    (root / "real" / "history.json").unlink()
    (root / "real" / "history.json").symlink_to(elsewhere / "schedule.json")

    for args in (["list", "--all"], ["show", "evil"], ["show", "garbage"], ["history", "huge"]):
        proc = pisub_cli("schedule", *args)
        assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 1, proc.stderr
    listed = pisub_cli("schedule", "list", "--all", "--json", check=True)
    assert [s["id"] for s in json.loads(listed.stdout)] == ["real"]
    assert pisub_cli("schedule", "show", "evil").returncode == 1

    report = schedule_tick(now=slot("real") + 1)
    assert [f.schedule_id for f in report.fired] == ["real"]
    assert sorted(e.split(":")[0] for e in report.errors) == ["fifojson", "garbage", "huge"]
    reasons = sorted(p.name for p in (root / ".quarantine").iterdir() if p.name.endswith(".reason"))
    assert len(reasons) >= 4  # three schedules and the symlinked history
    assert (elsewhere / "schedule.json").is_file() and not (elsewhere / "history.json").exists()
    settled(made.id)
    assert [r.state for r in schedule_history("real")] == [FireState.COMPLETED]
    proc = pisub_cli("schedule", "tick")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr


def test_strict_create_input_and_bounded_files(home: Path, tmp_path: Path) -> None:
    """The seed's ``schedule.create`` object is checked strictly (the field named); the history
    keeps the 100 newest fires and ``events.jsonl`` stays bounded."""
    from pisub.api.schedules import schedule_create_from
    from pisub.protocol.schedule import MAX_HISTORY, Fire
    from pisub.store.schedules import MAX_EVENTS_BYTES

    made = schedule_create_from({"workflowScript": "return 1", "every": "2h", "catchUp": "none", "id": "s.1"})
    assert (made.id, made.trigger.every_s, made.catch_up.value) == ("s.1", 7200, "none")
    assert (home / "schedules" / "s.1" / "workflow.js").read_text() == "return 1"
    for bad, field in (
        ({"workflowScript": "return 1", "every": "1h", "agent": "worker"}, "agent"),
        ({"workflowScript": "return 1", "every": "1h", "timezone": "UTC"}, "timezone"),
        ({"workflowScript": "return 1", "every": "1h", "overlap": "queue"}, "overlap"),
        ({"workflowScript": "return 1", "every": "1h", "catchUp": "all"}, "catchUp"),
        ({"every": "1h"}, "workflowScript"),
    ):
        with pytest.raises(InvalidInput, match=field):
            schedule_create_from(bad)

    store = ScheduleStore(open_home(home))
    with store.locked("s.1"):
        for n in range(MAX_HISTORY + 20):
            row = Fire(
                id=f"f{n:04d}",
                schedule_id="s.1",
                planned_at=f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}.000Z",
                due_reason=DueReason.TIMER,
                state=FireState.MISSED,
            )
            store.record("s.1", row)
        for _ in range(4000):
            store.event("s.1", "fire.missed", row, "x" * 200)
    rows = schedule_history("s.1")
    assert len(rows) == MAX_HISTORY and rows[0].id == f"f{MAX_HISTORY + 19:04d}"
    assert (home / "schedules" / "s.1" / "events.jsonl").stat().st_size <= MAX_EVENTS_BYTES + 1024
    assert store.events("s.1")[-1].type == "fire.missed"


def test_pending_limit(home: Path, tmp_path: Path) -> None:
    for n in range(20):
        schedule_create(text="return 1", every="1d", schedule_id=f"s{n}")
    with pytest.raises(InvalidInput, match="20 schedules are pending"):
        schedule_create(text="return 1", every="1d")
    schedule_delete("s0")
    with pytest.raises(InvalidInput, match="exists"):
        schedule_create(text="return 1", every="1d", schedule_id="s1")
    assert len(pisub.schedule_list()) == 19


def test_concurrent_creates_keep_the_pending_limit(home: Path, tmp_path: Path) -> None:
    """25 ``pisub schedule create`` at once: exactly 20 are created, the others refused."""
    creates = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pisub",
                "schedule",
                "create",
                "--workflow-script",
                "return 1",
                "--every",
                "1d",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(25)
    ]
    outcomes = [(c.communicate(timeout=120), c.returncode) for c in creates]
    refused = [err for (_out, err), code in outcomes if code != 0]
    assert len(refused) == 5 and all("pending" in err and "[INVALID_INPUT]" in err for err in refused)
    assert len(pisub.schedule_list(all_projects=True)) == 20
