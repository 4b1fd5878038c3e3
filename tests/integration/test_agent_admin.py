"""Agent management: create, update (set and clear keys), delete, disable/enable, eject and
reset shipped agents, packages and aliases; writes refuse files that changed since read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pisub
from pisub.agents.catalog import SHIPPED_DIR
from pisub.api.client import agent_catalog, edit_agent
from pisub.errors import AgentConflict, AgentDisabled, InvalidInput, UnknownAgent
from tests.conftest import pisub_cli


def _cli(*args: str) -> str:
    proc = pisub_cli(*args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_create_update_clear_and_delete(home: Path, tmp_path: Path) -> None:
    _cli(
        "agents",
        "create",
        "echoer",
        "--config",
        json.dumps({"command": "echo", "args": ["hi"], "timeout": 60}),
    )
    agent = agent_catalog().get("echoer")
    assert agent.frontmatter.command == "echo" and agent.frontmatter.timeout == 60
    _cli(
        "agents",
        "update",
        "echoer",
        "--config",
        '{"timeout": false, "description": "says hi"}',
        "--prompt",
        "Hi.",
    )
    agent = agent_catalog().get("echoer")
    assert agent.frontmatter.timeout is None and agent.frontmatter.description == "says hi"
    assert agent.system_prompt == "Hi."
    assert oct((home / "agents" / "echoer.md").stat().st_mode & 0o777) == "0o600"
    assert pisub.launch("echoer", "x").wait(timeout=30).state == "complete"
    _cli("agents", "delete", "echoer")
    with pytest.raises(UnknownAgent):
        agent_catalog().get("echoer")


def test_a_file_that_changed_since_it_was_read_is_a_conflict(home: Path) -> None:
    edit_agent("create", config={"name": "a", "command": "true"})
    shown = json.loads(_cli("agents", "show", "a", "--json"))
    (home / "agents" / "a.md").write_text('---\nname: a\ncommand: "false"\n---\n')  # someone else's edit
    proc = pisub_cli("agents", "update", "a", "--config", '{"timeout": 5}', "--expect", shown["sha256"])
    assert proc.returncode == 1 and "[AGENT_CONFLICT]" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(AgentConflict):
        edit_agent("delete", "a", expect=shown["sha256"])
    with pytest.raises(AgentConflict, match="exists already"):
        edit_agent("create", config={"name": "a", "command": "true"})


def test_disable_refuses_runs_and_enable_restores(home: Path) -> None:
    edit_agent("create", config={"name": "w", "command": "true"})
    _cli("agents", "disable", "w")
    with pytest.raises(AgentDisabled, match="pisub agents enable w"):
        pisub.launch("w", "x")
    proc = pisub_cli("run", "--agent", "w", "x")
    assert "[SUBAGENT_DISABLED]" in proc.stderr
    _cli("agents", "enable", "w")
    assert "disabled" not in (home / "agents" / "w.md").read_text()
    assert pisub.launch("w", "x").wait(timeout=30).state == "complete"


def test_packages_aliases_and_the_project_scope(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    monkeypatch.chdir(project)
    edit_agent("create", config={"name": "scout", "package": "code", "aliases": ["cs"], "command": "true"})
    edit_agent("create", config={"name": "scout", "package": "code", "command": "false"}, scope="project")
    assert (project / ".pisub" / "agents" / "code.scout.md").is_file()
    catalog = agent_catalog(cwd=project)
    assert catalog.get("code.scout").scope == "project"  # the project wins on a clash
    with pytest.raises(InvalidInput, match="both scopes"):
        edit_agent("update", "code.scout", config={"timeout": 5})
    edit_agent("update", "code.scout", config={"timeout": 5}, scope="user")
    edit_agent("delete", "code.scout", scope="project")
    assert agent_catalog(cwd=project).get("cs").name == "code.scout"  # the alias
    run = pisub.launch("cs", "x", cwd=project)
    assert run.manifest().agent.name == "code.scout"


def test_eject_and_reset_a_shipped_agent(home: Path) -> None:
    _cli("agents", "eject", "reviewer")
    path = home / "agents" / "reviewer.md"
    assert path.read_text() == (SHIPPED_DIR / "reviewer.md").read_text()
    assert "[AGENT_CONFLICT]" in pisub_cli("agents", "eject", "reviewer").stderr
    edit_agent("update", "reviewer", config={"description": "mine"})
    assert "mine" in path.read_text()
    _cli("agents", "reset", "reviewer")
    assert path.read_text() == (SHIPPED_DIR / "reviewer.md").read_text()
    assert "[UNKNOWN_AGENT]" in pisub_cli("agents", "eject", "nosuch").stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["create", "x", "--config", '{"runner": "robot"}'], "runner"),
        (["create", "../x", "--config", '{"command": "true"}'], "config.name"),
        (["create", "x", "--config", '{"command": "true", "colour": 1}'], "colour"),
        (["create", "x", "--config", "[1]"], "JSON object"),
        (["create", "x", "--config", "{" * 5000], "not JSON"),
        (["create", "x", "--config", '{"command": "true"}', "--scope", "elsewhere"], "scope"),
        (["update", "nosuch", "--config", "{}"], "no agent file"),
    ],
)
def test_bad_edits_are_one_line_naming_the_problem(home: Path, args: list[str], needle: str) -> None:
    if args[0] == "update":
        edit_agent("create", config={"name": "other", "command": "true"})
    proc = pisub_cli("agents", *args)
    assert proc.returncode != 0 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (home / "agents" / "x.md").exists()


def test_a_name_wins_over_an_alias_when_editing(home: Path) -> None:
    edit_agent(
        "create", config={"name": "foo", "command": "true", "description": "precious", "aliases": ["scout"]}
    )
    edit_agent("eject", "scout")
    edit_agent("reset", "scout")  # the ejected scout, not foo
    assert "precious" in (home / "agents" / "foo.md").read_text()
    edit_agent("create", config={"name": "bar", "command": "true"})
    edit_agent("create", config={"name": "baz", "command": "true", "aliases": ["bar"]})
    edit_agent("update", "bar", config={"timeout": 5})  # bar itself, though baz answers to it too
    assert agent_catalog().get("bar").frontmatter.timeout == 5
    edit_agent("delete", "bar")
    assert (home / "agents" / "baz.md").is_file() and not (home / "agents" / "bar.md").exists()


def test_a_broken_agent_file_is_named_and_create_scope_and_name_are_checked(home: Path) -> None:
    (home / "agents").mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "agents" / "odd.md").write_text("---\nname: odd\nbogus: 1\n---\n")
    with pytest.raises(InvalidInput, match="cannot be read as an agent"):
        edit_agent("delete", "odd")
    assert "is not NAME" in pisub_cli("agents", "create", "foo", "--config", '{"name": "bar1"}').stderr
    proc = pisub_cli("agents", "create", "p1", "--config", '{"command": "true", "scope": "project"}')
    assert proc.returncode == 0 and ".pisub/agents/p1.md" in proc.stdout, proc.stdout + proc.stderr


def test_a_disabled_agent_cannot_be_resumed(pi_home: Path) -> None:
    run = pisub.launch("pi", "first")
    assert run.wait(timeout=60).state == "complete"
    edit_agent("disable", "pi")
    with pytest.raises(AgentDisabled):
        pisub.resume(run.id, "again")


def test_models_with_no_match_and_bad_model_names(pi_home: Path) -> None:
    from pisub.children.pi.models import parse_table

    assert parse_table('No models matching "zzz"\n') == []
    assert pisub_cli("models", "zzz", "--json").stdout.strip() == ""
    for bad in ("fake/:max", "/"):
        with pytest.raises(InvalidInput, match="provider/id"):
            pisub.launch("pi", "x", model=bad)


def test_install_makes_private_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "ext"
    proc = pisub_cli("pi-extension", "install", "--into", str(target))
    assert proc.returncode == 0, proc.stderr
    for directory in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert oct(directory.stat().st_mode & 0o777) == "0o700"
    assert "[INVALID_INPUT]" in pisub_cli("pi-extension", "install", "--into", "").stderr
