"""pi-subagents users' agents (issue 25): a copy of a realistic agent tree (pi's user folder, a
project's .pi/agents and legacy .agents) resolves as the seed says; the seed's frontmatter keys
and shapes are honoured or recorded as ignored; hostile folders are skipped with a reason."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pisub.agents.catalog import Catalog, discover, parse_agent
from pisub.agents.walk import MAX_DEPTH
from pisub.errors import InvalidInput

TREE = Path(__file__).parent.parent / "fixtures" / "pi_subagents_tree"


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The fixture tree copied: (pi's agent dir, pisub's user dir, a folder inside the repo)."""
    shutil.copytree(TREE, tmp_path / "t")
    repo = tmp_path / "t" / "repo"
    (repo / ".git").mkdir()
    (repo / "src").mkdir()
    user = tmp_path / "t" / "home-agents"
    user.mkdir()
    return tmp_path / "t" / "pi-agent", user, repo / "src"


def _discover(tmp_path: Path) -> Catalog:
    pi_dir, user, cwd = _tree(tmp_path)
    return discover(user, cwd, pi_dir=pi_dir)


def test_the_tree_resolves_as_the_seed_says(tmp_path: Path) -> None:
    catalog = _discover(tmp_path)
    assert not catalog.problems
    names = set(catalog.agents)
    # Recursive (**), package names, the file's stem without a name, no *.chain.md.
    assert {"scout", "planner-bot", "code-analysis.scout", "untitled", "oracle", "legacy-only"} <= names
    assert "local-reviewer" in names and "writer-chain" not in names
    # The project wins over the user; .pi/agents over legacy .agents; builtin last.
    scout = catalog.agents["scout"]
    assert scout.scope == "project" and scout.path.parent.name == "agents"
    assert ".pi" in scout.path.parts and scout.frontmatter.description.endswith("(project)")
    shadowed = {(a.scope, a.frontmatter.description) for a in catalog.shadowed if a.name == "scout"}
    assert ("user", "Fast codebase recon (user)") in shadowed
    assert ("project", "Legacy scout (loses to .pi/agents)") in shadowed
    assert catalog.agents["legacy-only"].scope == "project"
    assert catalog.agents["planner-bot"].scope == "user"
    # Aliases from a comma string resolve to the canonical name.
    assert catalog.get("pb").name == "planner-bot" and catalog.get("advisor").name == "oracle"


def test_pi_dialect_defaults_and_honoured_keys(tmp_path: Path) -> None:
    catalog = _discover(tmp_path)
    scout = catalog.agents["scout"].spec()
    assert scout.runner == "pi" and scout.tools == ["read", "grep", "find", "ls", "bash"]
    assert scout.system_prompt_mode == "replace" and "--no-context-files" in scout.args
    assert catalog.agents["scout"].limits().timeout == 900 and scout.max_depth == 1
    assert catalog.agents["scout"].limits().tool_timeout == 600
    planner = catalog.agents["planner-bot"].spec()
    assert planner.system_prompt_mode == "append" and "--no-context-files" not in planner.args
    assert planner.skills is True and planner.ignored == []
    ca = catalog.agents["code-analysis.scout"].spec()
    assert ca.tools == ["read", "bash"] and ca.extensions is False
    assert {i.key for i in ca.ignored} == {"tools", "skills"}
    cli = catalog.agents["local-reviewer"].spec()
    assert cli.runner == "external-cli" and cli.command == "sh" and cli.args[0] == "-c"


def test_keys_pisub_does_not_act_on_are_recorded_with_why(tmp_path: Path) -> None:
    oracle = _discover(tmp_path).agents["oracle"]
    spec = oracle.spec()
    assert spec.tools == ["read"]  # mcp: dropped (recorded), excludeTools honoured
    ignored = {i.key: i.reason for i in spec.ignored}
    assert set(ignored) == {
        "tools",
        "fallbackModels",
        "output",
        "reads",
        "defaultReads",
        "progress",
        "defaultProgress",
        "interactive",
    }
    assert "pi-mcp-adapter" in ignored["tools"] and "--model" in ignored["fallbackModels"]
    assert "async" not in ignored and "completionGuard" not in ignored  # true / false: nothing lost
    assert oracle.system_prompt not in repr(spec.ignored)


