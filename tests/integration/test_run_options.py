"""A single run's per-run options (the seed's maxOutput, artifacts, includeProgress, isolation and
baseRef for one run) with real runners and real children: an external-cli agent, real git."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import pisub
from pisub.api.launch import start
from pisub.errors import InvalidInput
from tests.conftest import AgentMaker, pisub_cli
from tests.helpers import run_event_types

# the fixture repo: a clean repository and the agent editor
from tests.integration.test_worktree_runs import git, repo  # noqa: F401

LINES = """
import sys
print("\\n".join(f"line {i}" for i in range(50)))
print("oops", file=sys.stderr)
"""


def test_max_output_cuts_the_result_and_marks_it(make_agent: AgentMaker) -> None:
    make_agent("lines", python=LINES)
    run = pisub.launch("lines", "x", max_output_lines=5)
    result = run.wait(timeout=30)
    single = result.details.results[0]
    assert result.state == "complete"
    assert single.output is not None and single.output.startswith("line 0\nline 1\n")
    assert "line 10" not in single.output
    assert (
        "[TRUNCATED: showing first 5 of" in single.output and str(run.dir / "output-0.log") in single.output
    )
    assert result.details.error is not None and result.details.error.code == "SUBAGENT_OUTPUT_TRUNCATED"
    limits = run.manifest().max_output
    assert limits is not None and limits.lines == 5
    assert json.loads((run.dir / "manifest.json").read_bytes())["maxOutput"] == {"bytes": 204800, "lines": 5}
    # the log keeps everything
    assert "line 49" in (run.dir / "output-0.log").read_text()

    done = pisub_cli("run", "--agent", "lines", "x", "--max-output-bytes", "20", "--json", check=True)
    cut = pisub.Run(json.loads(done.stdout)["runId"]).wait(timeout=30).details.results[0].output
    assert (
        cut is not None and cut.startswith("line 0\nline 1\nline 2") and "of 50 lines" in cut
    )  # (50 lines, the last one ended by its newline)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"max_output_bytes": 0}, "maxOutput.bytes must be a whole number from 1 to"),
        ({"max_output_bytes": 10**12}, "maxOutput.bytes"),
        ({"max_output_lines": True}, "maxOutput.lines"),
        ({"max_output_lines": "5"}, "maxOutput.lines"),
        ({"artifacts": "no"}, "artifacts: give true or false"),
        ({"include_progress": 1}, "include_progress: give true or false"),
        ({"context": "FORK"}, "context: must be one of fresh, fork, profile"),
        ({"context": ["fork"]}, "context: must be one of"),
        ({"context": "fork"}, "for pi agents"),
        ({"session_dir": "s"}, "for pi agents"),
        ({"session_dir": ""}, "sessionDir: for pi agents"),
        ({"context": "fresh", "session_dir": "s"}, "sessionDir: for pi agents"),
        ({"context": "profile"}, "context: for pi agents"),
        ({"isolation": "worktree"}, "isolation='worktree'"),
        ({"base_ref": "main"}, "--base-ref needs --isolation worktree"),
    ],
)
def test_bad_options_start_nothing(
    make_agent: AgentMaker, home: Path, options: dict[str, object], needle: str
) -> None:
    make_agent("lines", python=LINES)
    with pytest.raises(InvalidInput, match=needle.replace("(", r"\(")):
        pisub.launch("lines", "x", **options)  # type: ignore[arg-type]
    assert not list(pisub.list_runs(children=True))


@pytest.mark.parametrize(
    "flags",
    [
        ["--session-dir", "SD"],
        ["--max-output-bytes", "10"],
        ["--max-output-lines", "3"],
        ["--no-artifacts"],
        ["--include-progress"],
        ["--context", "fork"],
    ],
)
def test_a_workflow_refuses_a_single_runs_options(
    make_agent: AgentMaker, tmp_path: Path, flags: list[str]
) -> None:
    """They were left aside silently for a workflow (``--task``, ``--parallel``...)."""
    make_agent("lines", python=LINES)
    done = pisub_cli("run", "--task", "lines=x", *[str(tmp_path / "sd") if f == "SD" else f for f in flags])
    assert done.returncode == 1, done.stdout
    assert f"{flags[0]} is for a single run" in done.stderr and "[INVALID_INPUT]" in done.stderr
    assert not list(pisub.list_runs(children=True)) and not (tmp_path / "sd").exists()


def test_a_workflow_takes_the_defaults_of_a_single_runs_options(make_agent: AgentMaker) -> None:
    make_agent("lines", python=LINES)
    run = start(  # a parent session only names a fork's source (the pi tool passes it always)
        tasks=[{"agent": "lines", "task": "x"}],
        artifacts=True,
        include_progress=False,
        parent_session="p.jsonl",
    )
    assert run.wait(timeout=60).state == "complete"
    with pytest.raises(InvalidInput, match="--no-artifacts is for a single run"):
        start(tasks=[{"agent": "lines", "task": "x"}], artifacts=False)


def test_context_fresh_is_a_no_op_for_any_agent(make_agent: AgentMaker) -> None:
    make_agent("lines", python=LINES)
    run = pisub.launch("lines", "x", context="fresh")
    assert run.wait(timeout=30).state == "complete" and run.manifest().context is None


def test_no_artifacts_keeps_only_the_protocol(make_agent: AgentMaker) -> None:
    make_agent("lines", python=LINES)
    kept = pisub.launch("lines", "x")
    kept.wait(timeout=30)
    assert (kept.dir / "stderr-0.log").read_text() == "oops\n"
    run = pisub.launch("lines", "x", artifacts=False)
    result = run.wait(timeout=30)
    assert result.state == "complete"
    assert not (run.dir / "stderr-0.log").exists()
    assert (run.dir / "output-0.log").exists() and (run.dir / "result.json").exists()
    assert "child.exited" in run_event_types(run)  # pisub's own events stay
    assert run.manifest().artifacts is False
    done = pisub_cli("run", "--agent", "lines", "x", "--no-artifacts", "--json", check=True)
    assert (
        json.loads((pisub.Run(json.loads(done.stdout)["runId"]).dir / "manifest.json").read_bytes())[
            "artifacts"
        ]
        is False
    )


def test_include_progress_puts_it_in_the_result(make_agent: AgentMaker) -> None:
    make_agent("lines", python=LINES)
    plain = pisub.launch("lines", "x")
    assert plain.wait(timeout=30).details.results[0].progress is None
    assert "progress" not in json.loads((plain.dir / "result.json").read_bytes())["details"]["results"][0]
    done = pisub_cli("run", "--agent", "lines", "x", "--include-progress", "--json", check=True)
    run = pisub.Run(json.loads(done.stdout)["runId"])
    progress = run.wait(timeout=30).details.results[0].progress
    assert progress is not None
    assert progress.output_bytes > 0 and progress.duration_ms is not None and progress.duration_ms >= 0
    assert progress.recent_output[-1] == "line 49"
    on_disk = json.loads((run.dir / "result.json").read_bytes())["details"]["results"][0]["progress"]
    assert set(on_disk) >= {"turnCount", "toolCount", "outputBytes", "durationMs", "recentOutput"}


def test_a_single_run_in_its_own_worktree(repo: Path) -> None:  # noqa: F811
    before = git(repo, "rev-parse", "HEAD")
    done = pisub_cli(
        "run", "--agent", "editor", "shared.txt=mine", "--isolation", "worktree", "--base-ref", "main",
        "--cwd", str(repo), "--json", check=True,
    )  # fmt: skip
    run = pisub.Run(json.loads(done.stdout)["runId"])
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    link = run.manifest().worktree
    assert link is not None and link.branch.endswith("/run") and link.base_commit == before.strip()
    assert run.manifest().cwd.startswith(link.path) and str(repo) not in run.manifest().cwd
    assert (repo / "shared.txt").read_text() == "base\n"  # the checkout is untouched
    assert "worktree.captured" in run_event_types(run)
    applied = json.loads(pisub_cli("worktree", "apply", run.id, "--json", check=True).stdout)
    assert applied["ok"] and (repo / "shared.txt").read_text() == "mine\n"
    assert git(repo, "rev-parse", "HEAD") == before


def test_a_single_worktree_run_needs_a_clean_repository_and_a_real_ref(repo: Path) -> None:  # noqa: F811
    (repo / "shared.txt").write_text("dirty\n")
    with pytest.raises(pisub.PisubError, match="isolation='worktree'"):
        pisub.launch("editor", "shared.txt=x", cwd=repo, isolation="worktree")
    git(repo, "checkout", "-q", "--", "shared.txt")
    bad = pisub_cli("run", "--agent", "editor", "x=y", "--isolation", "worktree", "--base-ref", "nosuchref",
                    "--cwd", str(repo))  # fmt: skip
    assert bad.returncode == 1 and "nosuchref" in bad.stderr and "Traceback" not in bad.stderr
    assert not list(pisub.list_runs(children=True))


def test_a_transcript_from_a_hostile_session(make_agent: AgentMaker, tmp_path: Path) -> None:
    """Once ``output-0.log`` is gone the transcript reads the session: a line nested too deeply
    was ``INTERNAL_ERROR RecursionError``; a FIFO or a symlink printed nothing with exit 0."""
    make_agent("lines", python=LINES)
    run = pisub.launch("lines", "x")
    assert run.wait(timeout=30).state == "complete"
    (run.dir / "output-0.log").unlink()
    session = run.dir / "session.jsonl"
    message = {"type": "message", "message": {"role": "assistant", "content": "still here"}}
    session.write_text("[" * 100_000 + "\n" + json.dumps(message) + "\n")
    done = pisub_cli("status", run.id, "--view", "transcript", "--json", check=True)
    assert json.loads(done.stdout)["lines"] == ["assistant: still here"]
    target = tmp_path / "elsewhere.jsonl"
    target.write_text(json.dumps(message) + "\n")
    for swap in ("fifo", "symlink"):
        session.unlink()
        os.mkfifo(session) if swap == "fifo" else session.symlink_to(target)
        proc = pisub_cli("status", run.id, "--view", "transcript", timeout=30)
        assert proc.returncode == 1 and proc.stdout == "" and "[IO_ERROR]" in proc.stderr, proc
