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
import * as crypto from "node:crypto";
import * as fs from "node:fs";
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
];
const AGENT_EDITS = new Set(["update", "delete", "eject", "disable", "enable", "reset"]);

const str = (description: string) => ({ type: "string", description });
const num = (description: string) => ({ type: "number", description });
const any = (description: string) => ({ description });

// No `additionalProperties: false`: pi's own validation would echo an unknown key raw (an escape
// sequence in a key reached the terminal); checkParams refuses unknown keys, escaped.
export const PARAMETERS = {
  type: "object",
  properties: {
    action: str(`One of: ${ACTIONS.join(", ")}. Omit it to start a run (agent + task).`),
    agent: str("The agent to run (pisub agents list)."),
    task: str("What the agent should do."),
    async: { type: "boolean", description: "false: wait for the run and return its result (default: background)." },
    id: str("A run id or a unique prefix (status, wait, steer, interrupt, stop, resume, get)."),
    childId: str("A workflow child's key or index (status, steer, interrupt, stop, get)."),
    message: str("The message of a steer, follow_up or resume."),
    mode: str("steer: steer | follow_up | auto."),
    index: num("resume: the workflow child's index whose session continues."),
    model: str("pi agents: provider/id."),
    cwd: str("The working directory."),
    timeoutMs: num("The run's timeout in milliseconds (wait: how long to wait; the run goes on after)."),
    acceptance: any('"auto" or {level, verify?, review?, ...} (see guide acceptance).'),
    gate: str("A command that must pass on the child's tree."),
    toolBudget: any("{hard, soft?, block?}"),
    toolTimeoutMs: num("Milliseconds one tool call may take."),
    usageBudget: any("Workflows: {tokens?: {soft?, hard}, costUsd?: {soft?, hard}}."),
    workflowScriptPath: str("Start the workflow script at this path."),
    context: str('A run: "fresh" (default). "fork" is for workflow children: runs.run(key, ..., context="fork").'),
    lanes: str("Start the lanes manifest at this path."),
    view: str("status: summary | fleet | transcript."),
    lines: num("status view transcript: lines (at most 500)."),
    reason: str("interrupt / stop: why."),
    topic: str("guide: overview, workflows, agents, control, acceptance, configuration, tool-reference, models."),
    path: str("validate: the workflow script to check."),
    parent: str("children.list: the workflow run."),
    capabilities: { type: "boolean", description: "list: one compact line per agent with what it can do." },
    agentScope: str("Agent actions: user or project (only needed when both scopes have the agent)."),
    config: any("create / update: frontmatter keys (camelCase), systemPrompt, scope (create); false or \"\" clears a key."),
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

function flag(argv: string[], name: string, value: string | null | undefined): void {
  if (value !== null && value !== undefined && value !== "") argv.push(name, value);
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
  const close = ACTIONS.filter((known) => distance(known, action) === 1);
  return close.length === 1 ? close[0] : null;
}

const ID = /^[0-9a-fA-F][0-9a-fA-F-]{0,63}$/;
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

// Checked values for the argv: a run id (or prefix) and an agent name have their own shapes,
// so nothing the model sends can be taken for an option; positionals also follow a `--`.
function bad(what: string, value: unknown): Result {
  return failure("INVALID_INPUT", `${what}: ${JSON.stringify(String(value)).slice(0, 80)} is not valid`);
}

const MAX_ARG_BYTES = 100_000; // one argv string (Linux takes at most 128 KiB)

// Every parameter of the type PARAMETERS gives it (pi may pass what a model sent as is): a
// number where a string belongs, an array, an object, null, a string too long for an argv, a
// key the schema does not name: one INVALID_INPUT line, never a crash or a mangled argv.
export function checkParams(p: unknown): Result | null {
  if (p === null || typeof p !== "object" || Array.isArray(p)) {
    return failure("INVALID_INPUT", "the tool's arguments must be an object");
  }
  const props: Record<string, any> = PARAMETERS.properties;
  for (const [key, value] of Object.entries(p as Record<string, unknown>)) {
    const schema = props[key];
    if (!schema) return failure("INVALID_INPUT", `unknown parameter ${JSON.stringify(key.slice(0, 64))}`);
    if (value === undefined) continue;
    const kind = Array.isArray(value) ? "array" : value === null ? "null" : typeof value;
    const wanted = schema.type as string | undefined;
    if (wanted && kind !== wanted) {
      return failure("INVALID_INPUT", `${key}: expected a ${wanted}, got ${kind}`);
    }
    if (kind === "number" && !Number.isFinite(value as number)) {
      return failure("INVALID_INPUT", `${key}: expected a finite number`);
    }
    const size = Buffer.byteLength(typeof value === "string" ? value : JSON.stringify(value) ?? "");
    if (size > MAX_ARG_BYTES) {
      return failure("INVALID_INPUT", `${key}: ${size} bytes; at most ${MAX_ARG_BYTES} (put a long text in a file)`);
    }
  }
  return null;
}

// The argv of a call (after `pisub`): options first, then `--` and the positionals; or a failure.
export function plan(p: any): string[] | Result {
  const refused = checkParams(p);
  if (refused) return refused;
  const action = p.action ?? (p.workflowScriptPath || p.lanes ? "run" : p.agent || p.task ? "run" : "");
  const child = (argv: string[]) => flag(argv, "--child", p.childId === undefined ? null : String(p.childId));
  const end = (argv: string[], ...positionals: string[]) => [...argv, "--", ...positionals];
  if (p.id !== undefined && !ID.test(String(p.id))) return bad("id", p.id);
  if (p.agent !== undefined && !NAME.test(String(p.agent))) return bad("agent", p.agent);
  if (p.childId !== undefined && !/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/.test(String(p.childId))) {
    return bad("childId", p.childId);
  }
  switch (action) {
    case "run": {
      const argv = ["run", "--json"];
      flag(argv, "--cwd", p.cwd);
      flag(argv, "--timeout", seconds(p.timeoutMs));
      if (p.workflowScriptPath) {
        argv.push("--workflow", p.workflowScriptPath);
        flag(argv, "--usage-budget", json(p.usageBudget));
        return argv;
      }
      if (p.lanes) {
        argv.push("--lanes", p.lanes);
        flag(argv, "--usage-budget", json(p.usageBudget));
        return argv;
      }
      if (!p.agent || !p.task) return failure("INVALID_INPUT", "a run needs agent and task (or workflowScriptPath)");
      if (p.context !== undefined && p.context !== "fresh") {
        return failure("INVALID_INPUT", 'context: a run starts "fresh"; "fork" is for a workflow script\'s runs.run(..., context="fork")');
      }
      argv.push("--agent", p.agent);
      flag(argv, "--model", p.model);
      flag(argv, "--tool-timeout", seconds(p.toolTimeoutMs));
      flag(argv, "--tool-budget", json(p.toolBudget));
      flag(argv, "--gate", p.gate);
      if (p.acceptance !== undefined && p.acceptance !== "auto") flag(argv, "--acceptance", json(p.acceptance));
      return end(argv, String(p.task));
    }
    case "status": {
      if (!p.id) return insideRun() ? ["list", "--json", "--all"] : ["list", "--json"];
      const argv = ["status", "--json"];
      child(argv);
      flag(argv, "--view", p.view);
      if (typeof p.lines === "number") argv.push("--lines", String(Math.min(500, Math.max(1, Math.floor(p.lines)))));
      return end(argv, p.id);
    }
    case "wait": {
      if (!p.id) return failure("INVALID_INPUT", "wait needs id");
      const argv = ["wait", "--json"];
      child(argv);
      flag(argv, "--timeout", seconds(p.timeoutMs));
      return end(argv, p.id);
    }
    case "steer":
    case "follow_up": {
      if (!p.id || !p.message) return failure("INVALID_INPUT", `${action} needs id and message`);
      const argv = [action === "steer" ? "steer" : "follow-up", "--json", "--wait", "3"];
      if (action === "steer") flag(argv, "--mode", p.mode);
      child(argv);
      return end(argv, p.id, String(p.message));
    }
    case "interrupt":
    case "stop": {
      if (!p.id) return failure("INVALID_INPUT", `${action} needs id`);
      const argv = [action, "--json", "--wait", "3"];
      child(argv);
      flag(argv, "--reason", p.reason);
      return end(argv, p.id);
    }
    case "resume": {
      if (!p.id) return failure("INVALID_INPUT", "resume needs id");
      const argv = ["resume", "--json"];
      if (typeof p.index === "number") argv.push("--child", String(Math.max(0, Math.floor(p.index))));
      flag(argv, "--timeout", seconds(p.timeoutMs));
      return p.message ? end(argv, p.id, String(p.message)) : end(argv, p.id);
    }
    case "list":
      return ["agents", "list", "--json"];
    case "fleet":
      return ["fleet", "--json"];
    case "models": {
      const argv = ["models", "--json"];
      flag(argv, "--agent", p.agent);
      return argv;
    }
    case "create": {
      const config = p.config;
      if (!config || typeof config !== "object" || typeof config.name !== "string" || !NAME.test(config.name)) {
        return failure("INVALID_INPUT", "create needs config: {name, ...} (a valid agent name)");
      }
      const rest = { ...config };
      const scope = rest.scope;
      delete rest.scope;
      const argv = ["agents", "create", "--config", JSON.stringify(rest)];
      flag(argv, "--scope", typeof scope === "string" ? scope : null);
      return end(argv, config.name);
    }
    case "get": {
      if (p.agent && !p.id) return end(["agents", "show", "--json"], p.agent);
      if (!p.id) return failure("INVALID_INPUT", "get needs id (a run) or agent");
      const argv = ["result", "--json"];
      child(argv);
      return end(argv, p.id);
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
    case "validate": {
      const target = p.path ?? p.workflowScriptPath;
      if (!target) return failure("INVALID_INPUT", "validate needs path");
      return end(["workflow", "validate", "--json"], String(target));
    }
    case "guide":
      return p.topic ? end(["guide"], String(p.topic)) : ["guide"];
    default: {
      if (AGENT_EDITS.has(action)) {
        if (!p.agent) return failure("INVALID_INPUT", `${action} needs agent`);
        const argv = ["agents", action];
        if (action === "update") argv.push("--config", JSON.stringify(p.config ?? {}));
        flag(argv, "--scope", p.agentScope);
        return end(argv, p.agent);
      }
      const hint = near(String(action));
      const did = hint ? ` Did you mean "${hint}"? (not run)` : "";
      return failure(
        "INVALID_INPUT",
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

function validateText(v: any): string {
  if (!v || typeof v !== "object") return readable(v);
  if (v.ok === true) return "valid: the workflow script passed every static check (nothing was started)";
  const errors: any[] = Array.isArray(v.errors) ? v.errors : [];
  return ["not valid:", ...errors.slice(0, 50).map((e) => `  line ${one(e?.line, 8)}:${one(e?.col, 8)} ${one(e?.message, 400)}`)].join("\n");
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
  const text = JSON.stringify(args) ?? "{}";
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
function sessionItems(file: unknown): DisplayItem[] | null {
  if (typeof file !== "string" || !file.endsWith(".jsonl") || !path.isAbsolute(file)) return null;
  const text = readSmall(file, MAX_SESSION);
  return text === null ? null : displayItems(text);
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
  const receipt = control && (code === 2 || code === 3) && stdout.trim().startsWith("{");
  const waited = verb === "wait" && code === 1 && stdout.trim().startsWith("{"); // a run that ended otherwise
  if (verb === "wait" && code === 3) return waitGaveUp(p);
  if (code !== 0 && !receipt && !waited && !(verb === "doctor" || verb === "workflow")) {
    const err = cliError(stderr, code);
    return failure(err.code, err.message);
  }
  if (verb === "guide" || verb === "doctor") {
    return answer(stdout.trim(), { mode: "management", results: [], ok: code === 0 });
  }
  const items = parseLines(stdout);
  const first = items[0];
  if (verb === "run" || verb === "resume") {
    if (typeof first?.runId !== "string") {
      return failure("SUBAGENT_FAILED", `pisub ${verb} gave no run id: ${JSON.stringify(stdout.trim().slice(0, 200))}`);
    }
    const what = verb === "resume" ? `resume of ${one(p?.id, 64)}` : p?.agent ? one(p.agent, 128) : p?.lanes ? "lanes" : "workflow";
    const who = ` (${what})`; // a space after the id: "started run ID (...)" splits cleanly
    const text = `started run ${first.runId}${who}: ${one(first.state, 20)}; it runs in the background and a notice comes when it ends.\n` +
      `look: {action: "status", id: "${first.runId}"}; block until it ends: {action: "wait", id: "${first.runId}"}`;
    return answer(text, { mode: "single", runId: first.runId, runDir: first.runDir, results: [], started: first });
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
    const agents = items.filter((a) => !p.agentScope || a.scope === p.agentScope);
    if (p.capabilities) {
      return answer(rows(agents, agentLine, "(no agents)"), {
        mode: "management",
        results: [],
        agentCapabilities: { agents, restrictedCount: 0 },
      });
    }
    return answer(rows(agents, agentLine, "(no agents)"), { mode: "management", results: [], items: agents });
  }
  const shown = verb === "list" ? ownRuns(items) : items;
  return answer(render(p, argv, shown).slice(0, 50_000), { mode: "management", results: [], items: shown.slice(0, 500) });
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

type Pending = { runId: string; agent: string | null };

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

  record(runId: string, agent: string | undefined): void {
    if (!this.dir || !RUN_ID.test(runId)) return;
    privateDir(this.dir);
    writeAtomic(path.join(this.dir, `${runId}.json`), JSON.stringify({ v: 1, runId, agent: agent ?? null }) + "\n");
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
      if (rec && typeof rec === "object") out.push({ runId, agent: typeof rec.agent === "string" ? rec.agent : null });
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
      this.notify(run, state as string, String(result?.content?.[0]?.text ?? "").slice(0, HEAD_CHARS));
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
    const text = termSafe(`pisub: run ${run.runId}${who} ended ${state}.${head ? "\n" + head : ""}`);
    this.pi.sendMessage(
      { customType: "pisub-notice", content: text, display: true, details: { runId: run.runId, state } },
      { triggerTurn: true, deliverAs: "followUp" },
    );
  }
}

function readState(runDir: string): string | null {
  const status = readJson(path.join(runDir, "status.json"), MAX_STATUS);
  return typeof status?.state === "string" ? status.state : null;
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

  pi.on("session_start", async (_event: any, ctx: any) => {
    const home = await homeOf(pi);
    if (home) notices.bind(home, sessionKey(ctx));
  });
  pi.on("session_shutdown", async () => notices.stop());

  registerCommands(pi, notices);

  pi.registerTool({
    name: "subagent",
    label: "Subagent",
    description:
      "Delegate work to a sub-agent run by pisub (detached; it survives this session). Start a run with agent + task " +
      "(background by default: a notice arrives when it ends; async: false waits), or manage runs with action: " +
      ACTIONS.join(", ") + ". action guide explains everything.",
    promptSnippet: "Start and steer background sub-agent runs (pisub)",
    parameters: PARAMETERS,
    async execute(_id: string, params: any, signal: any, onUpdate: any, ctx: any): Promise<Result> {
      try {
        return await execute(params, signal, onUpdate, ctx);
      } catch (e: any) {
        // a bug here must be an answer, never a crash of the extension
        return failure("INTERNAL_ERROR", termSafe(String(e?.message ?? e), true).slice(0, 500));
      }
    },
  });

  async function execute(params: any, signal: any, onUpdate: any, ctx: any): Promise<Result> {
    const planned = plan(params ?? {});
    if (!Array.isArray(planned)) return planned;
    if (planned[0] === "wait") return waitFor(params, planned, params.id, signal, onUpdate);
    const argv = pisubArgv();
    let r: any;
    try {
      r = await pi.exec(argv[0], [...argv.slice(1), ...planned], { signal, cwd: ctx?.cwd, timeout: 120_000 });
    } catch (e: any) {
      return failure("LAUNCH_FAILED", `cannot run pisub (${argv[0]}): ${e?.message ?? e}`);
    }
    const result = shape(params, planned, r.code, r.stdout ?? "", r.stderr ?? "");
    const started = planned[0] === "run" || planned[0] === "resume";
    if (!started || result.details.error) return result;
    const runId = result.details.runId;
    if (!notices.dir) {
      const home = await homeOf(pi);
      if (home) notices.bind(home, sessionKey(ctx));
    }
    try {
      notices.record(runId, params?.agent); // first: whatever happens to the wait, one notice comes
    } catch (e: any) {
      result.content[0].text += termSafe(` (no completion notice: ${e?.message ?? e})`, true);
    }
    if (params?.async !== false) return result;
    const waited = await waitFor(params, ["wait", "--json", "--", runId], runId, signal, onUpdate);
    return waited.details?.waiting ? { ...result, content: waited.content } : waited;
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
    if (waited && !signal?.aborted && waited.code !== 0 && waited.code !== 1) {
      return shape(params, ["wait"], waited.code, out, waited.stderr ?? "");
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
    const update = streamingUpdate(runDir);
    const key = update ? JSON.stringify(update) : "";
    if (!update || key === last) continue;
    last = key;
    try {
      onUpdate(update);
    } catch {
      // a renderer's trouble never ends the wait
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
const CHILD = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

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
      if (!running.length) return tell(ctx, "no run started from this session is running (/subagents-stop RUN stops any run)");
      const label = (r: Pending) => `${r.runId}  ${r.agent ? termSafe(r.agent, true).slice(0, 64) : "?"}  ${readState(notices.runDir(r.runId)) ?? "?"}`;
      if (!ctx?.hasUI || !ctx.ui?.select) {
        const lines = running.map((r) => `${label(r)}\n  subagent({action: "stop", id: "${r.runId}"})  or  /subagents-stop ${r.runId}`);
        return tell(ctx, `running runs of this session (no UI to pick from here):\n${lines.join("\n")}`);
      }
      const options = running.map(label);
      const picked = await ctx.ui.select("Stop which run? (a stop is final: not a pause)", options);
      const index = options.indexOf(picked);
      if (index < 0) return tell(ctx, "nothing stopped");
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
