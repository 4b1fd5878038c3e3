from __future__ import annotations

from pathlib import Path

import pytest

from pisub.agents.catalog import discover, parse_agent
from pisub.errors import InvalidInput, UnknownAgent


def test_flow_list_args_and_body() -> None:
    agent = parse_agent(
        '---\nname: hi\ndescription: says hi\ncommand: sh\nargs: ["-c", "echo hi"]\ntimeout: 5\n'
        "idleTimeout: 2.5\n---\nBe kind.\n",
        Path("hi.md"),
    )
    assert agent.frontmatter.args == ["-c", "echo hi"]
    assert agent.frontmatter.timeout == 5 and agent.frontmatter.idle_timeout == 2.5
    assert agent.system_prompt == "Be kind."
    spec = agent.spec()
    assert spec.runner == "external-cli" and spec.command == "sh" and spec.source == "hi.md"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: x\n", "no YAML frontmatter"),
        ("---\nname: x\ncommand: c\n", "no closing"),
        ("---\n[unclosed\n---\n", "not valid YAML"),
        ("---\n- a\n---\n", "must be a mapping"),
        ("---\nname: x\ncommand: c\nargz: []\n---\n", "argz"),
        ('---\nname: x\ncommand: c\nargs: "-c"\n---\n', "args"),
        ("---\nname: x\n---\n", "needs a 'command'"),
        ("---\nname: ../evil\ncommand: c\n---\n", "agent name"),
        ("---\nname: x\ncommand: c\ntimeout: -1\n---\n", "timeout must be a positive"),
        ("---\nname: x\nrunner: docker\ncommand: c\n---\n", "runner"),
    ],
)
def test_bad_agent_files(text: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=None) as info:
        parse_agent(text, Path("x.md"))
    assert needle in str(info.value)


def test_project_scope_wins_and_git_root_is_searched(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "a.md").write_text("---\nname: a\ncommand: user-cmd\n---\n")
    (user / "b.md").write_text("---\nname: b\ncommand: user-b\n---\n")
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".pisub" / "agents").mkdir(parents=True)
    (repo / ".pisub" / "agents" / "a.md").write_text("---\nname: a\ncommand: repo-cmd\n---\n")
    sub = repo / "src" / "deep"
    sub.mkdir(parents=True)
    catalog = discover(user, sub)
    assert catalog.agents["a"].frontmatter.command == "repo-cmd"
    assert catalog.agents["a"].scope == "project"
    assert catalog.agents["b"].scope == "user"
    with pytest.raises(UnknownAgent, match="Available agents: a, b"):
        catalog.get("zzz")
