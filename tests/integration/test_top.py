"""`pisub top` driven in tmux: select a real pi run, steer it (the receipt is shown), open its log
(the model's text as it streams), stop it after the confirmation, quit; where the cursor starts,
rows that keep their place while keys act on the highlighted run, the layout at 80 and 200
columns, colours (and none under NO_COLOR)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

import pisub
from pisub.api.client import launch_parallel
from pisub.api.views import FleetRow
from pisub.cli.top import Row, TopState, keys_of, render
from pisub.errors import PisubError
from tests.conftest import AgentMaker, processes_of, wait_for

pytestmark = pytest.mark.pi


class Tmux:
    """A tmux server of the test's own. Named (``-L``), not a socket path in ``tmp_path``: an
    xdist worker's ``tmp_path`` can be longer than a socket's path may be (108 bytes)."""

    def __init__(self) -> None:
        self.label = f"pisub-test-{uuid.uuid4().hex}"

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-L", self.label, *args], capture_output=True, text=True, timeout=30)
        return proc.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "top", *keys)

    def type(self, text: str) -> None:
        self("send-keys", "-t", "top", "-l", text)

    def styled(self) -> str:
        """The screen with its colours and attributes (SGR sequences)."""
        return self("capture-pane", "-e", "-p", "-t", "top")

    def highlighted(self) -> str:
        """The selected row (shown in reverse video), without its escape sequences."""
        rows = [line for line in self.styled().splitlines() if _REVERSE.search(line)]
        return _SGR.sub("", rows[0]) if rows else ""


_SGR = re.compile(r"\x1b\[[0-9;:]*m")
_REVERSE = re.compile(r"\x1b\[(?:[0-9;:]*;)?7(?:;[0-9;:]*)?m")
TOP = f"env -u COLUMNS -u LINES {sys.executable} -m pisub top"  # the pane's own size, not the test's
SLEEPER = "import sys, time\nsys.stdin.read()\nprint('working on it', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def tmux(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/test.sh installs it)")
    monkeypatch.setenv("SHELL", "/bin/sh")  # (pisub-ci's login shell is nologin: tmux runs commands with it)
    t = Tmux()
    yield t
    t("kill-server")


@pytest.mark.pi_versions
def test_top_selects_steers_logs_and_stops_a_run(pi_home: Path, tmux: Tmux) -> None:
    run = pisub.launch("pi", "SLOW:600 a long piece of work")
    wait_for(lambda: run.status().state == "running", timeout=30)
    tmux("new-session", "-d", "-s", "top", "-x", "180", "-y", "40", TOP)
    short = run.id[:8]
    wait_for(lambda: short in tmux.screen(), timeout=30, what="the run in the table")
    tmux.keys("s")
    wait_for(lambda: f"steer {short}>" in tmux.screen(), timeout=10, what="the steer prompt")
    tmux.type("please hurry")
    tmux.keys("Enter")
    wait_for(
        lambda: f"steer {short}: delivered" in tmux.screen() or f"steer {short}: queued" in tmux.screen(),
        timeout=20,
        what="the steer's receipt",
    )
    tmux.keys("Enter")
    wait_for(lambda: f"log of {short}" in tmux.screen(), timeout=10, what="the log view")
    # the model's text as it streams (pi's text deltas reach output-0.log), the run still running
    wait_for(lambda: "Slow chunk 3 of 600" in tmux.screen(), timeout=30, what="the streamed text")
    assert run.status().state == "running"
    screen = tmux.screen()
    assert "steering: " in screen and ("1 delivered" in screen or "1 queued" in screen), screen
    assert "back to the table" in screen and "j/k move" not in screen, screen  # its own footer
    tmux.keys("q")
    wait_for(lambda: "label/task" in tmux.screen(), timeout=10, what="the table again")
    tmux.keys("x")
    wait_for(lambda: f"stop {short}? y/n" in tmux.screen(), timeout=10, what="the confirmation")
    tmux.keys("y")
    assert run.wait(timeout=30).state == "stopped"
    wait_for(lambda: "stopped" in tmux.screen(), timeout=10, what="the stopped state")
    tmux.keys("q")
    wait_for(lambda: "top" not in tmux("list-sessions"), timeout=10, what="top to quit")


def test_keys_of_terminal_input() -> None:
    assert keys_of(b"jk\x1b[A\x1b[B\r\x1bq") == ["down", "up", "up", "down", "enter", "esc", "q"]


def test_top_refuses_a_pipe(home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "top"],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1 and "needs a terminal" in proc.stderr and "Traceback" not in proc.stderr


def test_top_shows_every_unreadable_run(home: Path, tmux: Tmux) -> None:
    import os

    runs = home / "runs"
    runs.mkdir(parents=True, mode=0o700)
    bad = [f"aaaaaaaa-0000-4000-8000-00000000000{n}" for n in range(7)]
    for number, run_id in enumerate(bad):
        (runs / run_id).mkdir(mode=0o700)
        status = runs / run_id / "status.json"
        if number == 0:
            os.mkfifo(status)
        elif number == 1:
            status.mkdir()
        else:
            status.write_bytes([b"", b"{", b"[1]", b"\xff", b"null"][number - 2])
    tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "40", f"{sys.executable} -m pisub top")
    wait_for(lambda: all(run_id in tmux.screen() for run_id in bad), timeout=30, what="every unreadable run")
    tmux.keys("q")


def test_top_ends_quietly_when_its_terminal_goes_away(home: Path, tmux: Tmux, tmp_path: Path) -> None:
    err, rc = tmp_path / "top.err", tmp_path / "top.rc"
    command = f"{sys.executable} -m pisub top 2>>{err}; echo $? >{rc}"
    tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "30", command)
    wait_for(lambda: "no runs yet" in tmux.screen(), timeout=30, what="the empty table")
    tmux("kill-server")
    wait_for(lambda: (err.exists() and rc.exists()) or not _top_alive(home), timeout=15, what="top to end")
    text = err.read_text() if err.exists() else ""
    assert "internal error" not in text and "Traceback" not in text, text


def _top_alive(home: Path) -> bool:
    """Whether this test's ``pisub top`` runs (it has this test's PISUB_HOME in its environment;
    other tests' tops, on other xdist workers, do not)."""
    for pid in processes_of(home):
        try:
            if b"pisub\0top" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def _sleepers(make_agent: AgentMaker, *tasks: str) -> list[pisub.Run]:
    make_agent("sleeper", python=SLEEPER)
    runs = []
    for task in tasks:
        runs.append(pisub.launch("sleeper", task))
        wait_for(lambda: runs[-1].status().state == "running", timeout=30, what="the run to start")
    return runs


