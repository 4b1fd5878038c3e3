"""``pisub schedule install`` / ``uninstall`` / ``timer`` against the real ``crontab`` of whoever
runs the tests (root, or pisub-ci under scripts/test.sh), and ``pisub doctor``'s schedule line.

Every test touches only its own lines: its homes' entries (removed by a finalizer, also when the
test fails) and the foreign lines it adds itself (a tag of its own; a February 31st that never
comes). Other workers' homes may add lines at the same time: edits to the crontab go through
the same user lock pisub takes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pisub.api.schedule_timer import cron_daemon, home_hash, read_crontab, uninstall, user_lock, write_crontab
from pisub.core.procs import end_group
from tests.conftest import end_processes, pid_alive, pisub_cli, processes_of, wait_for, wait_no_processes

CRON_SKIP = "no crontab command: apt-get install cron (scripts/test.sh installs it as root)"


def _skip(why: str) -> None:
    """Skip — or fail under CI, where ``scripts/test.sh`` made sure cron is there
    (``PISUB_REQUIRE_CRON=1``)."""
    if os.environ.get("PISUB_REQUIRE_CRON") == "1":
        pytest.fail(why)
    pytest.skip(why)


def need_crontab() -> None:
    """Skip (with the fix) where there is no ``crontab`` this user may use."""
    if shutil.which("crontab") is None:
        _skip(CRON_SKIP)
    done = subprocess.run(["crontab", "-l"], capture_output=True, timeout=30, check=False)
    if done.returncode != 0 and b"no crontab for" not in done.stderr:
        _skip(f"crontab -l fails for this user: {done.stderr.decode(errors='replace').strip()}")


def need_cron_daemon() -> None:
    """Skip (with the fix) where no cron daemon runs: nothing would ever run the entry."""
    need_crontab()
    pidfile = Path("/var/run/crond.pid")
    try:
        listed = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        listed = 0
    if cron_daemon() is None and not (listed > 0 and pid_alive(listed)):
        _skip("no cron daemon runs (pgrep -x cron, /var/run/crond.pid): start one (scripts/test.sh does)")


def ours(home: Path) -> list[bytes]:
    """The crontab lines of ``home``'s entry."""
    mark = f"# pisub-tick:{home_hash(home)} ".encode()
    return [line for line in read_crontab().split(b"\n") if mark in line]


def cli_json(*args: str, env: dict[str, str] | None = None) -> Any:
    """``pisub ARGS --json``'s object (it must succeed)."""
    done = pisub_cli(*args, "--json", env=env, check=True)
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


@pytest.fixture
def cron_home(home: Path) -> Iterator[Path]:
    """The test's home, whose timer entry is removed at the end whatever happened."""
    need_crontab()
    yield home
    if home.exists():
        uninstall(home=home)


@pytest.fixture
def other_home(tmp_path: Path) -> Iterator[Path]:
    """A second home (its own entry, removed at the end)."""
    root = tmp_path / "other home"
    yield root
    if root.exists():
        uninstall(home=root)


@pytest.fixture
def foreign_lines() -> Iterator[list[bytes]]:
    """Lines of someone else's put in the crontab (comment, variable, a job that never runs, a
    byte that is not UTF-8, cron's escaped %), taken out again at the end."""
    tag = uuid.uuid4().hex
    lines = [
        f"# someone else's crontab {tag}".encode(),
        f"0 0 31 2 * /bin/echo never 100\\% {tag} ".encode() + b"\xff",
        f"#0 0 31 2 * disabled {tag}\t# two  spaces".encode(),
    ]
    with user_lock():
        current = read_crontab()
        if current and not current.endswith(b"\n"):
            current += b"\n"
        write_crontab(current + b"\n".join(lines) + b"\n")
    yield lines
    with user_lock():
        write_crontab(b"".join(x + b"\n" for x in read_crontab().split(b"\n") if x and tag.encode() not in x))