def test_pisub_scopes_win_over_pi_folders(tmp_path: Path) -> None:
    pi_dir, user, cwd = _tree(tmp_path)
    (user / "scout.md").write_text("---\nname: scout\ncommand: mine\n---\n")
    catalog = discover(user, cwd, pi_dir=pi_dir)
    assert catalog.agents["scout"].scope == "project"  # the project still wins over the user
    assert catalog.agents["planner-bot"].scope == "user"
    (cwd.parent / ".pisub" / "agents").mkdir(parents=True)
    (cwd.parent / ".pisub" / "agents" / "scout.md").write_text("---\nname: scout\ncommand: ours\n---\n")
    catalog = discover(user, cwd, pi_dir=pi_dir)
    assert catalog.agents["scout"].effective.command == "ours"
    assert catalog.agents["scout"].effective.runner == "external-cli"  # pisub's own defaults


def test_the_nearest_pi_folder_up_to_the_git_root_only(tmp_path: Path) -> None:
    pi_dir, user, cwd = _tree(tmp_path)
    above = tmp_path / "t" / ".pi" / "agents"  # above the repository: not the project's
    above.mkdir(parents=True)
    (above / "planted.md").write_text("---\nname: planted\n---\nx\n")
    nearer = cwd / ".pi" / "agents"
    nearer.mkdir(parents=True)
    (nearer / "near.md").write_text("---\nname: near\n---\nx\n")
    catalog = discover(user, cwd, pi_dir=pi_dir)
    assert "near" in catalog.agents and "planted" not in catalog.agents
    assert "oracle" not in catalog.agents  # the nearest folder with agents is the project's
    outside = tmp_path / "elsewhere" / "deep"
    outside.mkdir(parents=True)
    (tmp_path / "elsewhere" / ".pi" / "agents").mkdir(parents=True)
    (tmp_path / "elsewhere" / ".pi" / "agents" / "up.md").write_text("---\nname: up\n---\nx\n")
    assert "up" not in discover(user, outside, pi_dir=pi_dir).agents  # no repository: cwd only


def test_hostile_entries_are_skipped_with_a_reason(tmp_path: Path) -> None:
    pi_dir, user, cwd = _tree(tmp_path)
    agents = cwd.parent / ".pi" / "agents"
    secret = tmp_path / "secret.md"
    secret.write_text("---\nname: secret\n---\nnot yours\n")
    os.symlink(secret, agents / "link.md")
    os.symlink(tmp_path, agents / "linked-dir")
    os.mkfifo(agents / "fifo.md")
    (agents / "huge.md").write_bytes(b"---\nname: huge\n---\n" + b"x" * (1024 * 1024 + 10))
    (agents / "latin1.md").write_bytes("---\nname: caf\xe9\n---\n".encode("latin-1"))
    os.close(os.open(os.fsencode(agents) + b"/bad-\xff.md", os.O_CREAT | os.O_WRONLY, 0o600))
    (agents / "unknown.md").write_text("---\nname: u\nfrobnicate: 1\n---\n")
    deep = agents.joinpath(*[f"d{i}" for i in range(MAX_DEPTH + 1)])
    deep.mkdir(parents=True)
    (deep / "deep.md").write_text("---\nname: deep\n---\nx\n")
    locked = agents / "locked.md"
    locked.write_text("---\nname: locked\n---\nx\n")
    locked.chmod(0)
    catalog = discover(user, cwd, pi_dir=pi_dir)  # returns: no hang on the FIFO, no crash
    why = {p.name: reason for p, reason in catalog.problems.items()}
    assert "symlink" in why["link.md"] and "symlink" in why["linked-dir"]
    assert "FIFO" in why["fifo.md"]
    assert "larger than" in why["huge.md"]
    assert "UTF-8" in why["latin1.md"]
    assert any("not UTF-8" in reason and "bad-" in name for name, reason in why.items())
    assert "frobnicate" in why["unknown.md"]
    assert "deep" in why[f"d{MAX_DEPTH}"]
    if os.geteuid() != 0:  # root reads a 000 file
        assert "cannot read" in why["locked.md"]
    assert "secret" not in catalog.agents and "oracle" in catalog.agents  # the rest still loads


