// pisub's `subagent` tool for pi: every call becomes one `pisub ... --json` command (argv, never a
// shell), and its answer the tool result `{content: [{type: "text", text}], details: {mode, runId?,
// results: [], error?: {code, message}}}`. The extension keeps no state of its own beyond a notice
// ledger in the pisub home: a reloaded pi, or a second pi on the same session, sees the same runs.
//
// Completion notices: a background run started from this session is recorded in
// <home>/notices/<session key>/<run id>.json; once its status is terminal, the first pi instance
// that creates <run id>.sent (O_EXCL) sends the parent session one message (and starts a turn when
// the session is idle). Exactly one notice per run and session, across restarts.
//
// The pisub command: PISUB_ARGV (a JSON array, e.g. ["/usr/bin/python3", "-m", "pisub"]), else
// the PISUB_ARGV_DEFAULT below (written by `pisub pi-extension install`), else ["pisub"].
import { spawn } from "node:child_process";
import * as crypto from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

const PISUB_ARGV_DEFAULT: string[] | null = null; // replaced by `pisub pi-extension install`
const POLL_MS = 1000;
const REPAIR_EVERY = 10; // polls between `pisub status` calls (a reader repairs a dead runner)
const TERMINAL = new Set(["complete", "failed", "stopped", "paused"]);
const HEAD_CHARS = 600;

const ACTIONS = [
  "run",
  "status",
  "wait",
  "steer",
  "follow_up",
  "interrupt",
  "stop",
  "resume",
  "list",
  "get",
  "doctor",
  "children.list",
  "validate",
  "guide",
  "fleet",
  "models",
  "create",
  "update",
  "delete",
  "eject",
  "disable",
  "enable",
  "reset",
  "refine",
  "refine.show",
  "refine.rollback",
  "lane.status",
  "lane.recordMerge",
  "lane.recordSupersession",
  "worktree.cleanup",
  "worktree.discard",
  "schedule.create",
  "schedule.list",
  "schedule.show",
  "schedule.history",
  "schedule.pause",
  "schedule.resume",
  "schedule.run",
  "schedule.run-due",
  "schedule.delete",
  "mission.create",
  "mission.list",
  "mission.show",
  "mission.update",
  "mission.resolve-decision",
  "mission.attach-run",
  "mission.close",
];
const AGENT_EDITS = new Set(["update", "delete", "eject", "disable", "enable", "reset"]);
const REFINES = new Set(["refine", "refine.show", "refine.rollback"]);

// The seed's actions pisub answers with a stable code instead of running anything: a later pisub
// issue builds them (NOT_AVAILABLE_YET, naming the topic), or they cannot exist here
// (UNSUPPORTED_HERE, one line why).
const INSPECTOR = ["command", "open", "status", "close"].map((a) => `inspector.${a}`);
const PROJECT = ["open", "status", "close"].map((a) => `project.${a}`);
const WATCHDOG = ["configure", "status"].map((a) => `watchdog.${a}`);
const ANSWERED_ACTIONS = [...INSPECTOR, ...PROJECT, ...WATCHDOG];
const NO_PANES =
  "pisub opens no Herdr/inspector panes: its runs are detached processes, followed with " +
  'action "status" (view "fleet" or "transcript") or `pisub top` in a terminal';

const str = (description: string) => ({ type: "string", description });
const num = (description: string) => ({ type: "number", description });
const bool = (description: string) => ({ type: "boolean", description });
const obj = (description: string) => ({ type: "object", description });
// An enum is checked by checkParams (ENUMS), not put in the schema: pi's own validation would
// echo the value a model sent.
const oneOf = (values: string[], description: string) => ({ type: "string", description, "x-enum": values });
const any = (description: string) => ({ description });
const later = (topic: string) => `Not available yet in pisub (${topic}): answered NOT_AVAILABLE_YET.`;

// Every parameter the seed's tool reference documents, under its name and shape, plus pisub's own
// (lanes, path, parent, reason, childId, forkFrom). No `additionalProperties: false`: pi's own
// validation would echo an unknown key raw (an escape sequence in a key reached the terminal);
// checkParams refuses unknown keys, escaped.
export const PARAMETERS = {
  type: "object",
  properties: {
    action: str(`One of: ${ACTIONS.join(", ")}. Omit it to start a run (agent + task).`),
    agent: str("The agent to run (action list shows them), or the agent an agent action is about."),
    task: str("What the agent should do."),
    async: bool("false: wait for the run and return its result (default: background)."),
    id: str(
      "A run id or a unique prefix (status, wait, steer, interrupt, stop, resume, get, worktree.discard); a schedule's " +
        "id (schedule.*; schedule.create: the id to give it); a decision's id (mission.resolve-decision).",
    ),
    childId: str("A workflow child's key or index (status, steer, interrupt, stop, get)."),
    index: num("A child's index (status, steer, resume, interrupt, stop); the same as childId."),
    message: str("The message of a steer, follow_up or resume."),
    mode: oneOf(["steer", "follow_up", "auto", "plan", "apply"], "steer: steer | follow_up | auto; worktree.cleanup: plan (default) | apply."),
    steeringRecovery: bool("steer: false never pauses and revives a run that misses the acknowledgement."),
    model: str("pi agents: provider/id (a :thinking suffix sets the thinking level)."),
    thinking: str("Only for watchdog.configure in the seed; ignored when a run starts."),
    cwd: str("The working directory."),
    timeoutMs: num("The run's maximum runtime in milliseconds (wait: how long to wait; the run goes on after)."),
    maxRuntimeMs: num("The same as timeoutMs (give one, or both equal)."),
    toolTimeoutMs: num("Milliseconds one tool call may take."),
    checkpointBeforeDeadlineMs: num("A single agent's run: ask it to checkpoint and stop this many ms before its deadline."),
    acceptance: any('"auto", false, or {level, verify?, review?, ...} (see guide acceptance).'),
    gate: str("A command that must pass on the child's tree (not with acceptance, but false)."),
    toolBudget: obj("{hard, soft?, block?}"),
    usageBudget: obj("Workflows: {tokens?: {soft?, hard}, costUsd?: {soft?, hard}}."),
    context: oneOf(["fresh", "fork", "profile"], "fresh, fork (this session's transcript) or profile (the agent's defaultContext)."),
    forkFrom: str("context fork: the run id or session file to fork instead of this session."),
    isolation: oneOf(["none", "worktree"], "worktree: the run (every workflow child) in its own git worktree."),
    worktree: bool("true: the same as isolation worktree."),
    baseRef: str("isolation worktree: HEAD (default) or a named ref (refs/heads/x, refs/tags/v1, origin/main); no commit ids, no HEAD~1."),
    maxOutput: obj("{bytes?, lines?}: the result's output is cut to these (default 200 KB, 5000 lines)."),
    artifacts: bool("false: no debug artifacts (default true)."),
    includeProgress: bool("true: the result carries the run's progress."),
    sessionDir: str("Where pi's session file of the run is kept."),
    share: bool("true: export the run's session to an HTML file when it ends (no gist upload here)."),
    chatProgress: oneOf(["auto", "off", "live-card"], "auto | off; live-card needs async false."),
    workflowScript: str(
      "A JavaScript workflow: a statement body run as one async function, with runs.run(key, {agent, task, ...}), " +
        "runs.all([{key, agent, task}, ...]) (an ordered array), runs.lanes, runs.steer, emit, console, args. E.g. " +
        "`const results = await runs.all([{ key: \"a\", agent: \"scout\", task: \"...\" }]); return results.map(r => r.output)`. " +
        "Await (or return, or Promise.all/race) every call; no nested async functions; no timers, require, fetch or files. " +
        "A detached, resumable run; action validate checks it first.",
    ),
    workflowScriptPath: str(
      "A workflow script file (relative to cwd): .js (the same JavaScript statement body as workflowScript) or .py " +
        "(Python: async def main(runs, state, args)). Not with workflowScript.",
    ),
    workflow: str(
      "A named workflow resource with args: review {task} or run-ci {command?, timeoutMs?} (or one registered in " +
        "pisub's config). Not with agent, task, workflowScript or workflowScriptPath.",
    ),
    args: obj("workflow: the resource's args; workflowScript / workflowScriptPath: the script's args {key: value}."),
    lanes: str("Start the lanes manifest at this path."),
    view: oneOf(["summary", "fleet", "transcript"], "status: summary | fleet | transcript."),
    lines: num("status view transcript: lines (default 80, at most 500)."),
    reason: str("interrupt / stop: why."),
    topic: str("guide: the topic (action guide lists them)."),
    path: str("validate: the workflow script file to check (the same as workflowScriptPath)."),
    parent: str("children.list: the workflow run."),
    capabilities: bool("list: one compact line per agent with what it can do."),
    agentScope: oneOf(["user", "project", "both"], "Agent discovery scope (default both; project wins)."),
    config: any("create / update / refine: frontmatter keys (camelCase), systemPrompt, scope (create); false or \"\" clears a key."),
    laneId: str("lane.*: the lane's run id (a workflow run)."),
    handoffPath: str("lane.*, worktree.cleanup: the lane's hand-off file (<run dir>/handoff.json)."),
    merge: obj("lane.recordMerge: {prNumber, reviewedHead, mergeCommit, treeEquivalent, postMergeChecks, attestedBy, attestedAt}."),
    supersession: obj("lane.recordSupersession: {supersededBy, attestedBy, attestedAt}."),
    repo: str("worktree.cleanup: only the worktrees of this repository."),
    planId: str("Reserved by the seed for a future worktree.cleanup apply; refused."),
    missionId: str(
      "A mission's id: a workflow start attaches to it (and shares its state); mission.show / update / " +
        "resolve-decision / attach-run / close name it.",
    ),
    mission: any(
      "A workflow start or mission.create: {title | summary (exactly one), objective?, goal?: true, budget?: {tokens}, " +
        "labels?: [..]}; goal: true needs budget.tokens and brings continuation notices. false (a start): no mission " +
        "and no state for this workflow (every workflow gets a default mission otherwise).",
    ),
    missionUpdate: obj(
      "mission.update: {title?, objective?, status?, labels?, decisions?: [{title, ...}], artifacts?: [{kind, path}], " +
        "receipts?: [{kind, status, title, url}]} (see guide missions).",
    ),
    missionStatus: str("mission.close: completed (default), failed or cancelled."),
    missionScope: oneOf(["project", "global"], "mission.list: project (default: this repository's) or global."),
    runId: str("mission.attach-run: the run to link (a run id)."),
    runMode: str("mission.attach-run: how the run relates (workflow or run)."),
    summary: str("mission.resolve-decision: the resolution (required); mission.close: a closing summary."),
    every: str(
      "schedule.create: fire every N minutes/hours/days/weeks (30m, 6h, 2d, 2w; the first fire one interval from " +
        "now). Not with at.",
    ),
    at: str("schedule.create: fire once, after a delay (+10m, +2h) or at an ISO time with a zone. Not with every."),
    name: str("schedule.create: the schedule's name (shown in its notices)."),
    catchUp: oneOf(["latest", "none"], "schedule.create: missed slots: latest (default: fire the newest once) or none."),
    overlap: oneOf(["skip"], "schedule.create: skip (the only policy: a slot while the last fire runs is skipped)."),
    sessionOnly: bool("schedule.create: true: fires only while this pi session is open (else project-wide)."),
    quiet: bool(
      "schedule.create with every: a successful automatic fire notifies without starting a turn (failures, stops and " +
        "pauses still do); schedule.run: this manual fire is quiet.",
    ),
    cron: str(later("calendar schedules (cron); the seed defers them: use every")),
    on: any(later("calendar schedules (on); the seed defers them: use every")),
    timezone: str(later("calendar schedules (timezone); the seed defers them: use every or at with a zone")),
    focus: bool(`inspector.open / project.open: ${NO_PANES}.`),
    machine: str("Herdr saved machines do not exist in pisub: answered UNSUPPORTED_HERE."),
    output: str(later("output files of a run the tool starts; a workflow child's runs.run(output=) has them")),
    outputMode: oneOf(["inline", "file-only"], later("output modes of a run the tool starts")),
    outputSchema: any(later("structured output")),
    agentContract: obj(later("agent contracts")),
  },
};

type Result = { content: { type: "text"; text: string }[]; details: any; isError?: boolean };

// Text a child, a model, a task or a workflow script produced reaches pi's terminal (the TUI
// shows tool results and notices) only through this: C0 controls (but newline and tab, unless
// oneLine; a CRLF is a newline), DEL, C1 controls (0x80-0x9F: 8-bit CSI, OSC, DCS...), the bidi controls and line
// separators, and lone surrogates become visible escapes (\x1b, \u202e); an escape sequence
// loses its introducer, so nothing in it is obeyed. The same set as pisub's Python side
// (pisub/termsafe.py, printable).
const UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]/gu;
const UNSAFE_AND_LINES = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]/gu;

export function termSafe(text: unknown, oneLine = false): string {
  const s = typeof text === "string" ? text : String(text);
  return (oneLine ? s : s.replace(/\r\n/g, "\n")).replace(oneLine ? UNSAFE_AND_LINES : UNSAFE, (c) => {
    const code = c.charCodeAt(0);
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
  });
}

function pisubArgv(): string[] {
  const raw = process.env.PISUB_ARGV;
  if (raw) {
    try {
      const parsed = JSON.parse(raw);
      if (Array.isArray(parsed) && parsed.length > 0 && parsed.every((p) => typeof p === "string")) return parsed;
    } catch {
      // fall through
    }
  }
  return PISUB_ARGV_DEFAULT ?? ["pisub"];
}

function answer(text: string, details: any): Result {
  return { content: [{ type: "text", text: termSafe(text) }], details };
}

function failure(code: string, message: string): Result {
  message = termSafe(message, true);
  const result = answer(`${code}: ${message}`, { mode: "management", results: [], error: { code, message } });
  return { ...result, isError: true };
}

// `pisub: message [CODE]` (the CLI's one error line) as {code, message}.
function cliError(stderr: string, code: number): { code: string; message: string } {
  const line = stderr.trim().split("\n").pop() ?? "";
  const m = /^pisub: (.*) \[([A-Z_]+)\]$/.exec(line);
  if (m) return { code: m[2], message: m[1] };
  if (code === 2 || /^(Error|Usage):/.test(line)) return { code: "INVALID_INPUT", message: line || "bad arguments" };
  return { code: "SUBAGENT_FAILED", message: line || `pisub exited with code ${code}` };
}

function seconds(ms: unknown): string | null {
  return typeof ms === "number" && ms > 0 ? String(ms / 1000) : null;
}

function json(value: unknown): string | null {
  if (value === undefined || value === null) return null;
  return typeof value === "string" ? value : JSON.stringify(value);
}

// `--name=value`: one argv word, so a value that starts with a dash is never read as an option.
function flag(argv: string[], name: string, value: string | null | undefined): void {
  if (value !== null && value !== undefined && value !== "") argv.push(`${name}=${value}`);
}

// The known action one typo away (one letter added, dropped, changed, or two neighbours
// swapped: Damerau-Levenshtein distance 1), never executed.
function distance(a: string, b: string): number {
  const d: number[][] = [];
  for (let i = 0; i <= a.length; i++) {
    d.push([i]);
    for (let j = 1; j <= b.length; j++) d[i].push(i === 0 ? j : 0);
  }
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.length][b.length];
}

function near(action: string): string | null {
  if (action.length > 64) return null;
  const close = [...ACTIONS, ...ANSWERED_ACTIONS].filter((known) => distance(known, action) === 1);
  return close.length === 1 ? close[0] : null;
}

const ID = /^[0-9a-fA-F][0-9a-fA-F-]{0,63}$/;
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const DISPLAY_NAME = /^[A-Za-z0-9][A-Za-z0-9 ._-]{0,127}$/;
const CHILD = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const FULL_COMMIT = /^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$/;

// Checked values for the argv: a run id (or prefix) and an agent name have their own shapes,
// so nothing the model sends can be taken for an option; positionals also follow a `--`.
function bad(what: string, value: unknown): Result {
  return failure("INVALID_INPUT", `${what}: ${JSON.stringify(String(value)).slice(0, 80)} is not valid`);
}

function invalid(message: string): Result {
  return failure("INVALID_INPUT", message);
}