def test_dry_run_says_the_entry_and_writes_nothing(cron_home: Path) -> None:
    plan = cli_json("schedule", "install", "--cron", "--dry-run")
    entry = str(plan["entry"])
    assert plan["kind"] == "cron" and plan["dryRun"] is True and plan["changed"] is True
    assert entry.startswith("* * * * * /usr/bin/env PISUB_HOME=")
    assert f"PISUB_HOME={cron_home} " in entry
    assert (
        f" {sys.executable} -m pisub schedule tick --from cron --quiet # pisub-tick:{home_hash(cron_home)} "
        in entry
    )
    assert plan["pisub"] == [os.path.abspath(sys.executable), "-m", "pisub"]
    assert ours(cron_home) == []
    said = pisub_cli("schedule", "install", "--cron", "--dry-run", check=True).stdout
    assert said.startswith("would install: cron timer in the crontab of ")
    assert f"  entry: {entry}\n" in said
    assert ours(cron_home) == []
    assert not (cron_home / "schedules" / "timer.json").exists()


def test_install_is_idempotent_and_uninstall_removes_only_its_own(
    cron_home: Path, other_home: Path, foreign_lines: list[bytes]
) -> None:
    other_env = {**os.environ, "PISUB_HOME": str(other_home)}
    other = cli_json("schedule", "install", "--cron", env=other_env)
    first = cli_json("schedule", "install", "--cron")
    assert first["changed"] is True and first["dryRun"] is False
    assert ours(cron_home) == [str(first["entry"]).encode()]
    before = read_crontab()
    # Foreign lines and the other home's entry, byte for byte and in their order.
    assert b"\n".join(foreign_lines) + b"\n" in before
    assert ours(other_home) == [str(other["entry"]).encode()]

    again = cli_json("schedule", "install")  # the machine's timer: cron here
    assert again["kind"] == "cron" and again["changed"] is False and again["entry"] == first["entry"]
    assert ours(cron_home) == [str(first["entry"]).encode()]
    assert b"\n".join(foreign_lines) + b"\n" in read_crontab()

    state = cli_json("schedule", "timer")
    assert state["installed"] == [
        {
            "kind": "cron",
            "entry": first["entry"],
            "pisub": [os.path.abspath(sys.executable), "-m", "pisub"],
            "pisubExists": True,
            "active": state["installed"][0]["active"],
        }
    ]
    # cron may tick the entry while it is installed
    assert state["lastTick"] is None or state["lastTick"]["source"] == "cron"
    record = json.loads((cron_home / "schedules" / "timer.json").read_bytes())
    assert record["kind"] == "cron" and record["entry"] == first["entry"]
    assert (cron_home / "schedules" / "timer.json").stat().st_mode & 0o777 == 0o600

    gone = cli_json("schedule", "uninstall")
    assert [r["entry"] for r in gone["removed"]] == [first["entry"]]
    assert ours(cron_home) == []
    after = read_crontab()
    assert b"\n".join(foreign_lines) + b"\n" in after
    assert ours(other_home) == [str(other["entry"]).encode()]
    assert cli_json("schedule", "uninstall")["removed"] == []
    assert pisub_cli("schedule", "uninstall", check=True).stdout.startswith("nothing to remove: ")
    assert cli_json("schedule", "timer")["installed"] == []


def test_a_home_with_a_space_and_a_percent_is_quoted_and_escaped(tmp_path: Path) -> None:
    need_crontab()
    root = tmp_path / "my home 100%"
    env = {**os.environ, "PISUB_HOME": str(root)}
    try:
        plan = cli_json("schedule", "install", "--cron", env=env)
        line = ours(root)
        assert line == [str(plan["entry"]).encode()]
        assert (
            b"PISUB_HOME=" in line[0]
            and b"'PISUB_HOME=" + str(root).replace("%", "\\%").encode() + b"'" in line[0]
        )
        assert b"100%" not in line[0].replace(b"\\%", b"")  # every % escaped for cron
        assert "a % in a path is written as \\% (cron reads a bare % as a newline)" in plan["notes"]
        shown = pisub_cli("schedule", "timer", env=env, check=True).stdout
        assert f"  runs: {sys.executable} -m pisub schedule tick --from cron --quiet\n" in shown
    finally:
        uninstall(home=root)
    assert ours(root) == []


