"""``pisub top``'s screen: lines of styled pieces laid out in the terminal's cells, and a painter
that writes to the terminal only the lines that changed since the last frame.

A redraw used to hand rich a table to measure and render whole (~25 ms for 40 rows of 160
columns, each second while an age shown moves); laying the table out here and rewriting only
the lines that differ costs a few milliseconds and a few hundred bytes.

Every piece's text is escaped by its maker (:func:`pisub.termsafe.printable`) before it gets
here; a style is one of this module's own words (never text from a run), turned into SGR codes
by :data:`SGR` — a word it does not know adds nothing."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rich.cells import cell_len as _cell_len
from rich.cells import set_cell_size

Piece = tuple[str, str]
"""Escaped text and its style (space-separated words of :data:`SGR`)."""
Line = tuple[Piece, ...]

SGR = {
    "bold": "1",
    "dim": "2",
    "reverse": "7",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "cyan": "36",
}
COLOURS = {"red", "green", "yellow", "cyan"}
GAP = 2
"""Cells between two columns."""


def cell_len(text: str) -> int:
    """The cells ``text`` takes (escaped text: ASCII is one cell a character)."""
    return len(text) if text.isascii() else _cell_len(text)


def fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells: cut with ``…`` when longer."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1) + "…"


def pad(text: str, width: int) -> str:
    """``text`` fitted to exactly ``width`` cells (cut with ``…``, or padded with spaces)."""
    shown = fit(text, width)
    return shown + " " * (width - cell_len(shown))


def cut_line(line: Line, width: int) -> Line:
    """``line`` cut at the screen's edge (with ``…``)."""
    out: list[Piece] = []
    room = width
    for text, style in line:
        size = cell_len(text)
        if size <= room:
            out.append((text, style))
            room -= size
            continue
        out.append((fit(text + "…", room) if room > 0 else "", style))  # (always ends in …)
        break
    return tuple(out)


def table(
    header: Sequence[str],
    rows: Sequence[tuple[Sequence[Piece], str]],
    width: int,
    ratios: Sequence[int],
    header_style: str = "bold",
) -> list[Line]:
    """A table ``width`` cells wide (wider only when even its narrowest columns are): the
    header, then each row (its cells, its row style). The
    first columns (as many as ``header`` has beyond ``ratios``) are as wide as their widest
    cell; the last ``len(ratios)`` share what is left by those ratios. When the fixed columns
    do not fit, the widest of them give up cells first."""
    n = len(header)
    flex = len(ratios)
    fixed = n - flex
    widths = [cell_len(name) for name in header]
    for cells, _ in rows:
        for i in range(fixed):
            widths[i] = max(widths[i], cell_len(cells[i][0]))
    room = width - GAP * (n - 1)
    flex_min = [min(cell_len(name), 4) for name in header[fixed:]]
    over = sum(widths[:fixed]) + sum(flex_min) - room
    while over > 0:  # the widest fixed column gives up a cell, until the row fits (or all are 1)
        widest = max(range(fixed), key=lambda i: widths[i], default=None)
        if widest is None or widths[widest] <= 1:
            break
        widths[widest] -= 1
        over -= 1
    left = max(sum(flex_min), room - sum(widths[:fixed]))
    total = sum(ratios) or 1
    given = 0
    for j, ratio in enumerate(ratios):
        share = left - given if j == flex - 1 else max(flex_min[j], left * ratio // total)
        widths[fixed + j] = share
        given += share
    lines = [_row([(name, header_style) for name in header], widths, "")]
    lines += [_row(cells, widths, style) for cells, style in rows]
    return lines


def _row(cells: Sequence[Piece], widths: list[int], row_style: str) -> Line:
    pieces: list[Piece] = []
    last = len(widths) - 1
    for i, ((text, style), size) in enumerate(zip(cells, widths, strict=True)):
        both = f"{row_style} {style}".strip()
        pieces.append((pad(text, size), both))
        if i < last:
            pieces.append((" " * GAP, row_style))
    return tuple(pieces)


def sgr(style: str, colour: bool) -> str:
    """The SGR sequence of ``style`` (empty for no style; colours only when ``colour``)."""
    codes = [SGR[word] for word in style.split() if word in SGR and (colour or word not in COLOURS)]
    return f"\x1b[{';'.join(codes)}m" if codes else ""


def encode_line(line: Line, colour: bool) -> str:
    """``line`` as the terminal is sent it: each styled piece between its SGR and a reset."""
    out = []
    for text, style in line:
        start = sgr(style, colour)
        out.append(f"{start}{text}\x1b[0m" if start else text)
    return "".join(out)


def to_rich(lines: Sequence[Line]) -> object:
    """``lines`` as a rich renderable (for tests and any caller that prints with rich): one
    ``Text`` a line, never wrapped, each piece's style its own (text taken literally)."""
    from rich.console import Group
    from rich.text import Text

    shown = []
    for line in lines:
        text = Text(no_wrap=True, overflow="ellipsis")
        for piece, style in line:
            text.append(piece, style=style or None)
        shown.append(text)
    return Group(*shown)


class Painter:
    """The alternate screen of terminal ``fd``, repainted line by line: a frame writes only
    the lines that differ from the last one (all of them after the size changed)."""

    ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"
    LEAVE = "\x1b[0m\x1b[?25h\x1b[?1049l"

    def __init__(self, fd: int, colour: bool) -> None:
        self.fd = fd
        self.colour = colour
        self.shown: list[str] = []
        self.size: tuple[int, int] = (0, 0)

    def __enter__(self) -> Painter:
        self._write(self.ENTER)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._write(self.LEAVE)
        except OSError:
            if exc[0] is None:  # (the terminal is gone: the error that said so is on its way)
                raise

    def paint(self, lines: Sequence[Line], height: int, width: int) -> None:
        """Show ``lines`` (at most ``height``, each at most ``width`` cells) from the top left."""
        if (height, width) != self.size:
            self.shown, self.size = [], (height, width)
            out = ["\x1b[0m\x1b[H\x1b[2J"]
        else:
            out = []
        frame = [encode_line(line, self.colour) for line in lines[:height]]
        for y, text in enumerate(frame):
            if y < len(self.shown) and self.shown[y] == text:
                continue
            size = sum(cell_len(piece) for piece, _ in lines[y])
            # (erasing the rest of a full line would erase its last cell: the cursor waits there)
            out.append(f"\x1b[{y + 1};1H{text}" + ("\x1b[K" if size < width else ""))
        out += [f"\x1b[{y + 1};1H\x1b[K" for y in range(len(frame), len(self.shown))]
        self.shown = frame
        if out:
            self._write("".join(out))

    def _write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8", "replace"))
        while data:
            data = data[os.write(self.fd, data) :]