def test_top_starts_on_the_newest_run_never_a_placeholder(
    home: Path, make_agent: AgentMaker, tmux: Tmux
) -> None:
    """The newest run is a workflow whose second call waits for a slot (a row with no run): the
    cursor starts on the workflow, not on the waiting call's row."""
    (older,) = _sleepers(make_agent, "an older run")
    workflow = launch_parallel(
        [
            {"key": "first", "agent": "sleeper", "task": "one"},
            {"key": "waits", "agent": "sleeper", "task": "two"},
        ],
        concurrency=1,
    )
    wait_for(lambda: any(s.run_id for s in workflow.status().steps), timeout=30, what="the first child")
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", TOP)
    wait_for(lambda: "waits" in tmux.screen() and older.id[:8] in tmux.screen(), timeout=30)
    assert workflow.id[:8] in tmux.highlighted(), tmux.screen()
    tmux.keys("q")


def test_top_keeps_rows_in_place_and_acts_on_the_highlighted_run(
    home: Path, make_agent: AgentMaker, tmux: Tmux
) -> None:
    """The newcomer's case: stop the top row, `j`, `i`: the stopped run stays where it was, `j`
    highlights the next run, and `i` interrupts that one (not a finished run)."""
    first, second, third = _sleepers(make_agent, "task one", "task two", "task three")
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", TOP)
    shorts = [run.id[:8] for run in (third, second, first)]
    wait_for(lambda: all(short in tmux.screen() for short in shorts), timeout=30, what="the three runs")
    assert shorts[0] in tmux.highlighted(), tmux.screen()
    tmux.keys("x")
    wait_for(lambda: f"stop {shorts[0]}? y/n" in tmux.screen(), timeout=10, what="the confirmation")
    tmux.keys("y")
    assert third.wait(timeout=30).state == "stopped"
    wait_for(lambda: "stopped" in _row_of(tmux.screen(), shorts[0]), timeout=10, what="the stopped state")
    assert _order(tmux.screen(), shorts) == shorts, tmux.screen()  # ended, and still on top
    tmux.keys("j")
    wait_for(lambda: shorts[1] in tmux.highlighted(), timeout=10, what="the next run highlighted")
    tmux.keys("i")
    wait_for(lambda: f"interrupt {shorts[1]}:" in tmux.screen(), timeout=15, what="the interrupt's answer")
    assert shorts[1] in tmux.highlighted() and _order(tmux.screen(), shorts) == shorts, tmux.screen()
    assert "RUN_CLOSED" not in tmux.screen(), tmux.screen()
    # an external CLI's run cannot be resumed: top refuses to pause it, as `pisub interrupt` does
    assert "delivered" not in tmux.screen(), tmux.screen()
    assert second.status().state == "running" and first.status().state == "running"
    tmux.keys("q")