@pytest.mark.parametrize("name", ["back\\slash", "new\nline"])
def test_a_home_a_crontab_line_cannot_hold_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    need_crontab()
    root = tmp_path / name
    done = pisub_cli("schedule", "install", "--cron", env={**os.environ, "PISUB_HOME": str(root)})
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.rstrip().endswith("[INVALID_INPUT]"), (
        done.stderr
    )
    assert "a crontab line or a unit file cannot hold safely" in done.stderr
    assert ours(root) == [] and not root.exists()


def test_no_timer_on_the_machine_is_one_line_with_its_code(home: Path) -> None:
    env = {**os.environ, "PATH": str(home.parent / "no-such-bin")}  # neither crontab nor systemctl
    done = pisub_cli("schedule", "install", env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("pisub: no timer on this machine: ") and done.stderr.rstrip().endswith(
        "[TIMER_ERROR]"
    )
    assert len(done.stderr.splitlines()) == 1
    said = pisub_cli("schedule", "timer", env=env, check=True).stdout
    assert "this machine has neither a systemd user manager nor a crontab command" in said


def test_timer_names_a_missing_pisub_and_a_stale_tick(cron_home: Path) -> None:
    plan = cli_json("schedule", "install", "--cron")
    gone_python = str(cron_home.parent / "removed venv" / "bin" / "python")
    with user_lock():  # the venv it was installed from is removed: the entry names a lost path
        current = read_crontab()
        entry = str(plan["entry"]).encode()
        write_crontab(
            current.replace(
                entry, entry.replace(sys.executable.encode(), gone_python.encode().replace(b" ", b"' '"))
            )
        )
    state = cli_json("schedule", "timer")
    assert state["installed"][0]["pisub"][0] == gone_python
    assert state["installed"][0]["pisubExists"] is False
    assert any(f"({gone_python}) no longer exists" in w for w in state["warnings"])

    # The last tick (as `pisub schedule tick` writes it) 10 minutes ago.
    old = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 600))
    tick = {"v": 1, "at": old, "pid": 1, "source": "cron", "fired": 2}
    (cron_home / "schedules" / "last-tick.json").write_text(json.dumps(tick))
    state = cli_json("schedule", "timer")
    assert state["lastTick"]["source"] == "cron" and state["lastTick"]["fired"] == 2
    assert any(
        w.startswith("the last tick was 10 min ago while a cron timer is installed")
        for w in state["warnings"]
    )
    shown = pisub_cli("schedule", "timer", check=True).stdout
    assert f"last tick: {old} (10 min ago), from cron, fired 2\n" in shown
    doctor = json.loads(pisub_cli("doctor", "--json").stdout)  # (exit 1 when pi has no model here)
    line = next(c for c in doctor["checks"] if c["name"] == "schedule")
    assert line["ok"] is True  # no schedule: a warning, not a problem
    assert line["detail"].startswith("warning: 0 schedules; timer: cron (last tick 10 min ago): ")


def test_doctor_says_when_no_timer_is_installed(home: Path) -> None:
    doctor = json.loads(pisub_cli("doctor", "--json").stdout)  # (exit 1 when pi has no model here)
    line = next(c for c in doctor["checks"] if c["name"] == "schedule")
    assert line == {
        "name": "schedule",
        "ok": True,
        "detail": "0 schedules; no timer installed: schedules fire only on `pisub schedule tick` "
        "(install one: pisub schedule install)",
        "fix": None,
    }


