"""The verdict rules of a run, row by row: which cause wins, and what each says."""

from __future__ import annotations

import itertools

import pytest

from pisub.children.base import ChildOutcome
from pisub.protocol import Limits, RunState
from pisub.runner.ending import Circumstances, EndCause, judge

LIMITS = Limits(timeout=60, idle_timeout=10, grace=3, output_cap=1 << 20, output_hard_cap=1 << 26)
TERMED = ChildOutcome(exit_code=143, process_exit=143, signal=15, output="partial")
CLEAN = ChildOutcome(exit_code=0, process_exit=0, output="done")
CIRCUMSTANCES = Circumstances(LIMITS, signal=15, tool=("bash", 2.5))

EXPECTED = {
    EndCause.STOP: (RunState.STOPPED, 143, "SUBAGENT_FAILED", None),
    EndCause.SIGNAL: (RunState.STOPPED, 143, "SUBAGENT_FAILED", None),
    EndCause.RUNTIME: (RunState.FAILED, 124, "SUBAGENT_TIMEOUT", "runtime"),
    EndCause.IDLE: (RunState.FAILED, 124, "SUBAGENT_TIMEOUT", "idle"),
    EndCause.TOOL: (RunState.FAILED, 124, "SUBAGENT_TIMEOUT", "tool"),
    EndCause.OUTPUT: (RunState.FAILED, 1, "SUBAGENT_OUTPUT_TRUNCATED", None),
    EndCause.INTERRUPT: (RunState.PAUSED, 143, None, None),
}


@pytest.mark.parametrize("cause", list(EndCause))
def test_each_cause_alone(cause: EndCause) -> None:
    verdict = judge({cause}, TERMED, CIRCUMSTANCES)
    state, exit_code, code, timeout_reason = EXPECTED[cause]
    assert (verdict.state, verdict.exit_code, verdict.timeout_reason) == (state, exit_code, timeout_reason)
    assert (verdict.error.code if verdict.error else None) == code


@pytest.mark.parametrize(("first", "second"), list(itertools.combinations(list(EndCause), 2)))
def test_the_cause_of_higher_precedence_wins(first: EndCause, second: EndCause) -> None:
    """Precedence: stop > signal > runtime > idle > tool > output > interrupt (e.g. a stop that arrives
    while a timeout is ending the child still makes the run ``stopped``)."""
    assert judge({first, second}, TERMED, CIRCUMSTANCES) == judge({first}, TERMED, CIRCUMSTANCES)


def test_a_paused_pi_reports_its_own_clean_exit() -> None:
    """pi exits 0 after an abort: the paused run says 0, while its task outcome would say 1."""
    aborted = ChildOutcome(exit_code=1, process_exit=0, error="pi was aborted: Request was aborted")
    verdict = judge({EndCause.INTERRUPT}, aborted, CIRCUMSTANCES)
    assert (verdict.state, verdict.exit_code, verdict.error) == (RunState.PAUSED, 0, None)


def test_without_a_cause_the_childs_outcome_decides() -> None:
    assert judge(set(), CLEAN, CIRCUMSTANCES).state == RunState.COMPLETE
    failed = judge(set(), ChildOutcome(exit_code=3, process_exit=3, error="boom"), CIRCUMSTANCES)
    assert (failed.state, failed.exit_code) == (RunState.FAILED, 3)
    assert failed.error is not None and failed.error.message == "boom"
    silent = judge(set(), ChildOutcome(exit_code=2), CIRCUMSTANCES)
    assert silent.error is not None and silent.error.message == "Subagent exited with code 2"


def test_the_messages_quote_the_limits_and_the_signal() -> None:
    runtime = judge({EndCause.RUNTIME}, TERMED, CIRCUMSTANCES).error
    assert runtime is not None and "60s" in runtime.message
    signal = judge({EndCause.SIGNAL}, TERMED, Circumstances(LIMITS, signal=2)).error
    assert signal is not None and "signal 2" in signal.message
    tool = judge({EndCause.TOOL}, TERMED, CIRCUMSTANCES).error
    assert tool is not None and tool.message == "Tool 'bash' exceeded its timeout of 2.5s."
