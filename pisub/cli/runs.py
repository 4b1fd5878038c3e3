"""``pisub run|status|list|logs|wait|result|path``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import typer

from pisub.cli.complete import RUN, agent_names, finite_seconds, run_ids
from pisub.cli.reading import print_fleet as _print_fleet
from pisub.cli.reading import run_named as _run
from pisub.cli.render import (
    err,
    json_line,
    out,
    out_block,
    result_text,
)

JSON = typer.Option(False, "--json", help="Machine-readable output (documented in spec/cli.md).")


def register(app: typer.Typer) -> None:
    for fn in (run, status, list_, fleet, top, logs, wait, result, path, share):
        app.command(fn.__name__.rstrip("_"))(fn)


def run(
    task: str | None = typer.Argument(None, help="What the agent should do (a single run)."),
    agent: str | None = typer.Option(
        None, "--agent", "-a", help="Agent name (a single run).", autocompletion=agent_names
    ),
    workflow: Path | None = typer.Option(
        None, "--workflow", readable=False, help="A workflow script to run: FILE.js or FILE.py."
    ),
    workflow_script: str | None = typer.Option(
        None,
        "--workflow-script",
        help="An inline JavaScript workflow (the seed's statement body); - reads stdin.",
    ),
    parallel: Path | None = typer.Option(
        None, "--parallel", readable=False, help="A JSON tasks file: run them all at once."
    ),
    chain: Path | None = typer.Option(
        None, "--chain", readable=False, help="A JSON tasks file: run them one after the other."
    ),
    lanes: Path | None = typer.Option(
        None, "--lanes", readable=False, help="A JSON lanes file: lanes of ordered stages side by side."
    ),
    tasks: list[str] | None = typer.Option(None, "--task", help="AGENT=TEXT, repeatable: a parallel run."),
    args: list[str] | None = typer.Option(
        None, "--arg", help="KEY=VALUE for the workflow's args (repeatable)."
    ),
    args_json: str | None = typer.Option(
        None, "--args", help="JSON object: the workflow's args (--arg wins over it, key by key)."
    ),
    resource: str | None = typer.Option(
        None, "--resource", help="A named workflow resource: review, run-ci, or one of config.toml's."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Children at once (default 4, max 64)."
    ),
    max_spawns: int | None = typer.Option(
        None, "--max-spawns", help="Run starts per tree of runs, whoever starts them (default 64)."
    ),
    state_ns: str | None = typer.Option(
        None, "--state-ns", help="The workflow state namespace to share (instead of the mission's state)."
    ),
    mission_id: str | None = typer.Option(
        None, "--mission-id", help="Attach the workflow to this mission (its state is the script's state)."
    ),
    mission: str | None = typer.Option(
        None,
        "--mission",
        help='JSON: the workflow\'s new mission {"title"|"summary", "objective", "goal": true, '
        '"budget": {"tokens": N}, "labels": [...]}, or false.',
    ),
    no_mission: bool = typer.Option(
        False, "--no-mission", help="No mission for the workflow (and no state unless --state-ns)."
    ),
    session_key: str | None = typer.Option(
        None, "--session-key", help="The pi session (32 hex digits) that owns the workflow's new mission."
    ),
    fork_from: str | None = typer.Option(
        None, "--fork-from", help="RUN or session file: what a fork copies (a pi run, workflow children)."
    ),
    context: str | None = typer.Option(
        None,
        "--context",
        help="pi: fresh | fork | profile (default: config, then the agent's defaultContext).",
    ),
    parent_session: str | None = typer.Option(
        None, "--parent-session", help="pi: the caller's session, what a preferred fork copies (the pi tool)."
    ),
    session_dir: str | None = typer.Option(  # a str: a Path would take '' for '.'
        None, "--session-dir", help="pi: keep the session file in this directory (0700)."
    ),
    max_output_bytes: int | None = typer.Option(
        None, "--max-output-bytes", help="The result returns at most this much output (200 KiB)."
    ),
    max_output_lines: int | None = typer.Option(
        None, "--max-output-lines", help="The result returns at most this many lines (5000)."
    ),
    no_artifacts: bool = typer.Option(
        False, "--no-artifacts", help="No debugging copies (raw pi events, stderr log)."
    ),
    include_progress: bool = typer.Option(
        False, "--include-progress", help="The result carries the child's progress."
    ),
    isolation: str | None = typer.Option(
        None, "--isolation", help="worktree: the child (every child) in its own git worktree."
    ),
    base_ref: str | None = typer.Option(None, "--base-ref", help="The commit worktrees start from (HEAD)."),
    usage_budget: str | None = typer.Option(
        None, "--usage-budget", help='JSON: {"tokens": {"hard": N, "soft": N}, "costUsd": {...}} (workflows).'
    ),
    cwd: Path | None = typer.Option(None, "--cwd", readable=False, help="Working directory of the child."),
    timeout: float | None = typer.Option(None, "--timeout", help="Runtime limit in seconds."),
    idle_timeout: float | None = typer.Option(None, "--idle-timeout", help="Seconds without output."),
    tool_timeout: float | None = typer.Option(
        None, "--tool-timeout", help="Seconds one tool call of a pi child may take."
    ),
    tool_budget: str | None = typer.Option(
        None, "--tool-budget", help='pi: JSON {"hard": N, "soft": N, "block": ["read", ...]} tool calls.'
    ),
    gate: str | None = typer.Option(None, "--gate", help="A command that must pass on the child's tree."),
    model: str | None = typer.Option(None, "--model", help="pi agents: provider/id instead of the agent's."),
    on_done: str | None = typer.Option(
        None, "--on-done", help="A command run once when the run has ended (no shell; PISUB_RUN_* set)."
    ),
    acceptance: str | None = typer.Option(
        None, "--acceptance", help='JSON: {"level": "verified", "verify": [{"id", "command"}]} or "auto".'
    ),
    checkpoint: float | None = typer.Option(
        None,
        "--checkpoint-before-deadline",
        help="pi: ask for a checkpoint this many seconds before the deadline.",
    ),
    backend: str | None = typer.Option(
        None, "--backend", help="Where the runner lives: local (default) or slurm (a batch job)."
    ),
    label: str | None = typer.Option(
        None, "--label", help="A name for the run: list/status/fleet show it, @LABEL finds it (80 chars)."
    ),
    review: bool | None = typer.Option(
        None,
        "--review/--no-review",
        help="Review each writer's work with a reviewer run (real tokens; default: config, else off).",
    ),
    group: str | None = typer.Option(
        None, "--group", help="Wait in this group for a free slot (pisub group add NAME --limit N)."
    ),
    priority: int | None = typer.Option(
        None, "--priority", help="In its group, higher starts first (default 0)."
    ),
    after: list[str] | None = typer.Option(
        None, "--after", help="RUN that must end complete before this one starts (repeatable)."
    ),
    as_json: bool = JSON,
) -> None:
    """Start a detached run — one agent on TASK, or a workflow (--workflow, --parallel, --chain,
    --lanes, --task) — and print its id once its runner has started."""
    from pisub.api.launch import refusal, start
    from pisub.errors import DepthExceeded

    try:
        handle = start(
            agent,
            task,
            workflow=workflow,
            workflow_script=_script_text(workflow_script),
            tasks=_task_pairs(tasks) if tasks else None,
            parallel=parallel,
            chain=chain,
            lanes=lanes,
            resource=resource,
            args=_merged_args(args_json, args),
            cwd=cwd,
            timeout=timeout,
            idle_timeout=idle_timeout,
            tool_timeout=tool_timeout,
            checkpoint_before_deadline=checkpoint,
            tool_budget=_json_option(tool_budget, "--tool-budget"),
            acceptance=_acceptance_option(acceptance),
            gate=gate,
            model=model,
            concurrency=concurrency,
            max_spawns=max_spawns,
            state_ns=state_ns,
            fork_from=fork_from,
            **_mission_options(mission_id, mission, no_mission, session_key),
            **_single_options(
                context,
                parent_session,
                session_dir,
                max_output_bytes,
                max_output_lines,
                no_artifacts,
                include_progress,
            ),
            isolation=isolation,
            base_ref=base_ref,
            usage_budget=_json_option(usage_budget, "--usage-budget"),
            on_done=on_done,
            backend=backend,
            **_queue_options(group, priority, after),
            label=label,
            review=review,
        )
    except DepthExceeded as exc:
        if as_json:  # the refusal as a result (mode "management") on stdout, the line on stderr
            json_line(refusal(exc))
        raise
    from pisub.api.agents import first_launch_warnings  # the agent's ignored keys, once

    for line in first_launch_warnings(handle):
        err(line)
    from pisub.api.acceptance import launch_lines

    manifest = handle.manifest()
    for line in launch_lines(manifest.acceptance_plan):
        err(line)
    if manifest.workflow is not None and manifest.workflow.mission_warning:
        err(f"pisub: warning: {manifest.workflow.mission_warning}")
    if as_json:
        import msgspec

        st = handle.status()
        plan = msgspec.to_builtins(manifest.acceptance_plan)
        shown: dict[str, object] = {"runId": handle.id, "runDir": str(handle.dir), "state": st.state}
        shown |= {"pid": st.pid, "acceptance": plan, "label": st.label}
        if manifest.workflow is not None:
            shown["missionId"] = st.mission_id
        if st.group is not None:
            shown["group"] = st.group
        json_line(shown)
    else:
        out(handle.id)


def _script_text(given: str | None) -> str | None:
    """``--workflow-script``'s text (``-``: standard input, at most 1 MiB).

    Raises:
        InvalidInput: stdin is not UTF-8 or too large.
    """
    if given != "-":
        return given
    from pisub.errors import InvalidInput
    from pisub.protocol.workflow import MAX_SCRIPT_BYTES

    data = sys.stdin.buffer.read(MAX_SCRIPT_BYTES + 1)
    if len(data) > MAX_SCRIPT_BYTES:
        raise InvalidInput(f"--workflow-script -: stdin holds more than {MAX_SCRIPT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("--workflow-script -: the script on stdin is not UTF-8") from None


def _mission_options(
    mission_id: str | None, mission: str | None, no_mission: bool, session_key: str | None
) -> dict[str, Any]:
    """The mission options as given (those left out stay out): ``--mission`` is a JSON object
    or ``false`` (the same as ``--no-mission``).

    Raises:
        InvalidInput: ``--mission`` with ``--no-mission``, or not JSON (saying where).
    """
    from pisub.errors import InvalidInput

    given: dict[str, Any] = {"mission_id": mission_id, "session_key": session_key}
    if mission is not None and no_mission:
        raise InvalidInput("--mission and --no-mission: give one")
    if no_mission:
        given["mission"] = False
    elif mission is not None:
        import json

        try:
            value = json.loads(mission)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise InvalidInput(f"--mission: not JSON ({exc.msg}, {where})") from None
        except (ValueError, RecursionError):
            raise InvalidInput("--mission: not JSON (or nested too deeply)") from None
        if value is not False and not isinstance(value, dict):
            raise InvalidInput(
                "--mission: give a JSON object {title|summary, objective?, goal?, budget?, labels?} or false"
            )
        _once_each(mission, "--mission")
        given["mission"] = value
    return {name: value for name, value in given.items() if value is not None}


def _queue_options(group: str | None, priority: int | None, after: list[str] | None) -> dict[str, Any]:
    """The queue options as given (those left out stay out)."""
    given: dict[str, Any] = {"group": group, "priority": priority, "after": after or None}
    return {name: value for name, value in given.items() if value is not None}


def _single_options(
    context: str | None,
    parent_session: str | None,
    session_dir: str | None,
    max_bytes: int | None,
    max_lines: int | None,
    no_artifacts: bool,
    include_progress: bool,
) -> dict[str, Any]:
    """A single run's options as given (those left out stay out: a workflow takes none)."""
    given: dict[str, Any] = {
        "context": context,
        "parent_session": parent_session,
        "session_dir": session_dir,
        "max_output_bytes": max_bytes,
        "max_output_lines": max_lines,
        "artifacts": False if no_artifacts else None,
        "include_progress": True if include_progress else None,
    }
    return {name: value for name, value in given.items() if value is not None}