def test_top_at_80_and_200_columns_with_colours(
    home: Path, make_agent: AgentMaker, tmux: Tmux, tmp_path: Path
) -> None:
    """At 80x24 the state words are whole, the task is shown and the run column is 8
    characters; at 200 the last output line is shown too; states are coloured, and not under
    NO_COLOR (the selection stays reverse video)."""
    make_agent("quick", python="import sys\nsys.stdin.read()\nprint('all done')\n")
    done = pisub.launch("quick", "summarise the parser module")
    assert done.wait(timeout=30).state == "complete"
    (live,) = _sleepers(make_agent, "refactor the lexer\nsecond line of the task")
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", TOP)
    wait_for(lambda: done.id[:8] in tmux.screen(), timeout=30, what="the runs")
    screen = tmux.screen()
    assert "complete" in _row_of(screen, done.id[:8]) and "running" in _row_of(screen, live.id[:8]), screen
    assert "summarise the parser module" in _row_of(screen, done.id[:8]), screen
    assert "refactor the lexer" in _row_of(screen, live.id[:8]), screen
    rows = [_row_of(screen, run.id[:8]) for run in (done, live)]
    assert all("…" not in row and live.id not in row for row in rows), screen  # 8-char ids, nothing cut
    assert f"{live.id[:8]} · in {str(tmp_path)[:40]}" in screen, screen  # the selected run's cwd
    styled = tmux.styled()
    assert "\x1b[32m" in styled and "\x1b[36m" in styled, styled  # complete green, running cyan
    tmux.keys("q")
    wait_for(lambda: "top" not in tmux("list-sessions"), timeout=10, what="top to quit")
    tmux("new-session", "-d", "-s", "top", "-x", "200", "-y", "50", f"NO_COLOR=1 {TOP}")
    wait_for(lambda: "working on it" in _row_of(tmux.screen(), live.id[:8]), timeout=30, what="the output")
    styled = tmux.styled()
    assert not re.search(r"\x1b\[(?:[0-9;]*;)?3[0-7]m", styled), styled
    assert live.id[:8] in tmux.highlighted(), styled
    tmux.keys("q")


def _row_of(screen: str, short: str) -> str:
    return next((line for line in screen.splitlines() if short in line), "")


