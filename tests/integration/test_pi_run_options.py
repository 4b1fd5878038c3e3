"""A single pi run's per-run options with the real pi against the scripted model: the session
kept in ``--session-dir``, ``--context fresh|fork|profile`` (the seed's precedence, a fork that
leaves signed and redacted thinking behind), ``pisub share``, ``--no-artifacts`` and
``--include-progress`` for pi, and ``runs.run(key, resume=..., task=...)`` without an agent."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch_workflow
from pisub.api.share import share
from pisub.errors import InvalidInput, NotResumable
from pisub.protocol.fields import Context
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli, wait_for
from tests.helpers import (
    REDACTED,
    SIGNED,
    UNSIGNED,
    run_event_types,
    sent_with,
    stop_and_end,
    write_script,
)

pytestmark = pytest.mark.pi


def _session_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assistant_blocks(path: Path) -> list[dict[str, Any]]:
    return [
        block
        for entry in _session_lines(path)
        if entry.get("type") == "message" and entry["message"].get("role") == "assistant"
        for block in entry["message"]["content"]
    ]


def _with_thinking(source: Path, dest: Path) -> None:
    """``source`` with signed, redacted and unsigned thinking put into every assistant message."""
    out = []
    for line in source.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("type") == "message" and entry["message"].get("role") == "assistant":
            entry["message"]["content"] = [SIGNED, UNSIGNED, *entry["message"]["content"], REDACTED]
        out.append(json.dumps(entry))
    dest.write_text("\n".join(out) + "\n")


def _first_run(text: str = "ECHO_HISTORY alpha", **options: Any) -> pisub.Run:
    run = pisub.launch("pi", text, **options)
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    return run


@pytest.mark.pi_versions
def test_session_dir_keeps_the_session_and_resume_finds_it(pi_home: Path, tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    run = _first_run(session_dir=str(sessions))
    kept = sessions / f"{run.id}.jsonl"
    assert stat.S_IMODE(sessions.stat().st_mode) == 0o700
    assert kept.is_file() and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert not (run.dir / "session.jsonl").exists()
    assert run.status().session_file == str(kept)
    assert run.result() is not None and run.result().details.results[0].session_file == str(kept)  # type: ignore[union-attr]
    assert run.manifest().session_dir == str(sessions)
    again = pisub.resume(run.id, "beta")
    result = again.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert result.details.results[0].output == "History: ECHO_HISTORY alpha | beta"
    assert again.status().session_file == str(kept)
    (run.dir / "output-0.log").unlink()  # the transcript falls back to the session, where it is
    view = json.loads(pisub_cli("status", run.id, "--view", "transcript", "--json", check=True).stdout)
    assert any("ECHO_HISTORY alpha" in line for line in view["lines"])
    # the CLI, a relative directory (from the caller's cwd), the directory existing already
    done = pisub_cli("run", "--agent", "pi", "hello", "--session-dir", "sessions", "--json", check=True)
    other = pisub.Run(json.loads(done.stdout)["runId"])
    other.wait(timeout=60)
    assert other.status().session_file == str(sessions / f"{other.id}.jsonl")


def test_session_dir_refuses_what_is_not_a_private_directory(pi_home: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "file").write_text("x")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    os.mkfifo(tmp_path / "fifo")
    for given, needle in (
        (tmp_path / "link", "is a symlink"),
        (tmp_path / "file", "is not a directory"),
        (tmp_path / "fifo", "is not a directory"),
        (shared, "writable by others"),
        (tmp_path / "missing" / "deeper", "does not exist"),
        ("bad\nname", "control characters"),
        ("x" * 5000, "at most 4096"),
        ("  ", "give a directory"),
    ):
        with pytest.raises(InvalidInput, match=f"sessionDir: .*{needle}|sessionDir: {needle}"):
            pisub.launch("pi", "hello", session_dir=str(given))
    assert not list(pisub.list_runs(children=True))
    assert not list(real.iterdir())
    bad = pisub_cli("run", "--agent", "pi", "hello", "--session-dir", str(tmp_path / "link"))
    assert bad.returncode == 1 and "is a symlink" in bad.stderr and "Traceback" not in bad.stderr
    empty = pisub_cli("run", "--agent", "pi", "hello", "--session-dir", "")  # it was taken as '.'
    assert empty.returncode == 1 and "sessionDir: give a directory [INVALID_INPUT]" in empty.stderr


@pytest.mark.pi_versions  # pi writes its header into the empty file pisub creates
def test_a_kept_session_is_private_from_its_first_byte(pi_home: Path, tmp_path: Path) -> None:
    """pi creates the session with the launcher's umask and pisub made it 0600 only after the
    first reply (a dead runner left it readable for good): now it is 0600 before pi starts."""
    sessions = tmp_path / "open"
    sessions.mkdir(mode=0o755)  # readable by others: the names show, never the contents
    old = os.umask(0o022)
    try:
        run = pisub.launch("pi", "SLOW:12 story", session_dir=str(sessions))
    finally:
        os.umask(old)
    kept = sessions / f"{run.id}.jsonl"
    wait_for(lambda: kept.exists() and kept.stat().st_size > 0, what="pi to write its session")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert run.wait(timeout=60).state == "complete"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    kept.chmod(0o644)  # a resume makes it private again before pi writes to it
    again = pisub.resume(run.id, "SLOW:60 more")
    wait_for(lambda: again.status().state == "running", what="the resume to start")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    stop_and_end(again)


def test_session_dir_refuses_an_unsafe_path_above_it(pi_home: Path, tmp_path: Path) -> None:
    """Like OpenSSH's StrictModes: no symlink anywhere in the path, no directory above it that
    someone else may write to; and never inside pisub's home."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "mine").mkdir(mode=0o700)
    for given, needle in (
        (tmp_path / "link" / "new", "link is a symlink"),
        (tmp_path / "link" / "new" / "deeper", "link is a symlink"),
        (shared / "mine", "shared is writable by others"),
        (shared / "mine" / "new", "shared is writable by others"),
        (pi_home, "inside pisub's home"),
        (pi_home / "runs" / "x", "inside pisub's home"),
        (tmp_path / ("n" * 256), "longer than 255 bytes"),
    ):
        with pytest.raises(InvalidInput, match=f"sessionDir: .*{needle}"):
            pisub.launch("pi", "hello", session_dir=str(given))
    assert not list(pisub.list_runs(children=True)) and not list(real.iterdir())
    long = pisub_cli("run", "--agent", "pi", "x", "--session-dir", str(tmp_path / ("n" * 256)))
    assert long.returncode == 1 and "[INVALID_INPUT]" in long.stderr, long.stderr