def _task_pairs(tasks: list[str]) -> list[dict[str, Any]]:
    """``--task AGENT=TEXT`` options as tasks keyed ``task-1``, ``task-2``..."""
    from pisub.errors import InvalidInput

    entries: list[dict[str, Any]] = []
    for number, spec in enumerate(tasks, start=1):
        name, sep, text = spec.partition("=")
        if not sep or not name or not text.strip():
            raise InvalidInput(f"--task {spec!r:.60}: give AGENT=TEXT")
        entries.append({"key": f"task-{number}", "agent": name, "task": text})
    return entries


def _acceptance_option(text: str | None) -> Any:
    """``--acceptance``: ``auto`` (bare or as JSON), ``false`` (no acceptance: the seed's
    shorthand that turns the gates off), or a JSON object; ``off``/``none`` are refused with
    that fix."""
    from pisub.errors import InvalidInput

    if text is None or text.strip() in ("auto", '"auto"'):
        return None if text is None else "auto"
    if text.strip() == "false":
        return False
    if text.strip().lower() in ("off", "none", "no", "0"):
        raise InvalidInput(
            f"--acceptance: {text.strip()[:20]!r} is not a value; --acceptance false turns acceptance "
            """off (the task as written), '{"level": "none", "reason": "..."}' says why"""
        )
    return _json_option(text, "--acceptance")