def test_a_symlinked_project_folder_is_not_entered(tmp_path: Path) -> None:
    pi_dir, user, cwd = _tree(tmp_path)
    real = cwd.parent / ".pi" / "agents"
    shutil.move(real, tmp_path / "moved")
    os.symlink(tmp_path / "moved", real)
    catalog = discover(user, cwd, pi_dir=pi_dir)
    assert "oracle" not in catalog.agents
    assert "symlink" in catalog.problems[real]
    # The user's own folder may be a symlink (dotfiles set-ups).
    shutil.move(pi_dir / "agents", tmp_path / "dotfiles")
    os.symlink(tmp_path / "dotfiles", pi_dir / "agents")
    assert "planner-bot" in discover(user, cwd, pi_dir=pi_dir).agents


@pytest.mark.parametrize(
    ("head", "needle"),
    [
        ("runner: {type: external-job}", "external-job"),
        ("runner: {type: external-cli, command: x, promptDelivery: argv}", "promptDelivery"),
        ("runner: {type: external-cli, command: x}\ncommand: y", "not both"),
        ("timeout: 5\ntimeoutMs: 5000", "not both"),
        ("skills: true\ninheritSkills: false", "disagree"),
        ("systemPromptMode: prepend", "systemPromptMode"),
        ("tools: 5", "tools"),
        ('tools: ["read\\u0000x"]', "not a tool name"),
        ('tools: "read, --evil"', "not a tool name"),
        ("aliases: [1, 2]", "aliases"),
        ("maxSubagentDepth: -1", "maxSubagentDepth"),
        ("name: '!!!'", "no letter or digit"),
        (f"tools: {', '.join(['t'] * 300)}", "more than"),
    ],
)
def test_bad_seed_shapes_name_the_key(head: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_agent(f"---\n{head}\n---\n", Path("/x/.pi/agents/a.md"), "project", "pi")
    assert needle in str(info.value)


def test_comma_strings_in_pisub_scopes_too() -> None:
    text = '---\nname: scout2\nrunner: pi\ntools: "read, bash"\naliases: "cs, sc, scout2"\n---\n'
    agent = parse_agent(text, Path("/h/scout2.md"))
    assert agent.effective.tools == ["read", "bash"] and agent.effective.aliases == ["cs", "sc"]
    assert agent.spec().system_prompt_mode == "append" and "--no-context-files" not in agent.spec().args
    empty = parse_agent("---\nname: bare\ntools:\n---\n", Path("/r/.pi/agents/bare.md"), "project", "pi")
    assert empty.spec().tools == []  # the seed's empty tools: no tools at all


def test_a_symlinked_dot_pi_is_not_entered(tmp_path: Path) -> None:
    pi_dir, user, cwd = _tree(tmp_path)
    dot_pi = cwd.parent / ".pi"
    shutil.move(dot_pi, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", dot_pi)
    catalog = discover(user, cwd, pi_dir=pi_dir)
    assert "oracle" not in catalog.agents and "symlink" in catalog.problems[dot_pi]
    assert "legacy-only" in catalog.agents  # the legacy folder beside it is still read


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/r/.pi/agents/x.md", "pi"),
        ("/r/.pi/agents/team/agents/x.md", "pi"),
        ("/r/.agents/x.md", "pi"),
        ("/u/.pi/agent/agents/x.md", "pi"),
        ("/u/.local/state/pisub/agents/x.md", "pisub"),
        ("/r/.pisub/agents/x.md", "pisub"),
        ("/u/agent/agents/x.md", "pisub"),
    ],
)
def test_dialect_of_a_path(path: str, dialect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pisub.agents.catalog import dialect_of

    monkeypatch.setenv("PI_CODING_AGENT_DIR", "/nowhere")
    assert dialect_of(Path(path)) == dialect


def test_overlays_read_only_for_agents_found_and_never_through_links(tmp_path: Path) -> None:
    pi_dir, user, cwd = _tree(tmp_path)
    where = cwd.parent / ".pi" / "subagents" / "refinements"
    where.mkdir(parents=True)
    good = "---\nagent: oracle\nrevision: 1\nprevious: null\n---\nBe brief.\n"
    (where / "oracle.md").write_text(good)
    (where / "nobody.md").write_bytes(b"\xff not even text")  # no such agent: never opened
    secret = tmp_path / "secret.md"
    secret.write_text(good.replace("oracle", "scout"))
    os.symlink(secret, where / "scout.md")
    (where / "legacy-only.md").write_text(good)  # its header names another agent
    catalog = discover(user, cwd, pi_dir=pi_dir)
    assert catalog.agents["oracle"].spec().system_prompt.endswith("Be brief.\n</pi-subagents-refinement>")
    assert catalog.agents["scout"].refinement is None
    assert "cannot read" in catalog.problems[where / "scout.md"]
    assert "not the file's name" in catalog.problems[where / "legacy-only.md"]
    assert where / "nobody.md" not in catalog.problems


def test_a_huge_folder_is_cut_short_with_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pisub.agents import walk

    monkeypatch.setattr(walk, "MAX_ENTRIES", 5)
    folder = tmp_path / "agents"
    folder.mkdir()
    for i in range(20):
        (folder / f"a{i:02d}.md").write_text(f"---\nname: a{i:02d}\n---\nx\n")
    files, problems = walk.agent_files(folder, recursive=True, follow_root=False)
    assert len(files) <= 5 and "more than 5 names" in problems[folder]
    fifo = tmp_path / "fifo-root"
    os.mkfifo(fifo)
    assert walk.agent_files(fifo, recursive=True, follow_root=True) == ([], {fifo: "not a folder"})


def _seed_keys(text: str) -> dict[str, str]:
    """pi-subagents' frontmatter reader: line by line, ``^([\\w-]+):\\s*(.*)$``."""
    import re

    lines = text.split("\n")
    assert lines[0] == "---"
    end = lines.index("---", 1)
    found = (re.match(r"^([\w-]+):\s*(.*)$", line) for line in lines[1:end])
    return {m.group(1): m.group(2) for m in found if m}


def test_edits_of_a_pi_folder_agent_stay_readable_line_by_line(tmp_path: Path) -> None:
    import subprocess

    from pisub.agents import files

    repo, home = tmp_path / "repo", tmp_path / "home" / "agents"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".pi" / "agents").mkdir(parents=True)
    ro = repo / ".pi" / "agents" / "ro.md"
    ro.write_text("---\nname: ro\ndescription: Read-only helper\ntools: read\n---\nBody line\n\n  kept\n")
    files.update(home, repo, "ro", {"description": "Read-only helper v2", "aliases": ["r1", "r2"]})
    keys = _seed_keys(ro.read_text())
    assert keys == {"name": "ro", "description": "Read-only helper v2", "tools": "read", "aliases": "r1, r2"}
    assert ro.read_text().endswith("---\nBody line\n\n  kept\n")
    files.set_disabled(home, repo, "ro", True)
    assert _seed_keys(ro.read_text())["disabled"] == "true" and _seed_keys(ro.read_text())["tools"] == "read"
    files.set_disabled(home, repo, "ro", False)
    assert "disabled" not in _seed_keys(ro.read_text()) and len(_seed_keys(ro.read_text())) == 4
    # The folder's lock is in pisub's home, never a stray file in the repository.
    assert sorted(p.name for p in ro.parent.iterdir()) == ["ro.md"]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, capture_output=True, text=True
    )
    assert status.stdout.split() == ["??", ".pi/agents/ro.md"]
    assert list((home / files.LOCKS).iterdir())


@pytest.mark.parametrize(
    "name", ["re\u200bviewer", "re\u00adviewer", "reviewer\u2028", "re\u3000viewer", "re\tviewer"]
)
def test_names_with_invisible_characters_are_skipped_not_normalised(tmp_path: Path, name: str) -> None:
    import json

    agents = tmp_path / "repo" / ".pi" / "agents"
    agents.mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()
    (agents / "planted.md").write_text(f"---\nname: {json.dumps(name)}\ntools: read\n---\nP\n")
    (agents / f"{name}.md").write_text("---\ndescription: no name, the stem\n---\nP\n")
    catalog = discover(tmp_path / "user", tmp_path / "repo", pi_dir=tmp_path / "pi")
    assert catalog.agents["reviewer"].scope == "builtin"
    reasons = {p.name: why for p, why in catalog.problems.items()}
    assert "invisible or control character" in reasons["planted.md"]
    assert "invisible or control character" in reasons[f"{name}.md"]