def _order(screen: str, shorts: list[str]) -> list[str]:
    lines = screen.splitlines()
    return sorted(shorts, key=lambda short: next(i for i, line in enumerate(lines) if short in line))


def test_top_holds_new_rows_while_keys_are_pressed(home: Path, make_agent: AgentMaker, tmux: Tmux) -> None:
    """A run that starts while a person presses keys waits (a notice says so) and takes its
    place once the keys stop: nothing moves under the cursor."""
    (old,) = _sleepers(make_agent, "the old run")
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", TOP)
    wait_for(lambda: old.id[:8] in tmux.highlighted(), timeout=30, what="the run, selected")
    tmux.keys("k")
    new = pisub.launch("sleeper", "the new run")

    def held() -> bool:
        tmux.keys("k")  # still navigating
        return "1 new row(s)" in tmux.screen()

    wait_for(held, timeout=30, interval=0.3, what="the notice of a held row")
    assert new.id[:8] not in tmux.screen() and old.id[:8] in tmux.highlighted(), tmux.screen()
    wait_for(lambda: new.id[:8] in tmux.screen(), timeout=30, what="the new row once the keys stopped")
    assert old.id[:8] in tmux.highlighted() and "new row(s)" not in tmux.screen(), tmux.screen()
    tmux.keys("q")


def test_top_shows_the_end_of_a_last_line_longer_than_the_tail_it_reads(
    home: Path, make_agent: AgentMaker, tmux: Tmux
) -> None:
    """Attack 32, F2: a live run whose last line is 1.1 MB — the log view shows that line's
    last screenful, its first row marked as cut, never "(nothing written yet)"."""
    big = "import sys, time\nsys.stdin.read()\nprint('first')\nprint('y' * 1_100_000, flush=True)\n"
    big += "time.sleep(600)\n"
    make_agent("big", python=big)
    run = pisub.launch("big", "one huge line")
    wait_for(lambda: (run.dir / "output-0.log").stat().st_size > 1_100_000, timeout=30, what="the huge line")
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", TOP)
    wait_for(lambda: run.id[:8] in tmux.highlighted(), timeout=30, what="the run, selected")
    tmux.keys("Enter")
    wait_for(lambda: f"log of {run.id[:8]}" in tmux.screen(), timeout=10, what="the log view")
    wait_for(lambda: "y" * 80 in tmux.screen(), timeout=10, what="the huge line's end")
    screen = tmux.screen()
    assert "nothing written yet" not in screen and "\u2026" + "y" * 79 in screen, screen
    tmux.keys("q")


def test_top_shows_a_hostile_task_escaped(home: Path, make_agent: AgentMaker, tmux: Tmux) -> None:
    """The task head (and the log view's header) reach the terminal escaped: no title change,
    no rich markup taken as a hyperlink."""
    (run,) = _sleepers(make_agent, "[link=http://e.x/]x[/link] \x1b]0;pwned-title\x07 \u202eevil")
    tmux("new-session", "-d", "-s", "top", "-x", "200", "-y", "30", TOP)
    tmux("set-option", "-g", "allow-rename", "on")
    title = tmux("display", "-p", "-t", "top", "#{host}")
    wait_for(lambda: run.id[:8] in tmux.screen(), timeout=30, what="the run")
    row = _row_of(tmux.screen(), run.id[:8])
    assert "[link=http://e.x/]x[/link] \\x1b]0;pwned-title\\x07 \\u202eevil" in row, row
    tmux.keys("Enter")
    wait_for(lambda: f"log of {run.id[:8]}" in tmux.screen(), timeout=10, what="the log view")
    assert "\\x1b]0;pwned-title" in tmux.screen(), tmux.screen()
    assert tmux("display", "-p", "-t", "top", "#{pane_title}") == title
    assert "\x1b]" not in tmux.styled()
    tmux.keys("q")
    tmux.keys("q")


