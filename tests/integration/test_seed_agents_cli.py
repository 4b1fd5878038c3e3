"""pi-subagents users' agents through the CLI and a real pi (issue 25): ``agents list --scope
--capabilities``, ``agents refine`` (``--config``, ``--show``, ``--rollback``), the keys pisub
does not act on (in the manifest, shown once at the first launch), and the seed's
``systemPromptMode`` / ``inherit*`` reaching pi."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api import agents as api
from pisub.errors import InvalidInput
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli

TREE = Path(__file__).parent.parent / "fixtures" / "pi_subagents_tree"


@pytest.fixture
def repo(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture tree with pi's agent folder as PI_CODING_AGENT_DIR; the cwd inside the repo."""
    shutil.copytree(TREE / "repo", tmp_path / "repo")
    shutil.copytree(TREE / "pi-agent" / "agents", tmp_path / "pi-agent" / "agents", dirs_exist_ok=True)
    (tmp_path / "repo" / ".git").mkdir()
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi-agent"))
    monkeypatch.chdir(tmp_path / "repo")
    return tmp_path / "repo"


def _json_lines(*args: str) -> list[dict[str, Any]]:
    proc = pisub_cli(*args, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_list_scopes_default_to_both(repo: Path) -> None:
    both = {row["name"]: row for row in _json_lines("agents", "list", "--json")}
    assert both["scout"]["scope"] == "project" and both["scout"]["source"] == "pi"
    assert both["planner-bot"]["aliases"] == ["plan", "pb"] and both["worker"]["scope"] == "builtin"
    assert both["oracle"]["ignored"] and "capabilities" not in both["oracle"]
    user = _json_lines("agents", "list", "--json", "--scope", "user")
    assert {r["name"] for r in user} == {"scout", "planner-bot", "code-analysis.scout", "untitled"}
    assert [r.get("shadowed") for r in user if r["name"] == "scout"] == [True]
    builtin = _json_lines("agents", "list", "--json", "--scope", "builtin")
    assert {r["scope"] for r in builtin} == {"builtin"}
    project = {r["name"] for r in _json_lines("agents", "list", "--json", "--scope", "project")}
    assert {"scout", "oracle", "local-reviewer", "legacy-only"} <= project and "planner-bot" not in project
    bad = pisub_cli("agents", "list", "--scope", "everywhere")
    assert bad.returncode != 0 and "scope" in bad.stderr and "Traceback" not in bad.stderr


def test_capabilities_say_what_each_agent_can_do(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (repo / ".pi" / "agents" / "gone.md").write_text(
        "---\nname: gone\nrunner: {type: external-cli, command: no-such-cmd-xyz}\ndisabled: true\n---\nP\n"
    )
    monkeypatch.setenv("PISUB_PI_BIN", str(repo / "no-pi-here"))
    rows = {r["name"]: r for r in _json_lines("agents", "list", "--json", "--capabilities")}
    caps = rows["local-reviewer"]["capabilities"]
    assert caps["runner"] == {
        "type": "external-cli",
        "command": "sh",
        "args": ["-c", "cat >/dev/null; echo reviewed"],
        "available": True,
        "unavailableReason": None,
    }
    gone = rows["gone"]["capabilities"]
    assert gone["runner"]["available"] is False and "no-such-cmd-xyz" in gone["runner"]["unavailableReason"]
    assert gone["ceilings"]["allowed"] is False and "disabled" in gone["ceilings"]["reason"]
    scout = rows["scout"]["capabilities"]
    assert scout["tools"]["allow"] == ["read", "grep", "find", "ls", "bash"]
    assert (
        scout["timeouts"]["declared"]["timeout"] == 900 and scout["timeouts"]["effective"]["timeout"] == 900
    )
    assert scout["ceilings"]["agentMaxDepth"] == 1 and scout["ceilings"]["allowed"] is True
    assert scout["runner"]["available"] is False and "PISUB_PI_BIN" in scout["runner"]["unavailableReason"]
    oracle = rows["oracle"]["capabilities"]["models"]
    assert oracle["fallbackModels"] == ["openai-codex/gpt-5.6-luna:low", "anthropic/claude-haiku-4-5"]
    listing = json.dumps(rows)
    assert "You advise; you never edit." not in listing  # never a system prompt
    text = pisub_cli("agents", "list", "--capabilities", check=True).stdout
    assert "unavailable: command not found on PATH: no-such-cmd-xyz" in text


def test_refine_round_trip(repo: Path) -> None:
    made = json.loads(
        pisub_cli(
            "agents",
            "refine",
            "scout",
            "--config",
            '{"guidance": "Check the tests first.", "reason": "r1"}',
            "--json",
        ).stdout
    )
    overlay = repo / ".pi" / "subagents" / "refinements" / "scout.md"
    assert made["revision"] == 1 and made["path"] == str(overlay)
    assert stat.S_IMODE(overlay.stat().st_mode) == 0o600
    api.refine("pb", {"guidance": "Keep plans short."})  # an alias names the agent
    api.refine("scout", {"guidance": "Cite file paths."})
    spec = pisub.agent_catalog().get("scout").spec()
    assert spec.system_prompt.endswith('revision="2">\nCite file paths.\n</pi-subagents-refinement>')
    assert spec.system_prompt.startswith("You are the project's scout.")
    shown = json.loads(pisub_cli("agents", "refine", "scout", "--show", "--json", check=True).stdout)
    assert shown["current"]["guidance"] == "Cite file paths."
    assert [r["revision"] for r in shown["history"]] == [1, 2]
    back = json.loads(pisub_cli("agents", "refine", "scout", "--rollback", "--json", check=True).stdout)
    assert back["current"]["guidance"] == "Check the tests first." and back["current"]["revision"] == 3
    text = pisub_cli("agents", "refine", "scout", "--rollback", check=True).stdout
    assert "removed" in text and not overlay.exists()
    assert "pi-subagents-refinement" not in pisub.agent_catalog().get("scout").spec().system_prompt
    assert api.refine_show("scout")["current"] is None and len(api.refine_show("scout")["history"]) == 4
    again = pisub_cli("agents", "refine", "scout", "--rollback")
    assert again.returncode != 0 and "no refinement overlay" in again.stderr
    assert "planner-bot" in {p.stem for p in overlay.parent.glob("*.md")}
    assert "(refined)" in pisub_cli("agents", "list", check=True).stdout


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"guidance": "x", "tools": "bash"}, "config.tools"),
        ({"guidance": ""}, "config.guidance"),
        ({"guidance": 5}, "config.guidance"),
        ({"guidance": "a </pi-subagents-refinement> b"}, "pi-subagents-refinement"),
        ({"guidance": "bell \x07"}, "control"),
        ({"guidance": "x" * 9000}, "larger than"),
        ({"guidance": "x", "reason": "\x1b[2J"}, "config.reason"),
    ],
)
def test_bad_refinements_are_refused(repo: Path, config: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidInput, match=None) as info:
        api.refine("scout", config)
    assert needle in str(info.value)
    assert not (repo / ".pi" / "subagents").exists()