def test_doctor_names_a_ticking_timer(cron_home: Path) -> None:
    cli_json("schedule", "install", "--cron")
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    tick = {"v": 1, "at": now, "pid": 1, "source": "cron", "fired": 0}
    (cron_home / "schedules" / "last-tick.json").write_text(json.dumps(tick))
    shown = pisub_cli("doctor").stdout
    line = next(x for x in shown.splitlines() if " schedule " in x)
    assert line.startswith("ok   schedule 0 schedules; timer: cron (last tick "), line


def test_systemd_dry_run_shows_both_units(home: Path) -> None:
    plan = cli_json("schedule", "install", "--systemd", "--dry-run")
    digest = home_hash(home)
    paths = [f["path"] for f in plan["files"]]
    assert [Path(p).name for p in paths] == [f"pisub-tick-{digest}.service", f"pisub-tick-{digest}.timer"]
    assert plan["entry"] == paths[1]
    service = plan["files"][0]["text"]
    assert f'Environment="PISUB_HOME={home}"\n' in service
    assert (
        f'ExecStart="{sys.executable}" "-m" "pisub" "schedule" "tick" "--from" "systemd" "--quiet"\n'
        in service
    )
    assert not any(Path(p).exists() for p in paths)


def test_systemd_install_without_a_user_manager_is_refused(home: Path) -> None:
    from pisub.api.schedule_timer import user_manager

    if user_manager():
        pytest.skip("a systemd user manager answers here: the refusal cannot be seen")
    done = pisub_cli("schedule", "install", "--systemd")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1
    assert "no systemd user manager answers" in done.stderr and done.stderr.rstrip().endswith("[TIMER_ERROR]")
    assert pisub_cli("schedule", "install", "--cron", "--systemd").stderr.rstrip().endswith("[INVALID_INPUT]")


def test_installs_of_many_homes_at_once_lose_no_line(tmp_path: Path) -> None:
    """Each install reads, changes and writes the whole crontab: the user lock keeps six at once
    from writing over each other's line."""
    need_crontab()
    roots = [tmp_path / f"h{n}" for n in range(6)]
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "pisub", "schedule", "install", "--cron"],
                env={**os.environ, "PISUB_HOME": str(root)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            for root in roots
        ]
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=120)
            finally:
                end_group(proc)
            assert proc.returncode == 0, err
        assert [len(ours(root)) for root in roots] == [1] * 6
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "pisub", "schedule", "uninstall"],
                env={**os.environ, "PISUB_HOME": str(root)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            for root in roots
        ]
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=120)
            finally:
                end_group(proc)
            assert proc.returncode == 0, err
        assert [len(ours(root)) for root in roots] == [0] * 6
    finally:
        for root in roots:
            if root.exists():
                uninstall(home=root)


def test_an_entry_of_a_removed_home_is_named_and_uninstalled_without_creating_it(
    cron_home: Path, other_home: Path
) -> None:
    other_env = {**os.environ, "PISUB_HOME": str(other_home)}
    cli_json("schedule", "install", "--cron", env=other_env)
    shutil.rmtree(other_home)  # removed without `uninstall`: its line ticks a home that is gone
    notes = cli_json("schedule", "timer")["notes"]
    assert any(f"({other_home}" in n and "no longer exist" in n for n in notes), notes
    gone = cli_json("schedule", "uninstall", env=other_env)
    assert len(gone["removed"]) == 1 and ours(other_home) == []
    assert not other_home.exists()  # uninstall did not make the home again


CRON_FIRE_S = 180.0
"""How long THE test waits for cron. Cron starts its jobs in a minute's first seconds: the first
tick after the slot fires it (up to ~60 s away, or ~120 s when the schedule was made in the last
second before a tick), and the tick after that reconciles the ended run into the history (60 s
more); the rest is room for a loaded machine. It returns as soon as both are seen (~65-125 s)."""


