from __future__ import annotations

from pathlib import Path

from pisub.protocol import ErrorCode, ErrorInfo
from pisub.store.results import REDACT_WINDOW, make_result, truncate_output


def test_short_output_untouched() -> None:
    assert truncate_output("a\nb", None) == ("a\nb", False)


def test_truncated_by_lines_names_full_output() -> None:
    text = "\n".join(f"line {i}" for i in range(6000))
    out, cut = truncate_output(text, Path("/runs/r/output-0.log"))
    assert cut
    assert out.count("\n") == 5000
    assert "[TRUNCATED: showing first 5000 of 6000 lines" in out
    assert "full output at /runs/r/output-0.log" in out


def test_truncated_by_bytes() -> None:
    out, cut = truncate_output("x" * 300_000, None)
    assert cut and len(out.encode()) < 205_000 and "of 300000 bytes" in out


def test_success_with_truncation_reports_code() -> None:
    res = make_result(run_id="r", state="complete", agent="a", task="t", exit_code=0, output="y\n" * 6000)
    assert res.details.error is not None
    assert res.details.error.code == ErrorCode.SUBAGENT_OUTPUT_TRUNCATED
    assert res.details.results[0].error is None


def test_failure_text_and_redaction() -> None:
    res = make_result(
        run_id="r",
        state="failed",
        agent="a",
        task="use sk-abcdefghijklmnopqrstuvwxyz12",
        exit_code=2,
        output="partial TOKEN=abc",
        error=ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message="boom API_KEY=zzz"),
    )
    text = res.content[0].text
    assert text.startswith("SUBAGENT_FAILED: boom API_KEY=[REDACTED]")
    assert "Partial output:\npartial TOKEN=[REDACTED]" in text
    single = res.details.results[0]
    assert "sk-abc" not in single.task and single.error == "boom API_KEY=[REDACTED]"


def test_all_eight_error_codes_exist() -> None:
    assert {c.value for c in ErrorCode} == {
        "INVALID_INPUT",
        "SUBAGENTS_DISABLED",
        "UNKNOWN_AGENT",
        "SUBAGENT_DISABLED",
        "SUBAGENT_DEPTH_EXCEEDED",
        "SUBAGENT_TIMEOUT",
        "SUBAGENT_FAILED",
        "SUBAGENT_OUTPUT_TRUNCATED",
    }


def test_a_workflows_result_text_cut_is_kept_whole_or_to_the_cap(tmp_path: Path) -> None:
    """Attack 32, F6: a workflow's result text over the result's 200 KiB is kept raw in the run's
    ``result.txt`` (the marker names it, with the text's real size); over the run's output cap,
    its first cap bytes (from a whole character), and the marker says so; a short one: no file."""
    from pisub.store.results import cut_result_text

    keep = tmp_path / "result.txt"
    assert cut_result_text("short TOKEN=abc", keep, 1000) == ("short TOKEN=[REDACTED]", None)
    assert not keep.exists()
    text = "TOKEN=abc\n" + "x" * 300_000
    shown, error = cut_result_text(text, keep, 1_000_000)
    assert keep.read_text() == text and shown.startswith("TOKEN=[REDACTED]\n"), shown[:40]
    assert shown.endswith(f"of 2 lines, 204800 of 300017 bytes - full output at {keep}]"), shown[-120:]
    assert error == ErrorInfo(
        code=ErrorCode.SUBAGENT_OUTPUT_TRUNCATED, message=f"Output truncated; full output at {keep}"
    )
    shown, error = cut_result_text("é" * 200_000, keep, 100_001)  # 400,000 bytes; the cap inside a character
    assert keep.read_text() == "é" * 50_000
    marker = f"of 400000 bytes - its first 100000 bytes (the run's output cap) at {keep}]"
    assert (
        shown.endswith(marker)
        and error is not None
        and error.message.endswith(f"(the run's output cap) at {keep}")
    )
    huge = "y" * (REDACT_WINDOW + 10) + "\nlast"  # beyond what is redacted: the whole size still given
    shown, _error = cut_result_text(huge, keep, 1_000_000)
    assert keep.read_text() == huge[:1_000_000]
    cap = f"its first 1000000 bytes (the run's output cap) at {keep}]"
    assert shown.endswith(f"showing first 1 of 2 lines, 204800 of {len(huge)} bytes - {cap}")
    keep.unlink()
    keep.mkdir()  # cannot be written: no path named
    shown, error = cut_result_text("z" * 300_000, keep, 1_000_000)
    assert (
        shown.endswith("204800 of 300000 bytes]")
        and error is not None
        and error.message == "Output truncated"
    )


def test_a_final_newline_ends_the_last_line_it_does_not_add_one(tmp_path: Path) -> None:
    """Attack 33, F6: exactly 5,000 lines ending in a newline were "5,001" and marked truncated."""
    from pisub.defaults import RESULT_MAX_LINES
    from pisub.store.results import line_count, truncate_output

    text = "line\n" * RESULT_MAX_LINES
    assert line_count(text) == RESULT_MAX_LINES and line_count("") == 0 and line_count("a") == 1
    assert truncate_output(text, tmp_path / "full") == (text, False)
    cut, was_cut = truncate_output(text + "one more\n", tmp_path / "full")
    assert was_cut and f"showing first {RESULT_MAX_LINES} of {RESULT_MAX_LINES + 1} lines" in cut, cut[-200:]
