"""``pisub top``'s own screen (``pisub.cli.top_screen``): every line fits its width in cells, a
frame rewrites only the lines that changed, and nothing a run wrote reaches the terminal but
as escaped text between the view's own sequences."""

from __future__ import annotations

import os
import re

from hypothesis import given
from hypothesis import strategies as st
from rich.cells import cell_len

from pisub.api.views import FleetRow
from pisub.cli.top import Row, TopState, screen
from pisub.cli.top_screen import Painter, encode_line, table
from pisub.store.paths import RunPaths
from tests.unit.test_termsafe import HOSTILE, UNSAFE

OWN = re.compile(r"\x1b\[(?:[0-9;]*[mHJK]|\?(?:1049|25)[hl])")
"""Exactly the sequences the painter writes itself."""


def _row(run_id: str, state: str = "running", task: str = "t", agent: str = "coder") -> Row:
    fleet = FleetRow(
        run_id=run_id, key=None, parent_run_id=None, agent=agent, state=state, started_at=None,
        last_activity_at=None,
    )  # fmt: skip
    row = Row(fleet, 0, spark=task)
    return row


def _painted(frames: list[tuple[TopState, int, int]], colour: bool = True) -> list[bytes]:
    """What the painter wrote for each frame (after entering the screen)."""
    read, write = os.pipe()
    out = []
    try:
        with Painter(write, colour) as painter:
            os.read(read, 1 << 16)  # (entering)
            for state, height, width in frames:
                painter.paint(screen(state, height, width), height, width)
                os.set_blocking(read, False)
                try:
                    out.append(os.read(read, 1 << 20))
                except BlockingIOError:
                    out.append(b"")
    finally:
        os.close(read)
        os.close(write)
    return out


def test_hostile_text_reaches_the_terminal_escaped() -> None:
    """Every hostile sequence, as a run's task, agent name and last output line, through the
    whole path (lines, SGR, cursor moves): only the painter's own sequences are left."""
    for width in (80, 200):
        rows = [_row(f"{i:08d}" + "a" * 28, task=text, agent=text) for i, text in enumerate(HOSTILE.values())]
        rows[0].fleet.state = "\x1b[8mconcealed"
        state = TopState(rows=rows, problems=list(HOSTILE.values()), message="\x1b]0;t\x07")
        (written,) = _painted([(state, 60, width)])
        text = OWN.sub("", written.decode("utf-8"))
        assert "\x1b" not in text and not UNSAFE.search(text.replace("\n", "")), repr(text)
        assert "[link=" not in text or "\\x1b" in text


@given(st.text(max_size=80), st.integers(min_value=20, max_value=200))
def test_every_line_fits_its_width_in_cells(task: str, width: int) -> None:
    state = TopState(rows=[_row("b" * 36, task=task), _row("c" * 36, task="全角の文字" * 20)], message=task)
    for line in screen(state, 24, width):
        assert sum(cell_len(text) for text, _ in line) <= width, (line, width)


def test_a_frame_rewrites_only_the_lines_that_changed() -> None:
    rows = [_row(f"{i:08d}" + "d" * 28) for i in range(10)]
    one = TopState(rows=rows)
    two = TopState(rows=[*rows[:4], _row("e" * 36), *rows[5:]])
    first, same, changed = _painted([(one, 24, 80), (one, 24, 80), (two, 24, 80)])
    assert b"00000003" in first and same == b""
    assert b"eeeeeeee" in changed and b"00000003" not in changed and changed.count(b"H") == 1, changed