// A seed parameter or action a later pisub issue builds: nothing runs.
function notYet(topic: string, hint = ""): Result {
  return failure("NOT_AVAILABLE_YET", `not available yet: ${topic} (a later pisub issue builds it)${hint ? "; " + hint : ""}`);
}

// A seed parameter or action that cannot exist in pisub: nothing runs.
function unsupported(why: string): Result {
  return failure("UNSUPPORTED_HERE", why);
}

const MAX_ARG_BYTES = 100_000; // one argv string (Linux takes at most 128 KiB)

function kindOf(value: unknown): string {
  return Array.isArray(value) ? "array" : value === null ? "null" : typeof value;
}

function shown(value: unknown): string {
  return JSON.stringify(typeof value === "string" ? value : String(value)).slice(0, 80);
}

// The parameters whose shape is more than one JSON type (the schema leaves their type open).
const UNION: Record<string, (value: unknown) => string | null> = {
  config: (v) => (kindOf(v) === "object" || typeof v === "string" ? null : "expected an object or a string"),
  mission: (v) => (kindOf(v) === "object" || v === false ? null : "expected an object or false"),
  on: (v) => (typeof v === "string" || Number.isSafeInteger(v) ? null : "expected a string or a whole number"),
  acceptance: (v) => (["object", "string", "boolean"].includes(kindOf(v)) ? null : "expected an object, a string or false"),
  outputSchema: (v) => (kindOf(v) === "object" ? null : "expected an object"),
};
const POSITIVE = ["timeoutMs", "maxRuntimeMs", "toolTimeoutMs", "checkpointBeforeDeadlineMs", "lines"];
const WHOLE = ["index", "lines"];
const MAX_MS = 2 ** 31 - 1; // a limit in milliseconds (the protocol's bound for ms limits)

// Every parameter of the type PARAMETERS gives it (pi may pass what a model sent as is): a
// number where a string belongs, an array, an object, null, a string too long for an argv or
// holding a NUL, a value outside the seed's enum, a key the schema does not name: one
// INVALID_INPUT line naming the field, never a crash or a mangled argv.
export function checkParams(p: unknown): Result | null {
  if (p === null || typeof p !== "object" || Array.isArray(p)) {
    return invalid("the tool's arguments must be an object");
  }
  const props: Record<string, any> = PARAMETERS.properties;
  for (const [key, value] of Object.entries(p as Record<string, unknown>)) {
    const schema = props[key];
    if (!schema || !Object.hasOwn(props, key)) return invalid(`unknown parameter ${JSON.stringify(key.slice(0, 64))}`);
    if (value === undefined) continue;
    const kind = kindOf(value);
    const wanted = schema.type as string | undefined;
    if (wanted && kind !== wanted) return invalid(`${key}: expected a ${wanted}, got ${kind}`);
    const union = UNION[key]?.(value);
    if (union) return invalid(`${key}: ${union}, got ${kind}`);
    if (kind === "number" && !Number.isFinite(value as number)) return invalid(`${key}: expected a finite number`);
    if (kind === "number" && POSITIVE.includes(key) && (value as number) <= 0) return invalid(`${key}: expected a positive number`);
    if (kind === "number" && key.endsWith("Ms") && (value as number) > MAX_MS) {
      return invalid(`${key}: at most ${MAX_MS} ms (about 24 days)`);
    }
    if (kind === "number" && WHOLE.includes(key) && (!Number.isSafeInteger(value) || (value as number) < 0)) {
      return invalid(`${key}: expected a whole number (0 or more)`);
    }
    if (kind === "string" && (value as string).includes("\u0000")) return invalid(`${key}: contains a NUL character`);
    const values: string[] | undefined = schema["x-enum"];
    if (values && !values.includes(value as string)) return invalid(`${key}: ${shown(value)} is not one of ${values.join(", ")}`);
    const size = Buffer.byteLength(typeof value === "string" ? value : JSON.stringify(value) ?? "");
    if (size > MAX_ARG_BYTES) {
      return invalid(`${key}: ${size} bytes; at most ${MAX_ARG_BYTES} (put a long text in a file)`);
    }
  }
  return null;
}

// An object parameter's fields: every key known, each of its kind; the first problem with the
// field's path (`merge.prNumber: ...`).
type Field = { kind: "string" | "number" | "boolean"; required?: boolean; test?: (v: any) => boolean; what?: string };

function checkObject(name: string, value: any, fields: Record<string, Field>): Result | null {
  for (const key of Object.keys(value)) {
    if (!Object.hasOwn(fields, key)) {
      return invalid(`${name}.${JSON.stringify(key.slice(0, 64))}: unknown field (known: ${Object.keys(fields).join(", ")})`);
    }
  }
  for (const [key, field] of Object.entries(fields)) {
    const v = value[key];
    if (v === undefined) {
      if (field.required) return invalid(`${name}.${key}: missing`);
      continue;
    }
    if (kindOf(v) !== field.kind) return invalid(`${name}.${key}: expected a ${field.kind}, got ${kindOf(v)}`);
    if (typeof v === "string" && (v.includes("\u0000") || v.length > 1024)) return invalid(`${name}.${key}: ${shown(v)} is not valid`);
    if (field.test && !field.test(v)) return invalid(`${name}.${key}: ${shown(v)} is not ${field.what}`);
  }
  return null;
}

const whole = (v: number) => Number.isInteger(v) && v >= 1 && v <= 2 ** 31;
const named = (v: string) => v.trim().length >= 1 && v.length <= 128;
const isoTime = (v: string) => /^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)$/.test(v) && !Number.isNaN(Date.parse(v));
const ATTESTED: Record<string, Field> = {
  attestedBy: { kind: "string", required: true, test: named, what: "1 to 128 characters" },
  attestedAt: { kind: "string", required: true, test: isoTime, what: "an ISO 8601 time with a zone" },
};
const MERGE: Record<string, Field> = {
  prNumber: { kind: "number", required: true, test: whole, what: "a positive whole number" },
  reviewedHead: { kind: "string", required: true, test: (v) => FULL_COMMIT.test(v), what: "a full commit id (40 or 64 hex digits)" },
  mergeCommit: { kind: "string", required: true, test: (v) => FULL_COMMIT.test(v), what: "a full commit id (40 or 64 hex digits)" },
  treeEquivalent: { kind: "boolean", required: true },
  postMergeChecks: { kind: "string", required: true, test: (v) => ["recorded", "skipped", "failed"].includes(v), what: "recorded, skipped or failed" },
  ...ATTESTED,
};
const SUPERSESSION: Record<string, Field> = {
  supersededBy: { kind: "string", required: true, test: (v) => ID.test(v), what: "a lane's run id" },
  ...ATTESTED,
};
const MAX_OUTPUT: Record<string, Field> = {
  bytes: { kind: "number", test: whole, what: "a positive whole number" },
  lines: { kind: "number", test: whole, what: "a positive whole number" },
};