def _row(run_id: str, state: str) -> Row:
    fleet = FleetRow(
        run_id=run_id, key=None, parent_run_id=None, agent="coder", state=state, started_at=None,
        last_activity_at=None,
    )  # fmt: skip
    return Row(fleet, 0)


def _rendered(state: TopState, width: int = 80, height: int = 24) -> str:
    console = Console(width=width, height=height, record=True, force_terminal=True, color_system="standard")
    console.print(render(state, height, width))
    return str(console.export_text(styles=True))


def test_top_renders_a_state_it_does_not_know_plain() -> None:
    """A state a newer pisub writes (or `queued`) is shown whole, uncoloured when unknown."""
    state = TopState(rows=[_row("a" * 36, "queued"), _row("b" * 36, "brand-new-state")], selected=1)
    text = _rendered(state)
    assert "queued" in text and "brand-new-state" in text and "aaaaaaaa " in text, text
    assert "\x1b[36mqueued" in text and "\x1b[7mbrand-new-state" in text, repr(text)


def test_top_fits_its_screen_with_many_rows_and_problems() -> None:
    """50 rows, 9 unreadable runs and held rows at 80x24: 24 lines, the selected row and the
    footer on them."""
    rows = [_row(f"{n:08d}" + "-" * 28, "running") for n in range(50)]
    problems = [f"run-{n}: not JSON" for n in range(9)]
    state = TopState(rows=rows, problems=problems, selected=30, held=2)
    lines = _rendered(state).rstrip("\n").split("\n")
    assert len(lines) <= 24, lines
    assert "00000030" in "".join(lines) and "j/k move" in lines[-1] and "2 new row(s)" in lines[-2], lines
    assert "more unreadable runs" in "".join(lines), lines


def test_top_shows_the_label_cwd_and_steering_in_words() -> None:
    """A labelled run: the label in the table; its id, cwd, steering in words and task head on
    the line under it."""
    from pisub.protocol.control import Ledger
    from pisub.protocol.status import RunState, Status

    status = Status(
        v=1, run_id="c" * 36, state=RunState.RUNNING, agent="coder", runner="pi", host="h",
        started_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z", label="nightly-build",
        task="fix the flaky test", cwd="/src/app", steering=Ledger(requested=3, delivered=1, failed=1),
    )  # fmt: skip
    row = _row(status.run_id, "running")
    row.status = status
    text = _SGR.sub("", _rendered(TopState(rows=[row]), width=120))
    assert "nightly-build" in _row_of(text, "cccccccc  "), text
    detail = "cccccccc · [nightly-build] · in /src/app · steering: 1 queued, 1 delivered, 1 failed"
    assert detail + " · task: fix the flaky test" in text, text


def _key_order(screen: str, keys: list[str]) -> list[str]:
    """``keys`` (a workflow's children) in the order their rows are on the screen."""
    lines = screen.splitlines()
    return sorted(
        keys, key=lambda key: next(i for i, line in enumerate(lines) if re.search(rf"\s{key}\s", line))
    )


def _state_of(run: pisub.Run) -> str:
    """The run's state; empty while its directory is not there yet (its id is recorded first)."""
    try:
        return str(run.status().state)
    except PisubError:
        return ""


def _step_run(workflow: pisub.Run, index: int) -> str | None:
    """The run id of the workflow's ``index``-th call, once it has one."""
    steps = workflow.status().steps
    return steps[index].run_id if len(steps) > index else None


