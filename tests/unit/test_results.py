from __future__ import annotations

from pathlib import Path

from pisub.protocol import ErrorCode, ErrorInfo
from pisub.store.results import make_result, truncate_output


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
