// The globals of a JavaScript workflow script (the seed's, and only those), run once in a fresh
// QuickJS context before the script. `__pisub_host(op, json)` is the one door to the coordinator
// (pisub/workflow/js/engine.py): it answers at once with {id} (an operation that settles later,
// through __pisub_settle), {value} or {error}. Nothing else of the host is reachable: no
// require, process, timers, fetch or file system — and no eval or new Function.
(function (host, setup) {
  "use strict";
  const G = globalThis;
  const KEY = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
  const MAX_DEPTH = 100;

  // -- the door ------------------------------------------------------------------------------
  function ask(op, payload) {
    const answer = JSON.parse(host(op, JSON.stringify(payload === undefined ? null : payload)));
    if (answer.error) throw hostError(answer.error);
    return answer;
  }
  function hostError(error) {
    const e = new Error(error.message);
    if (error.code) e.code = error.code;
    return e;
  }

  // -- boundary JSON: finite numbers, no cycles, sparse arrays, symbols or non-plain objects ---
  function plain(value, where) {
    const seen = [];
    function check(v, path, depth) {
      if (depth > MAX_DEPTH) throw new TypeError(`${where}: ${path} is nested deeper than ${MAX_DEPTH} levels`);
      if (v === null || typeof v === "string" || typeof v === "boolean" || v === undefined) return;
      if (typeof v === "number") {
        if (!Number.isFinite(v)) throw new TypeError(`${where}: ${path} is ${v}, not a finite number (JSON has none)`);
        return;
      }
      if (typeof v !== "object") throw new TypeError(`${where}: ${path} is a ${typeof v}, not JSON`);
      if (seen.includes(v)) throw new TypeError(`${where}: ${path} is a cycle (JSON has none)`);
      seen.push(v);
      if (Array.isArray(v)) {
        for (let i = 0; i < v.length; i++) {
          if (!(i in v)) throw new TypeError(`${where}: ${path} is a sparse array (index ${i} is a hole)`);
          check(v[i], `${path}[${i}]`, depth + 1);
        }
      } else {
        const proto = Object.getPrototypeOf(v);
        if (proto !== Object.prototype && proto !== null) {
          const name = (proto && proto.constructor && proto.constructor.name) || "object";
          throw new TypeError(`${where}: ${path} is a ${name}, not a plain object`);
        }
        if (Object.getOwnPropertySymbols(v).length) throw new TypeError(`${where}: ${path} has symbol keys (JSON has none)`);
        for (const k of Object.keys(v)) check(v[k], `${path}.${k}`, depth + 1);
      }
      seen.pop();
    }
    check(value, "the value", 0);
    return value === undefined ? null : value;
  }
  function encode(value, where) {
    return JSON.stringify(plain(value, where));
  }

  // -- calls the script must observe ---------------------------------------------------------
  const pending = new Map(); // id -> {resolve, reject, shape}
  const tracked = []; // launches, in call order: {what, key, launch}

  // A launch: a thenable, not a native Promise, so that whatever waits for it — await,
  // Promise.all/race/allSettled/any, .then — calls its then() and marks it observed.
  class Launch {
    constructor(id, settle) {
      this._id = id;
      this._seen = false;
      this._promise = new Promise((resolve, reject) => pending.set(id, { resolve, reject, settle }));
    }
    then(onFulfilled, onRejected) {
      if (!this._seen) {
        this._seen = true;
        host("observe", JSON.stringify(this._id));
      }
      return this._promise.then(onFulfilled, onRejected);
    }
    catch(onRejected) {
      return this.then(undefined, onRejected);
    }
    finally(onFinally) {
      return this.then().finally(onFinally);
    }
  }
  Object.defineProperty(Launch.prototype, Symbol.toStringTag, { value: "Promise" });
  function isThenable(v) {
    return v !== null && typeof v === "object" && typeof v.then === "function";
  }
  function start(op, payload, settle, what, key) {
    const launch = new Launch(ask(op, payload).id, settle);
    if (what) tracked.push({ what, key, launch });
    return launch;
  }
  function settled(id, ok, json) {
    const entry = pending.get(id);
    if (!entry) return;
    pending.delete(id);
    const value = json === "" ? undefined : JSON.parse(json);
    if (ok) entry.settle(value, entry.resolve, entry.reject);
    else entry.reject(hostError(value));
  }
  function unobserved() {
    return tracked.filter((t) => !t.launch._seen).map((t) => [t.what, t.key]);
  }

  // -- runs -----------------------------------------------------------------------------------
  function options(value, where) {
    if (value === undefined) return {};
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new TypeError(`${where}: the options must be an object`);
    }
    return value;
  }
  function checkKey(key, where) {
    if (typeof key !== "string" || !KEY.test(key)) {
      throw new TypeError(`${where}: the key ${JSON.stringify(String(key)).slice(0, 80)} must match ${KEY.source}`);
    }
  }
  function childResult(key) {
    return (result, resolve, reject) => {
      if (result && result.ok === false && result.state === "failed") {
        const why = (result.error && result.error.message) || result.output || "it failed";
        const e = new Error(`Run '${key}' failed: ${why}`);
        e.result = result;
        reject(e);
      } else resolve(result);
    };
  }
  function orderedArray(values, keys) {
    return new Proxy(values, {
      get(target, prop, receiver) {
        if (typeof prop === "string" && !(prop in target) && !/^(0|[1-9][0-9]*)$/.test(prop)) {
          if (prop === "then" || prop === "toJSON") return undefined;
          throw new TypeError(
            `runs.all resolves to an ordered array, not an object of results by their keys, so ` +
              `results.${prop} does not exist; use an index, destructuring or .map(...) ` +
              `(in the order given: ${keys.join(", ")})`,
          );
        }
        return Reflect.get(target, prop, receiver);
      },
    });
  }
  let warnedPromises = false;
  const runs = {
    run(key, params) {
      checkKey(key, "runs.run");
      const p = options(params, `runs.run(${JSON.stringify(key)})`);
      plain(p, `runs.run(${JSON.stringify(key)})`);
      return start("run", { key, params: p }, childResult(key), "runs.run", key);
    },
    all(calls) {
      if (!Array.isArray(calls)) throw new TypeError("runs.all takes an array of {key, agent, task, ...}");
      if (calls.some(isThenable)) {
        if (!warnedPromises) {
          warnedPromises = true;
          G.console.warn("runs.all was given runs.run promises: they are awaited as Promise.all (no batch admission)");
        }
        const keys = calls.map((c, i) => (isThenable(c) ? `#${i}` : String(c && c.key)));
        const each = calls.map((c) => (isThenable(c) ? c : runs.run(c && c.key, withoutKey(c))));
        return Promise.all(each).then((values) => orderedArray(values, keys));
      }
      plain(calls, "runs.all");
      const keys = calls.map((c) => String(c && c.key));
      return start("all", { calls }, (values, resolve) => resolve(orderedArray(values, keys)), "runs.all", keys.join(", "));
    },
    lanes(lanes) {
      plain(lanes, "runs.lanes");
      return start("lanes", { lanes }, (board, resolve) => resolve(board), "runs.lanes", "");
    },
    steer(key, message, opts) {
      checkKey(key, "runs.steer");
      const o = options(opts, "runs.steer");
      for (const name of Object.keys(o)) {
        if (!["mode", "index", "ackTimeoutMs"].includes(name)) {
          throw new TypeError(`runs.steer: unknown option ${JSON.stringify(name)} (mode, index, ackTimeoutMs)`);
        }
      }
      plain(o, "runs.steer");
      return start("steer", { key, message, options: o }, (r, resolve) => resolve(r), "runs.steer", key);
    },
    ref(result) {
      const key = result && typeof result === "object" ? result.key : undefined;
      const id = result && typeof result === "object" && typeof result.runId === "string" ? result.runId : "";
      return `[run ${key}; id=${id.slice(0, 8)}]`;
    },
    refs(results) {
      return Array.from(results || [], (r) => runs.ref(r)).join(", ");
    },
  };
  function withoutKey(call) {
    if (call === null || typeof call !== "object") return call;
    const rest = Object.assign({}, call);
    delete rest.key;
    return rest;
  }
  if (setup.host) {
    runs.host = function (key, params) {
      checkKey(key, "runs.host");
      const p = options(params, `runs.host(${JSON.stringify(key)})`);
      plain(p, `runs.host(${JSON.stringify(key)})`);
      return start("host", { key, params: p }, (r, resolve) => resolve(r), "runs.host", key);
    };
  } else {
    // A raw script has no host commands (the seed's rule); said in words, not "not a function".
    runs.host = function () {
      throw new TypeError(
        'runs.host is only available to named workflow resources (workflow: "run-ci"); ' +
          "a raw script has no host commands",
      );
    };
  }
  Object.freeze(runs);

  // -- state, emit, console --------------------------------------------------------------------
  let state;
  if (setup.state) {
    state = Object.freeze({
      get(key) {
        checkKey(key, "state.get");
        return start("state.get", { key }, (v, resolve) => resolve(v === null ? undefined : v), "", key);
      },
      set(key, value) {
        checkKey(key, "state.set");
        return start("state.set", { key, value: plain(value, `state.set(${JSON.stringify(key)})`) }, (v, resolve) => resolve(undefined), "", key);
      },
    });
  }
  function emit(value) {
    ask("emit", plain(value, "emit"));
  }
  function shown(v) {
    if (typeof v === "string") return v;
    try {
      const text = JSON.stringify(v);
      return text === undefined ? String(v) : text;
    } catch (e) {
      return String(v);
    }
  }
  const console = Object.freeze(
    Object.fromEntries(
      ["log", "info", "warn", "error"].map((level) => [
        level,
        (...values) => {
          ask("console", { level, text: values.map(shown).join(" ") });
        },
      ]),
    ),
  );

  // -- determinism: Math.random is seeded by the workflow, so a resume replays it ---------------
  let seed = setup.seed >>> 0 || 1;
  Math.random = function random() {
    seed ^= seed << 13;
    seed >>>= 0;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    seed >>>= 0;
    return seed / 4294967296;
  };

  // -- no code from strings ---------------------------------------------------------------------
  function refused() {
    throw new EvalError("code generation from strings is not allowed in a workflow script");
  }
  const prototypes = [
    Function.prototype,
    Object.getPrototypeOf(async function () {}),
    Object.getPrototypeOf(function* () {}),
    Object.getPrototypeOf(async function* () {}),
  ];
  for (const proto of prototypes) {
    Object.defineProperty(proto, "constructor", { value: refused, writable: false, configurable: false });
  }
  refused.prototype = Function.prototype;
  const hidden = ["eval", "Function"];
  for (const name of hidden) {
    Object.defineProperty(G, name, { value: name === "Function" ? refused : undefined, writable: false, configurable: false });
  }

  const globals = { runs, emit, console, args: setup.args };
  if (setup.state) globals.state = state;
  for (const [name, value] of Object.entries(globals)) {
    Object.defineProperty(G, name, { value, writable: false, enumerable: false, configurable: false });
  }
  // -- the script's end: its value (boundary JSON) or its error, told to the host once --------
  function describeError(e) {
    if (e === null || typeof e !== "object") return { name: "Error", message: String(e) };
    const code = e.code ? String(e.code) : null;
    return { name: String(e.name || "Error"), message: String(e.message), code, stack: String(e.stack || "") };
  }
  function watch(promise) {
    promise.then(
      (value) => {
        let json;
        try {
          json = encode(value, "the workflow's return value");
        } catch (e) {
          return ask("finish", { ok: false, error: describeError(e) });
        }
        ask("finish", { ok: true, json });
      },
      (e) => ask("finish", { ok: false, error: describeError(e) }),
    );
  }
  Object.defineProperty(G, "__pisub", {
    value: Object.freeze({ settled, unobserved, watch }),
    writable: false,
    enumerable: false,
    configurable: false,
  });
});
