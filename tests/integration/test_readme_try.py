"""README.md's "try it yourself" block, run verbatim in bash with a fresh HOME after the install
(``scripts/env.sh``: pisub on PATH, the installed pi, the scripted model when pi has none)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, end_processes, pid_alive, processes_of, wait_for

MARKER = "<!-- try-it-yourself -->"


def readme_block() -> str:
    """The bash block right after the marker line in README.md."""
    text = (ROOT / "README.md").read_text()
    found = re.search(re.escape(MARKER) + r"\n```bash\n(.*?)\n```\n", text, re.S)
    assert found, f"README.md has no ```bash block right after {MARKER}"
    return found.group(1)


@pytest.fixture
def checkout(tmp_path: Path) -> Iterator[Path]:
    """A checkout as the demo leaves it: scripts/env.sh, the .venv running these tests (pisub
    installed) and the installed pi (.pi-cli) — linked, so nothing of the real one changes."""
    if sys.prefix == sys.base_prefix or not (Path(sys.prefix) / "bin" / "pisub").exists():
        pytest.skip("the tests do not run from a virtualenv with pisub installed")
    launchers = sorted((ROOT / ".pi-cli").glob("[0-9]*/bin/pi"))
    if not launchers:
        pytest.skip("no pi installed in .pi-cli (scripts/install_pi.sh)")
    where = tmp_path / "checkout"
    (where / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "env.sh", where / "scripts" / "env.sh")
    shutil.copy(ROOT / "README.md", where / "README.md")
    (where / ".venv").symlink_to(sys.prefix)
    (where / ".pi-cli").symlink_to(ROOT / ".pi-cli")
    (tmp_path / "home").mkdir()
    yield where
    end_processes(processes_of(tmp_path), {os.getuid()})


def fresh_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A new login's environment: a fresh HOME, no pisub, pi or provider variables."""
    env = {"HOME": str(tmp_path / "home"), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if "TMPDIR" in os.environ:
        env["TMPDIR"] = os.environ["TMPDIR"]
    return {**env, **extra}


def bash(
    script: str, cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.pi
def test_readme_try_it_yourself_runs_verbatim(checkout: Path, tmp_path: Path) -> None:
    block = readme_block()
    assert len(block.splitlines()) == 5 and block.splitlines()[0] == ". scripts/env.sh"
    env = fresh_env(tmp_path)
    done = bash("set -e\n" + block, checkout, env)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert "started the scripted model (no API key, no tokens)" in out
        assert "Hello from the fake LLM. You said: What is in this folder?" in out
        assert any("complete" in line and "scout" in line for line in out.splitlines()), out  # list
        assert re.search(r"^state\s.*complete", out, re.M), out  # pisub status
        home = tmp_path / "home"
        assert (home / ".local/state/pisub/runs").is_dir()  # the default home of the fresh HOME
        # Sourced again (a second shell): the same server, nothing new started.
        again = bash(". scripts/env.sh && echo PI_CODING_AGENT_DIR=$PI_CODING_AGENT_DIR", checkout, env)
        assert again.returncode == 0 and "already serves" in again.stdout, again.stdout + again.stderr
        pid = int((home / ".cache/pisub/scripted-model/pid").read_text())
        assert f"PI_CODING_AGENT_DIR={home}/.cache/pisub/scripted-model/pi-agent" in again.stdout
    finally:
        stopped = bash(". scripts/env.sh --stop", checkout, env)
    assert "stopped the scripted model" in stopped.stdout, stopped.stdout + stopped.stderr
    wait_for(lambda: not pid_alive(pid), timeout=10, what="the scripted model to end")


def test_env_sh_leaves_a_real_provider_alone(checkout: Path, tmp_path: Path) -> None:
    """A provider's key (pi lists its models): no server started, PI_CODING_AGENT_DIR untouched."""
    env = fresh_env(tmp_path, ANTHROPIC_API_KEY="sk-test-not-used")
    done = bash(". scripts/env.sh && echo dir=${PI_CODING_AGENT_DIR-unset} bin=$PISUB_PI_BIN", checkout, env)
    assert done.returncode == 0, done.stderr
    assert "no scripted model started" in done.stdout and "dir=unset" in done.stdout
    assert f"bin={checkout}/.pi-cli/" in done.stdout
    assert not (tmp_path / "home/.cache/pisub/scripted-model/pid").exists()


def test_env_sh_refuses_what_it_cannot_do(checkout: Path, tmp_path: Path) -> None:
    env = fresh_env(tmp_path)
    bad = bash(". scripts/env.sh --bogus; echo rc=$?", checkout, env)
    assert "unknown option --bogus" in bad.stderr and "rc=2" in bad.stdout
    (checkout / ".venv").unlink()
    missing = bash(". scripts/env.sh; echo rc=$? still-here", checkout, env)
    assert "run ./scripts/demo.sh first" in missing.stderr and "rc=1 still-here" in missing.stdout
    assert "no scripted model running" in bash(". scripts/env.sh --stop", checkout, env).stdout


STRICT = "set -euo pipefail\n"


def test_env_sh_never_ends_a_strict_shell(checkout: Path, tmp_path: Path) -> None:
    """Under set -euo pipefail a problem is printed and the shell goes on (bash and zsh)."""
    env = fresh_env(tmp_path)
    for shell in shells():
        bad = run_in(shell, STRICT + ". scripts/env.sh --bogus; echo SURVIVED", checkout, env)
        assert "unknown option --bogus" in bad.stderr and "SURVIVED" in bad.stdout, (shell, bad)
    hollow = tmp_path / "hollow"
    (hollow / "scripts").mkdir(parents=True)
    shutil.copy(checkout / "scripts" / "env.sh", hollow / "scripts" / "env.sh")
    missing = bash(STRICT + ". scripts/env.sh; echo SURVIVED", hollow, env)
    assert "run ./scripts/demo.sh first" in missing.stderr and "SURVIVED" in missing.stdout
    for other_shell in ("dash", "sh"):
        if shutil.which(other_shell):
            other = run_in([other_shell, "-c"], "set -eu\n. ./scripts/env.sh; echo SURVIVED", checkout, env)
            assert "source me from bash or zsh" in other.stderr and "SURVIVED" in other.stdout, other
            assert "Bad substitution" not in other.stderr


def shells() -> list[list[str]]:
    """bash, and zsh when installed (scripts/test.sh installs it)."""
    found = [["bash", "-c"]]
    if shutil.which("zsh"):
        found.append(["zsh", "-f", "-c"])
    return found


def run_in(
    shell: list[str], script: str, cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*shell, script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


SHOW = (
    "for v in PI_CODING_AGENT_DIR PI_OFFLINE PI_TELEMETRY PI_SKIP_VERSION_CHECK NO_PROXY; "
    'do eval "echo $v=\\${$v-unset}"; done'
)


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_env_sh_in_a_strict_shell_gives_back_what_it_changed(
    checkout: Path, tmp_path: Path, shell: str
) -> None:
    """bash and zsh, set -euo pipefail: the model starts, a second source reuses it, --stop ends it
    and gives every variable its earlier value back; no helper variable or function is left."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (scripts/test.sh installs it)")
    argv = ["bash", "-c"] if shell == "bash" else ["zsh", "-f", "-c"]
    env = fresh_env(tmp_path, NO_PROXY="corp.example", PI_OFFLINE="7")
    script = (
        STRICT
        + f"""
. scripts/env.sh
. scripts/env.sh
{SHOW}
. scripts/env.sh --stop
echo AFTER
{SHOW}
(set; typeset -f) | grep -c -E '^_?pisub_env|^PISUB_ENV' || true
"""
    )
    done = run_in(argv, script, checkout, env)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    before, after = out.split("AFTER\n")
    state = tmp_path / "home/.cache/pisub/scripted-model"
    assert "started the scripted model" in before and "already serves" in before
    assert f"PI_CODING_AGENT_DIR={state}/pi-agent" in before and "PI_OFFLINE=1" in before
    assert "NO_PROXY=corp.example,127.0.0.1,localhost" in before
    assert f"stop it with: . '{checkout}/scripts/env.sh' --stop" in before
    assert "stopped the scripted model" in before
    assert after.splitlines() == [
        "PI_CODING_AGENT_DIR=unset",
        "PI_OFFLINE=7",
        "PI_TELEMETRY=unset",
        "PI_SKIP_VERSION_CHECK=unset",
        "NO_PROXY=corp.example",
        "0",
    ], out
    assert (state.stat().st_mode & 0o777) == 0o700


def test_env_sh_stops_only_its_own_server(checkout: Path, tmp_path: Path) -> None:
    """A pid file naming another process — even one that looks like the server — or a dead one:
    --stop ends nothing and says so quietly; the next start starts a real server."""
    env = fresh_env(tmp_path)
    state = tmp_path / "home/.cache/pisub/scripted-model"
    state.mkdir(parents=True, mode=0o700)
    decoy = subprocess.Popen(
        ["bash", "-c", "exec -a pisub.testing.fake_model sleep 300", "pisub.testing.fake_model"],
        start_new_session=True,
    )
    try:
        (state / "pid").write_text(f"{decoy.pid}\n")
        (state / "url").write_text("http://127.0.0.1:9/v1\n")
        stopped = bash(STRICT + ". scripts/env.sh --stop", checkout, env)
        assert stopped.stdout == "env.sh: no scripted model running\n" and stopped.stderr == ""
        assert decoy.poll() is None, "the decoy was killed"
        (state / "pid").write_text("999999\n")
        stale = bash(STRICT + ". scripts/env.sh --stop", checkout, env)
        assert stale.stdout == "env.sh: no scripted model running\n" and stale.stderr == "", stale
        (state / "pid").write_text(f"{decoy.pid}\n")
        started = bash(STRICT + ". scripts/env.sh", checkout, env)
        assert "started the scripted model" in started.stdout, started.stdout + started.stderr
        assert decoy.poll() is None
        assert "stopped the scripted model" in bash(". scripts/env.sh --stop", checkout, env).stdout
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


def test_a_wrapper_scripts_arguments_do_not_reach_env_sh(checkout: Path, tmp_path: Path) -> None:
    """bash: `./wrap.sh --stop` does not stop the server, `--verbose` is no error; an option given
    to `.` itself in the script is read."""
    env = fresh_env(tmp_path)
    wrap = tmp_path / "wrap.sh"
    wrap.write_text(f'#!/bin/bash\nset -eu\n. "{checkout}/scripts/env.sh"\necho WRAPPED "$@"\n')
    wrap.chmod(0o755)
    try:
        first = subprocess.run([wrap, "--verbose"], env=env, capture_output=True, text=True, timeout=120)
        assert "WRAPPED --verbose" in first.stdout and "started the scripted model" in first.stdout
        assert first.stderr == "", first.stderr
        again = subprocess.run([wrap, "--stop"], env=env, capture_output=True, text=True, timeout=120)
        assert "already serves" in again.stdout and "stopped" not in again.stdout, again.stdout
        if shutil.which("zsh"):  # zsh cannot tell: a script gives its option (README)
            zwrap = tmp_path / "wrap.zsh"
            zwrap.write_text(f'. "{checkout}/scripts/env.sh" --start\necho WRAPPED "$@"\n')
            zsh = subprocess.run(
                ["zsh", "-f", zwrap, "--stop"], env=env, capture_output=True, text=True, timeout=120
            )
            assert "already serves" in zsh.stdout and "WRAPPED --stop" in zsh.stdout, zsh.stdout + zsh.stderr
    finally:
        stopped = bash(". scripts/env.sh --stop", checkout, env)
    assert "stopped the scripted model" in stopped.stdout


def test_env_sh_gives_a_hanging_pi_ten_seconds(checkout: Path, tmp_path: Path) -> None:
    """A pi whose --list-models never ends (leaving a process on its stdout): env.sh goes on."""
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\n(setsid sleep 60 &)\nexec sleep 60\n")
    hang.chmod(0o755)
    env = fresh_env(tmp_path, PISUB_PI_BIN=str(hang))
    try:
        done = bash(STRICT + ". scripts/env.sh; echo SURVIVED", checkout, env, timeout=40)
        assert "did not answer in 10 s" in done.stderr and "SURVIVED" in done.stdout, done
    finally:
        bash(". scripts/env.sh --stop", checkout, env)


def test_the_slurm_recipe_writes_the_config_pisub_reads(tmp_path: Path) -> None:
    """README's "Runs on a Slurm cluster": its config line, verbatim, sets what `config show` shows."""
    section = (ROOT / "README.md").read_text().split("## Runs on a Slurm cluster", 1)[1]
    block = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert block
    (line,) = [line for line in block.group(1).splitlines() if "config.toml" in line]
    home = tmp_path / "home"
    home.mkdir()
    env = fresh_env(tmp_path, PISUB_HOME=str(tmp_path / "state"))
    done = bash(line, tmp_path, env)
    assert done.returncode == 0, done.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "pisub", "config", "show", "--json"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    rows = {r["name"]: r for r in json.loads(shown.stdout)}
    config = str(home / ".config/pisub/config.toml")
    assert rows["placement.backend"]["value"] == "slurm" and rows["placement.backend"]["file"] == config
    assert rows["slurm.partition"]["value"] == "cpu" and rows["slurm.time"]["value"] == "4:00:00"


@pytest.mark.pi
def test_readme_tasks_file_example_runs_verbatim(checkout: Path, tmp_path: Path) -> None:
    """README's tasks-file example (after `. scripts/env.sh`), and the guide shows the same file."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- tasks-file -->\n```bash\n(.*?)\n```\n", text, re.S)
    assert found
    env = fresh_env(tmp_path)
    done = bash("set -e\n. scripts/env.sh >/dev/null\n" + found.group(1), checkout, env)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        said = "Hello from the fake LLM. You said: Summarise in one line: Hello from the fake LLM."
        assert said in done.stdout
    finally:
        bash(". scripts/env.sh --stop", checkout, env)
    guide = subprocess.run(
        [sys.executable, "-m", "pisub", "guide", "workflows"], capture_output=True, text=True, check=True
    ).stdout
    assert '"agent": "scout", "task": "Summarise in one line: {previous}"' in guide
    assert "--chain FILE" in guide and "{previous}" in guide


def test_the_guide_names_only_agents_that_exist(home: Path) -> None:
    """The overview's first example starts an agent every user has (pisub ships it)."""
    overview = subprocess.run(
        [sys.executable, "-m", "pisub", "guide"], capture_output=True, text=True, check=True
    ).stdout
    named = re.findall(r'\{agent: "([^"]+)"', overview)
    assert named and "pi" not in named
    listed = subprocess.run(
        [sys.executable, "-m", "pisub", "agents", "list", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    agents = {json.loads(line)["name"] for line in listed.splitlines()}
    assert set(named) <= agents, (named, agents)


@pytest.mark.pi
def test_the_demo_output_is_short_and_ends_with_the_try_lines(checkout: Path, tmp_path: Path) -> None:
    """scripts/demo.sh after the install: no npm noise, the task and the scripted model named, the
    run's output once, then README's try-it-yourself lines. (Its pip and npm steps run against
    stand-ins here: pip must not re-point the venv the tests run from, and npm must not run.)"""
    for name in ("demo.sh", "install_pi.sh", "pi-pins.sh"):
        shutil.copy(ROOT / "scripts" / name, checkout / "scripts" / name)
    (checkout / ".venv").unlink()
    venv_bin = checkout / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    calls = tmp_path / "calls"
    python = venv_bin / "python"
    pip = f'if [ "$1 $2" = "-m pip" ]; then echo pip >>{calls}; exit 0; fi'
    python.write_text(f'#!/bin/sh\n{pip}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (venv_bin / "pisub").symlink_to(Path(sys.prefix) / "bin" / "pisub")
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "npm").write_text(f"#!/bin/sh\necho npm >>{calls}\nexit 1\n")
    (fake / "npm").chmod(0o755)
    env = fresh_env(tmp_path)
    env["PATH"] = f"{fake}:{env['PATH']}"
    done = bash("./scripts/demo.sh", checkout, env, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert calls.read_text() == "pip\n", "npm ran: the installed pi was not recognised"
    for noise in ("EBADENGINE", "npm notice", "npm warn", "child 0"):
        assert noise not in out
    assert "a local scripted one" in out and "no API key, no tokens" in out
    assert 'pisub run --agent coder "Look around first: TOOL: ls"' in out
    assert (
        out.count("Tool said:") == 1 and "complete: the agent coder took 2 turn(s) and 1 tool call(s)" in out
    )
    tail = done.stdout.rstrip("\n").splitlines()[-6:]
    assert tail[:5] == readme_block().splitlines() and ". scripts/env.sh --stop" in tail[5]
    assert len(out.splitlines()) < 45, out