def test_refinements_neither_follow_symlinks_nor_name_paths(repo: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, repo / ".pi" / "subagents")
    with pytest.raises(InvalidInput, match="symlink"):
        api.refine("scout", {"guidance": "x"})
    assert list(elsewhere.iterdir()) == []
    assert "symlink" in " ".join(pisub_cli("agents", "list").stderr.splitlines())
    proc = pisub_cli("agents", "refine", "../../etc/x", "--show")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    both = pisub_cli("agents", "refine", "scout", "--show", "--rollback")
    assert both.returncode != 0 and "one of" in both.stderr


def test_ignored_keys_are_in_the_manifest_and_shown_once(repo: Path) -> None:
    (repo / ".pi" / "agents" / "echo.md").write_text(
        "---\nname: echo\nrunner: {type: external-cli, command: sh, args: ['-c', 'cat']}\n"
        "fallbackModels: a/b\nprogress: true\nacceptance: {level: none, reason: test}\n---\nP\n"
    )
    first = pisub_cli("run", "-a", "echo", "hi", "--json", check=True)
    assert "fallbackModels: pisub does not retry" in first.stderr and "shown once" in first.stderr
    run = pisub.Run(json.loads(first.stdout)["runId"])
    assert [i.key for i in run.manifest().agent.ignored] == ["fallbackModels", "progress"]
    second = pisub_cli("run", "-a", "echo", "again", check=True)
    assert "fallbackModels" not in second.stderr
    assert run.wait(timeout=30).state == "complete"