// The seed's ref rule for baseRef: HEAD or a named ref (refs/heads/x, refs/tags/v1, origin/main,
// a branch); never a commit id or a revision expression (HEAD~1, a^, a..b, @{1}, :path).
export function refProblem(ref: string): string | null {
  if (ref === "HEAD") return null;
  if (FULL_COMMIT.test(ref)) return "a commit id; give HEAD or a named ref (a branch or tag)";
  if (/[~^:?*[\\\s]|@\{|\.\.|^@$/.test(ref) || /[\u0000-\u001f\u007f]/.test(ref)) {
    return "a revision expression; give HEAD or a named ref (refs/heads/x, refs/tags/v1, origin/main)";
  }
  const parts = ref.split("/");
  if (ref.startsWith("-") || ref.length > 255 || parts.some((c) => !c || c.startsWith(".") || c.endsWith(".lock")) || ref.endsWith(".")) {
    return "not a valid ref name";
  }
  return null;
}

// Parameters that mean something for only some actions: given elsewhere, they are refused
// rather than silently dropped.
const ONLY_FOR: Record<string, string[]> = {
  laneId: ["lane.status", "lane.recordMerge", "lane.recordSupersession", "worktree.cleanup"],
  handoffPath: ["lane.status", "lane.recordMerge", "lane.recordSupersession", "worktree.cleanup"],
  merge: ["lane.recordMerge"],
  supersession: ["lane.recordSupersession"],
  repo: ["worktree.cleanup"],
  capabilities: ["list"],
  view: ["status"],
  lines: ["status"],
  steeringRecovery: ["steer"],
  mode: ["steer", "worktree.cleanup"],
  share: ["run", "resume"],
  args: ["run", "schedule.create"],
  forkFrom: ["run"],
  // how a run starts: a resume, a status or a management action would drop them
  isolation: ["run"],
  worktree: ["run"],
  baseRef: ["run", "schedule.create"],
  maxOutput: ["run"],
  artifacts: ["run"],
  includeProgress: ["run"],
  sessionDir: ["run"],
  context: ["run"],
  checkpointBeforeDeadlineMs: ["run"],
  toolTimeoutMs: ["run"],
  toolBudget: ["run"],
  gate: ["run"],
  usageBudget: ["run"],
  topic: ["guide"],
  every: ["schedule.create"],
  at: ["schedule.create"],
  name: ["schedule.create"],
  catchUp: ["schedule.create"],
  overlap: ["schedule.create"],
  sessionOnly: ["schedule.create"],
  quiet: ["schedule.create", "schedule.run"],
  missionId: ["run", "mission.show", "mission.update", "mission.resolve-decision", "mission.attach-run", "mission.close"],
  mission: ["run", "mission.create"],
  missionUpdate: ["mission.update"],
  missionStatus: ["mission.close"],
  missionScope: ["mission.list"],
  runId: ["mission.attach-run"],
  runMode: ["mission.attach-run"],
  summary: ["mission.resolve-decision", "mission.close"],
};

function subagentsDisabled(): boolean {
  const v = (process.env.PISUB_SUBAGENTS_DISABLED ?? "").trim().toLowerCase();
  return v !== "" && !["0", "false", "no", "off"].includes(v);
}

function disabled(): Result {
  return failure("SUBAGENTS_DISABLED", "sub-agents are turned off here (PISUB_SUBAGENTS_DISABLED is set): do the work yourself");
}

// What a call's session adds: its session file (the source of context "fork") and its key (the
// owner of what the call creates: a schedule's notices, a mission's goal notices).
export type PlanContext = { sessionFile?: string | null; sessionKey?: string | null };

// What the action of a call is: `action`, else a start (agent + task, a workflow, lanes).
function actionOf(p: any): string {
  if (p.action !== undefined) return p.action;
  const starts = [p.workflowScript, p.workflowScriptPath, p.workflow, p.lanes, p.agent, p.task].some((v) => v !== undefined);
  return starts ? "run" : "";
}

// The seed's messages for its workflow inputs (workflowScript, workflowScriptPath, workflow + args).
const NO_WORKFLOW =
  "Execution requires either { agent, task? } for one child, a named workflow resource, or a non-empty workflowScript or workflowScriptPath for orchestration.";
const NO_VALIDATE_INPUT = "validate requires a non-empty workflowScript or workflowScriptPath.";

// The seed's rules between the workflow inputs and the rest of a call, in its words.
function workflowRules(p: any): Result | null {
  const script = p.workflowScript !== undefined || p.workflowScriptPath !== undefined;
  if (p.workflowScript !== undefined && p.workflowScriptPath !== undefined) {
    return invalid("workflowScript and workflowScriptPath are mutually exclusive: give one");
  }
  if (p.workflow !== undefined) {
    if (!p.workflow.trim()) return invalid("workflow must be a non-empty named workflow resource.");
    if (script) return invalid("workflow is mutually exclusive with workflowScript and workflowScriptPath.");
    if (p.action === "schedule.create") {
      return invalid("schedule.create takes workflowScript or workflowScriptPath; a named workflow resource is not scheduled");
    }
    if (p.action !== undefined) return invalid("Named workflow resource execution must omit action.");
    if (!NAME.test(p.workflow)) return bad("workflow (a resource's name)", p.workflow);
  } else if (p.args !== undefined && !script) {
    return invalid("args requires a named workflow resource (workflow), or a workflow script (workflowScript / workflowScriptPath).");
  }
  if (!script && p.workflow === undefined) return null;
  if (p.lanes !== undefined) return invalid("lanes is a workflow of its own: give lanes or a workflow script or resource, not both");
  if (p.action === "validate" || p.action === "schedule.create") return null;
  if (p.action !== undefined) {
    return invalid("Workflow execution must omit action; only validate and schedule.create accept action with workflowScript or workflowScriptPath.");
  }
  if (p.agent !== undefined || p.task !== undefined) {
    return invalid("Structured single-child execution cannot be combined with workflow, workflowScript, or workflowScriptPath.");
  }
  return null;
}

// ---- Schedules (spec/pi-extension.md "Schedules and missions"): `pisub schedule ...`.
export const SCHEDULE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/; // the seed's schedule ids
const MISSION_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const EVERY = /^[1-9][0-9]{0,8}[mhdw]$/;
const AT_DELAY = /^\+[1-9][0-9]{0,8}[smhd]$/;
const CALENDAR = /^(?:day|daily|week|weekly|month|monthly|year|yearly|hour|hourly)$/i;
const CALENDAR_HINT =
  "the seed defers calendar selectors: use every (30m, 6h, 2d, 2w) or at (+10m, or an ISO time with a zone)";
const MISSION_FIELDS = ["missionId", "mission", "missionUpdate", "missionStatus", "missionScope"];

// The seed's rules for schedule.create, in its order: a workflow (never agent/task), no mission
// fields, exactly one trigger, quiet only for an interval, always in the background.
function scheduleRules(p: any): Result | null {
  if (p.agent !== undefined || p.task !== undefined) {
    return invalid(
      "schedule.create takes a workflow (workflowScript or workflowScriptPath), not agent/task: wrap the run, e.g. " +
        "workflowScript: \"return runs.run('main', {agent: 'scout', task: '...'})\"",
    );
  }
  const mission = MISSION_FIELDS.find((k) => p[k] !== undefined);
  if (mission) {
    return invalid(`${mission}: schedule.create takes no mission fields (a fire runs without a mission; the seed defers mission attachment for schedules)`);
  }
  if (p.async === false) return invalid("async: schedule.create's fires always run in the background (async false is refused)");
  if (p.workflowScript === undefined && p.workflowScriptPath === undefined) {
    return invalid("schedule.create needs workflowScript or workflowScriptPath (the workflow each fire runs)");
  }
  if ((p.at === undefined) === (p.every === undefined)) {
    return invalid("schedule.create needs exactly one trigger: at (+10m, or an ISO time with a zone) or every (30m, 6h, 2d, 2w)");
  }
  if (p.every !== undefined && !EVERY.test(p.every.trim())) {
    return invalid(`every: ${shown(p.every)} is not an interval: a whole number and m, h, d or w (30m, 6h, 2d, 2w)`);
  }
  if (p.at !== undefined && !AT_DELAY.test(p.at.trim()) && !isoTime(p.at.trim())) {
    return invalid(`at: ${shown(p.at)} is neither a delay (+10m, +2h, +1d) nor an ISO 8601 time with a zone (2026-12-24T18:00:00Z)`);
  }
  if (p.quiet !== undefined && p.every === undefined) {
    return invalid("quiet is for a recurring schedule (every): a one-shot at stays noisy (schedule.run may pass quiet for one manual fire)");
  }
  if (p.id !== undefined && !SCHEDULE_ID.test(String(p.id))) {
    return bad("id (a schedule id: 1 to 64 letters, digits, . _ -, not starting with . _ -)", p.id);
  }
  if (p.baseRef !== undefined) {
    const problem = refProblem(p.baseRef);
    if (problem) return invalid(`baseRef: ${shown(p.baseRef)} is ${problem}`);
  }
  return null;
}

function scheduleCreateArgv(p: any, ctx: PlanContext): string[] | Result {
  if (subagentsDisabled()) return disabled();
  if (p.sessionOnly === true && !ctx.sessionFile) {
    return invalid("sessionOnly: this session has no file (pi started with --no-session): a sessionOnly schedule is bound to a persisted session");
  }
  const argv = ["schedule", "create", "--json"];
  if (p.workflowScript !== undefined) {
    if (!p.workflowScript.trim()) return invalid("schedule.create needs a non-empty workflowScript or workflowScriptPath");
    argv.push("--workflow-script=-");
  } else {
    if (!p.workflowScriptPath.trim()) return invalid("schedule.create needs a non-empty workflowScript or workflowScriptPath");
    const file = scriptFile(p, p.workflowScriptPath, "workflowScriptPath");
    if (typeof file !== "string") return file;
    argv.push(`--workflow=${file}`);
  }
  flag(argv, "--at", p.at?.trim());
  flag(argv, "--every", p.every?.trim());
  flag(argv, "--name", p.name);
  flag(argv, "--id", p.id);
  flag(argv, "--catch-up", p.catchUp);
  if (p.quiet === true) argv.push("--quiet");
  if (p.sessionOnly === true) argv.push("--session-only");
  flag(argv, "--session-key", ctx.sessionKey);
  flag(argv, "--cwd", p.cwd);
  if (p.args !== undefined) argv.push(`--args=${JSON.stringify(p.args)}`);
  const timeout = timeoutOf(p);
  if (timeout !== null && typeof timeout !== "string") return timeout;
  flag(argv, "--timeout", timeout);
  flag(argv, "--base-ref", p.baseRef);
  return argv;
}

// schedule.list / show / history / pause / resume / run / run-due / delete.
function scheduleArgv(p: any, verb: string): string[] | Result {
  const argv = ["schedule", verb, "--json"];
  if (verb === "list" || verb === "run-due") {
    if (p.id !== undefined) return invalid(`schedule.${verb} takes no id`);
    if (verb === "run-due" && subagentsDisabled()) return disabled();
    return argv;
  }
  if (p.id === undefined) return invalid(`schedule.${verb} needs id (the schedule's; schedule.list shows them)`);
  if (!SCHEDULE_ID.test(String(p.id))) return bad("id (a schedule id)", p.id);
  if (verb === "run") {
    if (subagentsDisabled()) return disabled();
    if (p.quiet === true) argv.push("--quiet");
  }
  return end(argv, String(p.id));
}

// ---- Missions: `pisub mission ...`. The mission object of mission.create and of a workflow start,
// checked as the seed does (field paths in the errors); the rest pisub checks (missionUpdate).
const MISSION_KEYS = ["title", "summary", "objective", "goal", "budget", "labels"];

export function missionProblem(m: any, name = "mission"): string | null {
  for (const key of Object.keys(m)) {
    if (!MISSION_KEYS.includes(key)) return `${name}.${JSON.stringify(key.slice(0, 64))}: unknown field (known: ${MISSION_KEYS.join(", ")})`;
  }
  if (m.title !== undefined && m.summary !== undefined) return `${name}: give title or summary, not both`;
  const title = m.title ?? m.summary;
  const which = m.title !== undefined ? "title" : "summary";
  if (title === undefined) return `${name}: needs a title or a summary (exactly one, non-empty)`;
  if (typeof title !== "string" || !title.trim()) return `${name}.${which}: expected a non-empty string`;
  if (title.length > 1024) return `${name}.${which}: at most 1024 characters`;
  if (m.objective !== undefined && (typeof m.objective !== "string" || !m.objective.trim())) {
    return `${name}.objective: expected a non-empty string`;
  }
  if (m.goal !== undefined && m.goal !== true) return `${name}.goal: only true (a goal mission), or leave it out`;
  if (m.budget !== undefined) {
    const b = m.budget;
    if (kindOf(b) !== "object") return `${name}.budget: expected an object {tokens}`;
    const extra = Object.keys(b).find((k) => k !== "tokens");
    if (extra !== undefined) return `${name}.budget.${JSON.stringify(extra.slice(0, 64))}: unknown field (known: tokens)`;
    if (!Number.isSafeInteger(b.tokens) || b.tokens < 1) return `${name}.budget.tokens: expected a positive whole number`;
  }
  if (m.goal === true && m.budget === undefined) return `${name}.budget: goal: true needs budget: {tokens: N}`;
  if (m.labels !== undefined) {
    if (!Array.isArray(m.labels)) return `${name}.labels: expected an array of strings`;
    const i = m.labels.findIndex((l: unknown) => typeof l !== "string" || !l.trim() || l.length > 128);
    if (i >= 0) return `${name}.labels[${i}]: expected a non-empty string (at most 128 characters)`;
  }
  return null;
}

function missionArgv(p: any, verb: string, ctx: PlanContext): string[] | Result {
  const argv = ["mission", verb, "--json"];
  if (verb === "create") {
    if (p.missionId !== undefined) return invalid("mission.create makes a new mission: missionId is for the other mission actions");
    if (p.mission === undefined || p.mission === false) {
      return invalid("mission.create needs mission: {title | summary, objective?, goal?, budget?: {tokens}, labels?}");
    }
    const problem = missionProblem(p.mission);
    if (problem) return invalid(problem);
    const m = p.mission;
    argv.push(m.title !== undefined ? `--title=${m.title}` : `--summary=${m.summary}`);
    flag(argv, "--objective", m.objective);
    if (m.goal === true) argv.push("--goal");
    flag(argv, "--budget-tokens", m.budget === undefined ? null : String(m.budget.tokens));
    for (const label of m.labels ?? []) argv.push(`--label=${label}`);
    flag(argv, "--cwd", p.cwd);
    flag(argv, "--session-key", ctx.sessionKey);
    return argv;
  }
  if (verb === "list") {
    flag(argv, "--scope", p.missionScope);
    flag(argv, "--cwd", p.cwd);
    return argv;
  }
  if (p.missionId === undefined) return invalid(`mission.${verb} needs missionId (mission.list shows them)`);
  if (!MISSION_ID.test(String(p.missionId))) return bad("missionId", p.missionId);
  if (p.id !== undefined && verb !== "resolve-decision" && verb !== "attach-run") {
    return invalid(`mission.${verb} names its mission with missionId; id is a decision's id (resolve-decision) or a run's (attach-run)`);
  }
  switch (verb) {
    case "show":
      return end(argv, p.missionId);
    case "update":
      if (p.missionUpdate === undefined) {
        return invalid("mission.update needs missionUpdate: {title?, objective?, status?, labels?, decisions?, artifacts?, receipts?}");
      }
      argv.push(`--set=${JSON.stringify(p.missionUpdate)}`);
      return end(argv, p.missionId);
    case "resolve-decision": {
      if (p.id === undefined) return invalid("mission.resolve-decision needs id (the decision's; mission.show lists them)");
      if (!MISSION_ID.test(String(p.id))) return bad("id (a decision id)", p.id);
      if (typeof p.summary !== "string" || !p.summary.trim()) return invalid("mission.resolve-decision needs summary (the resolution, non-empty)");
      argv.push(`--summary=${p.summary}`);
      return end(argv, p.missionId, p.id);
    }
    case "attach-run": {
      if (p.runId !== undefined && p.id !== undefined && p.runId !== p.id) return invalid("runId and id name different runs: give runId");
      const run = p.runId ?? p.id;
      if (run === undefined) return invalid("mission.attach-run needs runId (the run to link)");
      if (!ID.test(String(run))) return bad(p.runId !== undefined ? "runId" : "id", run);
      if (p.runMode !== undefined && !NAME.test(p.runMode)) return bad("runMode", p.runMode);
      flag(argv, "--mode", p.runMode);
      return end(argv, p.missionId, String(run));
    }
    case "close": {
      const status = p.missionStatus ?? "completed";
      if (!["completed", "failed", "cancelled"].includes(status)) {
        return invalid(`missionStatus: ${shown(status)} is not one of completed, failed, cancelled (a closed mission's status)`);
      }
      argv.push(`--status=${status}`);
      if (p.summary !== undefined && !p.summary.trim()) return invalid("summary: expected a non-empty string (or leave it out)");
      flag(argv, "--summary", p.summary);
      return end(argv, p.missionId);
    }
  }
  return invalid(`unknown action "mission.${verb}"`);
}

// A workflow start's mission: missionId (attach), mission {...} (its own), false (none), else the
// default mission pisub makes. A new mission (the default, or mission {...}) is owned by this
// session (the goal notices' session); an existing one keeps its owner and false makes none, so
// no --session-key goes with those (pisub refuses it there).
function startMission(p: any, ctx: PlanContext, argv: string[]): Result | null {
  if (p.missionId !== undefined && p.mission !== undefined) {
    return invalid(p.mission === false ? "missionId and mission: false contradict each other: give one" : "give missionId (attach to that mission) or mission (a new one), not both");
  }
  if (p.missionId !== undefined) {
    if (!MISSION_ID.test(String(p.missionId))) return bad("missionId", p.missionId);
    argv.push(`--mission-id=${p.missionId}`);
  } else if (p.mission === false) {
    argv.push("--no-mission");
  } else if (p.mission !== undefined) {
    const problem = missionProblem(p.mission);
    if (problem) return invalid(problem);
    argv.push(`--mission=${JSON.stringify(p.mission)}`);
  }
  if (p.missionId === undefined && p.mission !== false) flag(argv, "--session-key", ctx.sessionKey);
  return null;
}

// Answers that do not depend on the action: seed parameters pisub does not build (yet).
function seedAnswer(p: any, action: string): Result | null {
  if (p.workflowScript !== undefined && p.workflowScriptPath !== undefined) {
    return invalid("workflowScript and workflowScriptPath are mutually exclusive: give one");
  }
  if (p.cron !== undefined || p.on !== undefined || p.timezone !== undefined || (typeof p.every === "string" && CALENDAR.test(p.every.trim()))) {
    return notYet("calendar schedules (cron, on, timezone, every: day)", CALENDAR_HINT);
  }
  if (action.startsWith("watchdog.")) return notYet("the watchdog");
  if (action.startsWith("inspector.") || action.startsWith("project.")) return unsupported(NO_PANES);
  if (p.focus !== undefined) return invalid("focus is for inspector.open / project.open");
  if (p.machine !== undefined) {
    return unsupported("Herdr saved machines do not exist in pisub: a run starts on this host (or on Slurm with --backend slurm)");
  }
  if (p.planId !== undefined) return invalid("planId is reserved for a future worktree.cleanup apply (the seed refuses it too)");
  const workflow = workflowRules(p);
  if (workflow) return workflow;
  if (action === "schedule.create") {
    const refused = scheduleRules(p);
    if (refused) return refused;
  }
  if (p.agentContract !== undefined) return notYet("agent contracts", "use acceptance");
  if (p.outputSchema !== undefined) return notYet("structured output");
  if (p.output !== undefined || p.outputMode !== undefined) {
    return notYet("output files of a run the tool starts", "a workflow child's runs.run(output=, output_mode=) has them");
  }
  for (const [key, actions] of Object.entries(ONLY_FOR)) {
    if (p[key] !== undefined && !actions.includes(action)) return invalid(`${key} is for action ${actions.join(" / ")}`);
  }
  return null;
}

// The child a control names: childId, or index (both only when they agree).
function childOf(p: any): string | null | Result {
  if (p.childId !== undefined && p.index !== undefined && String(p.index) !== String(p.childId)) {
    return invalid(`childId ${shown(p.childId)} and index ${p.index} name different children: give one`);
  }
  if (p.childId !== undefined) return String(p.childId);
  return p.index !== undefined ? String(p.index) : null;
}

// A path relative to the call's cwd (the seed resolves workflowScriptPath there).
function underCwd(p: any, file: string): string {
  return typeof p.cwd === "string" && p.cwd && !path.isAbsolute(file) ? path.join(p.cwd, file) : file;
}

const TS_SCRIPT = /\.(?:ts|mts|cts|tsx)$/i;

// A workflow script file named by the call (`field`), relative to its cwd; a TypeScript file is
// refused (pisub runs JavaScript and Python; nothing compiles TypeScript).
function scriptFile(p: any, file: string, field: string): string | Result {
  if (TS_SCRIPT.test(file)) {
    return invalid(
      `${field}: ${shown(file)} is TypeScript, which pisub does not run: a workflow script is JavaScript (.js, the same ` +
        "statement body as workflowScript) or Python (.py); compile it to .js",
    );
  }
  return underCwd(p, file);
}

// Where a workflow comes from (after `pisub run`): an inline script (on stdin: inputOf), a
// script file, a named resource with its args, or a lanes manifest.
function workflowSource(p: any): string[] | Result {
  if (p.lanes !== undefined) return [`--lanes=${underCwd(p, p.lanes)}`];
  const argv: string[] = [];
  if (p.workflow !== undefined) {
    argv.push(`--resource=${p.workflow}`);
  } else if (p.workflowScript !== undefined) {
    if (!p.workflowScript.trim()) return invalid(NO_WORKFLOW);
    argv.push("--workflow-script=-");
  } else {
    if (!p.workflowScriptPath.trim()) return invalid(NO_WORKFLOW);
    const file = scriptFile(p, p.workflowScriptPath, "workflowScriptPath");
    if (typeof file !== "string") return file;
    argv.push(`--workflow=${file}`);
  }
  // one JSON object, so that a string stays a string ("123" is not read as a number)
  if (p.args !== undefined) argv.push(`--args=${JSON.stringify(p.args)}`);
  return argv;
}

// What a call sends pisub on stdin: the inline workflow script of `--workflow-script -`, else null.
export function inputOf(p: any, argv: string[]): string | null {
  return option(argv, "--workflow-script") === "-" && typeof p?.workflowScript === "string" ? p.workflowScript : null;
}

function timeoutOf(p: any): string | null | Result {
  if (p.timeoutMs !== undefined && p.maxRuntimeMs !== undefined && p.timeoutMs !== p.maxRuntimeMs) {
    return invalid(`timeoutMs ${p.timeoutMs} and maxRuntimeMs ${p.maxRuntimeMs} differ: they are the same limit, give one`);
  }
  return seconds(p.timeoutMs ?? p.maxRuntimeMs);
}

// The options a start shares whatever it starts: limits, isolation, context, output, artifacts.
function startOptions(p: any, ctx: PlanContext, argv: string[]): Result | null {
  if (p.worktree !== undefined && p.isolation !== undefined && (p.isolation === "worktree") !== p.worktree) {
    return invalid(`worktree ${p.worktree} contradicts isolation ${shown(p.isolation)}`);
  }
  const isolated = p.isolation === "worktree" || p.worktree === true;
  if (p.baseRef !== undefined) {
    if (!isolated) return invalid("baseRef: give it with isolation: \"worktree\" (the base of the run's worktree)");
    const problem = refProblem(p.baseRef);
    if (problem) return invalid(`baseRef: ${shown(p.baseRef)} is ${problem}`);
  }
  if (isolated) argv.push("--isolation=worktree");
  flag(argv, "--base-ref", p.baseRef);
  if (p.chatProgress === "live-card" && p.async !== false) {
    return invalid('chatProgress: "live-card" needs async: false (a background run has no inline card)');
  }
  if (p.maxOutput !== undefined) {
    const refused = checkObject("maxOutput", p.maxOutput, MAX_OUTPUT);
    if (refused) return refused;
    flag(argv, "--max-output-bytes", p.maxOutput.bytes === undefined ? null : String(p.maxOutput.bytes));
    flag(argv, "--max-output-lines", p.maxOutput.lines === undefined ? null : String(p.maxOutput.lines));
  }
  if (p.artifacts === false) argv.push("--no-artifacts");
  if (p.includeProgress === true) argv.push("--include-progress");
  flag(argv, "--session-dir", p.sessionDir);
  if (p.forkFrom !== undefined && p.context !== "fork" && p.context !== "profile") {
    return invalid('forkFrom: give it with context: "fork"');
  }
  if (p.forkFrom !== undefined && !ID.test(p.forkFrom) && !p.forkFrom.endsWith(".jsonl")) {
    return bad("forkFrom (a run id or a .jsonl session file)", p.forkFrom);
  }
  if (p.context === "fork" && !p.forkFrom && !ctx.sessionFile) {
    return invalid('context: "fork" needs this session persisted to a file (pi started without --no-session), or forkFrom');
  }
  flag(argv, "--context", p.context);
  flag(argv, "--fork-from", p.forkFrom);
  // this session: what a fork copies, explicit or preferred (the agent's defaultContext, the config's)
  flag(argv, "--parent-session", ctx.sessionFile);
  return null;
}

function startArgv(p: any, ctx: PlanContext): string[] | Result {
  if (subagentsDisabled()) return disabled();
  const argv = ["run", "--json"];
  flag(argv, "--cwd", p.cwd);
  const timeout = timeoutOf(p);
  if (timeout !== null && typeof timeout !== "string") return timeout;
  flag(argv, "--timeout", timeout);
  const refused = startOptions(p, ctx, argv);
  if (refused) return refused;
  const workflow = [p.workflowScript, p.workflowScriptPath, p.workflow, p.lanes].some((v) => v !== undefined);
  if (!workflow && (p.missionId !== undefined || (p.mission !== undefined && p.mission !== false))) {
    return invalid(
      `${p.missionId !== undefined ? "missionId" : "mission"}: a mission encloses a workflow (workflowScript, workflowScriptPath, ` +
        "workflow, lanes); link another run to a mission with mission.attach-run",
    );
  }
  if (workflow) {
    if (p.checkpointBeforeDeadlineMs !== undefined) {
      return invalid("checkpointBeforeDeadlineMs is for a single agent's run (the seed's rule), not a workflow");
    }
    const source = workflowSource(p);
    if (!Array.isArray(source)) return source;
    argv.push(...source);
    flag(argv, "--usage-budget", json(p.usageBudget));
    const refused = startMission(p, ctx, argv);
    return refused ?? argv;
  }
  if (!p.agent || !p.task) return invalid("a run needs agent and task (or workflowScript, workflowScriptPath, workflow)");
  if (p.gate !== undefined && p.acceptance !== undefined && p.acceptance !== false) {
    return invalid("gate is the acceptance shorthand: give gate or acceptance, not both (acceptance false is allowed)");
  }
  argv.push(`--agent=${p.agent}`);
  flag(argv, "--model", p.model);
  flag(argv, "--tool-timeout", seconds(p.toolTimeoutMs));
  flag(argv, "--checkpoint-before-deadline", seconds(p.checkpointBeforeDeadlineMs));
  flag(argv, "--tool-budget", json(p.toolBudget));
  flag(argv, "--gate", p.gate);
  if (p.acceptance !== undefined && p.acceptance !== "auto") flag(argv, "--acceptance", json(p.acceptance));
  return end(argv, String(p.task));
}

// `{action: "validate"}`: an inline script (on stdin), or a file (path or workflowScriptPath).
function validateArgv(p: any): string[] | Result {
  if (p.agent !== undefined || p.task !== undefined) {
    return invalid("validate requires workflowScript or workflowScriptPath and does not accept direct agent, task, or step execution fields.");
  }
  if (p.workflowScript !== undefined && p.path !== undefined) return invalid("workflowScript and path are mutually exclusive: give one");
  if (p.path !== undefined && p.workflowScriptPath !== undefined && p.path !== p.workflowScriptPath) {
    return invalid("path and workflowScriptPath name different files: give one");
  }
  if (p.workflowScript !== undefined) {
    return p.workflowScript.trim() ? ["workflow", "validate", "--json", "--workflow-script=-"] : invalid(NO_VALIDATE_INPUT);
  }
  const target: string | undefined = p.path ?? p.workflowScriptPath;
  if (target === undefined || !target.trim()) return invalid(NO_VALIDATE_INPUT);
  const file = scriptFile(p, target, p.path !== undefined ? "path" : "workflowScriptPath");
  return typeof file === "string" ? end(["workflow", "validate", "--json"], file) : file;
}

function end(argv: string[], ...positionals: string[]): string[] {
  return [...argv, "--", ...positionals];
}

function laneArgv(p: any, verb: string): string[] | Result {
  if (p.laneId === undefined) return invalid(`${p.action} needs laneId (the lane's run id)`);
  if (!ID.test(p.laneId)) return bad("laneId", p.laneId);
  const argv = ["lane", verb, "--json"];
  flag(argv, "--handoff", p.handoffPath);
  if (verb === "record-merge") {
    if (p.merge === undefined) return invalid("lane.recordMerge needs merge: {prNumber, reviewedHead, mergeCommit, treeEquivalent, postMergeChecks, attestedBy, attestedAt}");
    const refused = checkObject("merge", p.merge, MERGE);
    if (refused) return refused;
    const m = p.merge;
    argv.push(`--pr=${m.prNumber}`, `--reviewed-head=${m.reviewedHead}`, `--merge-commit=${m.mergeCommit}`);
    if (m.treeEquivalent) argv.push("--tree-equivalent");
    argv.push(`--post-merge-checks=${m.postMergeChecks}`, `--by=${m.attestedBy}`, `--at=${m.attestedAt}`);
  }
  if (verb === "record-supersession") {
    if (p.supersession === undefined) return invalid("lane.recordSupersession needs supersession: {supersededBy, attestedBy, attestedAt}");
    const refused = checkObject("supersession", p.supersession, SUPERSESSION);
    if (refused) return refused;
    const s = p.supersession;
    argv.push(`--by-lane=${s.supersededBy}`, `--by=${s.attestedBy}`, `--at=${s.attestedAt}`);
  }
  return end(argv, p.laneId);
}

function cleanupArgv(p: any): string[] | Result {
  if (p.mode !== undefined && p.mode !== "plan" && p.mode !== "apply") {
    return invalid(`mode: worktree.cleanup takes plan (the default) or apply, not ${shown(p.mode)}`);
  }
  if (p.laneId !== undefined && !ID.test(p.laneId)) return bad("laneId", p.laneId);
  const argv = ["worktree", "cleanup", "--json", p.mode === "apply" ? "--apply" : "--plan"];
  flag(argv, "--repo", p.repo === undefined ? null : underCwd(p, p.repo));
  flag(argv, "--lane", p.laneId);
  flag(argv, "--handoff", p.handoffPath);
  return argv;
}

function statusArgv(p: any, child: string | null): string[] | Result {
  if (!p.id) {
    if (child !== null) return invalid("status with childId/index needs the run's id");
    if (p.view === "fleet") return ["fleet", "--json"];
    if (p.view === "transcript") return invalid('status view "transcript" needs id (the run whose transcript)');
    return insideRun() ? ["list", "--json", "--all"] : ["list", "--json"]; // inside a run: its own (shape)
  }
  const argv = ["status", "--json"];
  flag(argv, "--child", child);
  flag(argv, "--view", p.view);
  if (typeof p.lines === "number") argv.push(`--lines=${Math.min(500, p.lines)}`);
  return end(argv, p.id);
}

function agentArgv(p: any, action: string): string[] | Result {
  if (!p.agent) return invalid(`${action} needs agent`);
  const scope = p.agentScope === "user" || p.agentScope === "project" ? p.agentScope : null;
  if (action.startsWith("refine")) {
    const argv = ["agents", "refine", "--json"];
    if (action === "refine.show") argv.push("--show");
    else if (action === "refine.rollback") argv.push("--rollback");
    else {
      if (p.config === undefined) return invalid("refine needs config (the overlay's keys)");
      argv.push(`--config=${JSON.stringify(p.config)}`);
    }
    return end(argv, p.agent);
  }
  const argv = ["agents", action];
  if (action === "update") argv.push(`--config=${JSON.stringify(p.config ?? {})}`);
  flag(argv, "--scope", scope);
  return end(argv, p.agent);
}

// The argv of a call (after `pisub`): options first, then `--` and the positionals; or a failure.
// `ctx` is what the call's session adds (its session file: the source of context "fork").
export function plan(p: any, ctx: PlanContext = {}): string[] | Result {
  const refused = checkParams(p);
  if (refused) return refused;
  const action = actionOf(p);
  const answered = seedAnswer(p, action);
  if (answered) return answered;
  // a schedule's id (schedule.*), a decision's or a run's (mission.*): checked where they are used
  const ownId = action.startsWith("schedule.") || action.startsWith("mission.");
  if (p.id !== undefined && !ownId && !ID.test(String(p.id))) return bad("id", p.id);
  if (p.agent !== undefined && !NAME.test(String(p.agent))) return bad("agent", p.agent);
  if (p.childId !== undefined && !CHILD.test(String(p.childId))) return bad("childId", p.childId);
  if (p.mode !== undefined && action === "steer" && !["steer", "follow_up", "auto"].includes(p.mode)) {
    return invalid(`mode: steer takes steer, follow_up or auto, not ${shown(p.mode)}`);
  }
  const child = childOf(p);
  if (child !== null && typeof child !== "string") return child;
  const withChild = (argv: string[]) => {
    flag(argv, "--child", child);
    return argv;
  };
  switch (action) {
    case "run":
      return startArgv(p, ctx);
    case "status":
      return statusArgv(p, child);
    case "wait": {
      if (!p.id) return invalid("wait needs id");
      const argv = withChild(["wait", "--json"]);
      flag(argv, "--timeout", seconds(p.timeoutMs));
      return end(argv, p.id);
    }
    case "steer":
    case "follow_up": {
      if (!p.id || !p.message) return invalid(`${action} needs id and message`);
      const argv = withChild([action === "steer" ? "steer" : "follow-up", "--json", "--wait=3"]);
      if (action === "steer") flag(argv, "--mode", p.mode);
      if (p.steeringRecovery === false) argv.push("--no-recover");
      return end(argv, p.id, String(p.message));
    }
    case "interrupt":
    case "stop": {
      if (!p.id) return invalid(`${action} needs id`);
      const argv = withChild([action, "--json", "--wait=3"]);
      flag(argv, "--reason", p.reason);
      return end(argv, p.id);
    }
    case "resume": {
      if (subagentsDisabled()) return disabled();
      if (!p.id) return invalid("resume needs id");
      const argv = withChild(["resume", "--json"]);
      const timeout = timeoutOf(p);
      if (timeout !== null && typeof timeout !== "string") return timeout;
      flag(argv, "--timeout", timeout);
      return p.message ? end(argv, p.id, String(p.message)) : end(argv, p.id);
    }
    case "list": {
      const argv = ["agents", "list", "--json"];
      // both (the default): every agent that resolves here, the project's over the user's
      if (p.agentScope === "user" || p.agentScope === "project") argv.push(`--scope=${p.agentScope}`);
      if (p.capabilities === true) argv.push("--capabilities");
      return argv;
    }
    case "fleet":
      return ["fleet", "--json"];
    case "models": {
      const argv = ["models", "--json"];
      flag(argv, "--agent", p.agent);
      return argv;
    }
    case "create": {
      const config = p.config;
      // the seed's names ("Code Scout" becomes code-scout): pisub normalizes and checks them
      if (!config || typeof config !== "object" || typeof config.name !== "string" || !DISPLAY_NAME.test(config.name)) {
        return invalid("create needs config: {name, ...} (a name of letters, digits, spaces, . _ -)");
      }
      const rest = { ...config };
      const scope = rest.scope;
      delete rest.scope;
      const argv = ["agents", "create", `--config=${JSON.stringify(rest)}`];
      flag(argv, "--scope", typeof scope === "string" ? scope : null);
      return end(argv, config.name);
    }
    case "get": {
      if (p.agent && !p.id) return end(["agents", "show", "--json"], p.agent);
      if (!p.id) return invalid("get needs id (a run) or agent");
      return end(withChild(["result", "--json"]), p.id);
    }
    case "doctor":
      return ["doctor"];
    case "children.list": {
      const argv = ["children", "list", "--json"];
      const parent = p.parent ?? p.id;
      if (parent !== undefined && !ID.test(String(parent))) return bad("parent", parent);
      flag(argv, "--parent", parent);
      return argv;
    }
    case "validate":
      return validateArgv(p);
    case "guide":
      return p.topic ? end(["guide"], String(p.topic)) : ["guide"];
    case "lane.status":
      return laneArgv(p, "status");
    case "lane.recordMerge":
      return laneArgv(p, "record-merge");
    case "lane.recordSupersession":
      return laneArgv(p, "record-supersession");
    case "worktree.cleanup":
      return cleanupArgv(p);
    case "worktree.discard":
      if (!p.id) return invalid("worktree.discard needs id (the run whose worktree is deleted)");
      return end(["worktree", "discard", "--force"], p.id);
    case "schedule.create":
      return scheduleCreateArgv(p, ctx);
    default: {
      if (action.startsWith("schedule.") && ACTIONS.includes(action)) return scheduleArgv(p, action.slice("schedule.".length));
      if (action.startsWith("mission.") && ACTIONS.includes(action)) return missionArgv(p, action.slice("mission.".length), ctx);
      if (AGENT_EDITS.has(action) || REFINES.has(action)) return agentArgv(p, action);
      const hint = near(String(action));
      const did = hint ? ` Did you mean "${hint}"? (not run)` : "";
      return invalid(
        `unknown action ${JSON.stringify(action)}.${did} Safe next steps: action "status" with an id, or action "list".`,
      );
    }
  }
}

function parseLines(stdout: string): any[] {
  const out: any[] = [];
  for (const line of stdout.split("\n")) {
    const t = line.trim();
    if (!t) continue;
    try {
      out.push(JSON.parse(t));
    } catch {
      out.push(t);
    }
  }
  return out;
}

// ---- What the model and the person see. Every answer's text is a readable summary (never raw
// JSON); `details` keeps the structure pisub printed. A value shown inside a line is made one
// line (termSafe oneLine: a hostile value cannot end its line and print a fake one); blocks (a
// result, a transcript, a guide) keep their newlines. answer() escapes the whole text again.

function one(value: unknown, max = 200): string {
  let s: string;
  if (typeof value === "string") s = value;
  else if (value === undefined || value === null) s = "";
  else s = JSON.stringify(value) ?? String(value);
  s = termSafe(s, true);
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

const LIST_MAX = 200; // rows shown of a listing (details keep every item pisub printed)

function rows<T>(items: T[], line: (item: T) => string, empty: string): string {
  if (!items.length) return empty;
  const shown = items.slice(0, LIST_MAX).map(line);
  if (items.length > LIST_MAX) shown.push(`… ${items.length - LIST_MAX} more (details.items has them)`);
  return shown.join("\n");
}

// Any object as `key: value` lines (a fallback: an answer no renderer below knows).
export function readable(value: unknown): string {
  if (value === null || typeof value !== "object") return one(value, 2000);
  if (Array.isArray(value)) return rows(value, (v) => "- " + one(v, 400), "(none)");
  const lines = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => `${one(k, 64)}: ${one(v, 400)}`);
  return lines.join("\n") || "(empty)";
}

function runLine(s: any): string {
  if (!s || typeof s !== "object") return one(s);
  const key = s.key ? ` [${one(s.key, 64)}]` : "";
  const ended = s.endedAt ? `, ended ${one(s.endedAt, 40)}` : "";
  return `${one(s.runId, 64)}  ${one(s.state, 20)}  ${one(s.agent, 64)}${key}  started ${one(s.startedAt, 40)}${ended}`;
}

function next(id: string, state: string): string {
  const ref = `id: "${one(id, 64)}"`;
  return TERMINAL.has(state)
    ? `next: the result {action: "get", ${ref}}; continue it {action: "resume", ${ref}, message}`
    : `next: {action: "wait", ${ref}} blocks until it ends; {action: "steer", ${ref}, message}; {action: "stop", ${ref}}`;
}

export function statusText(s: any): string {
  if (!s || typeof s !== "object") return readable(s);
  const out = [`run ${one(s.runId, 64)}: ${one(s.state, 20)} (agent ${one(s.agent, 64)}, runner ${one(s.runner, 32)})`];
  out.push(`started ${one(s.startedAt, 40)}${s.endedAt ? `, ended ${one(s.endedAt, 40)}` : ""}`);
  if (s.error) out.push(`error: ${one(s.error, 400)}`);
  if (s.parentRunId) out.push(`parent run: ${one(s.parentRunId, 64)}${s.key ? ` (key ${one(s.key, 64)})` : ""}`);
  const steps: any[] = Array.isArray(s.steps) ? s.steps : [];
  for (const step of steps.slice(0, 20)) {
    if (!step || typeof step !== "object") continue;
    const name = step.key ? ` ${one(step.key, 64)}` : "";
    const run = step.runId ? ` run ${one(step.runId, 64)}` : "";
    const tool = step.currentTool ? `, now ${one(step.currentTool?.name ?? step.currentTool, 64)}` : "";
    const exit = step.exitCode !== null && step.exitCode !== undefined ? `, exit ${one(step.exitCode, 8)}` : "";
    out.push(`step ${one(step.index, 8)}${name}${run}: ${one(step.status, 20)}, turns ${one(step.turnCount ?? 0, 8)}, tools ${one(step.toolCount ?? 0, 8)}${tool}${exit}`);
  }
  if (steps.length > 20) out.push(`… ${steps.length - 20} more steps`);
  const st = s.steering;
  if (st && typeof st === "object" && st.requested) {
    out.push(`steering: ${one(st.requested, 8)} requested, ${one(st.delivered, 8)} delivered, ${one(st.queued, 8)} queued, ${one(st.failed, 8)} failed`);
  }
  const recent: unknown[] = steps.length && Array.isArray(steps[steps.length - 1]?.recentOutput) ? steps[steps.length - 1].recentOutput : [];
  if (recent.length) out.push("recent output:", ...recent.slice(-5).map((l) => "  " + one(l, 300)));
  out.push(next(String(s.runId ?? ""), String(s.state ?? "")));
  return out.join("\n");
}

function fleetLine(r: any): string {
  if (!r || typeof r !== "object") return one(r);
  const key = r.key ? ` [${one(r.key, 64)}]` : "";
  const tool = r.currentTool ? ` · now ${one(r.currentTool?.name ?? r.currentTool, 64)}` : "";
  return `${one(r.runId, 64)}${key}  ${one(r.agent, 64)}  ${one(r.state, 20)} · turns ${one(r.turns ?? 0, 8)} · tools ${one(r.tools ?? 0, 8)}${tool} · steers ${one(r.steersDelivered ?? 0, 8)}/${one(r.steersRequested ?? 0, 8)} delivered · last activity ${one(r.lastActivityAt, 40)}`;
}

function agentLine(a: any): string {
  if (!a || typeof a !== "object") return one(a);
  return `${one(a.name, 128)} [${one(a.runner, 32)}, ${one(a.scope, 32)}]${a.description ? " " + one(a.description, 300) : ""}`;
}

function modelLine(m: any): string {
  if (!m || typeof m !== "object") return one(m);
  const traits = [m.context ? `context ${one(m.context, 16)}` : "", m.max_out ? `max output ${one(m.max_out, 16)}` : ""];
  if (m.thinking) traits.push("thinking");
  if (m.images) traits.push("images");
  return `${one(m.name ?? `${m.provider}/${m.id}`, 200)}  ${traits.filter(Boolean).join(", ")}`;
}

function childLine(c: any): string {
  if (!c || typeof c !== "object") return one(c);
  const can = c.resumable ? "resumable" : `not resumable${c.reason ? ": " + one(c.reason, 200) : ""}`;
  return `${one(c.runId, 64)} [${one(c.key, 64)}] ${one(c.agent, 64)} ${one(c.state, 20)}, ended ${one(c.endedAt, 40)} — ${can}`;
}

function agentText(shown: any): string {
  const spec = shown?.spec;
  if (!spec || typeof spec !== "object") return readable(shown);
  const out = [`agent ${one(spec.name, 128)} (${one(shown.scope, 32)}, runner ${one(spec.runner, 32)})`, `file: ${one(shown.path, 400)}`];
  for (const [k, v] of Object.entries(spec)) {
    if (["name", "runner", "systemPrompt", "source"].includes(k) || v === null || v === false) continue;
    if (Array.isArray(v) && !v.length) continue;
    out.push(`${one(k, 64)}: ${one(v, 400)}`);
  }
  if (typeof spec.systemPrompt === "string" && spec.systemPrompt) {
    out.push("system prompt:", spec.systemPrompt.length > 4000 ? spec.systemPrompt.slice(0, 4000) + "\n…" : spec.systemPrompt);
  }
  return out.join("\n");
}

// One problem of a validate: `line L:C [kind] message` (the seed's {message, line?, column?, kind?};
// pisub's Python checks said `col`).
function problemLine(e: any): string {
  const column = e?.column ?? e?.col;
  const where = e?.line !== undefined && e?.line !== null ? `line ${one(e.line, 8)}${column !== undefined && column !== null ? ":" + one(column, 8) : ""} ` : "";
  const kind = typeof e?.kind === "string" && e.kind ? `[${one(e.kind, 40)}] ` : "";
  return `  ${where}${kind}${one(e?.message ?? e, 400)}`;
}

function validateText(v: any): string {
  if (!v || typeof v !== "object") return readable(v);
  const warnings: any[] = Array.isArray(v.warnings) ? v.warnings : [];
  const warned = warnings.length ? ["warnings:", ...warnings.slice(0, 50).map(problemLine)] : [];
  if (v.ok === true) return ["valid: the workflow script passed every static check (nothing was started)", ...warned].join("\n");
  const errors: any[] = Array.isArray(v.errors) ? v.errors : [];
  return ["not valid:", ...errors.slice(0, 50).map(problemLine), ...warned].join("\n");
}

const RECEIPT_MEANING: Record<string, string> = {
  delivered: "the run took it",
  queued: "accepted; it is taken at the run's next turn boundary",
  scheduled: "kept: it is delivered when the run (or child) next starts or resumes",
  pending: "no answer within the wait; look again with {action: \"status\", id}",
  partial: "some children took it, some did not (details.receipt)",
  recovered: "the run was paused and resumed with it",
};

function receiptText(verb: string, r: any, p: any): string {
  const rid = r.requestId ?? r.id;
  const run = r.runId ?? p.id;
  const child = p.childId !== undefined ? ` child ${one(p.childId, 128)}` : "";
  const head = `${one(r.state, 20)}: ${verb}${rid ? " " + one(rid, 64) : ""} → run ${one(run, 64)}${child}`;
  const why = r.reason ? one(r.reason, 400) : RECEIPT_MEANING[String(r.state)] ?? "";
  return why ? `${head}: ${why}` : head;
}

// A pi session's assistant messages as the seed's displayItems (text and tool calls), the last
// DISPLAY_MAX of them; each text and argument bounded and escaped.
const DISPLAY_MAX = 50;
const DISPLAY_TEXT = 2000;
const DISPLAY_ARGS = 2000;
const MAX_SESSION = 16 << 20;
type DisplayItem = { type: "text"; text: string } | { type: "toolCall"; name: string; args: Record<string, unknown> };

function safeArgs(args: unknown): Record<string, unknown> {
  if (!args || typeof args !== "object" || Array.isArray(args)) return {};
  let text: string;
  try {
    text = JSON.stringify(args) ?? "{}"; // a child wrote the session: it may be nested past the stack
  } catch {
    return { truncated: "(arguments not shown: nested too deeply)" };
  }
  if (text.length > DISPLAY_ARGS) return { truncated: termSafe(text.slice(0, DISPLAY_ARGS), true) + "…" };
  return JSON.parse(text, (_k, v) => (typeof v === "string" ? termSafe(v) : v));
}

export function displayItems(session: string): DisplayItem[] {
  const items: DisplayItem[] = [];
  for (const line of session.split("\n")) {
    if (!line.includes('"assistant"')) continue;
    let entry: any;
    try {
      entry = JSON.parse(line);
    } catch {
      continue;
    }
    const msg = entry?.message;
    if (entry?.type !== "message" || msg?.role !== "assistant" || !Array.isArray(msg.content)) continue;
    for (const part of msg.content) {
      if (part?.type === "text" && typeof part.text === "string" && part.text.trim()) {
        const t = part.text.length > DISPLAY_TEXT ? part.text.slice(0, DISPLAY_TEXT) + "…" : part.text;
        items.push({ type: "text", text: termSafe(t) });
      } else if (part?.type === "toolCall" && typeof part.name === "string") {
        items.push({ type: "toolCall", name: one(part.name, 128), args: safeArgs(part.arguments) });
      }
    }
    if (items.length > 4 * DISPLAY_MAX) items.splice(0, items.length - DISPLAY_MAX);
  }
  return items.slice(-DISPLAY_MAX);
}

// A session file a result or status names: only a regular `.jsonl` file (never through a
// symlink, never a FIFO: readSmall), at most MAX_SESSION bytes.
// The last session read: a foreground wait polls once a second, and a session of up to
// MAX_SESSION bytes is read and parsed again only when it changed (its inode, size or mtime).
let lastSession: { key: string; items: DisplayItem[] } | null = null;

function sessionItems(file: unknown): DisplayItem[] | null {
  if (typeof file !== "string" || !file.endsWith(".jsonl") || !path.isAbsolute(file)) return null;
  let key: string;
  try {
    const st = fs.lstatSync(file);
    key = `${file}\0${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
  } catch {
    return null;
  }
  if (lastSession?.key === key) return [...lastSession.items];
  const text = readSmall(file, MAX_SESSION);
  if (text === null) return null;
  const items = displayItems(text);
  lastSession = { key, items };
  return [...items];
}

// details.results[] with displayItems (from the session file, else the output as one text).
function withDisplayItems(details: any): any {
  if (!details || typeof details !== "object" || !Array.isArray(details.results)) return details;
  const results = details.results.map((r: any) => {
    if (!r || typeof r !== "object" || Array.isArray(r.displayItems)) return r;
    const items = sessionItems(r.sessionFile) ?? [];
    if (!items.length && typeof r.output === "string" && r.output) items.push({ type: "text", text: termSafe(r.output.slice(0, DISPLAY_TEXT)) });
    return { ...r, displayItems: items };
  });
  return { ...details, results };
}

function resultText(first: any): string {
  const text = first?.content?.[0]?.text;
  if (typeof text === "string" && text.trim()) return text;
  const id = first?.details?.runId ?? "";
  return `run ${one(id, 64)} ended ${one(first?.state, 20)} with no output`;
}

// The tool result of a finished command.
export function shape(p: any, argv: string[], code: number, stdout: string, stderr: string): Result {
  const verb = argv[0];
  const control = ["steer", "follow-up", "interrupt", "stop"].includes(verb);
  // 2 failed, 3 no answer yet, 1 RUN_CLOSED (the run had finished: nothing written; --json prints it)
  const receipt = control && (code === 1 || code === 2 || code === 3) && stdout.trim().startsWith("{");
  const waited = verb === "wait" && code === 1 && stdout.trim().startsWith("{"); // a run that ended otherwise
  const checked = verb === "workflow" && stdout.trim().startsWith("{"); // validate: {ok, errors}
  if (verb === "wait" && code === 3) return waitGaveUp(p);
  if (code !== 0 && !receipt && !waited && !checked && verb !== "doctor") {
    const err = cliError(stderr, code);
    return failure(err.code, err.message);
  }
  if (verb === "guide" || verb === "doctor") {
    return answer(stdout.trim(), { mode: "management", results: [], ok: code === 0 });
  }
  const items = parseLines(stdout);
  const first = items[0];
  if (checked) {
    // a failing validate ({ok: false, errors}) is a failed tool call, as the seed's
    const found = { ok: first?.ok === true, errors: first?.errors ?? [], ...(Array.isArray(first?.warnings) ? { warnings: first.warnings } : {}) };
    const result = answer(validateText(first), { mode: "management", results: [], ...found });
    return first?.ok === true ? result : { ...result, isError: true };
  }
  if (verb === "run" || verb === "resume") {
    if (typeof first?.runId !== "string") {
      return failure("SUBAGENT_FAILED", `pisub ${verb} gave no run id: ${JSON.stringify(stdout.trim().slice(0, 200))}`);
    }
    const what =
      verb === "resume" ? `resume of ${one(p?.id, 64)}` : p?.agent ? one(p.agent, 128) : p?.lanes ? "lanes" : p?.workflow ? `workflow ${one(p.workflow, 128)}` : "workflow";
    const who = ` (${what})`; // a space after the id: "started run ID (...)" splits cleanly
    const missionId = typeof first.missionId === "string" ? first.missionId : null;
    const mission = missionId ? `\nmission ${one(missionId, 128)}: {action: "mission.show", missionId: "${one(missionId, 128)}"}` : "";
    const text = `started run ${first.runId}${who}: ${one(first.state, 20)}; it runs in the background and a notice comes when it ends.\n` +
      `look: {action: "status", id: "${first.runId}"}; block until it ends: {action: "wait", id: "${first.runId}"}${mission}`;
    return answer(text, { mode: "single", runId: first.runId, runDir: first.runDir, results: [], started: first, ...(missionId ? { missionId } : {}) });
  }
  if (verb === "result" || verb === "wait") {
    const result = answer(resultText(first), withDisplayItems(first?.details ?? { mode: "single", results: [] }));
    return first?.state === "complete" || verb === "result" ? result : { ...result, isError: true };
  }
  if (control) {
    // exit 2: failed / rejected / partial; 3: no answer past pending within the wait
    const r = first && typeof first === "object" ? first : {};
    return answer(receiptText(verb, r, p), { mode: "management", runId: p.id, results: [], receipt: r, deliveryStatus: r.state });
  }
  if (verb === "agents" && argv[1] === "list") {
    const scoped = p.agentScope === "user" || p.agentScope === "project"; // both (the default): every agent
    const agents = items.filter((a) => !scoped || a.scope === p.agentScope);
    if (p.capabilities) {
      return answer(rows(agents, agentLine, "(no agents)"), {
        mode: "management",
        results: [],
        agentCapabilities: { agents, restrictedCount: agents.filter((a) => a?.capabilities?.ceilings?.allowed === false).length },
      });
    }
    return answer(rows(agents, agentLine, "(no agents)"), { mode: "management", results: [], items: agents });
  }
  if (verb === "schedule" || verb === "mission") {
    // one JSON value: a record, or an array (list, history)
    const all = items.length === 1 && Array.isArray(first) ? first : items;
    const details: any = { mode: "management", results: [], items: all.slice(0, 500) };
    if (verb === "schedule" && argv[1] === "run") details.fired = fireOf(first, p);
    const record = !Array.isArray(first) && first && typeof first === "object" ? first : null;
    if (verb === "mission" && record) details.missionId = record.id ?? record.missionId ?? null;
    if (verb === "schedule" && record && argv[1] !== "run-due") details.scheduleId = record.id ?? record.scheduleId ?? p?.id ?? null;
    return answer(render(p, argv, all).slice(0, 50_000), details);
  }
  const shown = verb === "list" || verb === "fleet" ? ownRuns(items) : items;
  return answer(render(p, argv, shown).slice(0, 50_000), { mode: "management", results: [], items: shown.slice(0, 500) });
}

// ---- Schedules and missions as text. The records are pisub's (spec/schedules.md,
// spec/missions.md); a field a renderer does not know is in details.items.

function pick(o: any, ...keys: string[]): any {
  for (const key of keys) {
    const v = key.split(".").reduce((x: any, k) => (x && typeof x === "object" ? x[k] : undefined), o);
    if (v !== undefined && v !== null && v !== "") return v;
  }
  return undefined;
}

function scheduleState(s: any): string {
  const state = pick(s, "state", "status");
  if (typeof state === "string") return state;
  if (s?.paused === true) return "paused";
  if (s?.done === true) return "done"; // a one-shot that fired
  return pick(s, "activeRunId", "active.runId") ? "running" : "scheduled";
}

function triggerOf(s: any): string {
  const every = pick(s, "every", "trigger.every");
  if (every !== undefined) return `every ${one(every, 32)}`;
  const at = pick(s, "at", "trigger.at");
  return at !== undefined ? `at ${one(at, 64)}` : "";
}

function scheduleLine(s: any): string {
  if (!s || typeof s !== "object") return one(s);
  const next = pick(s, "nextRunAt", "nextAt", "next", "trigger.nextRunAt");
  const traits = [s.quiet === true ? "quiet" : "", s.sessionOnly === true ? "session-only" : ""].filter(Boolean);
  const name = pick(s, "name");
  return (
    `${one(s.id, 64)}${name !== undefined && name !== s.id ? `  "${one(name, 128)}"` : ""}  ${one(scheduleState(s), 20)}  ${triggerOf(s)}` +
    `  next ${next !== undefined ? one(next, 40) : "none"}${traits.length ? "  " + traits.join(", ") : ""}`
  );
}

function fireLine(f: any): string {
  if (!f || typeof f !== "object") return one(f);
  const run = pick(f, "runId", "run");
  const runState = pick(f, "runState");
  const state = `${pick(f, "state", "outcome", "status") ?? "?"}${runState !== undefined ? ` (run ${runState})` : ""}`;
  const planned = pick(f, "plannedAt");
  const reason = pick(f, "dueReason", "reason");
  const error = pick(f, "error");
  return (
    `${run !== undefined ? "run " + one(run, 64) : "no run"}  ${one(state, 48)}` +
    `${planned !== undefined ? "  planned " + one(planned, 40) : ""}${reason !== undefined ? "  (" + one(reason, 20) + ")" : ""}` +
    `${error !== undefined ? "  " + one(error, 200) : ""}`
  );
}

function scheduleText(s: any): string {
  if (!s || typeof s !== "object") return readable(s);
  const out = [`schedule ${scheduleLine(s)}`];
  const cwd = pick(s, "cwd");
  if (cwd !== undefined) out.push(`cwd: ${one(cwd, 400)}`);
  const catchUp = pick(s, "catchUp");
  if (catchUp !== undefined) out.push(`catch up: ${one(catchUp, 20)}; overlap: skip`);
  const active = pick(s, "active");
  if (active && typeof active === "object") out.push(`firing now: ${fireLine(active)}`);
  const last = pick(s, "last");
  if (last && typeof last === "object") out.push(`last fire: ${fireLine(last)}`);
  if (typeof s.fires === "number") out.push(`fires so far: ${s.fires}`);
  const recent: any[] = Array.isArray(s.recent) ? s.recent : Array.isArray(s.history) ? s.history : [];
  if (recent.length) out.push("recent fires:", ...recent.slice(0, 10).map((f) => "  " + fireLine(f)));
  return out.join("\n");
}

function fireOf(first: any, p: any): { runId: string | null; schedule: { id: string; name: string } } {
  const f = first && typeof first === "object" ? first : {};
  const runId = pick(f, "runId", "fire.runId", "run");
  const id = String(pick(f, "scheduleId", "schedule.id") ?? p?.id ?? "");
  const name = pick(f, "name", "scheduleName", "schedule.name") ?? id;
  return { runId: typeof runId === "string" ? runId : null, schedule: { id, name: String(name) } };
}

function missionLine(m: any): string {
  if (!m || typeof m !== "object") return one(m);
  const decisions: any[] = Array.isArray(m.decisions) ? m.decisions : [];
  const open = decisions.filter((d) => d && d.status !== "resolved" && !d.resolution).length;
  const goal = m.goal ? "  goal" : "";
  return `${one(pick(m, "id", "missionId"), 64)}  ${one(m.status, 20)}  ${one(pick(m, "title", "summary"), 200)}${goal}${open ? `  ${open} open decision${open > 1 ? "s" : ""}` : ""}`;
}

function missionText(m: any): string {
  if (!m || typeof m !== "object") return readable(m);
  const out = [`mission ${missionLine(m)}`];
  if (m.objective) out.push(`objective: ${one(m.objective, 600)}`);
  const budget = pick(m, "budget.tokens", "budgetTokens");
  if (m.goal || budget !== undefined) {
    const used = pick(m, "usage.tokens", "usedTokens") ?? 0;
    const goal = typeof m.goal === "object" && m.goal ? pick(m.goal, "status") : m.goal ? "active" : undefined;
    out.push(`goal: ${one(goal ?? "none", 24)}${budget !== undefined ? `, ${one(used, 16)} of ${one(budget, 16)} tokens used` : ""}`);
  }
  if (Array.isArray(m.labels) && m.labels.length) out.push(`labels: ${one(m.labels.join(", "), 400)}`);
  if (m.ownerSession) out.push(`session: ${one(m.ownerSession, 64)}`);
  if (m.summary && m.title) out.push(`summary: ${one(m.summary, 600)}`);
  const runs: any[] = Array.isArray(m.runs) ? m.runs : [];
  if (runs.length) {
    out.push("runs:", ...runs.slice(0, 20).map((r) => `  ${one(r?.runId, 64)} (${one(r?.mode ?? "run", 20)}${r?.status || r?.state ? ", " + one(r.status ?? r.state, 20) : ""})`));
  }
  const decisions: any[] = Array.isArray(m.decisions) ? m.decisions : [];
  if (decisions.length) {
    out.push(
      "decisions:",
      ...decisions.slice(0, 20).map((d) => `  ${one(d?.id, 64)}: ${one(d?.status ?? (d?.resolution ? "resolved" : "open"), 16)} — ${one(d?.title, 200)}${d?.resolution ? "; " + one(d.resolution, 200) : ""}`),
    );
  }
  const artifacts: any[] = Array.isArray(m.artifacts) ? m.artifacts : [];
  if (artifacts.length) out.push("artifacts:", ...artifacts.slice(0, 20).map((a) => `  ${one(a?.kind, 20)}: ${one(a?.path, 400)}`));
  const receipts: any[] = Array.isArray(m.receipts) ? m.receipts : [];
  if (receipts.length) {
    out.push("receipts:", ...receipts.slice(0, 20).map((r) => `  ${one(r?.kind, 20)} (${one(r?.status, 16)}): ${one(r?.title ?? "", 200)} ${one(r?.url, 400)}`));
  }
  if (m.nextStep) out.push(`next: ${one(m.nextStep, 400)}`);
  const open = decisions.find((d) => d && d.status === "open" && typeof d.id === "string");
  const id = one(pick(m, "id", "missionId"), 64);
  if (open) out.push(`resolve: {action: "mission.resolve-decision", missionId: "${id}", id: "${one(open.id, 64)}", summary: "..."}`);
  return out.join("\n");
}

function scheduleRender(sub: string, items: any[], p: any): string {
  const first = items[0];
  switch (sub) {
    case "list":
      return rows(items, scheduleLine, "(no schedules in this project)");
    case "history":
      return rows(items, fireLine, `(schedule ${one(p?.id, 64)} has not fired yet)`);
    case "run": {
      const fired = fireOf(first, p);
      return fired.runId
        ? `fired schedule ${one(fired.schedule.name, 128)}: run ${fired.runId} (${one(pick(first, "state", "outcome") ?? "started", 20)}); ` +
            `a notice comes when it ends. look: {action: "status", id: "${fired.runId}"}`
        : `schedule ${one(p?.id, 64)}: ${fireLine(first)}`;
    }
    case "run-due":
      return runDueText(first);
    case "delete":
      return `deleted schedule ${one(pick(first, "id") ?? p?.id, 64)}`;
    case "create":
      return `${scheduleText(first)}\nfires run detached by \`pisub schedule tick\` (a timer: \`pisub schedule install\`); ` +
        `look: {action: "schedule.show", id: "${one(pick(first, "id"), 64)}"}`;
    default:
      return scheduleText(first);
  }
}

// What a run-due did: {fired, ended, skipped, missed: [fire], waiting, busy: [schedule id], errors}.
function runDueText(report: any): string {
  if (!report || typeof report !== "object" || Array.isArray(report)) return readable(report);
  const out: string[] = [];
  const fires = (key: string, verb: string) => {
    const list: any[] = Array.isArray(report[key]) ? report[key] : [];
    for (const f of list.slice(0, 50)) out.push(`${verb} ${one(pick(f, "scheduleId") ?? "?", 64)}: ${fireLine(f)}`);
  };
  fires("fired", "fired");
  fires("ended", "ended");
  fires("skipped", "skipped");
  fires("missed", "missed");
  for (const id of Array.isArray(report.waiting) ? report.waiting.slice(0, 50) : []) out.push(`waiting ${one(id, 64)}: due, but its pi session is not open`);
  for (const id of Array.isArray(report.busy) ? report.busy.slice(0, 50) : []) out.push(`busy ${one(id, 64)}: another pisub process held its lock for the whole wait (60 s)`);
  for (const e of Array.isArray(report.errors) ? report.errors.slice(0, 50) : []) out.push(`error ${one(e, 400)}`);
  return out.join("\n") || "nothing was due";
}

function missionRender(sub: string, items: any[]): string {
  if (sub === "list") return rows(items, missionLine, "(no missions)");
  return missionText(items[0]);
}

// An option's value in an argv (`--name=value` or `--name value`, before the `--`), or null.
function option(argv: string[], name: string): string | null {
  for (let i = 0; i < argv.length && argv[i] !== "--"; i++) {
    if (argv[i].startsWith(name + "=")) return argv[i].slice(name.length + 1);
    if (argv[i] === name && i + 1 < argv.length) return argv[i + 1];
  }
  return null;
}

// The text of a listing or an object pisub printed, by the command that printed it.
function render(p: any, argv: string[], items: any[]): string {
  const first = items[0];
  const [verb, sub] = argv;
  if (verb === "status") {
    const view = option(argv, "--view");
    if (view === "fleet") return rows(items, fleetLine, "(nothing live)");
    if (view === "transcript") {
      const lines: unknown[] = Array.isArray(first?.lines) ? first.lines : [];
      const head = `transcript of run ${one(first?.runId, 64)} (last ${lines.length} lines)`;
      return lines.length ? `${head}:\n${lines.map((l) => (typeof l === "string" ? l : one(l))).join("\n")}` : `${head}: no output yet`;
    }
    return statusText(first);
  }
  if (verb === "list") return bareStatus(items);
  if (verb === "fleet") return rows(items, fleetLine, "(nothing live: no run or workflow child is running or queued)");
  if (verb === "models") return rows(items, modelLine, "(no models)");
  if (verb === "children") return rows(Array.isArray(first) ? first : items, childLine, "(no retained children)");
  if (verb === "workflow" && sub === "validate") return validateText(first);
  if (verb === "agents" && sub === "show") return agentText(first);
  if (verb === "schedule") return scheduleRender(sub, items, p);
  if (verb === "mission") return missionRender(sub, items);
  return items.map((i) => (typeof i === "string" ? i : readable(i))).join("\n") || "(nothing)";
}

// Inside a pisub run (its markers in this process's environment), a bare status shows only that
// run and the runs it started: a child cannot enumerate unrelated runs (the seed's fan-out-safe
// status). Elsewhere: every top-level run.
function insideRun(): string | null {
  const own = process.env.PISUB_RUN_ID;
  return own && RUN_ID.test(own) ? own : null;
}

function ownRuns(items: any[]): any[] {
  const own = insideRun();
  return own ? items.filter((s) => s && typeof s === "object" && (s.runId === own || s.parentRunId === own)) : items;
}

function bareStatus(mine: any[]): string {
  const own = insideRun();
  if (!own) return rows(mine, runLine, "(no runs)");
  const head = `inside run ${own}: this run and the runs it started (a bare status here shows no other run; give an id)`;
  return `${head}\n${rows(mine, runLine, "(none)")}`;
}

function waitGaveUp(p: any): Result {
  const s = seconds(p?.timeoutMs);
  const text = `run ${one(p?.id, 64)} is still going: the wait gave up after ${s ?? "?"} s and the run goes on. ` +
    `Wait again: {action: "wait", id: "${one(p?.id, 64)}"}; look: {action: "status", id: "${one(p?.id, 64)}"}`;
  return answer(text, { mode: "single", runId: p?.id, results: [], waiting: { done: false, reason: "timeout" } });
}

function isDir(dir: string | undefined): boolean {
  try {
    return typeof dir === "string" && fs.statSync(dir).isDirectory();
  } catch {
    return false;
  }
}

// Where pisub runs for a call: the call's cwd for a schedule or mission action that has no --cwd
// option of its own (pisub finds "this project" there), else pi's.
function cwdOf(p: any, planned: string[], ctx: any): string | undefined {
  const own = (planned[0] === "schedule" || planned[0] === "mission") && option(planned, "--cwd") === null;
  return own && typeof p?.cwd === "string" && p.cwd ? p.cwd : ctx?.cwd;
}

// The parent session's file (the source of context "fork"), or null when it has none.
function sessionFileOf(ctx: any): string | null {
  try {
    const file = ctx?.sessionManager?.getSessionFile?.();
    return typeof file === "string" && file ? file : null;
  } catch {
    return null;
  }
}

// share: true: the run's session exported to an HTML file (`pisub share RUN --json`); the seed's
// gist upload is not done (UNSUPPORTED_HERE: pisub uploads nothing; the file stays local).
const NO_GIST = "no gist upload: pisub keeps a session local (it may hold code, paths and secrets); share the file yourself";

async function shareRun(pi: any, runId: string, signal: any): Promise<any> {
  const argv = pisubArgv();
  try {
    const r = await pi.exec(argv[0], [...argv.slice(1), "share", "--json", "--", runId], { signal, timeout: 120_000 });
    if (r.code === 0) {
      const out = JSON.parse(String(r.stdout ?? "").trim().split("\n")[0]);
      return { path: out.path, gist: { code: "UNSUPPORTED_HERE", message: NO_GIST } };
    }
    return { error: cliError(String(r.stderr ?? ""), r.code) };
  } catch (e: any) {
    return { error: { code: "SUBAGENT_FAILED", message: String(e?.message ?? e) } };
  }
}

function shareText(share: any): string {
  if (share.error) return `\nshare: not exported (${share.error.code}: ${share.error.message})`;
  return `\nshare: the session is exported to ${share.path} (${NO_GIST})`;
}

// The parent session's key: its session file's canonical path (as leases name a session), so
// the same file reached through another path is the same session; else its session id.
function sessionKey(ctx: any): string {
  let id = "";
  try {
    const file = ctx?.sessionManager?.getSessionFile?.();
    if (typeof file === "string" && file) {
      try {
        id = fs.realpathSync(file);
      } catch {
        id = path.join(fs.realpathSync(path.dirname(file)), path.basename(file));
      }
    } else {
      id = `session-id:${ctx?.sessionManager?.getSessionId?.() ?? ""}`;
    }
  } catch {
    id = "";
  }
  return crypto.createHash("sha256").update(id || `pid-${process.pid}`).digest("hex").slice(0, 32);
}

// pi.exec gives a command no stdin; an inline workflow script reaches `pisub ... --workflow-script -`
// on its stdin through this instead (never in argv, where `ps` shows it and 128 KiB is the most,
// nor in a file). pi.exec's contract: {stdout, stderr, code (128 + signal when killed), killed};
// the signal or the timeout end it (TERM, then KILL 5 s later); output past MAX_EXEC_OUTPUT ends it.
const MAX_EXEC_OUTPUT = 64 << 20;

type ExecOptions = { signal?: any; cwd?: string; timeout: number };
type Exec = { stdout: string; stderr: string; code: number; killed: boolean };

export function execInput(command: string, args: string[], input: string, options: ExecOptions): Promise<Exec> {
  return new Promise((resolve, reject) => {
    const proc = spawn(command, args, { cwd: options.cwd, shell: false, stdio: ["pipe", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let size = 0;
    let killed = false;
    const kill = () => {
      if (killed) return;
      killed = true;
      proc.kill("SIGTERM");
      setTimeout(() => proc.exitCode === null && proc.signalCode === null && proc.kill("SIGKILL"), 5000).unref();
    };
    const timer = setTimeout(kill, options.timeout);
    if (options.signal?.aborted) kill();
    else options.signal?.addEventListener?.("abort", kill, { once: true });
    const take = (into: Buffer[]) => (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_EXEC_OUTPUT) kill();
      else into.push(chunk);
    };
    proc.stdout.on("data", take(out));
    proc.stderr.on("data", take(err));
    proc.stdin.on("error", () => {}); // pisub refused the call before reading: its answer says why
    proc.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    proc.on("close", (code, sig) => {
      clearTimeout(timer);
      options.signal?.removeEventListener?.("abort", kill);
      const signalled = sig ? 128 + (os.constants.signals[sig] ?? 0) : 1;
      resolve({ stdout: Buffer.concat(out).toString("utf8"), stderr: Buffer.concat(err).toString("utf8"), code: code ?? signalled, killed });
    });
    proc.stdin.end(input, "utf8");
  });
}

function privateDir(dir: string): void {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
}

function writeAtomic(file: string, text: string): void {
  const tmp = `${file}.tmp-${process.pid}-${crypto.randomBytes(4).toString("hex")}`;
  fs.writeFileSync(tmp, text, { mode: 0o600, flag: "wx" });
  fs.renameSync(tmp, file);
}

// A small regular file's text, or null: never follows a symlink, never blocks on a FIFO (a run's
// files may be anything a child planted).
function readSmall(file: string, limit: number): string | null {
  let fd = -1;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
    const st = fs.fstatSync(fd);
    if (!st.isFile() || st.size > limit) return null;
    const buf = Buffer.alloc(st.size);
    const n = fs.readSync(fd, buf, 0, st.size, 0);
    return buf.subarray(0, n).toString("utf8");
  } catch {
    return null;
  } finally {
    if (fd >= 0) fs.closeSync(fd);
  }
}

function readJson(file: string, limit: number): any {
  const text = readSmall(file, limit);
  if (text === null) return null;
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

const RUN_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const MAX_STATUS = 1 << 20;
const MAX_RESULT = 8 << 20;

// A ledger entry: a run this session started (agent), or a schedule's fire (schedule, quiet:
// pisub writes those for the schedule's owner session; the tool for a manual fire from here).
type Pending = { runId: string; agent: string | null; share: boolean; schedule: { id: string; name: string } | null; quiet: boolean };

function scheduleOf(value: any): { id: string; name: string } | null {
  if (!value || typeof value !== "object" || typeof value.id !== "string" || !SCHEDULE_ID.test(value.id)) return null;
  const name = typeof value.name === "string" && value.name.trim() ? value.name : value.id;
  return { id: value.id, name: name.slice(0, 128) };
}

class Notices {
  home: string | null = null;
  dir: string | null = null;
  timer: any = null;
  polls = 0;
  busy = false;

  constructor(private pi: any) {}

  // The ledger of this session; polled from now on (cheap: one readdir a second), so that
  // runs another pi on the same session started are noticed too.
  bind(home: string, key: string): void {
    this.home = home;
    this.dir = path.join(home, "notices", key);
    this.start();
  }

  runDir(runId: string): string {
    return path.join(this.home as string, "runs", runId); // never a path the ledger names
  }

  record(runId: string, agent: string | undefined, share = false): void {
    if (!this.dir || !RUN_ID.test(runId)) return;
    privateDir(this.dir);
    writeAtomic(path.join(this.dir, `${runId}.json`), JSON.stringify({ v: 1, runId, agent: agent ?? null, ...(share ? { share } : {}) }) + "\n");
  }

  // A schedule's fire started from this session (schedule.run): noticed as the schedule's, once.
  recordFire(runId: string, schedule: unknown, quiet: boolean): void {
    const owner = scheduleOf(schedule);
    if (!this.dir || !RUN_ID.test(runId) || !owner) return;
    privateDir(this.dir);
    const file = path.join(this.dir, `${runId}.json`);
    if (fs.existsSync(file)) return; // pisub wrote it (this session owns the schedule)
    writeAtomic(file, JSON.stringify({ v: 1, runId, agent: null, schedule: owner, quiet }) + "\n");
  }

  // Mark a run noticed without a message (its result was returned to the model directly).
  settle(runId: string): void {
    if (!this.dir || !RUN_ID.test(runId)) return;
    try {
      fs.closeSync(fs.openSync(path.join(this.dir, `${runId}.sent`), "wx", 0o600));
    } catch {
      // noticed already
    }
  }

  pending(): Pending[] {
    if (!this.dir) return [];
    let names: string[] = [];
    try {
      names = fs.readdirSync(this.dir);
    } catch {
      return [];
    }
    const sent = new Set(names.filter((n) => n.endsWith(".sent")).map((n) => n.slice(0, -5)));
    const out: Pending[] = [];
    for (const name of names) {
      const runId = name.endsWith(".json") ? name.slice(0, -5) : "";
      if (!RUN_ID.test(runId) || sent.has(runId)) continue;
      const rec = readJson(path.join(this.dir, name), 64 * 1024);
      if (rec && typeof rec === "object") {
        out.push({
          runId,
          agent: typeof rec.agent === "string" ? rec.agent : null,
          share: rec.share === true,
          schedule: scheduleOf(rec.schedule),
          quiet: rec.quiet === true,
        });
      }
    }
    return out;
  }

  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.poll(), POLL_MS);
    this.timer.unref?.();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  async poll(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const runs = this.pending();
      if (runs.length) this.polls++;
      for (const run of runs) await this.check(run);
    } finally {
      this.busy = false;
    }
  }

  async check(run: Pending): Promise<void> {
    const dir = this.runDir(run.runId);
    try {
      fs.lstatSync(dir);
    } catch {
      return this.notify(run, "gone", "(its run directory was removed before its end was seen)");
    }
    let state = readState(dir);
    if (!TERMINAL.has(state ?? "") && this.polls % REPAIR_EVERY === 0) {
      const argv = pisubArgv(); // a reader's look repairs a run whose runner died
      await this.pi.exec(argv[0], [...argv.slice(1), "status", "--json", "--", run.runId], { timeout: 30_000 }).catch(() => null);
      state = readState(dir);
    }
    if (TERMINAL.has(state ?? "")) {
      const result = readJson(path.join(dir, "result.json"), MAX_RESULT);
      let head = String(result?.content?.[0]?.text ?? "").slice(0, HEAD_CHARS);
      if (run.share && !fs.existsSync(path.join(this.dir as string, `${run.runId}.sent`))) {
        head += shareText(await shareRun(this.pi, run.runId, undefined));
      }
      this.notify(run, state as string, head);
    }
  }

  notify(run: Pending, state: string, head: string): void {
    if (!this.dir) return;
    try {
      fs.closeSync(fs.openSync(path.join(this.dir, `${run.runId}.sent`), "wx", 0o600));
    } catch {
      return; // another instance (or an earlier life of this session) sent it
    }
    const who = run.agent ? ` (${termSafe(run.agent, true)})` : "";
    // (a default name "schedule ID" is not said twice)
    const name = termSafe(run.schedule?.name ?? "", true).replace(/^schedule\s+(?=\S)/i, "");
    const line = run.schedule
      ? `pisub: schedule ${name} fired run ${run.runId}: ended ${state}.`
      : `pisub: run ${run.runId}${who} ended ${state}.`;
    const text = termSafe(`${line}${head ? "\n" + head : ""}`);
    // a quiet schedule's successful fire is shown without starting a turn; anything else wakes the parent
    const quietly = run.schedule !== null && run.quiet && state === "complete";
    const details = { runId: run.runId, state, ...(run.schedule ? { schedule: run.schedule, quiet: run.quiet } : {}) };
    this.pi.sendMessage(
      { customType: "pisub-notice", content: text, display: true, details },
      { triggerTurn: !quietly, deliverAs: "followUp" },
    );
  }
}

function readState(runDir: string): string | null {
  const status = readJson(path.join(runDir, "status.json"), MAX_STATUS);
  return typeof status?.state === "string" ? status.state : null;
}

// ---- Presence: `<ledger>/presence/<pid>.json` = {v: 1, pid, startTicks} while this pi has the
// session open (written on session_start, removed on session_shutdown): a sessionOnly schedule
// fires only while one names a live process (pisub checks the pid and its start time).

// The start time (field 22 of /proc/PID/stat, in clock ticks) from a stat line; the process name
// (field 2, in parentheses) may hold spaces and parentheses, so fields are counted after the last ")".
export function startTicksOf(stat: string): number | null {
  const close = stat.lastIndexOf(")");
  if (close < 0) return null;
  const fields = stat.slice(close + 1).trim().split(/\s+/);
  const ticks = Number(fields[19]); // fields[0] is field 3
  return /^\d+$/.test(fields[19] ?? "") && Number.isSafeInteger(ticks) ? ticks : null;
}

function ticksOf(pid: number): number | null {
  try {
    return startTicksOf(fs.readFileSync(`/proc/${pid}/stat`, "utf8")); // /proc files have no size: read to the end
  } catch {
    return null;
  }
}

// This process's presence file, after removing the ones that name a dead process (a pi killed
// with -9 never removed its own); null when it cannot be written (no /proc, no home).
export function writePresence(ledger: string | null, pid = process.pid): string | null {
  if (!ledger) return null;
  const ticks = ticksOf(pid);
  if (ticks === null) return null;
  const dir = path.join(ledger, "presence");
  try {
    privateDir(ledger);
    privateDir(dir);
    const st = fs.lstatSync(dir);
    if (!st.isDirectory()) return null; // a symlink planted there is not followed
    if ((st.mode & 0o777) !== 0o700) fs.chmodSync(dir, 0o700);
    for (const name of fs.readdirSync(dir)) {
      const m = /^(\d{1,10})\.json$/.exec(name);
      if (!m || Number(m[1]) === pid) continue;
      const rec = readJson(path.join(dir, name), 4096);
      const other = Number(m[1]);
      if (rec && rec.pid === other && Number.isSafeInteger(rec.startTicks) && ticksOf(other) === rec.startTicks) continue;
      fs.rmSync(path.join(dir, name), { force: true });
    }
    const file = path.join(dir, `${pid}.json`);
    writeAtomic(file, JSON.stringify({ v: 1, pid, startTicks: ticks }) + "\n");
    return file;
  } catch {
    return null;
  }
}

function removePresence(file: string | null): void {
  if (!file) return;
  try {
    fs.rmSync(file, { force: true });
  } catch {
    // gone already
  }
}

// ---- Goal missions: after a parent turn settles (pi idle), `pisub mission next --session-key
// KEY --json` says whether a goal mission of this session has a continuation notice; one is sent
// (custom type pisub-mission, starting a turn). At most one per idle turn and none while a tool
// call of this extension runs. pisub gives a notice once per progress of its mission (it records
// it as given), so what it answers is always sent: a notice never repeats without progress.
class Goals {
  running = 0; // tool calls of this extension in flight
  turn = 0; // agent runs started in this session
  checked = -1; // the turn whose end was looked at
  settledSeen = false; // this pi has agent_settled (older ones: agent_end, then idle)

  constructor(
    private pi: any,
    private notices: Notices,
  ) {}

  started(): void {
    this.turn++;
  }

  // not awaited: pi defers what is asked during agent_settled until its handlers return
  settled(ctx: any): void {
    this.settledSeen = true;
    void this.check(ctx);
  }

  ended(ctx: any): void {
    if (this.settledSeen) return;
    const timer = setTimeout(() => {
      if (!this.settledSeen && ctx?.isIdle?.() !== false) void this.check(ctx);
    }, 300);
    timer.unref?.();
  }

  async check(ctx: any): Promise<void> {
    if (this.running > 0 || this.checked === this.turn || !this.notices.home) return;
    if (ctx?.isIdle?.() === false) return; // a turn began already: its end looks
    this.checked = this.turn;
    if (!hasMissions(this.notices.home)) return; // no mission anywhere: no process per turn
    const argv = pisubArgv();
    let out: any = null;
    try {
      const args = [...argv.slice(1), "mission", "next", "--json", `--session-key=${sessionKey(ctx)}`];
      const r = await this.pi.exec(argv[0], args, { cwd: ctx?.cwd, timeout: 30_000 });
      if (r.code !== 0) return;
      out = JSON.parse(String(r.stdout ?? "").trim().split("\n")[0]);
    } catch {
      return; // a pisub without missions, a broken answer: no notice
    }
    const notice = typeof out?.notice === "string" ? out.notice.trim() : "";
    if (!notice) return;
    // given is given (pisub marked it): a turn that began meanwhile gets it as a follow-up
    this.pi.sendMessage(
      {
        customType: "pisub-mission",
        content: termSafe(notice.slice(0, 500)),
        display: true,
        details: {
          missionId: typeof out?.missionId === "string" ? out.missionId : null,
          reason: typeof out?.reason === "string" ? out.reason : null,
        },
      },
      { triggerTurn: true, deliverAs: "followUp" },
    );
  }
}

function hasMissions(home: string): boolean {
  try {
    return fs.readdirSync(path.join(home, "missions")).length > 0;
  } catch {
    return false;
  }
}

async function homeOf(pi: any): Promise<string | null> {
  const argv = pisubArgv();
  try {
    const r = await pi.exec(argv[0], [...argv.slice(1), "home"], { timeout: 30_000 });
    return r.code === 0 ? r.stdout.trim() : null;
  } catch {
    return null;
  }
}

export default function (pi: any) {
  const notices = new Notices(pi);
  const goals = new Goals(pi, notices);
  let presence: string | null = null;

  pi.on("session_start", async (_event: any, ctx: any) => {
    const home = await homeOf(pi);
    if (home) {
      notices.bind(home, sessionKey(ctx));
      presence = writePresence(notices.dir);
    }
  });
  pi.on("session_shutdown", async () => {
    notices.stop();
    removePresence(presence);
    presence = null;
  });
  pi.on("agent_start", async () => goals.started());
  pi.on("agent_end", async (_event: any, ctx: any) => goals.ended(ctx));
  pi.on("agent_settled", async (_event: any, ctx: any) => goals.settled(ctx));

  registerCommands(pi, notices);

  pi.registerTool({
    name: "subagent",
    label: "Subagent",
    description:
      "Delegate work to a sub-agent run by pisub (detached; it survives this session). Start a run with agent + task " +
      "(background by default: a notice arrives when it ends; async: false waits), or a workflow (workflowScript, " +
      "workflowScriptPath; each in a mission unless mission: false, missionId shares one). Fire a workflow later or every " +
      "interval with action schedule.create (at | every). Manage with action: " +
      ACTIONS.join(", ") + ". action guide explains everything (topic missions: missions and schedules).",
    promptSnippet: "Start and steer background sub-agent runs (pisub)",
    parameters: PARAMETERS,
    async execute(_id: string, params: any, signal: any, onUpdate: any, ctx: any): Promise<Result> {
      goals.running++;
      try {
        return await execute(params, signal, onUpdate, ctx);
      } catch (e: any) {
        // a bug here must be an answer, never a crash of the extension
        return failure("INTERNAL_ERROR", termSafe(String(e?.message ?? e), true).slice(0, 500));
      } finally {
        goals.running--;
      }
    },
  });

  async function execute(params: any, signal: any, onUpdate: any, ctx: any): Promise<Result> {
    const planned = plan(params ?? {}, { sessionFile: sessionFileOf(ctx), sessionKey: sessionKey(ctx) });
    if (!Array.isArray(planned)) return planned;
    if (planned[0] === "wait") return waitFor(params, planned, params.id, signal, onUpdate);
    const argv = pisubArgv();
    const input = inputOf(params, planned);
    let r: any;
    const cwd = cwdOf(params, planned, ctx);
    if (cwd !== ctx?.cwd && !isDir(cwd)) return invalid(`cwd: ${shown(cwd)} is not a directory`);
    try {
      const options = { signal, cwd, timeout: 120_000 };
      const command = [...argv.slice(1), ...planned];
      r = input === null ? await pi.exec(argv[0], command, options) : await execInput(argv[0], command, input, options);
    } catch (e: any) {
      return failure("LAUNCH_FAILED", `cannot run pisub (${argv[0]}): ${e?.message ?? e}`);
    }
    const result = shape(params, planned, r.code, r.stdout ?? "", r.stderr ?? "");
    if (planned[0] === "schedule" && planned[1] === "run" && !result.details.error) {
      // a manual fire from here: its end is noticed in this session (the schedule's owner session
      // gets its own entry from pisub; the same run is noticed once per session)
      const fired = result.details.fired;
      if (!notices.dir) {
        const home = await homeOf(pi);
        if (home) notices.bind(home, sessionKey(ctx));
      }
      if (fired && typeof fired.runId === "string") {
        try {
          notices.recordFire(fired.runId, fired.schedule, params?.quiet === true);
        } catch {
          // the answer names the run; its notice is best effort
        }
      }
      return result;
    }
    const started = planned[0] === "run" || planned[0] === "resume";
    if (!started || result.details.error) return result;
    const runId = result.details.runId;
    if (!notices.dir) {
      const home = await homeOf(pi);
      if (home) notices.bind(home, sessionKey(ctx));
    }
    try {
      notices.record(runId, params?.agent, params?.share === true); // first: whatever happens to the wait, one notice comes
    } catch (e: any) {
      result.content[0].text += termSafe(` (no completion notice: ${e?.message ?? e})`, true);
    }
    const later = " share: its session is exported to an HTML file when it ends (the notice names it).";
    if (params?.async !== false) {
      if (params?.share === true) result.content[0].text += later;
      return result;
    }
    const waited = await waitFor(params, ["wait", "--json", "--", runId], runId, signal, onUpdate);
    if (waited.details?.waiting) {
      const text = waited.content[0].text + (params?.share === true ? later : "");
      return { ...result, content: [{ type: "text", text }] }; // the run goes on: its notice comes
    }
    if (params?.share === true && !waited.details?.error) {
      waited.details = { ...waited.details, share: await shareRun(pi, runId, signal) };
      waited.content[0].text += termSafe(shareText(waited.details.share));
    }
    return waited;
  }

  // `pisub wait` for a run (async: false, or the wait action): the run's result; while it
  // works, streaming updates (onUpdate) from its files. An interrupted wait (the signal) or one
  // that timed out leaves the run going and says so.
  async function waitFor(params: any, planned: string[], id: string, signal: any, onUpdate: any): Promise<Result> {
    const argv = pisubArgv();
    const runDir = RUN_ID.test(id) && notices.home ? notices.runDir(id) : await locate(id);
    const exec = pi.exec(argv[0], [...argv.slice(1), ...planned], { signal });
    const stream = runDir && typeof onUpdate === "function" ? follow(runDir, exec, signal, onUpdate) : null;
    let waited: any = null;
    try {
      waited = await exec;
    } catch {
      waited = null;
    } finally {
      await stream;
    }
    const out = String(waited?.stdout ?? "");
    if (waited && (waited.code === 0 || waited.code === 1) && out.trim().startsWith("{")) {
      const result = shape(params, ["wait"], waited.code, out, waited.stderr ?? "");
      const runId = result.details?.runId;
      if (typeof runId === "string") notices.settle(runId); // its result is this answer: no notice on top
      return result;
    }
    if (waited && waited.code === 3) return shape(params, ["wait"], 3, out, waited.stderr ?? "");
    if (waited && !signal?.aborted && !waited.killed) {
      // pisub answered with an error (a run it cannot read, ...): its code and line, not "interrupted"
      return shape(params, ["wait"], waited.code === 0 ? 1 : waited.code, out, waited.stderr ?? "");
    }
    const text = `the wait for run ${one(id, 64)} was interrupted before the run ended; the run goes on in the background ` +
      `(a notice comes when it ends if this session started it; wait again: {action: "wait", id: "${one(id, 64)}"}).`;
    return answer(text, { mode: "single", runId: id, results: [], waiting: { done: false, reason: "interrupted" } });
  }

  // A run id (or unique prefix)'s directory, from `pisub status` (null: unknown: no streaming).
  async function locate(id: string): Promise<string | null> {
    if (!notices.home) {
      const home = await homeOf(pi);
      if (!home) return null;
      notices.home = home;
    }
    if (RUN_ID.test(id)) return notices.runDir(id);
    const argv = pisubArgv();
    const r = await pi.exec(argv[0], [...argv.slice(1), "status", "--json", "--", id], { timeout: 30_000 }).catch(() => null);
    const runId = parseLines(String(r?.stdout ?? ""))[0]?.runId;
    return typeof runId === "string" && RUN_ID.test(runId) ? notices.runDir(runId) : null;
  }
}

// Streaming updates while a foreground wait lasts: every STREAM_MS the run's status.json and
// its pi session (files only: no process per poll, never blocking: readSmall) become a partial
// result `{content, details: {mode: "single", runId, results: [], streaming: {displayItems,
// usage, turnCount}}}`, sent when it changed. Ends when the wait ends or the call is aborted.
const STREAM_MS = 1000;

export function streamingUpdate(runDir: string): Result | null {
  const status = readJson(path.join(runDir, "status.json"), MAX_STATUS);
  if (!status || typeof status !== "object") return null;
  const steps: any[] = Array.isArray(status.steps) ? status.steps.filter((s: any) => s && typeof s === "object") : [];
  const turnCount = steps.reduce((n, s) => n + (Number.isFinite(s.turnCount) ? s.turnCount : 0), 0);
  const tools = steps.reduce((n, s) => n + (Number.isFinite(s.toolCount) ? s.toolCount : 0), 0);
  const live = steps.find((s) => s.status === "running") ?? steps[steps.length - 1];
  const items = sessionItems(status.sessionFile) ?? [];
  const usage = status.usage && typeof status.usage === "object" ? status.usage : { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, cost: 0, turns: turnCount };
  const now = live?.currentTool ? ` · now ${one(live.currentTool?.name ?? live.currentTool, 64)}` : "";
  const started = Date.parse(String(status.startedAt ?? ""));
  const age = Number.isFinite(started) ? ` · ${Math.max(0, Math.round((Date.now() - started) / 1000))} s` : "";
  const lines = [`run ${one(status.runId, 64)} (${one(status.agent, 64)}): ${one(status.state, 20)}${age} · turn ${turnCount} · ${tools} tool calls${now}`];
  const recent: unknown[] = Array.isArray(live?.recentOutput) ? live.recentOutput : [];
  lines.push(...recent.slice(-3).map((l) => "  " + one(l, 300)));
  const last = items[items.length - 1];
  if (!recent.length && last) lines.push("  " + (last.type === "text" ? one(last.text, 300) : `${last.name} ${one(last.args, 200)}`));
  return answer(lines.join("\n"), {
    mode: "single",
    runId: status.runId,
    results: [],
    streaming: { displayItems: items, usage, turnCount },
  });
}

async function follow(runDir: string, done: Promise<unknown>, signal: any, onUpdate: any): Promise<void> {
  let over = false;
  done.then(() => (over = true), () => (over = true));
  let last = "";
  while (!over && !signal?.aborted) {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, STREAM_MS);
      done.then(() => { clearTimeout(timer); resolve(); }, () => { clearTimeout(timer); resolve(); });
    });
    if (over || signal?.aborted) return;
    try {
      // the run's files are a child's to write: nothing in them may end the wait (or pi)
      const update = streamingUpdate(runDir);
      const key = update ? JSON.stringify(update) : "";
      if (!update || key === last) continue;
      last = key;
      onUpdate(update);
    } catch {
      // an unreadable update, or a renderer's trouble, never ends the wait
    }
  }
}