@pytest.fixture
def cron_fire_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private home whose path has a space and a % (cron's newline), exported as PISUB_HOME;
    at the end its cron entry is removed and what is left of its runs ended, whatever happened."""
    root = tmp_path / "cron home 100%"
    monkeypatch.setenv("PISUB_HOME", str(root))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.chdir(tmp_path)
    try:
        yield root
    finally:
        if root.exists():
            uninstall(home=root)
        end_processes(processes_of(root), {os.getuid()})
        wait_no_processes(root, timeout=10)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())  # written atomically: whole or missing
    except FileNotFoundError:
        return None


@pytest.mark.idle  # it waits up to two of cron's minutes: in a pass of its own (scripts/test.sh)
def test_cron_alone_fires_a_schedule(cron_fire_home: Path) -> None:
    """THE test: nothing but the cron daemon starts the tick that fires the schedule — no pi, no
    resident pisub, no pisub command of the test's while it waits."""
    need_cron_daemon()
    root = cron_fire_home
    plan = cli_json("schedule", "install", "--cron")
    assert plan["changed"] is True and "\\%" in plan["entry"]
    script = "return 'fired by cron';"
    schedule = cli_json("schedule", "create", "--workflow-script", script, "--at", "+1s", "--name", "by-cron")
    sid = schedule["id"]
    assert processes_of(root) == []  # nothing of pisub stays resident: only cron can tick now

    def fired() -> Any:
        """The completed fire, once cron has ticked the home (last-tick.json says cron)."""
        tick = _read_json(root / "schedules" / "last-tick.json")
        history = _read_json(root / "schedules" / sid / "history.json")
        fires = [] if history is None else [f for f in history["fires"] if f["state"] == "completed"]
        if tick is None or tick["source"] != "cron" or not fires:
            return None
        return fires[0]

    what = "cron to tick the home and the schedule's fire to complete"
    fire = wait_for(fired, timeout=CRON_FIRE_S, interval=0.5, what=what)
    # Only now does the test run pisub again.
    assert fire["dueReason"] == "timer" and fire["runId"], fire
    status = _read_json(root / "runs" / fire["runId"] / "status.json")
    assert status["state"] == "complete", status
    history = json.loads(pisub_cli("schedule", "history", sid, "--json", check=True).stdout)
    assert [f["id"] for f in history if f["state"] == "completed"] == [fire["id"]]
    state = cli_json("schedule", "timer")
    assert state["lastTick"]["source"] == "cron" and state["warnings"] == [], state
    doctor = json.loads(pisub_cli("doctor", "--json").stdout)
    line = next(c for c in doctor["checks"] if c["name"] == "schedule")
    assert line["ok"] is True and line["detail"].startswith("1 schedule; timer: cron (last tick "), line


def test_doctor_warns_of_schedules_without_a_timer_and_fails_a_timer_that_stopped(cron_home: Path) -> None:
    later = cli_json("schedule", "create", "--workflow-script", "return 1;", "--at", "+2h", "--name", "later")
    assert later["id"]
    doctor = json.loads(pisub_cli("doctor", "--json").stdout)
    line = next(c for c in doctor["checks"] if c["name"] == "schedule")
    assert line["ok"] is True
    assert line["detail"] == (
        "warning: 1 schedule; no timer installed: schedules fire only on `pisub schedule tick` "
        "(install one: pisub schedule install)"
    )
    cli_json("schedule", "install", "--cron")
    old = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 3600))
    (cron_home / "schedules" / "last-tick.json").write_text(
        json.dumps({"v": 1, "at": old, "pid": 1, "source": "cron", "fired": 0})
    )
    doctor = json.loads(pisub_cli("doctor", "--json").stdout)
    line = next(c for c in doctor["checks"] if c["name"] == "schedule")
    assert line["ok"] is False and doctor["healthy"] is False
    stale = "1 schedule; timer: cron (last tick 60 min ago): the last tick was 60 min ago"
    assert line["detail"].startswith(stale), line
    assert line["fix"] == "pisub schedule timer says more; pisub schedule install repairs the entry"
