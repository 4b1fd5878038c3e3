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
    id: str("A run id or a unique prefix (status, steer, interrupt, stop, resume, get)."),
    childId: str("A workflow child's key or index (status, steer, interrupt, stop, get)."),
    message: str("The message of a steer, follow_up or resume."),
    mode: str("steer: steer | follow_up | auto."),
    index: num("resume: the workflow child's index whose session continues."),
    model: str("pi agents: provider/id."),
    cwd: str("The working directory."),
    timeoutMs: num("The run's timeout in milliseconds."),
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
      if (!p.id) return ["list", "--json"];
      const argv = ["status", "--json"];
      child(argv);
      flag(argv, "--view", p.view);
      if (typeof p.lines === "number") argv.push("--lines", String(Math.min(500, Math.max(1, Math.floor(p.lines)))));
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

// The tool result of a finished command.
export function shape(p: any, argv: string[], code: number, stdout: string, stderr: string): Result {
  const control = ["steer", "follow-up", "interrupt", "stop"].includes(argv[0]);
  const receipt = control && (code === 2 || code === 3) && stdout.trim().startsWith("{");
  const waited = argv[0] === "wait" && code === 1 && stdout.trim().startsWith("{"); // a run that ended otherwise
  if (code !== 0 && !receipt && !waited && !(argv[0] === "doctor" || argv[0] === "workflow")) {
    const err = cliError(stderr, code);
    return failure(err.code, err.message);
  }
  const verb = argv[0];
  if (verb === "guide" || verb === "doctor") {
    return answer(stdout.trim(), { mode: "management", results: [], ok: code === 0 });
  }
  const items = parseLines(stdout);
  const first = items[0];
  if (verb === "run" || verb === "resume") {
    if (typeof first?.runId !== "string") {
      return failure("SUBAGENT_FAILED", `pisub ${verb} gave no run id: ${JSON.stringify(stdout.trim().slice(0, 200))}`);
    }
    const text = `started run ${first.runId} (${first.state}); it runs in the background: ` +
      `subagent {action: "status", id: "${first.runId}"}; a notice comes when it ends.`;
    return answer(text, { mode: "single", runId: first.runId, runDir: first.runDir, results: [], started: first });
  }
  if (verb === "result" || verb === "wait") {
    const text = first?.content?.[0]?.text ?? "";
    const result = answer(text, first?.details ?? { mode: "single", results: [] });
    return first?.state === "complete" || verb === "result" ? result : { ...result, isError: true };
  }
  if (control) {
    // exit 2: failed / rejected / partial; 3: no answer past pending within the wait
    const r = first ?? {};
    const rid = r.id ?? r.requestId ?? "";
    const text = `${r.state}: ${verb} ${rid}${r.reason ? ": " + r.reason : ""}`;
    return answer(text, { mode: "management", runId: p.id, results: [], receipt: r, deliveryStatus: r.state });
  }
  if (verb === "agents" && argv[1] === "list") {
    const agents = items.filter((a) => !p.agentScope || a.scope === p.agentScope);
    if (p.capabilities) {
      const lines = agents.map((a) => `${a.name} [${a.runner}, ${a.scope}]${a.description ? " " + a.description : ""}`);
      return answer(lines.join("\n") || "(no agents)", {
        mode: "management",
        results: [],
        agentCapabilities: { agents, restrictedCount: 0 },
      });
    }
    return answer(agents.map((a) => JSON.stringify(a)).join("\n") || "(no agents)", {
      mode: "management",
      results: [],
      items: agents,
    });
  }
  const text = items.map((i) => (typeof i === "string" ? i : JSON.stringify(i))).join("\n") || "(nothing)";
  return answer(text.slice(0, 50_000), { mode: "management", results: [], items: items.slice(0, 500) });
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

  pi.registerTool({
    name: "subagent",
    label: "Subagent",
    description:
      "Delegate work to a sub-agent run by pisub (detached; it survives this session). Start a run with agent + task " +
      "(background by default: a notice arrives when it ends; async: false waits), or manage runs with action: " +
      ACTIONS.join(", ") + ". action guide explains everything.",
    promptSnippet: "Start and steer background sub-agent runs (pisub)",
    parameters: PARAMETERS,
    async execute(_id: string, params: any, signal: any, _onUpdate: any, ctx: any): Promise<Result> {
      try {
        return await execute(params, signal, ctx);
      } catch (e: any) {
        // a bug here must be an answer, never a crash of the extension
        return failure("INTERNAL_ERROR", termSafe(String(e?.message ?? e), true).slice(0, 500));
      }
    },
  });

  async function execute(params: any, signal: any, ctx: any): Promise<Result> {
    const planned = plan(params ?? {});
    if (!Array.isArray(planned)) return planned;
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
    if (params?.async === false) {
      let waited: any = null;
      try {
        waited = await pi.exec(argv[0], [...argv.slice(1), "wait", "--json", "--", runId], { signal });
      } catch {
        waited = null;
      }
      if (waited && (waited.code === 0 || waited.code === 1) && String(waited.stdout ?? "").trim().startsWith("{")) {
        notices.settle(runId); // its result is this answer: no notice on top
        return shape(params, ["wait"], waited.code, waited.stdout ?? "", waited.stderr ?? "");
      }
      result.content[0].text =
        `run ${runId} was not waited for to its end (interrupted); it goes on in the background, ` +
        "and a notice comes when it ends.";
    }
    return result;
  }
}