// ---- Slash commands (the seed's): /subagents-guide [topic], /subagents-stop [RUN [CHILD]] (a
// picker of this session's running runs), /subagents-steer [--child K] RUN [--child K] MESSAGE,
// /subagents-refine AGENT [GUIDANCE | --show | --rollback] (`pisub agents refine`).
// What they say goes to pi's UI (a notification; the guide as a message in the session), or,
// with no UI (print and JSON modes), into the session as a message.
const GUIDE_TOPICS = [
  "overview", "workflows", "agents", "control", "acceptance", "configuration", "tool-reference", "models",
  "missions", "observability", "watchdog", "extension-api",
];

// `/subagents-steer` arguments: flags (`--child K`) only before the message; `--` ends them.
export function parseSteer(args: string): { run: string; child: string | null; message: string } | string {
  let rest = String(args ?? "").trim();
  let run: string | null = null;
  let child: string | null = null;
  while (rest) {
    const flagged = /^--child(?:=(\S+)|\s+(\S+))\s*/.exec(rest);
    if (flagged) {
      if (child !== null) return "--child given twice";
      child = flagged[1] ?? flagged[2];
      rest = rest.slice(flagged[0].length);
      continue;
    }
    if (rest === "--" || rest.startsWith("-- ")) {
      rest = rest.slice(2).trimStart();
      break;
    }
    if (run !== null) break;
    const word = /^(\S+)\s*/.exec(rest) as RegExpExecArray;
    run = word[1];
    rest = rest.slice(word[0].length);
  }
  if (!run || !rest) return "usage: /subagents-steer [--child KEY] RUN MESSAGE";
  if (!ID.test(run)) return `not a run id: ${one(run, 80)}`;
  if (child !== null && !CHILD.test(child)) return `not a child key or index: ${one(child, 80)}`;
  return { run, child, message: rest };
}

