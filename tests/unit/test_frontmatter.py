"""The plain frontmatter reader (:mod:`pisub.agents.frontmatter`) means what YAML means: on every
text it reads, its answer is YAML's; everything else it leaves to YAML (None)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pisub.agents.frontmatter import plain

ROOT = Path(__file__).resolve().parents[2]


def _frontmatter(path: Path) -> str | None:
    text = path.read_text(encoding="utf-8", errors="replace")
    parts = re.split(r"^---[ \t]*$", text, maxsplit=2, flags=re.MULTILINE)
    return parts[1] if text.startswith("---") and len(parts) == 3 else None


def _typed(value: object) -> object:
    """``value`` with every type spelt out (``True == 1`` in Python, not in an agent file)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def _same(text: str) -> None:
    mine = plain(text)
    if mine is not None:
        assert _typed(mine) == _typed(yaml.safe_load(text)), text


def test_the_shipped_agents_read_plainly_and_as_yaml_reads_them() -> None:
    for path in sorted((ROOT / "pisub" / "agents" / "builtin").glob("*.md")):
        text = _frontmatter(path)
        assert text is not None and plain(text) is not None, path
        _same(text)


def test_every_agent_file_of_the_tests_reads_as_yaml_reads_it() -> None:
    for path in sorted((ROOT / "tests").rglob("*.md")):
        text = _frontmatter(path)
        if text is not None:
            _same(text)


@pytest.mark.parametrize(
    "value",
    [
        "yes",
        "No",
        "ON",
        "off",
        "True",
        "FALSE",
        "null",
        "Null",
        "~",
        "y",
        "n",
        "012",
        "0x1F",
        "1_000",
        "1:30",
        "-1",
        "+1",
        "1.5",
        ".inf",
        ".NaN",
        "2001-12-14",
        "'single'",
        "a #c",
        "a: b",
        "a:b",
        "&anchor x",
        "*alias",
        "!tag x",
        "|",
        ">",
        "%x",
        "@x",
        "`x",
        "- a",
        '"x" # c',
        '"a\\u00e9"',
        '"a\\x41"',
        '"a\\/b"',
        '"a\\ b"',
        '"a\\0"',
        '"a\\e"',
        "[a, yes]",
        "[1, 2]",
        "[a, ]",
        "[a b]",
        "[a, [b]]",
        "[a, {b: c}]",
        '["a\\nb", c]',
        "[]",
        "[ ]",
        "{}",
        "{a: 1}",
        "a b  c",
        "it's x",
        "a, b",
        "x!",
        "0",
        "7",
        "true",
        "false",
        "a\\b",
        "é",
        "18446744073709551616",
        "99999999999999999999",
    ],
)
def test_each_value_means_what_yaml_says_or_is_left_to_yaml(value: str) -> None:
    _same(f"\nkey: {value}\n")


@pytest.mark.parametrize(
    "text",
    [
        "\na: 1\na: 2\n",  # YAML takes the last
        "\nyes: 1\n",  # a boolean key
        "\na: 1\n  b: 2\n",  # indented
        "\n# c\na: 1\n",
        "\na:\n",
        "\na: 1\t\n",
        "\na: 1\r\n",
        "\n",
        "",
        "\na: 1\n...\n",
    ],
)
def test_every_other_shape_is_left_to_yaml(text: str) -> None:
    assert plain(text) is None


_KEY = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,6}", fullmatch=True)
_ALPHABET = st.sampled_from(list("aZ09 .,:;#'\"\\[]{}!&*|>%@`-_~+ntbfr/()?\t"))
_VALUE = st.one_of(
    st.text(_ALPHABET, min_size=1, max_size=12),
    st.builds(lambda s: f'"{s}"', st.text(_ALPHABET, max_size=10)),
    st.builds(
        lambda xs: "[" + ", ".join(xs) + "]", st.lists(st.text(_ALPHABET, min_size=1, max_size=6), max_size=3)
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_KEY, _VALUE), min_size=1, max_size=4))
def test_any_text_it_reads_means_what_yaml_says(pairs: list[tuple[str, str]]) -> None:
    text = "\n" + "\n".join(f"{k}: {v}" for k, v in pairs) + "\n"
    try:
        expected = yaml.safe_load(text)
    except yaml.YAMLError:
        expected = None
    mine = plain(text)
    if mine is not None:
        assert _typed(mine) == _typed(expected), text