SEED_CREATE_CONFIG: dict[str, object] = {
    "name": "Code Scout",
    "package": "code-analysis",
    "description": "Scans codebases for patterns and issues",
    "scope": "user",
    "systemPrompt": "You are a code scout...",
    "systemPromptMode": "replace",
    "inheritProjectContext": False,
    "inheritGlobalContext": False,
    "inheritSkills": False,
    "model": "anthropic/claude-sonnet-4",
    "fallbackModels": ["openai-codex/gpt-5.6-luna:low", "anthropic/claude-haiku-4-5"],
    "tools": "read, bash, mcp:github/search_repositories",
    "extensions": "",
    "skills": "parallel-scout",
    "thinking": "high",
    "acceptance": {"level": "none", "reason": "lightweight lookup"},
    "acceptanceRole": "read-only",
    "output": "context.md",
    "reads": "shared-context.md",
    "progress": True,
}
"""The seed's create example (shared/seeds/001, 管理动作), verbatim."""


def test_seed_create_config_verbatim(home: Path) -> None:
    """The seed's create example (a pi agent: no runner given; comma strings; its keys)."""
    config = {**SEED_CREATE_CONFIG, "aliases": "cs, sc"}
    proc = pisub_cli("agents", "create", "Code Scout", "--config", json.dumps(config))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("code-analysis.code-scout.md")
    agent = pisub.agent_catalog().get("sc")
    assert agent.name == "code-analysis.code-scout" and agent.effective.runner == "pi"
    spec = agent.spec()
    assert spec.tools == ["read", "bash"] and spec.thinking == "high"
    assert {i.key for i in spec.ignored} >= {
        "fallbackModels",
        "output",
        "reads",
        "progress",
        "skills",
        "tools",
    }
    assert "inheritGlobalContext" not in {
        i.key for i in spec.ignored
    }  # false with the project's off: honoured


@pytest.mark.pi
@pytest.mark.pi_versions
def test_prompt_mode_and_context_reach_pi(
    pi_home: Path, model_server: FakeModelServer, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    (project / "AGENTS.md").write_text("PROJECT-RULE-XYZ\n")
    agents = project / ".pi" / "agents"
    agents.mkdir(parents=True)
    none = "acceptance: {level: none, reason: scripted}\n"
    (agents / "narrow.md").write_text(
        f"---\nname: Narrow One\nmodel: fake/fake-model\n{none}---\nSEED-NARROW\n"
    )
    (agents / "broad.md").write_text(
        "---\nname: broad\nmodel: fake/fake-model\nsystemPromptMode: append\n"
        f"inheritProjectContext: true\ninheritGlobalContext: true\n{none}---\nSEED-BROAD\n"
    )
    for name, task in (("narrow-one", "task-narrow-1"), ("broad", "task-broad-1")):
        result = pisub.launch(name, task, cwd=project).wait(timeout=60)
        assert result.state == "complete", result.content[0].text
    systems = {}
    for request in model_server.requests:
        text = json.dumps(request)
        for task in ("task-narrow-1", "task-broad-1"):
            if task in text:
                systems[task] = json.dumps(request["messages"][0])
    narrow, broad = systems["task-narrow-1"], systems["task-broad-1"]
    assert (
        "SEED-NARROW" in narrow
        and "PROJECT-RULE-XYZ" not in narrow
        and "a coding agent harness" not in narrow
    )
    assert "SEED-BROAD" in broad and "PROJECT-RULE-XYZ" in broad and "a coding agent harness" in broad


def test_pi_folder_agents_are_edited_in_place_and_doctor_names_skipped_files(repo: Path) -> None:
    pisub_cli("agents", "update", "oracle", "--config", '{"description": "Second opinions"}', check=True)
    oracle = repo / ".pi" / "agents" / "review" / "oracle.md"
    assert "Second opinions" in oracle.read_text()
    assert pisub.agent_catalog().get("oracle").frontmatter.description == "Second opinions"
    pisub_cli("agents", "disable", "planner-bot", check=True)  # pi's user folder, found by name
    assert pisub.agent_catalog().get("planner-bot").frontmatter.disabled
    pisub_cli("agents", "delete", "legacy-only", check=True)
    assert not (repo / ".agents" / "legacy-only.md").exists()
    (repo / ".pi" / "agents" / "broken.md").write_bytes(b"\xff\xfe not text")
    hostile = os.fsencode(repo / ".pi" / "agents") + b"/a\xff\x1b[2J.md"
    os.close(os.open(hostile, os.O_CREAT | os.O_WRONLY, 0o600))
    listed = pisub_cli("agents", "list")
    assert listed.returncode == 0 and "\x1b" not in listed.stderr and "not UTF-8" in listed.stderr
    report = pisub_cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(report.stdout)["checks"]}
    assert checks["agents"]["ok"] is False and "broken.md: not UTF-8" in checks["agents"]["detail"]


