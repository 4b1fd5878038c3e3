"""Where and as what a workflow's child runs: its cwd, its workspace (in place or a git
worktree: :mod:`pisub.worktrees.workspace`), the agents visible there and the manifest of its
run (:func:`pisub.runs.launch.plan_run`, or ``plan_resume`` for a call that resumes a run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.fields import Isolation
from pisub.protocol.manifest import LimitValues, Manifest, seconds_of_ms
from pisub.protocol.workflow import ChildCall, Context, Shape
from pisub.workflow.entries import ChildEntry, ChildTable

if TYPE_CHECKING:
    from pisub.agents.catalog import Catalog


@dataclass(eq=False)
class Placement:
    """Places a workflow's children."""

    table: ChildTable
    catalogs: dict[Path, Catalog] = field(default_factory=dict, init=False)
    """The agents visible from each cwd, read once per batch of calls."""

    def isolation(self, call: ChildCall) -> Isolation:
        """Where ``call``'s child works: its own isolation, else the workflow's."""
        return call.isolation if call.isolation is not None else self.table.spec.isolation

    def preflight(self, call: ChildCall, cwd: Path, where: str) -> None:
        """A child's workspace can hold it (for a worktree: a clean git repository, its base
        ref, its cwd in that commit, a branch name for its key; checked per batch, again when
        its worktree is made). Isolation is never dropped silently.

        Raises:
            InvalidInput: naming what is wrong (the uncommitted paths, the ref, the key).
        """
        from pisub.worktrees.workspace import workspace

        space = workspace(self.isolation(call))
        try:
            space.check(cwd, call.key or "", self.base_ref(call))
        except PisubError as exc:
            raise type(exc)(f"{where}: isolation={space.isolation.value!r}: {exc.message}") from None

    def base_ref(self, call: ChildCall) -> str | None:
        """The commit a worktree child starts from: its own base ref, else the workflow's."""
        return call.base_ref if call.base_ref is not None else self.table.spec.base_ref

    def child_cwd(self, call: ChildCall, where: str) -> Path:
        """The directory ``call`` names, relative to the workflow's cwd.

        Raises:
            InvalidInput: it does not exist or is inside pisub's home (naming ``where``).
        """
        from pisub.runs.launch import outside_home, working_dir

        try:
            where_ = working_dir(call.cwd, Path(self.table.manifest.cwd))
            return outside_home(where_, self.table.home) if call.cwd is not None else where_
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: cwd: {exc.message}") from None

    def plan_start(
        self, call: ChildCall, cwd: Path, where: str, run_id: str | None = None
    ) -> tuple[Manifest, dict[str, Path]]:
        """The manifest of ``call``'s run in ``cwd`` (``run_id`` when journaled before) and the
        files to seed it with (a forked session); nothing is created.

        Raises:
            PisubError: what :func:`~pisub.runs.launch.plan_run` or ``plan_resume`` raise, naming
                ``where``.
        """
        from pisub.acceptance.infer import Setting
        from pisub.runs.launch import plan_resume, plan_run, resumed_acceptance, with_report_section
        from pisub.store.config import load_config

        assert call.key is not None
        lineage = self.table.lineage.child(self.table.manifest.run_id)
        caller = LimitValues(
            timeout=call.timeout,
            idle_timeout=call.idle_timeout,
            tool_timeout=seconds_of_ms(call.tool_timeout_ms),
            checkpoint_before_deadline=seconds_of_ms(call.checkpoint_before_deadline_ms),
            tool_budget=call.tool_budget.budget() if call.tool_budget is not None else None,
        )
        seeds: dict[str, Path] = {}
        try:
            from pisub.acceptance.spec import parse

            accept = parse(call.acceptance, call.gate, "the call", resume=call.resume is not None)
            if call.resume is not None:
                if call.context == Context.FORK:
                    raise InvalidInput("resume and context='fork' exclude each other")
                manifest = plan_resume(
                    self.table.home,
                    call.resume,
                    call.task,
                    lineage=lineage,
                    key=call.key,
                    timeout=call.timeout,
                )
                manifest.acceptance = resumed_acceptance(
                    accept,
                    manifest.agent.name,
                    self.catalog(cwd),
                    load_config(self.table.home.root),
                    lineage,
                    self.table.spec.review,
                )
                with_report_section(manifest)
                if manifest.agent.name != call.agent:
                    raise InvalidInput(
                        f"run {call.resume} is a run of agent {manifest.agent.name!r}, not {call.agent!r}"
                    )
            else:
                manifest = plan_run(
                    catalog=self.catalog(cwd),
                    home=self.table.home,
                    agent=call.agent,
                    task=call.task,
                    cwd=cwd,
                    caller=caller,
                    lineage=lineage,
                    key=call.key,
                    model=call.model,
                    run_id=run_id,
                    acceptance=accept,
                    setting=Setting.DYNAMIC if self.table.spec.shape is Shape.WORKFLOW else Setting.DECLARED,
                    backend=call.backend,
                    review=self.table.spec.review,
                )
                if call.context == Context.FORK:
                    seeds["session.jsonl"] = self._fork_source(manifest)
        except PisubError as exc:
            raise type(exc)(f"{where}: {exc.message}") from None
        if run_id is not None:
            manifest.run_id = run_id
        return manifest, seeds

    def catalog(self, cwd: Path) -> Catalog:
        """The agents visible from ``cwd``, read once per batch of calls."""
        from pisub.agents.catalog import discover

        if cwd not in self.catalogs:
            self.catalogs[cwd] = discover(self.table.home.agents, cwd)
        return self.catalogs[cwd]

    def _fork_source(self, manifest: Manifest) -> Path:
        if manifest.agent.runner != "pi":
            raise InvalidInput("context='fork' needs a pi agent")
        if self.table.spec.fork_from is None:
            raise InvalidInput(
                "context='fork' needs a session to fork: start the workflow with --fork-from RUN"
            )
        from pisub.runs.launch import check_session

        return check_session(self.table.spec.fork_from, "--fork-from")

    def place(self, entry: ChildEntry, manifest: Manifest) -> Manifest:
        """In a launch thread: ``manifest`` placed in the child's workspace, made now (see
        :meth:`pisub.worktrees.workspace.Workspace.prepare`).

        Raises:
            InvalidInput, WorktreeError, StorageError: no workspace, so no child.
        """
        from pisub.worktrees.workspace import workspace

        space = workspace(self.isolation(entry.call))
        return space.prepare(self.table.home, manifest, entry.key, self.base_ref(entry.call))
