"""Attacks on schedules (issue 28's outside attack, /work/notes/attack28-schedules.md) and what
using them showed, each reproduced through the real CLI or API:

- F2: a tick never runs a schedule planted by another user (a foreign ``schedules/<id>/``, a
  foreign ``schedule.json`` or script copy, a folder others may write): quarantined with the
  reason; another user's ``schedules/`` is refused whole; ours open to others is tightened;
- F3: a fire's notices-ledger entry is never dropped silently: a symlink or FIFO standing as
  ``notices/<KEY>`` is moved aside and the folder made again, said in an event and the tick's
  ``errors``;
- a schedule is named by its id, its name or a unique id prefix; ambiguity lists the candidates;
- ``schedule list`` is a table fitted to the terminal with a hint when nothing ticks;
- a fire's run is labelled ``schedule:<name>`` and its task names the script's file;
- a tick run from inside a pisub run still fires top-level runs.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.api.schedules import schedule_create, schedule_show, schedule_tick
from pisub.errors import InvalidInput, ScheduleNotFound
from pisub.protocol.schedule import FireState, epoch
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import SLEEPER

QUICK_JS = 'return "ok";\n'
SLOW = (
    "async def main(runs, state, args):\n"
    "    done = await runs.run('s', agent='sleeper', task='x')\n"
    "    return done.output\n"
)
EVIL_JS = 'return "evil ran";\n'
OTHER = os.environ.get("PISUB_NONROOT_USER") or "pisub-ci"
KEY2 = "fedcba9876543210fedcba9876543210"
KEY3 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"


def runs_of(home: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(home / "runs") if not n.startswith("."))
    except FileNotFoundError:
        return []


def other_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root (scripts/test.sh runs this as root)")
    try:
        return pwd.getpwnam(OTHER)
    except KeyError:
        pytest.skip(f"no user {OTHER!r} to act as (scripts/test.sh creates it)")


def as_other(user: pwd.struct_passwd, script: str, *args: str, data: str | None = None) -> None:
    """Run ``sh -c script`` as ``user`` (no supplementary groups, a bare environment)."""
    subprocess.run(
        ["sh", "-c", script, "sh", *args],
        input=data,
        text=True,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "HOME": "/"},
        cwd="/",
        check=True,
        timeout=30,
    )


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A base folder others may traverse (0755), with a ``home`` in it exported as PISUB_HOME."""
    base = Path(tempfile.mkdtemp(prefix="pisub-sched-attack-", dir="/tmp"))
    os.chmod(base, 0o755)
    monkeypatch.setenv("PISUB_HOME", str(base / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "xdg"))
    (base / "proj").mkdir()
    monkeypatch.chdir(base / "proj")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def planted_record(template: dict[str, object], schedule_id: str) -> str:
    """A valid record, due an hour ago."""
    record = dict(template)
    past = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    record["id"] = schedule_id
    record["trigger"] = {"kind": "at", "at": past}
    record["nextRunAt"] = past
    return json.dumps(record)


