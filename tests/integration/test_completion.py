"""Shell completion: run ids (live runs first, by prefix) and agent names, through bash itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, pisub_cli


def _pisub_bin() -> str:
    found = Path(sys.executable).with_name("pisub")
    if not found.is_file():
        pytest.skip("no pisub console script next to this python")
    return str(found)


def _complete(words: str, cword: int) -> list[str]:
    env = {**os.environ, "_PISUB_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    proc = subprocess.run([_pisub_bin()], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_run_ids_complete_live_first_and_by_prefix(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", command="true")
    make_agent("long", command="sleep", args=["30"])
    done = pisub.launch("quick", "x")
    done.wait(timeout=30)
    live = pisub.launch("long", "x")
    try:
        offered = _complete("pisub status ", 2)
        assert offered[:1] == [live.id] and done.id in offered
        assert _complete(f"pisub wait {done.id[:6]}", 2) == [done.id]
        assert _complete("pisub status zz", 2) == []
    finally:
        assert pisub_cli("stop", live.id).returncode == 0


def test_agent_names_complete(home: Path, make_agent: AgentMaker) -> None:
    make_agent("alpha", command="true")
    assert "alpha" in _complete("pisub run --agent ", 3)
    assert _complete("pisub run --agent al", 3) == ["alpha"]


def test_bash_completes_through_the_generated_script(
    home: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    make_agent("alpha", command="true")
    script = subprocess.run(
        [_pisub_bin(), "--show-completion", "bash"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "complete" in script and "_pisub_completion" in script
    driver = tmp_path / "drive.sh"
    driver.write_text(
        script + "\nCOMP_WORDS=(pisub run --agent al); COMP_CWORD=3; _pisub_completion pisub\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{Path(_pisub_bin()).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-i", str(driver)], capture_output=True, text=True, timeout=60, env=env)
    assert "alpha" in proc.stdout.split(), proc.stdout + proc.stderr