@pytest.mark.root
def test_session_dir_refuses_a_directory_above_it_of_another_user(pi_home: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 999, 999)
    (theirs / "mine").mkdir(mode=0o700)
    with pytest.raises(InvalidInput, match=r"sessionDir: .*theirs belongs to another user"):
        pisub.launch("pi", "hello", session_dir=str(theirs / "mine"))


@pytest.mark.pi_versions
def test_fork_copies_the_session_without_signed_or_redacted_thinking(
    pi_home: Path, tmp_path: Path, model_server: FakeModelServer
) -> None:
    first = _first_run()
    source = tmp_path / "with-thinking.jsonl"
    session = first.status().session_file
    assert session is not None
    _with_thinking(Path(session), source)
    assert SIGNED in _assistant_blocks(source)

    run = pisub.launch("pi", "beta", context="fork", fork_from=str(source))
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert result.details.results[0].output == "History: ECHO_HISTORY alpha | beta"
    assert (run.manifest().context, run.manifest().forked_from) == (Context.FORK, str(source))
    blocks = _assistant_blocks(run.dir / "session.jsonl")
    assert SIGNED not in blocks and REDACTED not in blocks
    assert UNSIGNED in blocks and any(b.get("type") == "text" for b in blocks)
    text = (run.dir / "session.jsonl").read_text()
    signature, redacted = str(SIGNED["thinkingSignature"]), str(REDACTED["thinkingSignature"])
    assert signature not in text and redacted not in text
    assert not any(signature in json.dumps(r) for r in sent_with(model_server, "beta"))
    assert signature in source.read_text()  # the source is left as it was

    # a run id as the source (the CLI; a fork source alone asks for a fork), into a session dir
    done = pisub_cli("run", "--agent", "pi", "gamma", "--fork-from", first.id,
                     "--session-dir", str(tmp_path / "s"), "--json", check=True)  # fmt: skip
    forked = pisub.Run(json.loads(done.stdout)["runId"])
    out = forked.wait(timeout=60).details.results[0].output
    assert out == "History: ECHO_HISTORY alpha | gamma"
    assert (tmp_path / "s" / f"{forked.id}.jsonl").is_file() and not (forked.dir / "session.jsonl").exists()