@pytest.mark.root
def test_a_tick_never_runs_a_schedule_planted_by_another_user(shared: Path) -> None:
    user = other_user()
    home = shared / "home"
    (shared / "proj" / "w.js").write_text(QUICK_JS)
    pisub_cli("schedule", "create", "--workflow", "w.js", "--at", "+1h", "--id", "tmpl", check=True)
    schedules = home / "schedules"
    template = json.loads((schedules / "tmpl" / "schedule.json").read_text())
    # a careless setup: the home and its schedules/ were once open to others
    os.chmod(home, 0o755)
    os.chmod(schedules, 0o777)

    # another user plants a whole schedule (its folder, record and script all its own)
    as_other(
        user,
        'mkdir -m 755 "$1" && cat > "$1/schedule.json" && printf %s "$2" > "$1/workflow.js" '
        '&& echo \'{"v": 1, "fires": []}\' > "$1/history.json"',
        str(schedules / "evil"),
        EVIL_JS,
        data=planted_record(template, "evil"),
    )
    # ... or swaps the script copy of a folder of ours (left open to others once)
    shutil.copytree(schedules / "tmpl", schedules / "swapped")
    (schedules / "swapped" / "schedule.json").write_text(planted_record(template, "swapped"))
    os.chmod(schedules / "swapped", 0o777)
    os.unlink(schedules / "swapped" / "workflow.js")
    as_other(user, 'printf %s "$2" > "$1"', str(schedules / "swapped" / "workflow.js"), EVIL_JS)
    os.chmod(schedules / "swapped", 0o700)  # closed again: the foreign file stays
    # ... or a folder of ours that others may write into
    shutil.copytree(schedules / "tmpl", schedules / "open")
    (schedules / "open" / "schedule.json").write_text(planted_record(template, "open"))
    os.chmod(schedules / "open", 0o777)

    # a manual fire of a planted schedule is refused, nothing starts
    refused = pisub_cli("schedule", "run", "evil")
    assert refused.returncode != 0 and "not to you" in refused.stderr, refused.stderr
    assert runs_of(home) == []

    done = pisub_cli("schedule", "tick", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["fired"] == [], report
    assert runs_of(home) == []  # nothing of the other user's ran
    errors = "\n".join(report["errors"])
    for planted in ("evil", "swapped", "open"):
        assert f"{planted}: not fired, quarantined" in errors, errors
    assert f"belongs to uid {user.pw_uid}" in errors and "writable by others" in errors
    # schedules/ tightened as pisub tightens its own folders, and said so
    assert stat.S_IMODE(schedules.stat().st_mode) == 0o700
    assert "tightened permissions" in done.stderr
    # the planted folders are out of the way, each with its reason
    quarantined = os.listdir(schedules / ".quarantine")
    reasons = [n for n in quarantined if n.endswith(".reason")]
    assert len(reasons) == 3, quarantined
    listed = json.loads(pisub_cli("schedule", "list", "--all", "--json", check=True).stdout)
    assert [s["id"] for s in listed] == ["tmpl"]
    # the next tick is clean
    again = json.loads(pisub_cli("schedule", "tick", "--json", check=True).stdout)
    assert again["errors"] == [] and again["fired"] == []


@pytest.mark.root
def test_a_schedules_folder_of_another_user_is_refused_whole(shared: Path) -> None:
    user = other_user()
    home = shared / "home"
    (shared / "proj" / "w.js").write_text(QUICK_JS)
    pisub_cli("schedule", "create", "--workflow", "w.js", "--at", "+1h", "--id", "tmpl", check=True)
    os.chown(home / "schedules", user.pw_uid, user.pw_gid)
    done = pisub_cli("schedule", "tick")
    assert done.returncode != 0
    assert f"belongs to uid {user.pw_uid}" in done.stderr and "nothing in it is fired" in done.stderr
    assert done.stderr.rstrip().endswith("[IO_ERROR]")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert runs_of(home) == []


def test_a_hostile_notices_entry_is_moved_aside_made_again_and_said(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    notices = home / "notices"
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    a = schedule_create(workflow=wf, every="1m", session_key=KEY2, schedule_id="sk2")
    b = schedule_create(workflow=wf, every="1m", session_key=KEY3, schedule_id="sk3")
    notices.mkdir(mode=0o700)
    (notices / KEY2).symlink_to(decoy)  # a symlink standing as the session's folder
    os.mkfifo(notices / KEY3)  # a FIFO

    report = schedule_tick(now=max(epoch(a.next_run_at or ""), epoch(b.next_run_at or "")) + 1)
    fired = {f.schedule_id: f for f in report.fired}
    assert set(fired) == {"sk2", "sk3"} and all(f.state is FireState.RUNNING for f in fired.values())
    assert os.listdir(decoy) == []  # never written through the symlink
    for key, sid, kind in ((KEY2, "sk2", "symlink"), (KEY3, "sk3", "FIFO")):
        run_id = fired[sid].run_id
        folder = notices / key
        assert stat.S_ISDIR(folder.lstat().st_mode)  # made again
        entry = json.loads((folder / f"{run_id}.json").read_text())
        assert entry["runId"] == run_id and entry["schedule"] == {"id": sid, "name": "w"}
        aside = [n for n in os.listdir(notices) if n.startswith(f".{key}.bad-")]
        assert len(aside) == 1
        said = [line for line in report.errors if line.startswith(f"{sid}: run {run_id}")]
        assert said and f"was a {kind}: moved aside" in said[0], report.errors
        events = [
            json.loads(line) for line in (home / "schedules" / sid / "events.jsonl").read_text().splitlines()
        ]
        notice = [e for e in events if e["type"] == "fire.notice"]
        assert notice and f"was a {kind}" in notice[0]["detail"] and notice[0]["runId"] == run_id
        pisub.Run(run_id or "").wait_until_terminal(30)


def test_a_schedule_is_named_by_id_name_or_id_prefix(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    nightly = schedule_create(workflow=wf, every="1d", name="nightly review")
    schedule_create(workflow=wf, every="1d", name="dup", schedule_id="alpha-one")
    schedule_create(workflow=wf, every="1d", name="dup", schedule_id="alpha-two")
    schedule_create(workflow=wf, every="1d", name="alpha-one", schedule_id="beta-1234")

    # the API: a name, a prefix, an id (an id wins over a name)
    assert schedule_show("nightly review").schedule.id == nightly.id
    assert schedule_show("beta").schedule.id == "beta-1234"
    assert schedule_show("alpha-one").schedule.id == "alpha-one"
    with pytest.raises(InvalidInput, match="2 schedules are named 'dup': alpha-one \\(dup\\), alpha-two"):
        schedule_show("dup")
    with pytest.raises(InvalidInput, match="have ids starting with 'alph'"):
        schedule_show("alph")
    with pytest.raises(ScheduleNotFound, match="at least 4 characters"):
        schedule_show("bet")
    with pytest.raises(ScheduleNotFound, match="no schedule with the id or name"):
        schedule_show("weekly")

    # the CLI: every command takes a name
    shown = json.loads(pisub_cli("schedule", "show", "nightly review", "--json", check=True).stdout)
    assert shown["id"] == nightly.id
    assert (
        "paused schedule " + nightly.id in pisub_cli("schedule", "pause", "nightly review", check=True).stdout
    )
    assert pisub_cli("schedule", "resume", "nightly review", check=True).returncode == 0
    assert "has not fired yet" in pisub_cli("schedule", "history", "beta-", check=True).stdout
    both = pisub_cli("schedule", "show", "dup")
    assert both.returncode != 0 and "alpha-one (dup), alpha-two (dup)" in both.stderr
    assert "[INVALID_INPUT]" in both.stderr
    missing = pisub_cli("schedule", "run", "weekly")
    assert missing.returncode != 0 and "[SCHEDULE_NOT_FOUND]" in missing.stderr
    fired = pisub_cli("schedule", "run", "nightly review", check=True).stdout
    assert f"schedule {nightly.id} fired: run " in fired
    run_id = fired.strip().rsplit(" ", 1)[1]
    pisub.Run(run_id).wait_until_terminal(30)
    wait_for(lambda: schedule_show(nightly.id).schedule.active is None, 30, what="the fire to end")
    gone = pisub_cli("schedule", "delete", "nightly review", check=True).stdout
    assert gone.strip() == f"deleted schedule {nightly.id}"


def test_schedule_list_is_a_table_fitted_to_the_terminal(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    schedule_create(workflow=wf, every="6h", name="a rather long name for a nightly review of everything")
    # due and kept due: a session-only schedule whose session is not open
    due = schedule_create(workflow=wf, at="+1s", name="soon", session_only=True, session_key=KEY2)
    wait_for(lambda: epoch(due.next_run_at or "") < time.time() - 0.5, 5, what="the slot to pass")
    env = {**os.environ, "COLUMNS": "80"}

    text = pisub_cli("schedule", "list", env=env, check=True).stdout
    lines = text.rstrip("\n").split("\n")
    header = lines[0]
    assert header.split() == ["ID", "NAME", "TRIGGER", "NEXT", "STATE", "LAST"]
    rows = lines[1:3]
    assert all(len(line) <= 80 for line in lines[:3]), lines
    at = header.index("STATE")
    assert {row[at:].split()[0] for row in rows} == {"due", "waiting"}  # aligned, short states
    assert any("every 6h" in row and "…" in row for row in rows)  # the long name cut to fit
    assert len(lines) == 4 and lines[3].startswith("due: fired by the next `pisub schedule tick`")
    assert "no timer ticked in the last 3 minutes" in lines[3]

    # a timer ticked a moment ago (the session is still away: the slot stays due): no hint
    ticked = pisub_cli("schedule", "tick", "--from", "cron", env=env, check=True).stdout
    assert ticked.startswith(f"waiting {due.id}: due") and "nothing due" not in ticked
    text = pisub_cli("schedule", "list", env=env, check=True).stdout
    assert len(text.rstrip("\n").split("\n")) == 3 and "due:" not in text


def test_a_fire_is_labelled_by_its_schedule_and_names_its_script(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "review.js"
    wf.write_text(QUICK_JS)
    plain = schedule_create(workflow=wf, every="1m", name="nightly")
    labelled = schedule_create(workflow=wf, every="1m", name="other", label="my-label")
    report = schedule_tick(now=max(epoch(plain.next_run_at or ""), epoch(labelled.next_run_at or "")) + 1)
    runs = {f.schedule_id: pisub.Run(f.run_id or "") for f in report.fired}
    assert runs[plain.id].status().label == "schedule:nightly"
    assert runs[labelled.id].status().label == "my-label"
    for run in runs.values():
        assert run.wait_until_terminal(30).state == "complete"
    listed = pisub_cli("list", env={**os.environ, "COLUMNS": "200"}, check=True).stdout
    row = next(line for line in listed.splitlines() if runs[plain.id].id[:8] in line)
    assert "schedule:nightly" in row and "workflow.js" in row and "inline" not in row


def test_a_tick_from_inside_a_run_fires_a_top_level_run(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    outer = pisub.launch_workflow(wf)  # the run the ticking process belongs to
    assert outer.wait_until_terminal(30).state == "complete"
    made = schedule_create(workflow=wf, at="+1s", name="top")
    wait_for(lambda: epoch(made.next_run_at or "") < time.time(), 5, what="the slot to pass")
    inside = {
        **os.environ,
        "PISUB_RUN_ID": outer.id,
        "PISUB_ROOT_RUN_ID": outer.id,
        "PISUB_RUN_DIR": str(home / "runs" / outer.id),
        "PISUB_DEPTH": "1",
        "PISUB_MAX_DEPTH": "1",  # at the limit: a child launch would be refused
    }
    report = json.loads(pisub_cli("schedule", "tick", "--json", env=inside, check=True).stdout)
    assert [f["state"] for f in report["fired"]] == ["running"], report
    fired = pisub.Run(report["fired"][0]["runId"])
    status = fired.wait_until_terminal(30)
    assert status.state == "complete"
    assert status.parent_run_id is None and status.depth == 0


HOLDER = """
import sys
from contextlib import ExitStack
from pathlib import Path
from pisub.core.locks import exclusive
with ExitStack() as stack:
    for path in sys.argv[1:]:
        stack.enter_context(exclusive(Path(path), 10))
    print("held", flush=True)
    sys.stdin.read()
"""


def hold_locks(*paths: Path) -> subprocess.Popen[str]:
    """A process holding the schedules' locks until its stdin is closed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *map(str, paths)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.wait(10)
    proc.stdout.close()


def sleeping(pid: int) -> bool:
    """Whether process ``pid`` sits in a sleep (nanosleep, clock_nanosleep: x86-64 numbers) —
    pisub's lock wait, which is the only sleep before a fire."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] in ("35", "230")
    except (OSError, IndexError):
        return False


def test_schedule_run_reads_now_after_the_lock_wait(home: Path, tmp_path: Path) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the test tells a lock wait by x86-64 syscall numbers")
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    made = schedule_create(workflow=wf, every="1m", schedule_id="st")
    holder = hold_locks(home / "schedules" / "st" / "lock")
    cli = subprocess.Popen(
        [sys.executable, "-m", "pisub", "schedule", "run", "st", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: sleeping(cli.pid), 30, interval=0.005, what="the run to wait for the lock")
        released = time.time()
        release(holder)
        out, err = cli.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            release(holder)
    assert cli.returncode == 0, err
    fire = json.loads(out)
    assert epoch(fire["claimedAt"]) >= released - 0.01  # not the time before the wait
    shown = schedule_show(made.id).schedule
    assert epoch(shown.next_run_at or "") >= released + 60 - 0.01  # re-anchored from the real now
    pisub.Run(fire["runId"]).wait_until_terminal(30)


def test_the_names_of_pisubs_own_files_are_no_schedule_ids(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    for name in ("last-tick.json", "timer.json"):
        done = pisub_cli("schedule", "create", "--workflow", str(wf), "--every", "1h", "--id", name)
        assert done.returncode == 1 and "[INVALID_INPUT]" in done.stderr and "pisub's" in done.stderr
    assert pisub_cli("schedule", "tick", check=True).stdout.strip() == "nothing due"
    assert json.loads((home / "schedules" / "last-tick.json").read_text())["v"] == 1


def test_a_stuck_lock_holder_delays_no_other_schedule_and_waits_add_up_to_one(
    home: Path, tmp_path: Path
) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    for sid in ("b1", "b2"):
        schedule_create(workflow=wf, every="1h", schedule_id=sid)
    due = schedule_create(workflow=wf, at="+1s", schedule_id="c")
    # a temp file a tick killed mid-write left behind
    stale = home / "schedules" / "c" / ".schedule.json.4242.0badc0de.tmp"
    stale.write_text("{}")
    wait_for(lambda: epoch(due.next_run_at or "") < time.time(), 5, what="c's slot to pass")
    holder = hold_locks(home / "schedules" / "b1" / "lock", home / "schedules" / "b2" / "lock")
    tick = subprocess.Popen(
        [sys.executable, "-m", "pisub", "schedule", "tick", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # c (sorted after the held ones) fires while b1 and b2 are still held
        fired = wait_for(lambda: runs_of(home), 30, interval=0.05, what="c to fire")
        assert tick.poll() is None  # the tick still waits for b1 and b2
        release(holder)
        out, err = tick.communicate(timeout=90)
    finally:
        if holder.poll() is None:
            release(holder)
    report = json.loads(out)
    assert [f["scheduleId"] for f in report["fired"]] == ["c"] and report["fired"][0]["runId"] in fired
    assert report["busy"] == [] and report["errors"] == [], (report, err)
    assert not stale.exists()
    pisub.Run(report["fired"][0]["runId"]).wait_until_terminal(30)


def test_a_stuck_fire_can_be_let_go_with_delete_force(
    home: Path, tmp_path: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", python=SLEEPER)
    wf = tmp_path / "long.py"
    wf.write_text(SLOW)
    made = schedule_create(workflow=wf, every="1m", name="long")
    first = epoch(made.next_run_at or "")
    fire = schedule_tick(now=first + 1).fired[0]
    run = pisub.Run(fire.run_id or "")
    pid = wait_for(lambda: run.status().pid, what="the fire's runner")
    os.kill(pid, signal.SIGSTOP)  # alive but stuck: it answers nothing
    try:
        report = schedule_tick(now=first + 61)
        assert [s.state for s in report.skipped] == [FireState.SKIPPED]
        refused = pisub_cli("schedule", "delete", "long")
        assert refused.returncode == 1 and "--force" in refused.stderr and "pause" in refused.stderr
        gone = pisub_cli("schedule", "delete", "long", "--force", check=True).stdout
        assert gone.strip() == f"deleted schedule {made.id}"
        assert not (home / "schedules" / made.id).exists()
        assert run.status().state == "running"  # goes on as an ordinary run
    finally:
        os.kill(pid, signal.SIGCONT)
    run.stop()
    assert run.wait_until_terminal(60).state == "stopped"


def test_every_is_shown_without_leading_zeros(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    made = json.loads(
        pisub_cli("schedule", "create", "--workflow", str(wf), "--every", "01m", "--json", check=True).stdout
    )
    assert made["trigger"]["every"] == "1m" and made["trigger"]["everyS"] == 60


def test_an_interval_without_its_next_slot_goes_on_and_says_so(home: Path, tmp_path: Path) -> None:
    wf = tmp_path / "w.js"
    wf.write_text(QUICK_JS)
    made = schedule_create(workflow=wf, every="1h", schedule_id="grid")
    path = home / "schedules" / "grid" / "schedule.json"
    record = json.loads(path.read_text())
    record["nextRunAt"] = None  # edited by hand
    path.write_text(json.dumps(record))
    report = json.loads(pisub_cli("schedule", "tick", "--json", check=True).stdout)
    assert report["errors"] and report["errors"][0].startswith("grid: nextRunAt was missing")
    shown = schedule_show("grid").schedule
    assert shown.next_run_at is not None
    assert epoch(shown.next_run_at) == pytest.approx(epoch(made.created_at) + 3600, abs=1)
    events = (home / "schedules" / "grid" / "events.jsonl").read_text()
    assert "schedule.repaired" in events