def _json_option(text: str | None, flag: str) -> Any:
    """A JSON flag's value (None when not given).

    Raises:
        InvalidInput: it is not a JSON object.
    """
    if text is None:
        return None
    import json

    from pisub.errors import InvalidInput

    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidInput(f"{flag}: not JSON") from None
    except RecursionError:
        raise InvalidInput(f"{flag}: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{flag}: give a JSON object")
    _once_each(text, flag)
    return value


def _once_each(text: str, flag: str) -> None:
    """Refuse JSON text that gives a key twice in one object (which one was meant?)."""
    from pisub.errors import InvalidInput
    from pisub.protocol.json_words import duplicate_key

    twice = duplicate_key(text)
    if twice is not None:
        raise InvalidInput(f"{flag}: {twice}")


def _merged_args(text: str | None, pairs: list[str] | None) -> dict[str, Any] | None:
    """``--args JSON`` (an object) with ``--arg KEY=VALUE`` over it (None: neither given)."""
    if text is None and not pairs:
        return None
    return {**(_json_option(text, "--args") or {}), **(_args(pairs) if pairs else {})}


def _args(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that is JSON (a number, true, a list...) is taken as such."""
    import json

    from pisub.errors import InvalidInput

    found: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--arg {pair!r:.60}: give a name and a value, name=value")
        try:
            found[key] = json.loads(value)
        except ValueError:
            found[key] = value
    return found


CHILD = typer.Option(None, "--child", metavar="KEY|INDEX", help="A workflow's child (key or index).")


def status(
    ref: str | None = typer.Argument(
        None, metavar="[RUN]", autocompletion=run_ids, help="A run id, a unique prefix (4+) or @LABEL."
    ),
    child: str | None = CHILD,
    view: str = typer.Option("summary", "--view", help="summary | fleet | transcript"),
    lines: int = typer.Option(80, "--lines", help="transcript: how many lines (at most 500)."),
    as_json: bool = JSON,
) -> None:
    """Show where a run is now (after crash detection); a workflow lists its children.
    --view fleet: one line per live child; --view transcript: the tail of the output.
    Without RUN: the most recent runs, newest first."""
    from pisub.cli.reading import status as shown

    shown(ref, child, view, lines, as_json)


def fleet(as_json: bool = JSON) -> None:
    """Every live run and workflow child, one line each."""
    from pisub.api.views import fleet as fleet_rows

    _print_fleet(fleet_rows(), as_json)


def top() -> None:
    """A full-screen live table of runs: arrows/j/k select, enter log, s steer, i interrupt,
    x stop, q quit."""
    from pisub.cli.top import run_top

    run_top()


def list_(
    state: str | None = typer.Option(None, "--state", help="Only runs in this state."),
    all_: bool = typer.Option(False, "--all", help="Include child runs (a workflow's, a run's)."),
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's runs."),
    since: str | None = typer.Option(None, "--since", help="Only runs started in the last 30m, 2h, 3d..."),
    limit: int | None = typer.Option(None, "--limit", min=0, help="Only the newest N."),
    as_json: bool = JSON,
) -> None:
    """List the top-level runs (with --all, every run), oldest first."""
    from pisub.cli.reading import listed

    listed(state, all_, agent, since, limit, as_json)


def logs(
    ref: str = RUN,
    child: str | None = CHILD,
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Keep printing until the run ends (exit 1 with status's error line if its runner died).",
    ),
    tail: int | None = typer.Option(
        None, "--tail", "-n", min=0, help="Only the last N lines (then, with -f, what comes)."
    ),
    stderr: bool = typer.Option(False, "--stderr", help="The child's standard error (stderr-N.log)."),
    raw: bool = typer.Option(
        False, "--raw", help="The log's bytes exactly as written (escape sequences included)."
    ),
) -> None:
    """Print a child's output log (a workflow's child: --child KEY|INDEX; a workflow without
    --child: every child's lines, prefixed [key]). Control characters, escape sequences, bidi
    controls and bytes that are not UTF-8 are shown escaped (\\x1b, \\u202e, \\udcff) unless
    --raw."""
    from pisub.api.views import log_bytes, workflow_log_lines
    from pisub.errors import InvalidInput

    handle = _run(ref, child)
    if handle.manifest().workflow is not None:
        if stderr:
            raise InvalidInput(
                f"run {handle.id} is a workflow: each child has its own stderr log; "
                "name one with --child KEY|INDEX"
            )
        for line in workflow_log_lines(handle, follow=follow, tail=tail):
            if raw:
                sys.stdout.buffer.write(line.encode("utf-8", "surrogateescape") + b"\n")
            else:
                out_block(line)  # one line of the log (a tab stays, as in `logs`)
            if follow:
                sys.stdout.flush()
        sys.stdout.flush()
    else:
        sink = _LogSink(raw)
        for chunk in log_bytes(handle, follow=follow, tail=tail, stderr=stderr):
            sink.write(chunk)
            if follow:
                sys.stdout.flush()
        sink.close()
    if follow:
        _ended_by_a_dead_runner(handle)


def _ended_by_a_dead_runner(handle: Any) -> None:
    """``logs -f`` followed a run until it ended: when it ended because its runner died (a
    reader repaired it ``failed``), the log may stop short of what its child did — a dead
    coordinator's children even go on — so the follow ends with what ``status`` says of it,
    one line, exit 1."""
    status = handle.status()
    if status.repaired is None or status.state != "failed" or status.error is None:
        return
    err(f"pisub: run {handle.id} failed: {status.error.message} [{status.error.code}]")
    raise typer.Exit(1)


class _LogSink:
    """Where ``logs`` writes a log's bytes: as they are (``--raw``), or through the one
    terminal filter (:mod:`pisub.termsafe`)."""

    def __init__(self, raw: bool) -> None:
        from pisub.termsafe import PrintableStream

        self.stream = None if raw else PrintableStream()

    def write(self, chunk: bytes, *, final: bool = False) -> None:
        if self.stream is None:
            sys.stdout.buffer.write(chunk)
        else:
            sys.stdout.buffer.write(self.stream.feed(chunk, final=final).encode("utf-8"))

    def close(self) -> None:
        self.write(b"", final=True)
        sys.stdout.flush()


def wait(
    refs: list[str] = typer.Argument(..., metavar="RUN...", autocompletion=run_ids),
    child: str | None = CHILD,
    any_: bool = typer.Option(False, "--any", help="Several runs: return when the first one ends."),
    all_: bool = typer.Option(
        False, "--all", help="Several runs: return when every one has ended (the default)."
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", min=0, callback=finite_seconds, help="Give up after this many seconds (exit 3)."
    ),
    as_json: bool = JSON,
) -> None:
    """Wait for a run to end and print its result; exit 0 only for a complete run.

    Several runs: wait for every one (or with --any, the first to end) and print one line per
    ended run (run id, state); exit 0 when every run printed is complete, 1 otherwise."""
    from pisub.errors import InvalidInput, WaitTimeout

    if any_ and all_:
        raise InvalidInput("give --any or --all, not both")
    if len(refs) > 1 or any_ or all_:
        if child is not None:
            raise InvalidInput("--child names one run's child: wait for one run")
        _wait_many(refs, every=not any_, timeout=timeout, as_json=as_json)
    handle = _run(refs[0], child)
    try:
        res = handle.wait(timeout)
    except WaitTimeout as exc:
        err(f"pisub: {exc.message} [{exc.code}]")
        raise typer.Exit(3) from None
    json_line(res) if as_json else out_block(result_text(res))
    raise typer.Exit(0 if res.state == "complete" else 1)


def _wait_many(refs: list[str], *, every: bool, timeout: float | None, as_json: bool) -> NoReturn:
    from pisub.api.client import Run, wait_runs
    from pisub.cli.progress import progress
    from pisub.errors import WaitTimeout

    runs = [Run(ref) for ref in dict.fromkeys(refs)]
    try:
        with progress() as update:
            shown = None if update is None or not every else lambda n, total: update("runs ended", n, total)
            ended = wait_runs(runs, every=every, timeout=timeout, progress=shown)
    except WaitTimeout as exc:
        err(f"pisub: {exc.message} [{exc.code}]")
        raise typer.Exit(3) from None
    states = [(run.id, run.status().state.value) for run in ended]
    for run_id, state in states:
        json_line({"runId": run_id, "state": state}) if as_json else out(f"{run_id}  {state}")
    raise typer.Exit(0 if all(state == "complete" for _, state in states) else 1)


def result(
    ref: str = RUN,
    child: str | None = CHILD,
    as_json: bool = JSON,
) -> None:
    """Print a finished run's result."""
    from pisub.errors import InvalidInput

    handle = _run(ref, child)
    handle.status()  # crash repair may write the result
    res = handle.result()
    if res is None:
        raise InvalidInput(f"run {handle.id} has no result yet (it is still running)")
    json_line(res) if as_json else out_block(result_text(res))


def path(ref: str = RUN) -> None:
    """Print the run directory."""
    from pisub.api.client import Run

    out(str(Run(ref).dir))


def share(
    ref: str = RUN,
    out_file: Path | None = typer.Option(
        None, "--out", readable=False, help="Where to write the HTML (default: <run dir>/share.html)."
    ),
    as_json: bool = JSON,
) -> None:
    """Export a pi run's session as HTML, the way `pi --export` does, and print the file's path."""
    from pisub.api.share import share as export

    shared = export(ref, out_file)
    json_line(shared) if as_json else out(shared.path)
