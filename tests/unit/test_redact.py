"""One test per redaction pattern."""

from __future__ import annotations

import os

import pytest

from pisub.core.redact import MASK, preview, redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("key sk-abcdefghijklmnopqrstuvwxyz123456 here", "sk-abcdefghijklmnopqrstuvwxyz123456"),
        ("ant sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx", "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWx"),
        ("gh ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("gho_ABCDEFGHIJKLMNOPQRSTUVWXYZ01 token", "gho_ABCDEFGHIJKLMNOPQRSTUVWXYZ01"),
        (
            "pat github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
        ),
        ("aws AKIAIOSFODNN7EXAMPLE id", "AKIAIOSFODNN7EXAMPLE"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG"),
        ("slack xoxb-1234567890-abcdefghij", "xoxb-1234567890-abcdefghij"),
        ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("curl -H 'Bearer abcdef123456789xyz'", "abcdef123456789xyz"),
        ("OPENAI_API_KEY=short1", "short1"),
        ("export MY_TOKEN=abc123", "abc123"),
        ("DB_PASSWORD: 'hunter2'", "hunter2"),
        ('client_secret="s3cr3t value"', "s3cr3t value"),
    ],
)
def test_each_secret_pattern_is_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out
    assert MASK in out


def test_home_path_is_shortened() -> None:
    home = os.path.expanduser("~")
    out = redact(f"open {home}/project/file.py and /home/alice/x but not /srv/home/runs")
    assert home + "/" not in out
    assert "~/project/file.py" in out
    assert "/home/alice" not in out
    assert "/srv/home/runs" in out


def test_long_stack_traces_are_cut() -> None:
    js = "Error: boom\n" + "\n".join(f"    at fn{i} (/app/x.js:{i}:1)" for i in range(40))
    out = redact(js)
    assert out.count("    at fn") == 5
    assert "35 stack lines omitted" in out
    py = (
        "Traceback (most recent call last):\n"
        + "\n".join(f'  File "/app/m{i}.py", line {i}, in f\n    call()' for i in range(10))
        + "\nValueError: bad"
    )
    out = redact(py)
    assert "omitted" in out and out.endswith("ValueError: bad")


def test_plain_text_untouched() -> None:
    text = "The key insight: tokens are cheap.\n    indented code stays\nsk-short monkey=banana"
    assert redact(text) == text


def test_preview_is_redacted_and_bounded() -> None:
    p = preview("use sk-abcdefghijklmnopqrstuvwxyz123456 " + "word " * 100)
    assert "sk-abc" not in p and len(p) == 160


def test_a_file_named_like_a_secret_at_the_end_of_a_path_is_not_a_secret() -> None:
    """An error naming ``/etc/passwd`` or ``…/token`` keeps its words (an outside attack found
    the message after such a path masked); a secret's name after a space or ``--`` is still one."""
    for text in ("/etc/passwd: not a workflow script", "/tmp/x/token: not a tasks file", "C:\\x\\token: y"):
        assert redact(text) == text
    assert redact("--token=abcdef") == f"--token={MASK}"
    assert redact("see token: abc123") == f"see token: {MASK}"