def test_create_warns_when_it_overrides_a_shipped_agent(home: Path) -> None:
    proc = pisub_cli("agents", "create", "reviewer", "--config", '{"tools": "read"}', check=True)
    assert "overrides the agent pisub ships as 'reviewer'" in proc.stderr and "review gates" in proc.stderr
    quiet = pisub_cli("agents", "create", "mine", "--config", '{"tools": "read"}', check=True)
    assert quiet.stderr == ""


ECHO = "---\nname: echo\nrunner: {type: external-cli, command: sh, args: ['-c', 'cat']}\n"


def _checks() -> dict[str, dict[str, Any]]:
    report = json.loads(pisub_cli("doctor", "--json").stdout)
    return {c["name"]: c for c in report["checks"]}


def test_a_project_reviewer_is_named_at_launch_and_by_doctor(repo: Path) -> None:
    agents = repo / ".pi" / "agents"
    assert _checks()["reviewer"]["detail"] == "review gates run the 'reviewer' pisub ships"
    (agents / "echo.md").write_text(
        f"{ECHO}acceptance: {{level: attested, review: {{required: true}}}}\n---\nP\n"
    )
    reviewer = agents / "reviewer.md"
    reviewer.write_text(
        "---\nname: reviewer\nrunner: {type: external-cli, command: sh, args: ['-c', 'echo none']}\n---\nR\n"
    )
    first = pisub_cli("run", "-a", "echo", "hi", "--json", check=True)
    assert f"review gate runs the reviewer in {reviewer} (project scope" in first.stderr
    assert "not the one pisub ships" in first.stderr and "shown once" in first.stderr
    second = pisub_cli("run", "-a", "echo", "again", "--json", check=True)
    assert "review gate runs the reviewer" not in second.stderr  # said once; the launch line stays
    # The seed's semantics: a reviewer without tools gets pi's default tools, and says so.
    reviewer.write_text("---\nname: reviewer\ndescription: mine\n---\nR\n")
    third = pisub_cli("run", "-a", "echo", "third", "--json", check=True)
    assert "sets no tools, so it gets pi's default tools and can change files" in third.stderr
    check = _checks()["reviewer"]
    assert check["ok"] is True and check["detail"].startswith(f"warning: review gates run {reviewer}")
    assert "pi's default tools" in check["detail"]
    for proc in (first, second, third):
        pisub.Run(json.loads(proc.stdout)["runId"]).wait(timeout=60)


def _bomb(path: Path) -> None:
    levels = "".join(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" for n in range(1, 9))
    path.write_text(f"---\nl0: &l0 [lol]\n{levels}agent: echo\n---\nG\n")


@pytest.mark.parametrize("kind", ["symlink", "fifo", "huge", "bomb", "other-agent"])
def test_an_unused_overlay_is_named_at_launch_and_by_doctor(repo: Path, tmp_path: Path, kind: str) -> None:
    (repo / ".pi" / "agents" / "echo.md").write_text(
        f"{ECHO}acceptance: {{level: none, reason: t}}\n---\nP\n"
    )
    api.refine("echo", {"guidance": "G"})
    overlay = repo / ".pi" / "subagents" / "refinements" / "echo.md"
    overlay.unlink()
    if kind == "symlink":
        (tmp_path / "target.md").write_text("---\nagent: echo\nrevision: 1\n---\nG\n")
        overlay.symlink_to(tmp_path / "target.md")
    elif kind == "fifo":
        os.mkfifo(overlay)
    elif kind == "huge":
        overlay.write_text("---\nagent: echo\nrevision: 1\n---\n" + "x" * (1024 * 1024 + 1))
    elif kind == "bomb":
        _bomb(overlay)
    else:
        overlay.write_text("---\nagent: scout\nrevision: 1\n---\nG\n")
    first = pisub_cli("run", "-a", "echo", "hi", "--json", check=True)
    assert f"warning: the refinement overlay {overlay}: " in first.stderr and "not used" in first.stderr
    second = pisub_cli("run", "-a", "echo", "again", "--json", check=True)
    assert "overlay" not in second.stderr
    checks = _checks()
    assert checks["overlays"]["ok"] is False and str(overlay) in checks["overlays"]["detail"]
    assert checks["agents"]["ok"] is True
    for proc in (first, second):
        assert pisub.Run(json.loads(proc.stdout)["runId"]).wait(timeout=60).state == "complete"


def test_refine_leaves_no_lock_file_in_the_repository(repo: Path) -> None:
    api.refine("scout", {"guidance": "G"})
    api.refine_rollback("scout")
    folder = repo / ".pi" / "subagents" / "refinements"
    assert sorted(p.name for p in folder.iterdir()) == ["scout.revisions"]
