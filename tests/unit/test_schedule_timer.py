"""The pieces of ``pisub schedule install`` that need no timer: the crontab line (quoting, cron's
``%``), rewriting a crontab byte for byte, reading the entry back, the systemd units."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pisub.api.schedule_timer import (
    CRON_COMMAND_MAX,
    check_path_text,
    cron_line,
    home_hash,
    parse_cron_pisub,
    parse_unit_pisub,
    unit_texts,
    with_cron_line,
    without_cron_line,
)
from pisub.errors import InvalidInput

PISUB = ["/opt/v env/bin/python", "-m", "pisub"]


def _unescape(line: str) -> str:
    """What cron hands the shell: the command after the five fields, ``\\%`` read as ``%``."""
    return line.split(None, 5)[5].replace("\\%", "%")


@pytest.mark.parametrize(
    "root", ["/tmp/h", "/tmp/a b", "/tmp/100%", '/tmp/it\'s $HOME `x` "q"', "/tmp/é ü", "/tmp/%%a b%"]
)
def test_cron_line_quotes_every_path_for_the_shell_and_escapes_percent(root: str) -> None:
    line = cron_line(root, PISUB, [("PISUB_HOME", root)])
    assert line.startswith("* * * * * /usr/bin/env ")
    # No bare % reaches cron: each is escaped (cron would end the command there).
    assert "%" not in line.replace("\\%", "")
    words = shlex.split(_unescape(line), comments=True)
    assert words == [
        "/usr/bin/env",
        f"PISUB_HOME={root}",
        *PISUB,
        "schedule",
        "tick",
        "--from",
        "cron",
        "--quiet",
    ]
    assert f"# pisub-tick:{home_hash(root)} home " in line
    assert parse_cron_pisub(line) == PISUB


@pytest.mark.parametrize("bad", ["/tmp/a\nb", "/tmp/a\\b", "/tmp/a\rb", "/tmp/a\x7fb", "/tmp/a\tb"])
def test_a_path_a_crontab_line_cannot_hold_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="cannot hold safely"):
        check_path_text("the pisub home", bad)


def test_home_hash_is_of_the_real_path() -> None:
    assert len(home_hash("/tmp/x")) == 12
    assert home_hash("/tmp/x") != home_hash("/tmp/y")
    assert home_hash("/tmp//x/") == home_hash("/tmp/x")


TICK = "* * * * * /usr/bin/env X=1 /p -m pisub schedule tick --from cron --quiet"
MINE = f"{TICK} # pisub-tick:aaaaaaaaaaaa home /h"
OTHER = f"{TICK.replace('X=1', 'X=2')} # pisub-tick:bbbbbbbbbbbb home /g"
FOREIGN = [
    b"# m h dom mon dow command",
    b"MAILTO=me",
    b"0 5 * * *  /bin/echo 100\\% \xff done",
    b"",
    OTHER.encode(),
]


def test_the_line_is_added_at_the_end_and_every_other_line_kept_byte_for_byte() -> None:
    current = b"\n".join(FOREIGN) + b"\n"
    new = with_cron_line(current, MINE.encode(), "aaaaaaaaaaaa")
    assert new == current + MINE.encode() + b"\n"
    assert with_cron_line(new, MINE.encode(), "aaaaaaaaaaaa") == new  # installed twice: the same
    assert without_cron_line(new, "aaaaaaaaaaaa") == (current, [MINE.encode()])
    assert without_cron_line(current, "aaaaaaaaaaaa") == (current, [])


def test_a_changed_line_replaces_the_old_in_place_and_a_second_copy_goes() -> None:
    old = MINE.replace("X=1", "X=0").encode()
    current = b"\n".join([old, FOREIGN[2], old, FOREIGN[1]]) + b"\n"
    new = with_cron_line(current, MINE.encode(), "aaaaaaaaaaaa")
    assert new == b"\n".join([MINE.encode(), FOREIGN[2], FOREIGN[1]]) + b"\n"


def test_an_empty_crontab_and_one_without_a_last_newline() -> None:
    assert with_cron_line(b"", MINE.encode(), "aaaaaaaaaaaa") == MINE.encode() + b"\n"
    assert without_cron_line(MINE.encode() + b"\n", "aaaaaaaaaaaa") == (b"", [MINE.encode()])
    assert with_cron_line(b"0 5 * * * /bin/true", MINE.encode(), "aaaaaaaaaaaa") == (
        b"0 5 * * * /bin/true\n" + MINE.encode() + b"\n"
    )


def test_only_the_exact_marker_is_ours() -> None:
    lookalikes = [
        MINE.replace("aaaaaaaaaaaa", "aaaaaaaaaaaab"),  # a longer hash
        MINE.replace("# pisub-tick:", "#pisub-tick-"),
        "0 5 * * * /bin/echo pisub-tick:aaaaaaaaaaaa",  # not a comment
    ]
    current = "\n".join(lookalikes).encode() + b"\n"
    assert without_cron_line(current, "aaaaaaaaaaaa") == (current, [])


@given(
    st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b and b"pisub-tick" not in b), max_size=8)
)
def test_foreign_lines_survive_install_and_uninstall(foreign: list[bytes]) -> None:
    current = b"".join(line + b"\n" for line in foreign)
    installed = with_cron_line(current, MINE.encode(), "aaaaaaaaaaaa")
    assert installed.split(b"\n")[:-2] == foreign
    back, removed = without_cron_line(installed, "aaaaaaaaaaaa")
    assert removed == [MINE.encode()] and back == current


def test_a_line_too_long_for_cron_is_measured_in_bytes() -> None:
    root = "/tmp/" + "é" * 600
    line = cron_line(root, PISUB, [("PISUB_HOME", root)])
    assert len(line.encode()) - len("* * * * * ") > CRON_COMMAND_MAX


def test_systemd_units_quote_percent_dollar_and_quotes() -> None:
    root = '/tmp/a b%c$d"e'
    service, timer = unit_texts(root, PISUB, [("PISUB_HOME", root)])
    assert 'Environment="PISUB_HOME=/tmp/a b%%c$d\\"e"\n' in service
    assert (
        'ExecStart="/opt/v env/bin/python" "-m" "pisub" "schedule" "tick" "--from" "systemd" "--quiet"'
        in service
    )
    assert "Type=oneshot" in service
    assert "OnCalendar=minutely\nPersistent=true\n" in timer and "WantedBy=timers.target" in timer
    assert 'Description=pisub schedule tick every minute for /tmp/a b%%c$d"e' in timer
    assert parse_unit_pisub(service) == PISUB