def test_top_keeps_a_workflows_children_in_plan_order_when_a_queued_one_starts(
    home: Path, make_agent: AgentMaker, tmux: Tmux
) -> None:
    """Attack 1, finding 11: concurrency 1, three calls; the cursor on the queued q2; q1 is
    stopped, q2 starts — q2 keeps its row (plan order, not start time) and the cursor on it. On
    a call with no run yet, x and s say why nothing was done."""
    make_agent("sleeper", python=SLEEPER)
    workflow = launch_parallel(
        [{"key": key, "agent": "sleeper", "task": f"task {key}"} for key in ("q1", "q2", "q3")],
        concurrency=1,
    )
    q1 = pisub.Run(wait_for(lambda: _step_run(workflow, 0), timeout=30, what="q1's run"))
    wait_for(lambda: _state_of(q1) == "running", timeout=30, what="q1 running")
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", TOP)
    keys = ["q1", "q2", "q3"]
    wait_for(lambda: all(re.search(rf"\s{k}\s", tmux.screen()) for k in keys), timeout=30, what="the calls")
    assert _key_order(tmux.screen(), keys) == keys, tmux.screen()
    assert workflow.id[:8] in tmux.highlighted(), tmux.screen()
    tmux.keys("j", "j")  # q1, then q2 (no run yet)
    wait_for(lambda: " q2 " in tmux.highlighted(), timeout=10, what="q2 highlighted")
    tmux.keys("x")
    wait_for(lambda: "q2 has not started (queued): stop its workflow" in tmux.screen(), timeout=10)
    assert "y/n" not in tmux.screen(), tmux.screen()
    tmux.keys("s")
    wait_for(lambda: "steer" not in tmux.screen().splitlines()[-1], timeout=10, what="no steer prompt")
    q1.stop()
    q2 = wait_for(lambda: _step_run(workflow, 1), timeout=30, what="q2's run")
    wait_for(lambda: q2[:8] in tmux.screen(), timeout=30, what="q2's run in the table")
    assert _key_order(tmux.screen(), keys) == keys, tmux.screen()  # q2 kept its row
    assert q2[:8] in tmux.highlighted(), tmux.screen()  # and the cursor
    tmux.keys("q")
    workflow.stop()


def test_top_at_80_columns_keeps_a_refusals_code_and_the_log_headers_cwd(
    pi_home: Path, make_agent: AgentMaker, tmux: Tmux, tmp_path: Path
) -> None:
    """Attack 1, finding 11: at 80 columns `i` on a finished run shows its code (RUN_CLOSED)
    before the words an 80-column footer may cut, and the log view keeps cwd and steering on a
    second header line."""
    make_agent("quick", python="import sys\nsys.stdin.read()\nprint('all done')\n")
    done = pisub.launch("quick", "a finished run")
    assert done.wait(timeout=30).state == "complete"
    live = pisub.launch("pi", "SLOW:600 a long piece of work with a task line long enough to fill the header")
    wait_for(lambda: live.status().state == "running", timeout=30)
    live.steer("please hurry")
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", TOP)
    wait_for(lambda: live.id[:8] in tmux.highlighted(), timeout=30, what="the live run selected")
    tmux.keys("j")
    wait_for(lambda: done.id[:8] in tmux.highlighted(), timeout=10, what="the finished run selected")
    tmux.keys("i")
    wait_for(lambda: f"interrupt {done.id[:8]}: RUN_CLOSED" in tmux.screen(), timeout=15, what="the refusal")
    footer = tmux.screen().rstrip("\n").splitlines()[-1].rstrip()
    with pytest.raises(PisubError) as refused:
        done.interrupt()
    full = f"interrupt {done.id[:8]}: {refused.value.code} — {refused.value.message}"
    shown = footer.removesuffix("…")
    assert len(footer) <= 80 and full.startswith(shown), (footer, full)
    assert shown == full or full[len(shown)] in " ;,.", (footer, full)  # cut after a whole word
    tmux.keys("k")
    wait_for(lambda: live.id[:8] in tmux.highlighted(), timeout=10, what="the live run selected")
    tmux.keys("Enter")
    wait_for(lambda: f"log of {live.id[:8]}" in tmux.screen(), timeout=10, what="the log view")
    header = tmux.screen().splitlines()[:2]
    assert "steering: 1 " in header[1] and f"in {str(tmp_path)[:30]}" in header[1], header
    tmux.keys("q")
    tmux.keys("q")
    live.stop()
