"""``runs.host`` and named workflow resources: real coordinators running real commands (npm,
sh), the permit, output confinement, the process tree ended, journaled across a kill -9."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest

import pisub
from pisub.api.client import Run, resume_workflow
from pisub.core.locks import is_held
from pisub.protocol.workflow import HostPermit, ResourceOrigin
from tests.conftest import pisub_cli, wait_for, wait_no_processes
from tests.helpers import write_script

PACKAGE = {
    "name": "t",
    "version": "1.0.0",
    "scripts": {"test": 'node -e "process.exit(0)"', "typecheck": 'node -e "process.exit(1)"'},
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A tiny npm package: ``npm test`` passes, ``npm run typecheck`` fails."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "package.json").write_text(json.dumps(PACKAGE))
    return root


def launch_with_permit(
    tmp_path: Path,
    body: str,
    *,
    commands: list[str],
    keys: list[str] | None = None,
    cwd: Path,
    max_calls: int = 32,
    args: dict[str, Any] | None = None,
) -> Run:
    """A Python workflow whose spec carries a host permit (as a named resource's would)."""
    from pisub.api import client
    from pisub.protocol.workflow import Shape

    script = write_script(tmp_path, body)
    permit = HostPermit(keys=keys or [], commands=commands, max_calls=max_calls)
    origin = ResourceOrigin(name="test", source="config", path=str(script))
    return client._launch_workflow(
        Shape.WORKFLOW, name=script.name, script=script, cwd=cwd, args=args, permit=permit, resource=origin
    )


def launch_one_call(tmp_path: Path, key: str, command: str, timeout_ms: int, cwd: Path) -> Run:
    """A permitted workflow that returns what ``runs.host(key, command)`` gives."""
    return launch_with_permit(
        tmp_path,
        f"""
        async def main(runs, state, args):
            params = {{"kind": "command", "command": {command!r}, "timeoutMs": {timeout_ms}}}
            return await runs.host({key!r}, params)
        """,
        commands=[command],
        cwd=cwd,
    )


def said_by(tmp_path: Path, body: str, *, keys: list[str] | None = None) -> tuple[Run, list[str]]:
    """Run a permitted script (command ``true``) that returns a list of messages; the run and it."""
    run = launch_with_permit(tmp_path, body, commands=["true"], keys=keys, cwd=tmp_path)
    state, text = _result(run)
    assert state == "complete", text
    said: list[str] = json.loads(text)
    return run, said


def _result(run: Run, timeout: float = 60) -> tuple[str, str]:
    result = run.wait(timeout=timeout)
    return result.state, result.content[0].text


def _host_rows(run: Run) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = msgspec.to_builtins(run.status().host_steps)
    return rows


def test_a_host_command_passes_and_its_row_and_log_are_kept(
    home: Path, project: Path, tmp_path: Path
) -> None:
    run = launch_with_permit(
        tmp_path,
        """
        async def main(runs, state, args):
            result = await runs.host("ci", {"kind": "command", "command": "npm test", "timeoutMs": 60000,
                                            "role": "ci", "output": "reports/ci.txt"})
            again = await runs.host("ci", {"kind": "command", "command": "npm test", "timeoutMs": 60000,
                                           "role": "ci", "output": "reports/ci.txt"})
            assert again == result
            return result
        """,
        commands=["npm test"],
        keys=["ci"],
        cwd=project,
    )
    state, text = _result(run)
    assert state == "complete", text
    result = json.loads(text)
    assert result["ok"] is True and result["exitCode"] == 0 and result["key"] == "ci"
    assert "process.exit(0)" in result["output"]
    assert result["reportPath"] == str(project / "reports" / "ci.txt")
    assert "process.exit(0)" in (project / "reports" / "ci.txt").read_text()
    log = Path(result["logPath"])
    assert log == run.dir / "host" / "ci.log" and (log.stat().st_mode & 0o777) == 0o600
    assert (log.parent.stat().st_mode & 0o777) == 0o700
    rows = _host_rows(run)
    assert [(r["key"], r["state"], r["exitCode"]) for r in rows] == [("ci", "done", 0)]
    events = [json.loads(line)["type"] for line in run.paths.events.read_text().splitlines()]
    assert events.count("workflow.host_started") == 1 and events.count("workflow.host_ended") == 1


def test_a_failing_command_rejects_and_the_script_may_catch_it(
    home: Path, project: Path, tmp_path: Path
) -> None:
    run = launch_with_permit(
        tmp_path,
        """
        from pisub.errors import HostCommandFailed

        async def main(runs, state, args):
            try:
                await runs.host("tc", {"kind": "command", "command": "npm run typecheck", "timeoutMs": 60000})
            except HostCommandFailed as exc:
                return {"caught": exc.message, "code": exc.code}
            return "not raised"
        """,
        commands=["npm run typecheck"],
        cwd=project,
    )
    state, text = _result(run)
    assert state == "complete", text
    caught = json.loads(text)
    assert caught["code"] == "HOST_COMMAND_FAILED" and "exited with code 1" in caught["caught"]
    assert [(r["state"], r["reasonCode"], r["exitCode"]) for r in _host_rows(run)] == [("error", "exit", 1)]


def test_an_uncaught_failure_fails_the_workflow(home: Path, project: Path, tmp_path: Path) -> None:
    run = launch_one_call(tmp_path, "tc", "npm run typecheck", 60000, project)
    state, text = _result(run)
    assert state == "failed" and "HOST_COMMAND_FAILED" in text and "exited with code 1" in text, text


def test_a_timeout_ends_the_whole_process_tree(home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-marker"
    command = f"sh -c 'export PISUB_TEST_MARK={marker}; sleep 300 & sleep 301 & wait'"
    run = launch_one_call(tmp_path, "slow", command, 500, tmp_path)
    state, text = _result(run)
    assert state == "failed" and "timed out after 500 ms" in text, text
    assert [(r["state"], r["reasonCode"]) for r in _host_rows(run)] == [("error", "timeout")]
    wait_no_processes(marker, timeout=5)


def test_the_workflows_stop_ends_a_running_host_command(home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "stop-marker"
    command = f"sh -c 'export PISUB_TEST_MARK={marker}; sleep 300 & wait'"
    run = launch_one_call(tmp_path, "slow", command, 600000, tmp_path)
    wait_for(lambda: [r["state"] for r in _host_rows(run)] == ["running"], 30, what="the host step")
    wait_for(lambda: (run.dir / "host" / "slow.log").exists(), 10, what="its log")
    run.stop()
    state, _text = _result(run, 30)
    assert state == "stopped"
    wait_no_processes(marker, timeout=5)
    assert [(r["state"], r["reasonCode"]) for r in _host_rows(run)] == [("cancelled", "cancelled")]


BAD_OUTPUTS = [
    ("/etc/passwd-pisub", "must be relative"),
    ("../escape.txt", "no '..'"),
    ("a/../../escape.txt", "no '..'"),
    ("x" * 241, "longer than 240 bytes"),
    ("a\nb", "control character"),
]


@pytest.mark.parametrize(("output", "said"), BAD_OUTPUTS)
def test_an_output_outside_the_cwd_is_refused_at_the_call(
    home: Path, tmp_path: Path, output: str, said: str
) -> None:
    run = launch_with_permit(
        tmp_path,
        f"""
        async def main(runs, state, args):
            return await runs.host("o", {{"kind": "command", "command": "true", "timeoutMs": 5000,
                                          "output": {output!r}}})
        """,
        commands=["true"],
        cwd=tmp_path,
    )
    state, text = _result(run)
    assert state == "failed" and "INVALID_INPUT" in text and said in text, text
    assert _host_rows(run) == []


def test_an_output_through_a_symlink_or_over_a_hard_link_is_refused(home: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    work = tmp_path / "work"
    work.mkdir()
    (work / "link.txt").symlink_to(victim)
    (work / "linkdir").symlink_to(outside)
    os.link(victim, work / "hard.txt")
    run = launch_with_permit(
        tmp_path,
        """
        async def main(runs, state, args):
            said = {}
            for key, output in (("a", "link.txt"), ("b", "linkdir/victim.txt"), ("c", "hard.txt")):
                try:
                    await runs.host(key, {"kind": "command", "command": "echo written", "timeoutMs": 5000,
                                          "output": output})
                    said[key] = "written"
                except Exception as exc:
                    said[key] = exc.message
            return said
        """,
        commands=["echo written"],
        cwd=work,
    )
    state, text = _result(run)
    assert state == "complete", text
    said = json.loads(text)
    assert "symlink" in said["a"] and "symlink" in said["b"] and "hard-linked" in said["c"], said
    assert victim.read_text() == "keep me"
    assert [r["reasonCode"] for r in _host_rows(run)] == ["output"] * 3


def test_the_permit_is_the_ceiling(home: Path, tmp_path: Path) -> None:
    run, said = said_by(
        tmp_path,
        """
        async def main(runs, state, args):
            said = []
            for key, params in (
                ("other", {"kind": "command", "command": "true", "timeoutMs": 5000}),
                ("ci", {"kind": "command", "command": "rm -rf /nothing", "timeoutMs": 5000}),
                ("ci", {"kind": "command", "command": "true", "timeoutMs": 5000, "cwd": "/"}),
                ("ci", {"kind": "command", "command": "true", "timeoutMs": 5000, "shell": True}),
                ("ci", {"kind": "command", "command": "true", "timeoutMs": 0}),
                ("ci", {"kind": "command", "command": "true", "timeoutMs": 86400001}),
                ("ci", {"kind": "shell", "command": "true", "timeoutMs": 5000}),
                ("ci", {"kind": "command", "command": "x" * 16385, "timeoutMs": 5000}),
                ("ci", {"kind": "command", "command": "true", "timeoutMs": 5000, "provider": "p" * 129}),
                ("ci", {"kind": "command", "command": "true", "timeoutMs": 5000, "role": "deploy"}),
                ("ci", ["not", "an", "object"]),
            ):
                try:
                    runs.host(key, params)
                    said.append("accepted")
                except Exception as exc:
                    said.append(exc.message)
            return said
        """,
        keys=["ci"],
    )
    assert "not permitted by this resource (its keys: ci)" in said[0]
    assert "command is not permitted" in said[1]
    assert "no per-step cwd" in said[2]
    assert "shell" in said[3]
    assert all("timeoutMs" in s for s in said[4:6]), said
    assert "kind" in said[6]
    assert "command" in said[7] and "provider" in said[8] and "role" in said[9]
    assert "must be an object" in said[10]
    assert _host_rows(run) == []


def test_the_33rd_call_is_refused(home: Path, tmp_path: Path) -> None:
    run = launch_with_permit(
        tmp_path,
        """
        async def main(runs, state, args):
            for i in range(32):
                await runs.host(f"k{i}", {"kind": "command", "command": "true", "timeoutMs": 5000})
            try:
                runs.host("k32", {"kind": "command", "command": "true", "timeoutMs": 5000})
            except Exception as exc:
                return exc.message
        """,
        commands=["true"],
        cwd=tmp_path,
    )
    state, text = _result(run, 120)
    assert state == "complete", text
    assert "at most 32 host commands per workflow" in text
    assert len(_host_rows(run)) == 32


def test_a_raw_script_has_no_host_commands(home: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            try:
                runs.host("ci", {"kind": "command", "command": "npm test", "timeoutMs": 5000})
            except Exception as exc:
                return exc.message
        """,
    )
    run = pisub.launch_workflow(script, cwd=tmp_path)
    state, text = _result(run)
    assert state == "complete", text
    assert text == (
        'runs.host is only available to named workflow resources (workflow: "run-ci"); '
        "a raw script has no host commands"
    )


def test_run_and_host_share_one_key_namespace(home: Path, make_agent: Any, tmp_path: Path) -> None:
    make_agent("worker", python="print('did')")
    _run, said = said_by(
        tmp_path,
        """
        async def main(runs, state, args):
            said = []
            await runs.host("h", {"kind": "command", "command": "true", "timeoutMs": 5000})
            try:
                await runs.run("h", agent="worker", task="x")
            except Exception as exc:
                said.append(exc.message)
            await runs.run("r", agent="worker", task="x")
            try:
                runs.host("r", {"kind": "command", "command": "true", "timeoutMs": 5000})
            except Exception as exc:
                said.append(exc.message)
            try:
                runs.host("h", {"kind": "command", "command": "true", "timeoutMs": 6000})
            except Exception as exc:
                said.append(exc.message)
            return said
        """,
    )
    assert "is a runs.host key" in said[0] and "is a runs.run key" in said[1], said
    assert "already used with other parameters" in said[2]


def test_a_resumed_workflow_never_runs_a_finished_host_command_again(home: Path, tmp_path: Path) -> None:
    count = tmp_path / "count.txt"
    gate = tmp_path / "gate"
    command = f"sh -c 'echo ran >> {count}'"
    run = launch_with_permit(
        tmp_path,
        f"""
        import asyncio, os

        async def main(runs, state, args):
            first = await runs.host("once", {{"kind": "command", "command": {command!r}, "timeoutMs": 10000}})
            while not os.path.exists({str(gate)!r}):
                await asyncio.sleep(0.05)
            return first["exitCode"]
        """,
        commands=[command],
        cwd=tmp_path,
    )
    wait_for(lambda: [r["state"] for r in _host_rows(run)] == ["done"], 30, what="the host step")
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 10)
    gate.touch()
    again = resume_workflow(run.id)
    state, text = _result(again)
    assert state == "complete", text
    assert count.read_text() == "ran\n"
    rows = _host_rows(again)
    assert [(r["key"], r["state"], r["replayed"]) for r in rows] == [("once", "done", True)]
    assert pisub_cli("resume", run.id).returncode == 1


# == named resources ===========================================================================


def test_run_ci_through_the_cli_runs_npm_test_in_javascript(home: Path, project: Path) -> None:
    launched = pisub_cli(
        "run", "--resource", "run-ci", "--args", '{"command": "npm test"}', "--cwd", str(project)
    )
    assert launched.returncode == 0, launched.stderr
    assert "acceptance" not in launched.stderr, launched.stderr  # it starts no child
    run = Run(launched.stdout.strip())
    state, text = _result(run)
    assert state == "complete", text
    result = json.loads(text)
    assert result["ok"] is True and result["exitCode"] == 0 and result["key"] == "ci"
    spec = run.manifest().workflow
    assert spec is not None and spec.language == "javascript" and spec.resource is not None
    assert (spec.resource.name, spec.resource.source) == ("run-ci", "builtin")
    assert spec.permit is not None and spec.permit.commands == ["npm test"] and spec.permit.keys == ["ci"]
    assert spec.args == {"command": "npm test", "timeoutMs": 120000}
    shown = pisub_cli("status", run.id)
    assert "resource run-ci (builtin" in shown.stdout and "npm test" in shown.stdout, shown.stdout


def test_run_ci_typecheck_failing_fails_the_workflow(home: Path, project: Path) -> None:
    # --arg wins over --args: the typecheck runs, with its own timeout
    launched = pisub_cli(
        "run", "--resource", "run-ci", "--args", '{"command": "npm test", "timeoutMs": 5}',
        "--arg", "command=npm run typecheck", "--arg", "timeoutMs=60000", "--cwd", str(project),
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    run = Run(launched.stdout.strip())
    state, text = _result(run)
    assert state == "failed" and "HOST_COMMAND_FAILED" in text and "exited with code 1" in text, text
    assert [(r["state"], r["exitCode"]) for r in _host_rows(run)] == [("error", 1)]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ('{"command": "rm -rf /"}', "give `npm test` (the default) or `npm run typecheck`"),
        ('{"command": "npm test", "shell": true}', "unknown arg 'shell'"),
        ('{"timeoutMs": 0}', "timeoutMs must be a whole number"),
        ('{"timeoutMs": 86400001}', "timeoutMs must be a whole number"),
        ('{"timeoutMs": true}', "timeoutMs must be a whole number"),
        ('["npm test"]', "--args: give a JSON object"),
        ('{"command": "' + "x" * 17000 + '"}', "larger than 16384 bytes"),
        ('{"command": "npm  test"}', "args.command 'npm  test': give `npm test`"),  # as given
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "--args: JSON nested too deeply"),
    ],
)
def test_run_ci_refuses_bad_args_before_anything_runs(
    home: Path, project: Path, args: str, said: str
) -> None:
    launched = pisub_cli("run", "--resource", "run-ci", "--args", args, "--cwd", str(project))
    assert launched.returncode != 0 and said in launched.stderr, launched.stderr
    assert list(pisub.list_runs()) == []


def test_an_unknown_resource_is_refused(home: Path) -> None:
    with pytest.raises(pisub.PisubError, match="no workflow resource 'nope' \\(known: review, run-ci"):
        pisub.launch_resource("nope")


def test_review_runs_one_reviewer_child(home: Path, make_agent: Any, tmp_path: Path) -> None:
    make_agent("reviewer", python="import sys; print('reviewed:', sys.stdin.read().strip())")
    run = pisub.launch_resource("review", {"task": "look at main.py"}, cwd=tmp_path)
    state, text = _result(run)
    assert state == "complete", text
    assert json.loads(text)["output"] == "reviewed: look at main.py\n"
    assert [s.key for s in run.status().steps] == ["review"]
    with pytest.raises(pisub.PisubError, match="unknown arg 'agent'"):
        pisub.launch_resource("review", {"task": "x", "agent": "writer"})


LINT_JS = """
const r = await runs.host("lint", { kind: "command", command: "sh -c 'echo lint ok'", timeoutMs: 10000,
                                     output: "reports/lint.txt" });
let refused = "";
try { await runs.host("other", { kind: "command", command: "sh -c 'echo lint ok'", timeoutMs: 10000 }); }
catch (e) { refused = e.message; }
return { output: r.output, reportPath: r.reportPath, refused, who: args.who };
"""


def _register(
    tmp_path: Path,
    name: str,
    script: Path,
    mode: int = 0o600,
    commands: tuple[str, ...] = ("sh -c 'echo lint ok'",),
    keys: tuple[str, ...] = ("lint",),
) -> Path:
    config = tmp_path / "xdg-config" / "pisub" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"[workflows.resources.{name}]", f'script = "{script}"', 'description = "lint it"']
    lines += [f"commands = {json.dumps(list(commands))}", f"keys = {json.dumps(list(keys))}"]
    config.write_text("\n".join(lines) + "\n")
    config.chmod(mode)
    return config


def _script(tmp_path: Path, text: str = LINT_JS, mode: int = 0o600) -> Path:
    scripts = tmp_path / "scripts"
    scripts.mkdir(mode=0o700, exist_ok=True)
    path = scripts / "lint.js"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_config_resource_runs_with_its_own_permit(home: Path, tmp_path: Path) -> None:
    script = _script(tmp_path)
    _register(tmp_path, "lint", script)
    work = tmp_path / "work"
    work.mkdir()
    assert [(r.name, r.source) for r in pisub.list_resources()] == [
        ("review", "builtin"),
        ("run-ci", "builtin"),
        ("lint", "config"),
    ]
    run = pisub.launch_resource("lint", {"who": "me"}, cwd=work)
    script.write_text("return 'edited after launch';")  # read once, at launch
    state, text = _result(run)
    assert state == "complete", text
    said = json.loads(text)
    assert said["output"] == "lint ok\n" and said["who"] == "me"
    assert said["reportPath"] == str(work / "reports" / "lint.txt")
    assert "not permitted by this resource (its keys: lint)" in said["refused"]
    spec = run.manifest().workflow
    assert spec is not None and spec.resource is not None
    assert (spec.resource.source, spec.resource.path) == ("config", str(script))
    import hashlib

    assert spec.resource.sha256 == hashlib.sha256(LINT_JS.encode()).hexdigest()
    listed = pisub_cli("resources")
    assert listed.returncode == 0 and "lint" in listed.stdout and "run-ci" in listed.stdout, listed.stderr


def test_config_resources_that_are_not_safe_are_refused(home: Path, tmp_path: Path) -> None:
    script = _script(tmp_path)
    _register(tmp_path, "run-ci", script)
    with pytest.raises(pisub.PisubError, match="shadows the builtin resource 'run-ci'"):
        pisub.launch_resource("run-ci")
    _register(tmp_path, "lint", script, mode=0o620)
    with pytest.raises(pisub.PisubError, match="registers workflow resources and is writable by others"):
        pisub.launch_resource("lint")
    _register(tmp_path, "lint", script)
    script.chmod(0o620)
    with pytest.raises(pisub.PisubError, match="is writable by others \\(mode 620\\)"):
        pisub.launch_resource("lint")
    script.chmod(0o600)
    linked = tmp_path / "scripts" / "linked.js"
    linked.symlink_to("/etc/hostname")  # someone else's file (root's), through a symlink
    _register(tmp_path, "lint", linked)
    with pytest.raises(pisub.PisubError, match="is a symlink: give the file itself"):
        pisub.launch_resource("lint")
    _register(tmp_path, "lint", Path("relative.js"))
    with pytest.raises(pisub.PisubError, match="give an absolute path"):
        pisub.launch_resource("lint")
    assert list(pisub.list_runs()) == []


def test_a_host_command_its_coordinator_died_under_runs_once_more_then_not_again(
    home: Path, tmp_path: Path
) -> None:
    count, gate, marker = tmp_path / "count.txt", tmp_path / "gate", tmp_path / "crash-marker"
    command = f"sh -c 'export PISUB_TEST_MARK={marker}; echo ran >> {count}; test -e {gate} || sleep 300'"
    run = launch_one_call(tmp_path, "slow", command, 600000, tmp_path)

    def crash(victim: Run) -> None:
        wait_for(lambda: count.exists() and count.read_text().count("ran") >= 1, 30, what="the command")
        wait_for(lambda: [r["state"] for r in _host_rows(victim)] == ["running"], 30, what="its row")
        coordinator = victim.status().pid
        assert coordinator is not None
        os.kill(coordinator, signal.SIGKILL)
        wait_for(lambda: victim.status().state == "failed", 10)  # the repair ends the command's tree
        wait_no_processes(marker, timeout=10)
        # the repaired run's row does not stay `running` for ever
        assert [(r["state"], r["reasonCode"]) for r in _host_rows(victim)] == [("cancelled", "interrupted")]

    crash(run)
    again = resume_workflow(run.id)
    wait_for(lambda: count.read_text().count("ran") == 2, 30, what="the rerun")
    crash(again)
    third = resume_workflow(again.id)
    state, text = _result(third)
    assert state == "failed" and "its coordinator died twice while it ran" in text, text
    assert count.read_text().count("ran") == 2
    assert [(r["state"], r["reasonCode"]) for r in _host_rows(third)] == [("error", "interrupted")]
    events = [json.loads(line) for line in again.paths.events.read_text().splitlines()]
    started = [e["data"] for e in events if e["type"] == "workflow.host_started"]
    assert started and started[0]["rerun"] is True


def test_a_fifo_at_the_output_path_is_refused(home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(work / "pipe.txt")
    params = {"kind": "command", "command": "echo hi", "timeoutMs": 5000, "output": "pipe.txt"}
    said = _refusal(tmp_path, f"runs.host('f', {params!r})", commands=["echo hi"], cwd=work)
    assert "not a regular file" in said, said


def _refusal(tmp_path: Path, call: str, *, commands: list[str], cwd: Path) -> str:
    """The message one awaited ``runs`` call (Python, in a permitted workflow) is refused with."""
    run = launch_with_permit(
        tmp_path,
        f"""
        async def main(runs, state, args):
            try:
                await {call}
            except Exception as exc:
                return exc.message
        """,
        commands=commands,
        cwd=cwd,
    )
    state, text = _result(run)
    assert state == "complete", text
    return text


def test_the_log_is_capped_at_one_mib_and_the_preview_at_four_kib(home: Path, tmp_path: Path) -> None:
    command = "sh -c 'head -c 3000000 /dev/zero | tr \"\\0\" a; echo; echo the-end'"
    run = launch_one_call(tmp_path, "big", command, 60000, tmp_path)
    state, text = _result(run)
    assert state == "complete", text[:300]
    result = json.loads(text)
    log = Path(result["logPath"])
    assert log.stat().st_size <= 1024 * 1024 and "bytes not kept" in log.read_text()
    assert len(result["output"].encode()) <= 4096 and result["output"].endswith("the-end\n")


def test_a_hostile_key_is_refused(home: Path, tmp_path: Path) -> None:
    run, said = said_by(
        tmp_path,
        """
        async def main(runs, state, args):
            said = []
            for key in ("../x", "", "a/b", "x" * 129, 7, None):
                try:
                    runs.host(key, {"kind": "command", "command": "true", "timeoutMs": 5000})
                except Exception as exc:
                    said.append(exc.message)
            return said
        """,
    )
    assert len(said) == 6 and all("must match" in s for s in said), said
    assert not (run.dir / "host").exists()


def test_a_python_config_resource_runs_too(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "lint.py"
    script.parent.mkdir(mode=0o700)
    script.write_text(
        "async def main(runs, state, args):\n"
        "    params = {'kind': 'command', 'command': \"sh -c 'echo lint ok'\", 'timeoutMs': 10000}\n"
        "    return (await runs.host('lint', params))['output']\n"
    )
    script.chmod(0o600)
    _register(tmp_path, "pylint", script)
    run = pisub.launch_resource("pylint", cwd=tmp_path)
    state, text = _result(run)
    assert state == "complete" and text == "lint ok\n", text
    spec = run.manifest().workflow
    assert spec is not None and spec.language == "python"


def test_a_javascript_resource_killed_after_its_host_step_resumes_without_running_it_again(
    home: Path, make_agent: Any, tmp_path: Path
) -> None:
    count = tmp_path / "count.txt"
    make_agent("worker", python="import time; time.sleep(4); print('worked')")
    command = f"sh -c 'echo ran >> {count}'"
    script = _script(
        tmp_path,
        f"""
        const params = {{ kind: "command", command: {json.dumps(command)}, timeoutMs: 10000 }};
        const first = await runs.host("once", params);
        const child = await runs.run("work", {{ agent: "worker", task: "work" }});
        return {{ exitCode: first.exitCode, child: child.output }};
        """,
    )
    _register(tmp_path, "twostep", script, commands=(command,), keys=())
    run = pisub.launch_resource("twostep", cwd=tmp_path)
    wait_for(lambda: [str(s.status) for s in run.status().steps] == ["running"], 30, what="the child")
    assert [r["state"] for r in _host_rows(run)] == ["done"]
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 10)
    again = resume_workflow(run.id)
    state, text = _result(again)
    assert state == "complete", text
    assert json.loads(text) == {"exitCode": 0, "child": "worked\n"}
    assert count.read_text() == "ran\n"
    assert [(r["key"], r["replayed"]) for r in _host_rows(again)] == [("once", True)]


def test_args_json_merges_with_arg_for_a_script_workflow(home: Path, tmp_path: Path) -> None:
    launched = pisub_cli(
        "run", "--workflow-script", "return args;", "--args", '{"a": 1, "b": {"c": 2}}', "--arg", "b=3",
        "--cwd", str(tmp_path),
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    state, text = _result(Run(launched.stdout.strip()))
    assert state == "complete" and json.loads(text) == {"a": 1, "b": 3}, text
    refused = pisub_cli("run", "--workflow-script", "return args;", "--args", "[1]")
    assert refused.returncode != 0 and "--args: give a JSON object" in refused.stderr


def test_a_cwd_inside_pisub_home_is_refused_at_launch(
    home: Path, project: Path, make_agent: Any, tmp_path: Path
) -> None:
    # the attack: `--cwd <home>/runs/<another run> --args '{"output": "status.json"}'` overwrote that
    # run's status.json with a host command's output
    make_agent("worker", python="print('worked')")
    first = pisub.launch_resource("run-ci", cwd=project)
    assert first.wait(timeout=60).state == "complete"
    # (wait returns on the result; the runner writes its terminal status just after it, then exits)
    wait_for(lambda: not is_held(first.dir / "runner.lock"), 30, what="the runner to exit")
    before = first.paths.status.read_bytes()
    launched = pisub_cli("run", "--resource", "run-ci", "--cwd", str(first.dir))
    assert launched.returncode == 1, launched
    said = launched.stderr.strip()
    assert said.startswith("pisub: working directory ") and said.endswith("[INVALID_INPUT]"), said
    assert f"is inside pisub's home {home}; give a directory of your own" in said, said
    assert len(said.splitlines()) == 1
    with pytest.raises(pisub.PisubError, match="is inside pisub's home"):
        pisub.launch_workflow(text="return 1", cwd=home)
    with pytest.raises(pisub.PisubError, match="is inside pisub's home"):
        pisub.launch("worker", "x", cwd=home / "runs")
    tree = home / "worktrees" / "repo" / "w1"  # the worktrees pisub makes there are not its files
    tree.mkdir(parents=True)
    assert pisub.launch_workflow(text="return 1", cwd=tree).wait(timeout=60).state == "complete"
    # a child's cwd relative to the workflow's may not reach it either
    child = f"runs.run('c', agent='worker', task='x', cwd={os.path.relpath(first.dir, tmp_path)!r})"
    said = _refusal(tmp_path, child, commands=["true"], cwd=tmp_path)
    assert "is inside pisub's home" in said, said
    assert first.paths.status.read_bytes() == before
    assert first.status().state == "complete"


def test_an_output_inside_pisub_home_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    # what a workflow whose cwd reached the home (launched before the launch refused it) meets
    from pisub.protocol.host import HostParams, HostReason, HostState
    from pisub.store.paths import Home
    from pisub.workflow.host import run_host

    fake_home = tmp_path / "pisub-home"
    victim_dir = fake_home / "runs" / "other"
    victim_dir.mkdir(parents=True)
    (victim_dir / "status.json").write_text('{"v": 1}')
    ran = tmp_path / "ran"
    params = HostParams(kind="command", command=f"touch {ran}", timeout_ms=5000, output="status.json")
    log = tmp_path / "log" / "o.log"
    outcome = run_host("o", params, cwd=victim_dir, log=log, should_stop=lambda: False, home=Home(fake_home))
    assert outcome.reason is HostReason.OUTPUT and outcome.error is not None
    assert f"inside pisub's home {fake_home}" in outcome.error, outcome.error
    assert (victim_dir / "status.json").read_text() == '{"v": 1}' and not ran.exists()
    tree = fake_home / "worktrees" / "repo" / "w1"  # an isolated child's checkout is the user's
    tree.mkdir(parents=True)
    outcome = run_host("o", params, cwd=tree, log=log, should_stop=lambda: False, home=Home(fake_home))
    assert outcome.state is HostState.DONE and (tree / "status.json").exists(), outcome.error


def test_a_setsid_daemon_of_a_host_command_ends_with_its_step(home: Path, tmp_path: Path) -> None:
    marker, gate = tmp_path / "daemon-marker", tmp_path / "gate"
    detached = "setsid sleep 44.4 > /dev/null 2>&1 < /dev/null &"
    daemon = f"sh -c 'export PISUB_TEST_MARK={marker}; {detached} sleep 0.5; echo spawned'"
    waiter = f"sh -c 'while ! test -e {gate}; do sleep 0.1; done'"
    run = launch_with_permit(
        tmp_path,
        f"""
        async def main(runs, state, args):
            first = await runs.host("d", {{"kind": "command", "command": {daemon!r}, "timeoutMs": 10000}})
            await runs.host("w", {{"kind": "command", "command": {waiter!r}, "timeoutMs": 60000}})
            return first["output"]
        """,
        commands=[daemon, waiter],
        cwd=tmp_path,
    )
    wait_for(lambda: [r["key"] for r in _host_rows(run)] == ["d", "w"], 30, what="the second step")
    assert _host_rows(run)[0]["state"] == "done"
    wait_no_processes(marker, timeout=5)  # gone while the coordinator still runs
    gate.touch()
    state, text = _result(run)
    assert state == "complete" and "spawned" in text, text


def test_a_config_resource_that_does_not_validate_is_named_by_its_file(home: Path, tmp_path: Path) -> None:
    script = _script(tmp_path, 'return await runs.run("a", { agent: "nosuchagent", task: "x" });\n')
    _register(tmp_path, "lint", script)
    with pytest.raises(pisub.PisubError) as raised:
        pisub.launch_resource("lint", cwd=tmp_path)
    assert str(raised.value).startswith(f"resource lint ({script}) does not validate: line 1"), raised.value
    assert list(pisub.list_runs()) == []