function registerCommands(pi: any, notices: Notices): void {
  const pisub = async (args: string[], ctx: any): Promise<any> => {
    const argv = pisubArgv();
    return pi.exec(argv[0], [...argv.slice(1), ...args], { cwd: ctx?.cwd, timeout: 60_000 }).catch((e: any) => ({
      code: -1,
      stdout: "",
      stderr: `pisub: cannot run pisub (${argv[0]}): ${e?.message ?? e} [LAUNCH_FAILED]`,
    }));
  };
  const tell = (ctx: any, text: string, level: "info" | "warning" | "error" = "info"): void => {
    const safe = termSafe(text);
    if (ctx?.hasUI && ctx.ui?.notify) ctx.ui.notify(safe, level);
    else pi.sendMessage({ customType: "pisub-command", content: safe, display: true, details: { level } }, { triggerTurn: false });
  };
  const failed = (r: any): string => {
    const err = cliError(String(r?.stderr ?? ""), Number(r?.code ?? 1));
    return `${err.code}: ${err.message}`;
  };
  // `pisub schedule list --json`: the ones not paused (an older pisub, an error: none)
  const activeSchedules = async (ctx: any): Promise<any[]> => {
    const r = await pisub(["schedule", "list", "--json"], ctx);
    if (r.code !== 0) return [];
    const items = parseLines(String(r.stdout ?? ""));
    const all: any[] = items.length === 1 && Array.isArray(items[0]) ? items[0] : items;
    const inactive = new Set(["paused", "done", "completed", "complete", "expired", "fired", "deleted"]);
    return all.filter((sc) => sc && typeof sc === "object" && typeof sc.id === "string" && SCHEDULE_ID.test(sc.id) && !inactive.has(scheduleState(sc)));
  };
  const stop = async (ctx: any, run: string, child: string | null): Promise<void> => {
    const argv = ["stop", "--json", "--wait", "3", "--reason", "/subagents-stop"];
    if (child !== null) argv.push("--child", child);
    const r = await pisub([...argv, "--", run], ctx);
    const out = String(r.stdout ?? "").trim();
    if (!out.startsWith("{")) return tell(ctx, failed(r), "error");
    const result = shape({ id: run, childId: child ?? undefined }, argv, r.code, out, String(r.stderr ?? ""));
    tell(ctx, result.content[0].text, result.details?.receipt?.state === "delivered" ? "info" : "warning");
  };

  pi.registerCommand("subagents-guide", {
    description: "Show a pisub guide: /subagents-guide [topic]",
    getArgumentCompletions: (prefix: string) => {
      const found = GUIDE_TOPICS.filter((t) => t.startsWith(String(prefix ?? "").trim()));
      return found.length ? found.map((t) => ({ value: t, label: t })) : null;
    },
    handler: async (args: string, ctx: any) => {
      const topic = String(args ?? "").trim();
      const r = await pisub(topic ? ["guide", "--", topic] : ["guide"], ctx);
      if (r.code !== 0) return tell(ctx, failed(r), "error");
      pi.sendMessage(
        { customType: "pisub-guide", content: termSafe(String(r.stdout ?? "").trim()), display: true, details: { topic: topic || "overview" } },
        { triggerTurn: false },
      );
    },
  });

  pi.registerCommand("subagents-stop", {
    description: "Stop a run: /subagents-stop [RUN [CHILD]] (no run: pick one of this session's running runs)",
    handler: async (args: string, ctx: any) => {
      const words = String(args ?? "").trim().split(/\s+/).filter(Boolean);
      if (words.length > 2) return tell(ctx, "usage: /subagents-stop [RUN [CHILD]]", "error");
      if (words.length) {
        if (!ID.test(words[0])) return tell(ctx, `not a run id: ${one(words[0], 80)}`, "error");
        if (words[1] !== undefined && !CHILD.test(words[1])) return tell(ctx, `not a child key or index: ${one(words[1], 80)}`, "error");
        return stop(ctx, words[0], words[1] ?? null);
      }
      if (!notices.dir) {
        const home = await homeOf(pi);
        if (home) notices.bind(home, sessionKey(ctx));
      }
      const running = notices.pending().filter((r) => !TERMINAL.has(readState(notices.runDir(r.runId)) ?? "complete"));
      // this project's schedules that still fire: listed as schedules, and paused (never stopped)
      const schedules = await activeSchedules(ctx);
      if (!running.length && !schedules.length) {
        return tell(ctx, "no run started from this session is running, and no schedule here is active (/subagents-stop RUN stops any run)");
      }
      const who = (r: Pending) => (r.agent ? termSafe(r.agent, true).slice(0, 64) : r.schedule ? `schedule ${termSafe(r.schedule.name, true).slice(0, 64)}` : "?");
      const label = (r: Pending) => `${r.runId}  ${who(r)}  ${readState(notices.runDir(r.runId)) ?? "?"}`;
      const scheduleLabel = (sc: any) => `[schedule] ${scheduleLine(sc)}  (pauses it)`;
      if (!ctx?.hasUI || !ctx.ui?.select) {
        const lines = running.map((r) => `${label(r)}\n  subagent({action: "stop", id: "${r.runId}"})  or  /subagents-stop ${r.runId}`);
        lines.push(...schedules.map((sc) => `${scheduleLabel(sc)}\n  subagent({action: "schedule.pause", id: "${one(sc.id, 64)}"})`));
        return tell(ctx, `running runs of this session and active schedules (no UI to pick from here):\n${lines.join("\n")}`);
      }
      const options = [...running.map(label), ...schedules.map(scheduleLabel)];
      const picked = await ctx.ui.select("Stop which run? (a stop is final: not a pause; a schedule is paused)", options);
      const index = options.indexOf(picked);
      if (index < 0) return tell(ctx, "nothing stopped");
      if (index >= running.length) {
        const id = String(schedules[index - running.length].id);
        const sure = ctx.ui.confirm ? await ctx.ui.confirm(`Pause schedule ${id}?`, "It fires no more until schedule.resume; a run it started goes on.") : true;
        if (!sure) return tell(ctx, "nothing paused");
        const r = await pisub(["schedule", "pause", "--json", "--", id], ctx);
        if (r.code !== 0) return tell(ctx, failed(r), "error");
        return tell(ctx, `paused schedule ${one(id, 64)} (resume it: subagent({action: "schedule.resume", id: "${one(id, 64)}"}))`);
      }
      const runId = running[index].runId;
      const sure = ctx.ui.confirm ? await ctx.ui.confirm(`Stop run ${runId}?`, "It ends for good; start a new run to redo it.") : true;
      if (!sure) return tell(ctx, "nothing stopped");
      return stop(ctx, runId, null);
    },
  });

  pi.registerCommand("subagents-refine", {
    description: "Refine an agent in this project: /subagents-refine AGENT [GUIDANCE | --show | --rollback]",
    handler: async (args: string, ctx: any) => {
      const text = String(args ?? "").trim();
      const agent = /^\S+/.exec(text)?.[0] ?? "";
      let rest = text.slice(agent.length).trim();
      if (!NAME.test(agent)) return tell(ctx, "usage: /subagents-refine AGENT [GUIDANCE | --show | --rollback]", "error");
      const refine = async (argv: string[]) => {
        const r = await pisub(["agents", "refine", ...argv, "--", agent], ctx);
        return r.code === 0 ? tell(ctx, String(r.stdout ?? "").trim()) : tell(ctx, failed(r), "error");
      };
      if (rest === "--show") return refine(["--show"]);
      if (rest === "--rollback") return refine(["--rollback"]);
      if (!rest && ctx?.hasUI && ctx.ui?.input) {
        rest = String((await ctx.ui.input(`Guidance for ${agent} in this project`, "what it should do differently here")) ?? "").trim();
      }
      if (!rest) return tell(ctx, `nothing refined: give the guidance (/subagents-refine ${agent} GUIDANCE), or --show / --rollback`);
      return refine([`--config=${JSON.stringify({ guidance: rest, reason: "/subagents-refine" })}`]);
    },
  });

  pi.registerCommand("subagents-steer", {
    description: "Steer a run: /subagents-steer [--child KEY] RUN MESSAGE (no pause-and-resume recovery)",
    handler: async (args: string, ctx: any) => {
      const parsed = parseSteer(args);
      if (typeof parsed === "string") return tell(ctx, parsed, "error");
      const argv = ["steer", "--json", "--wait", "3", "--no-recover"];
      if (parsed.child !== null) argv.push("--child", parsed.child);
      const r = await pisub([...argv, "--", parsed.run, parsed.message], ctx);
      const out = String(r.stdout ?? "").trim();
      if (!out.startsWith("{")) return tell(ctx, failed(r), "error");
      const result = shape({ id: parsed.run, childId: parsed.child ?? undefined }, argv, r.code, out, String(r.stderr ?? ""));
      const state = result.details?.receipt?.state;
      tell(ctx, result.content[0].text, state === "delivered" || state === "queued" || state === "scheduled" ? "info" : "warning");
    },
  });
}
