"""The YAML frontmatter of an agent file (``<name>.md``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from pisub.protocol.acceptance import AcceptanceRole
from pisub.protocol.budget import ToolBudgetInput
from pisub.protocol.codec import StrictRecord
from pisub.protocol.fields import Context
from pisub.protocol.manifest import AgentRunner, ThinkingLevel
from pisub.protocol.placement import BackendName, SlurmOptions


class AgentFrontmatter(StrictRecord, kw_only=True):
    """What an agent file's frontmatter may say; unknown keys are an error."""

    name: str
    package: str | None = None
    """The runtime name is ``package.name`` when given."""
    aliases: list[str] | str | None = None
    """Other names the agent answers to (resolved to its runtime name); a list, or the seed's
    comma string ``"cs, sc"``."""
    disabled: bool = False
    """A disabled agent's runs are refused (``SUBAGENT_DISABLED``)."""
    description: str = ""
    runner: AgentRunner | RunnerProfile | None = None
    """``pi`` or ``external-cli`` (the default in pisub's own scopes; in pi's agent directories
    the default is ``pi``), or the seed's ``{type, command, args, promptDelivery}``."""
    command: str | None = None
    args: list[str] = []
    timeout: float | None = None
    idle_timeout: float | None = None
    output_cap: int | None = None
    output_hard_cap: int | None = None
    tool_timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    """pi only: milliseconds one tool call may take."""
    checkpoint_before_deadline_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    """pi only: ask the child to checkpoint this long before its runtime deadline."""
    tool_budget: ToolBudgetInput | None = None
    """pi only: ``{hard, soft?, block?}`` tool calls."""
    acceptance: str | bool | dict[str, Any] | None = None
    """``"auto"`` or ``{level, verify?, ...}`` (checked when a run is planned)."""
    gate: str | None = None
    """A command that must pass on the child's tree for its run to complete."""
    acceptance_role: AcceptanceRole | None = None
    """What the inference of ``acceptance: "auto"`` takes this agent for (``read-only`` or
    ``writer``); without it, a pi agent whose tools are all read-only is read-only."""
    model: str | None = None
    """pi only: ``provider/id`` (or any pattern pi's ``--model`` takes)."""
    tools: list[str] | str | None = None
    """pi only: allow-list of tool names (``--tools``): a list or the seed's comma string;
    ``mcp:`` entries are ignored (recorded)."""
    thinking: ThinkingLevel | None = None
    """pi only: thinking level (``--thinking``)."""
    extensions: bool | str | list[str] | None = None
    """pi only: keep pi's extension discovery (off by default: extensions rewrite messages).
    The seed's empty value means off; a list of extension paths is ignored (recorded)."""
    skills: bool | str | list[str] | None = None
    """pi only: keep pi's skills. The seed's names of skills to inject are ignored (recorded)."""
    prompt_templates: bool = False
    """pi only: keep pi's prompt templates."""
    max_depth: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    """How deep the runs this agent starts may nest: lowers ``PISUB_MAX_DEPTH`` inside its runs,
    never raises it."""
    backend: BackendName | None = None
    """Where its runs' runners live (``local``, ``slurm``) unless the call says."""
    slurm: SlurmOptions | None = None
    """What its Slurm runs ask of the engine (``partition``, ``time``, ``cpus``, ``mem``,
    ``sbatch``: further options, one argv word each)."""
    default_context: Context | None = None
    """pi only: how this agent's runs begin when the call says no ``context`` (``fresh``,
    ``fork``: a preference, fresh when there is no session to fork); ``context: profile`` asks for it."""
    trust_project: bool = False
    """pi only: load the working directory's ``.pi/`` resources (settings, ``APPEND_SYSTEM.md``,
    extensions): pi's ``--approve``. Off by default: a sub-agent sent into someone else's
    repository does not run that repository's pi extensions."""

    # The keys of pi-subagents' agent files (the seed); what each does here is in
    # pisub.agents.seedkeys and spec/cli.md "Agent files".
    system_prompt_mode: Literal["append", "replace"] | None = None
    inherit_project_context: bool | None = None
    inherit_global_context: bool | None = None
    inherit_skills: bool | None = None
    fallback_models: list[str] | str | None = None
    output: str | bool | None = None
    reads: list[str] | str | bool | None = None
    default_reads: list[str] | str | bool | None = None
    progress: bool | None = None
    default_progress: bool | None = None
    async_: bool | None = msgspec.field(default=None, name="async")
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=2**53)] | None = None
    max_subagent_depth: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    exclude_tools: list[str] | str | None = None
    subagent_only_extensions: list[str] | str | None = None
    skill: list[str] | str | bool | None = None
    skill_path: list[str] | str | None = None
    mutation_tools: list[str] | str | None = None
    completion_guard: bool | None = None
    interactive: bool | None = None
    allow_nested_subagents: bool | None = None
    memory: dict[str, Any] | None = None


class RunnerProfile(StrictRecord, kw_only=True):
    """The seed's ``runner:`` mapping (``type: external-cli``, ``command``, ``args``,
    ``promptDelivery: stdin``)."""

    type: Literal["external-cli", "pi", "external-job"]
    command: str | None = None
    args: list[str] = []
    prompt_delivery: Literal["stdin"] = "stdin"