def test_a_full_line_is_not_erased_after_its_last_cell() -> None:
    """The cursor waits on the last cell after a full line: an erase there would blank it."""
    line = (("x" * 80, ""),)
    read, write = os.pipe()
    try:
        painter = Painter(write, colour=False)
        painter.paint([line, (("short", ""),)], 2, 80)
        written = os.read(read, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
    assert b"x" * 80 + b"\x1b[K" not in written and b"short\x1b[K" in written, written


def test_states_coloured_and_not_without_colour() -> None:
    state = TopState(rows=[_row("f" * 36, "complete"), _row("g" * 36, "brand-new")], selected=1)
    (coloured,) = _painted([(state, 24, 80)])
    (plain,) = _painted([(state, 24, 80)], colour=False)
    assert b"\x1b[32mcomplete" in coloured and b"\x1b[7mbrand-new" in coloured, coloured
    assert not re.search(rb"\x1b\[(?:[0-9;]*;)?3[0-7]m", plain) and b"\x1b[7mbrand-new" in plain, plain


def test_the_table_gives_the_last_columns_what_the_others_leave() -> None:
    lines = table(
        ["a", "b", "task", "out"], [([("x" * 10, ""), ("y", ""), ("t", ""), ("o", "")], "")], 100, [3, 2]
    )
    row = encode_line(lines[1], colour=False)
    assert len(row) == 100 and row.startswith("x" * 10 + "  y  t"), row
    assert row.index("o") == 10 + 2 + 1 + 2 + (100 - 3 * 2 - 11) * 3 // 5 + 2, row  # task : output = 3 : 2


def test_a_last_line_longer_than_the_tail_read_is_shown_cut_never_nothing(bare_run: RunPaths) -> None:
    """Attack 32, F2: a log whose last line is longer than the bytes read from its end (1.1 MB
    of ``y`` after ``first``) — the transcript gives that line's end behind ``…`` (from a whole
    character), not nothing; the log view shows its last screenful, its first row marked as cut."""
    from pisub.runs.views import CUT, TAIL_BYTES, transcript

    log = bare_run.output_log(0)
    log.write_bytes(b"first\n" + b"y" * 1_100_000 + b"\n")
    (line,) = transcript(bare_run, 3)
    assert line == CUT + "y" * (TAIL_BYTES - 1), len(line)
    log.write_bytes(b"first\n" + "é".encode() * 600_000 + b"\nlast")  # the tail begins inside a character
    cut, last = transcript(bare_run, 3)
    assert cut.startswith(CUT + "é") and "\udcc3" not in cut and "\udca9" not in cut and last == "last"
    log.write_bytes(b"a" * 100 + b"\n" + b"b" * (TAIL_BYTES - 1) + b"\n")  # the tail begins at a line
    assert transcript(bare_run, 3) == ["b" * (TAIL_BYTES - 1)]
    log.write_bytes(b"a" * 100 + b"\n" + b"b" * (TAIL_BYTES - 1))  # nothing of the cut line read
    assert transcript(bare_run, 3) == ["b" * (TAIL_BYTES - 1)]
    state = TopState(rows=[_row("c" * 36)], mode="log", log=["first", "y" * 1_100_000], target=_row("c" * 36))
    lines = ["".join(text for text, _style in line) for line in screen(state, 24, 80)]
    assert "(nothing written yet)" not in " ".join(lines), lines
    assert lines[1] == "\u2026" + "y" * 79 and lines[2:-1] == ["y" * 80] * 21, lines
    state.log = ["first", "y" * 100, "z"]  # everything fits: nothing marked
    lines = ["".join(text for text, _style in line) for line in screen(state, 24, 80)]
    assert lines[1:5] == ["first", "y" * 80, "y" * 20, "z"], lines


def test_a_live_runs_last_line_longer_than_its_read_starts_on_a_whole_character(bare_run: RunPaths) -> None:
    """Attack 33, F4: top's output column showed ``\\udcac€€€…`` for a last line of 4,201 bytes
    of ``€`` (its 4,096-byte read began inside a character)."""
    from pisub.api.views import SPARK_BYTES, log_last_line
    from pisub.runs.views import CUT

    log = bare_run.output_log(0)
    for extra in range(3):  # the read begins on each byte of a character in turn
        log.write_bytes(b"a" + "€".encode() * 1400 + b"x" * extra)
        line = log_last_line(log)
        assert line.startswith(CUT + "€"), ascii(line[:8])
        assert not any("\udc80" <= char <= "\udcff" for char in line), ascii(line[:8])
        assert line.endswith("€" + "x" * extra)
    log.write_bytes(b"first\n" + "€".encode() * 600 + b"\n")  # within the read: whole, unmarked
    assert log_last_line(log) == "€" * 600
    log.write_bytes(b"x" * (SPARK_BYTES + 10) + b"\nlast\n")
    assert log_last_line(log) == "last"