def test_context_precedence(pi_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = _first_run()
    agents = pi_home / "agents"
    text = (agents / "pi.md").read_text()
    (agents / "forker.md").write_text(text.replace("name: pi\n", "name: forker\ndefaultContext: fork\n"))

    def history(agent: str, task: str, **options: Any) -> tuple[str | None, Context | None]:
        run = pisub.launch(agent, task, **options)
        result = run.wait(timeout=60)
        assert result.state == "complete", result.content[0].text
        return result.details.results[0].output, run.manifest().context

    # Outside any run there is nothing to fork: a preference begins fresh, an explicit fork fails.
    assert history("forker", "ECHO_HISTORY one") == ("History: ECHO_HISTORY one", Context.FRESH)
    with pytest.raises(InvalidInput, match="context 'fork': there is no session to fork"):
        pisub.launch("pi", "x", context="fork")
    with pytest.raises(InvalidInput, match="agent 'pi' declares no defaultContext"):
        pisub.launch("pi", "x", context="profile")
    with pytest.raises(InvalidInput, match="forkFrom: a run that forks"):
        pisub.launch("pi", "x", context="fresh", fork_from=parent.id)

    # The caller's own session (the pi tool passes it): what a preferred fork copies.
    mine = parent.status().session_file
    assert mine is not None
    assert history("forker", "one-b", parent_session=mine)[0] == "History: ECHO_HISTORY alpha | one-b"
    gone = str(tmp_path / "not-yet.jsonl")  # not written yet: a preference begins fresh
    assert history("forker", "ECHO_HISTORY one-c", parent_session=gone)[1] == Context.FRESH
    with pytest.raises(InvalidInput, match="context 'fork': there is no session to fork"):
        pisub.launch("forker", "x", context="fork", parent_session=gone)
    with pytest.raises(InvalidInput, match="parentSession: the path holds control characters"):
        pisub.launch("forker", "x", parent_session="a\x1bb")
    done = pisub_cli("run", "--agent", "forker", "one-d", "--parent-session", mine, "--json", check=True)
    out = pisub.Run(json.loads(done.stdout)["runId"]).wait(timeout=60).details.results[0].output
    assert out == "History: ECHO_HISTORY alpha | one-d"

    # Inside a pi run (its session is the fork's source): the agent's defaultContext forks ...
    monkeypatch.setenv("PISUB_RUN_ID", parent.id)
    assert history("forker", "two") == ("History: ECHO_HISTORY alpha | two", Context.FORK)
    assert history("pi", "ECHO_HISTORY three") == ("History: ECHO_HISTORY three", Context.FRESH)
    assert history("pi", "four", context="fork")[0] == "History: ECHO_HISTORY alpha | four"
    # ... the config's default comes before the agent's; explicit and profile before the config.
    (pi_home / "config.toml").write_text('default_subagent_context = "fresh"\n')
    assert history("forker", "ECHO_HISTORY five") == ("History: ECHO_HISTORY five", Context.FRESH)
    assert history("forker", "six", context="profile")[1] == Context.FORK
    (pi_home / "config.toml").write_text('default_subagent_context = "fork"\n')
    assert history("pi", "seven")[0] == "History: ECHO_HISTORY alpha | seven"
    assert history("pi", "ECHO_HISTORY eight", context="fresh")[1] == Context.FRESH
    (pi_home / "config.toml").write_text('default_subagent_context = "sideways"\n')
    with pytest.raises(pisub.PisubError, match="default_subagent_context"):
        pisub.launch("pi", "x")


@pytest.mark.pi_versions
def test_share_exports_the_session_as_pi_does(pi_home: Path, tmp_path: Path, make_agent: Any) -> None:
    run = _first_run()
    done = json.loads(pisub_cli("share", run.id, "--json", check=True).stdout)
    page = run.dir / "share.html"
    assert done == {"runId": run.id, "path": str(page)}
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    html = page.read_text()
    assert "<html" in html.lower() and len(html) > 1000

    # --out: a symlink there is replaced, never followed; a directory or a FIFO is refused
    target = tmp_path / "victim.txt"
    target.write_text("keep me\n")
    link = tmp_path / "out.html"
    link.symlink_to(target)
    shared = share(run.id, link)
    assert shared.path == str(link) and not link.is_symlink() and target.read_text() == "keep me\n"
    assert stat.S_IMODE(link.stat().st_mode) == 0o600
    os.mkfifo(tmp_path / "fifo")
    for bad, needle in ((tmp_path, "is not a regular file"), (tmp_path / "fifo", "is not a regular file"),
                        (tmp_path / "no" / "x.html", "is not a directory")):  # fmt: skip
        with pytest.raises(InvalidInput, match=needle):
            share(run.id, bad)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pisub-share-")]

    make_agent("cli", python="print('hi')")
    other = pisub.launch("cli", "x")
    other.wait(timeout=30)
    with pytest.raises(NotResumable, match="not a pi run"):
        share(other.id)
    refused = pisub_cli("share", other.id)
    assert refused.returncode == 1 and "not a pi run" in refused.stderr and "Traceback" not in refused.stderr


def test_share_never_writes_into_pisubs_home(pi_home: Path, tmp_path: Path) -> None:
    """``--out`` inside the home overwrote pisub's own files (a manifest, another run's result);
    a 256-byte name was ``IO_ERROR``."""
    run = _first_run()
    result = run.dir / "result.json"
    before = result.read_bytes()
    for bad in (result, run.dir / "manifest.json", pi_home / "x.html", pi_home / "runs" / "y.html"):
        with pytest.raises(InvalidInput, match=r"--out: .* is inside pisub's home"):
            share(run.id, bad)
    assert result.read_bytes() == before
    assert share(run.id, run.dir / "share.html").path == str(run.dir / "share.html")  # the default
    long = pisub_cli("share", run.id, "--out", str(tmp_path / ("n" * 256)))
    assert long.returncode == 1
    assert "--out: the file name is longer than 255 bytes [INVALID_INPUT]" in long.stderr


@pytest.mark.pi_versions
def test_no_artifacts_and_progress_for_pi(pi_home: Path) -> None:
    run = pisub.launch("pi", "please run TOOL: echo hi", artifacts=False, include_progress=True)
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert not any(t.startswith("pi.") for t in run_event_types(run))
    assert not (run.dir / "stderr-0.log").exists()
    progress = result.details.results[0].progress
    assert progress is not None and (progress.turn_count, progress.tool_count) == (2, 1)
    assert progress.recent_output[-1] == "Tool said: hi"


def test_runs_run_resumes_without_an_agent(pi_home: Path, tmp_path: Path) -> None:
    first = _first_run()
    script = write_script(
        tmp_path,
        f"""
        async def main(runs, state, args):
            again = await runs.run("again", resume={first.id!r}, task="beta")
            return again.output
        """,
    )
    result = launch_workflow(script).wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    assert result.content[0].text == "History: ECHO_HISTORY alpha | beta"
    nothing = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            return await runs.run("lost", task="beta")
        """,
        name="bad.py",
    )
    failed = launch_workflow(nothing).wait(timeout=60)
    assert failed.state == "failed" and "give agent (or resume=RUN_ID" in failed.content[0].text


def test_a_fork_source_that_is_no_session_starts_nothing(pi_home: Path, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir.jsonl").mkdir()
    for given, needle in (
        (tmp_path / "fifo", "is not a session file"),
        (tmp_path / "dir.jsonl", "is not a session file"),
        (tmp_path / "missing.jsonl", "is not a session file"),
        ("0123abcd", "no run"),
        ("../etc", "is not a session file"),
        ("bad\x07ref", "run"),
    ):
        with pytest.raises(pisub.PisubError, match=needle):
            pisub.launch("pi", "x", fork_from=str(given))
    assert not list(pisub.list_runs(children=True))


def test_a_fork_source_must_be_a_pi_session_before_anything_is_copied(pi_home: Path, tmp_path: Path) -> None:
    """``/proc/self/environ`` was copied into the run (the launcher's environment), a symlink to
    a secret or ``--parent-session secret`` copied as it was and only then failed."""
    secret = tmp_path / "secret"
    secret.write_text("TOKEN=hunter2\n")
    (tmp_path / "x.jsonl").symlink_to(secret)
    cases: tuple[tuple[dict[str, Any], str], ...] = (
        ({"fork_from": "/proc/self/environ"}, "--fork-from: .*the system's"),
        ({"fork_from": str(tmp_path / "x.jsonl")}, "--fork-from: .*not a pi session"),
        ({"parent_session": str(secret), "context": "fork"}, "parentSession: .*not a pi session"),
    )
    for options, needle in cases:
        with pytest.raises(InvalidInput, match=needle):
            pisub.launch("pi", "x", **options)
    assert not list(pisub.list_runs(children=True))
    assert not [p for p in (pi_home / "runs").iterdir() if p.name.startswith(".creating-")]
    cli = pisub_cli("run", "--agent", "pi", "x", "--fork-from", "/proc/self/environ")
    assert cli.returncode == 1 and "[INVALID_INPUT]" in cli.stderr and "TOKEN" not in cli.stderr
    # a parent session is checked only when a fork copies it (the pi tool passes it always)
    fresh = pisub.launch("pi", "hello", parent_session=str(secret))
    assert fresh.wait(timeout=60).state == "complete" and fresh.manifest().context == Context.FRESH


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file (CI runs this as pisub-ci)")
def test_an_unreadable_fork_source_is_named(pi_home: Path, tmp_path: Path) -> None:
    """It said ``cannot create a run in ~/runs: Permission denied [HOME_UNUSABLE]``."""
    locked = tmp_path / "locked.jsonl"
    locked.write_text('{"type":"session","id":"s"}\n')
    locked.chmod(0)
    with pytest.raises(InvalidInput, match=f"--fork-from: cannot read {locked}: Permission denied"):
        pisub.launch("pi", "x", fork_from=str(locked))
