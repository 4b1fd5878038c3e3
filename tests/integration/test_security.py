"""Secure by default: no symlink followed, argv literal, no environment copied, secrets redacted."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, pisub_cli, wait_for


def test_symlink_in_place_of_status_is_not_followed(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    planted = tmp_path / "planted.json"
    planted.write_bytes((run.dir / "status.json").read_bytes().replace(b'"complete"', b'"paused"'))
    (run.dir / "status.json").unlink()
    os.symlink(planted, run.dir / "status.json")
    proc = pisub_cli("status", run.id, "--json")
    assert proc.returncode == 1 and "PROTOCOL_ERROR" in proc.stderr
    assert "paused" not in proc.stdout


def test_shell_metacharacters_stay_literal(home: Path, make_agent: AgentMaker, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    args = ["%s|", f"$(touch {canary})", "; touch " + str(canary), f"`touch {canary}`", "&& echo no", "*"]
    make_agent("literal", command="printf", args=args)
    result = pisub.launch("literal", "x").wait(timeout=30)
    assert result.state == "complete"
    assert result.details.results[0].output == "".join(a + "|" for a in args[1:])
    assert not canary.exists()


def test_environment_values_are_never_copied(
    home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("PISUB_TEST_CANARY", secret)
    make_agent("envcheck", python="import os; print('has canary:', 'PISUB_TEST_CANARY' in os.environ)")
    run = pisub.launch("envcheck", "x")
    assert run.wait(timeout=30).details.results[0].output == "has canary: True\n"  # the child gets it...
    found = subprocess.run(["grep", "-rl", secret, str(home)], capture_output=True, text=True)
    assert found.stdout == "", f"...but no pisub file may hold it: {found.stdout}"


def test_everything_returned_is_redacted(home: Path, make_agent: AgentMaker) -> None:
    token = "ghp_" + "a1B2c3D4e5" * 4
    make_agent(
        "leaky",
        python=f"""
        import time
        print("OPENAI_API_KEY=sk-{"x" * 30}")
        print("Authorization: Bearer {token}")
        print("home is", __import__("os").path.expanduser("~") + "/secret/project", flush=True)
        time.sleep(30)
    """,
    )
    run = pisub.launch("leaky", "x")
    wait_for(lambda: (run.dir / "output-0.log").stat().st_size > 0)
    refused = pisub_cli("steer", run.id, f"use {token} please", "--json")  # refused up front
    assert "NOT_STEERABLE" in refused.stderr and token not in refused.stdout + refused.stderr
    run.send_steer(f"use {token} please")  # by hand: the runner fails it, and says so redacted
    wait_for(lambda: run.status().steering.failed == 1)
    assert token not in run.status().steering.recent[-1].preview
    assert pisub_cli("stop", run.id).returncode == 0
    result = run.wait(timeout=30)
    returned = pisub_cli("result", run.id, "--json").stdout
    for leaked in ("sk-xxxx", token, os.path.expanduser("~") + "/secret"):
        assert leaked not in returned
        assert leaked not in (result.details.results[0].output or "")
    assert "[REDACTED]" in returned and "~/secret/project" in returned
    # The run's own log stays raw, in a private file.
    assert token in (run.dir / "output-0.log").read_text()
    assert oct((run.dir / "output-0.log").stat().st_mode & 0o777) == "0o600"
