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
  const MAX_STRINGIFY_DEPTH = 10000;

  // The intrinsics pisub's own code uses, taken before the script runs: a script that replaces
  // JSON.parse, Promise.prototype.then or Array.isArray breaks only its own use of them.
  const apply = Reflect.apply;
  const parseJSON = JSON.parse;
  const stringifyJSON = JSON.stringify;
  const isArray = Array.isArray;
  const keysOf = Object.keys;
  const protoOf = Object.getPrototypeOf;
  const symbolsOf = Object.getOwnPropertySymbols;
  const define = Object.defineProperty;
  const freeze = Object.freeze;
  const create = Object.create;
  const isFinite = Number.isFinite;
  const ObjectProto = Object.prototype;
  const NativePromise = Promise;
  const promiseThen = Promise.prototype.then;
  const promiseFinally = Promise.prototype.finally;
  const String_ = String;
  const TypeError_ = TypeError;
  const Error_ = Error;
  const descriptorOf = Object.getOwnPropertyDescriptor;

  // -- the door ------------------------------------------------------------------------------
  function ask(op, payload) {
    const answer = parseJSON(host(op, stringifyJSON(payload === undefined ? null : payload)));
    if (answer.error) throw hostError(answer.error);
    return answer;
  }
  function hostError(error) {
    const e = new Error_(error.message);
    if (error.code) e.code = error.code;
    return e;
  }

  // -- boundary JSON: finite numbers, no cycles, sparse arrays, symbols or non-plain objects ---
  // plain() returns a COPY of plain data, reading each property once: a getter cannot answer
  // the check one way and the encoding another.
  function plain(value, where) {
    const seen = [];
    function copy(v, path, depth) {
      if (depth > MAX_DEPTH) throw new TypeError_(`${where}: ${path} is nested deeper than ${MAX_DEPTH} levels`);
      if (v === null || typeof v === "string" || typeof v === "boolean") return v;
      if (v === undefined) return undefined;
      if (typeof v === "number") {
        if (!isFinite(v)) throw new TypeError_(`${where}: ${path} is ${v}, not a finite number (JSON has none)`);
        return v;
      }
      if (typeof v !== "object") throw new TypeError_(`${where}: ${path} is a ${typeof v}, not JSON`);
      if (v instanceof Launch) throw new TypeError_(`${where}: ${path} is a pending call: await it first`);
      for (let i = 0; i < seen.length; i++) {
        if (seen[i] === v) throw new TypeError_(`${where}: ${path} is a cycle (JSON has none)`);
      }
      seen[seen.length] = v;
      let out;
      if (isArray(v)) {
        const length = v.length;
        out = [];
        for (let i = 0; i < length; i++) {
          if (!descriptorOf(v, i)) throw new TypeError_(`${where}: ${path} is a sparse array (index ${i} is a hole)`);
          const item = copy(v[i], `${path}[${i}]`, depth + 1);
          out[i] = item === undefined ? null : item;
        }
      } else {
        const proto = protoOf(v);
        if (proto !== ObjectProto && proto !== null) {
          let name = "object";
          try {
            name = String_((proto && proto.constructor && proto.constructor.name) || "object");
          } catch (e) {
            name = "object";
          }
          throw new TypeError_(`${where}: ${path} is a ${name}, not a plain object`);
        }
        if (symbolsOf(v).length) throw new TypeError_(`${where}: ${path} has symbol keys (JSON has none)`);
        out = {};
        const names = keysOf(v);
        for (let i = 0; i < names.length; i++) {
          const item = copy(v[names[i]], `${path}.${names[i]}`, depth + 1);
          if (item !== undefined) define(out, names[i], { value: item, enumerable: true, writable: true, configurable: true });
        }
      }
      seen.length = seen.length - 1;
      return out;
    }
    const copied = copy(value, "the value", 0);
    return copied === undefined ? null : copied;
  }
  function encode(value, where) {
    return stringifyJSON(plain(value, where));
  }

  // JSON.stringify of QuickJS has no stack check: a structure nested deep enough crashes the
  // process. The script's JSON.stringify first measures the nesting of its data properties.
  function tooDeep(value) {
    let level = [value];
    for (let depth = 0; level.length; depth++) {
      if (depth > MAX_STRINGIFY_DEPTH) return true;
      const next = [];
      for (let i = 0; i < level.length && next.length < 100000; i++) {
        const v = level[i];
        if (v === null || typeof v !== "object") continue;
        const names = keysOf(v);
        for (let j = 0; j < names.length; j++) {
          const d = descriptorOf(v, names[j]);
          if (d && "value" in d && d.value !== null && typeof d.value === "object") next[next.length] = d.value;
        }
      }
      level = next;
    }
    return false;
  }
  function guardedStringify(value, replacer, space) {
    if (value !== null && typeof value === "object" && tooDeep(value)) {
      throw new RangeError(`JSON.stringify: the value is nested deeper than ${MAX_STRINGIFY_DEPTH} levels`);
    }
    return stringifyJSON(value, replacer, space);
  }
  define(JSON, "stringify", {
    value: function stringify(value, replacer, space) {
      return guardedStringify(value, replacer, space);
    },
    writable: true,
    configurable: true,
  });

  // -- calls the script must observe ---------------------------------------------------------
  const pending = create(null); // id -> {resolve, reject, settle}
  const tracked = []; // launches, in call order: {what, key, launch}

  // A launch: a thenable, not a native Promise, so that whatever waits for it — await,
  // Promise.all/race/allSettled/any, .then — calls its then() and marks it observed.
  class Launch {
    constructor(id, settle) {
      this._id = id;
      this._seen = false;
      this._promise = new NativePromise((resolve, reject) => {
        pending[id] = { resolve, reject, settle };
      });
    }
    then(onFulfilled, onRejected) {
      if (!this._seen) {
        this._seen = true;
        host("observe", stringifyJSON(this._id));
      }
      return apply(promiseThen, this._promise, [onFulfilled, onRejected]);
    }
    catch(onRejected) {
      return this.then(undefined, onRejected);
    }
    finally(onFinally) {
      return apply(promiseFinally, this.then(), [onFinally]);
    }
  }
  define(Launch.prototype, Symbol.toStringTag, { value: "Promise" });
  freeze(Launch.prototype);
  freeze(Launch);
  function isThenable(v) {
    return v !== null && typeof v === "object" && typeof v.then === "function";
  }
  function start(op, payload, settle, what, key) {
    const launch = new Launch(ask(op, payload).id, settle);
    if (what) tracked[tracked.length] = { what, key, launch };
    return launch;
  }
  function settled(id, ok, json) {
    const entry = pending[id];
    if (!entry) return;
    delete pending[id];
    const value = json === "" ? undefined : parseJSON(json);
    if (ok) entry.settle(value, entry.resolve, entry.reject);
    else entry.reject(hostError(value));
  }
  function unobserved() {
    const left = [];
    for (let i = 0; i < tracked.length; i++) {
      if (!tracked[i].launch._seen) left[left.length] = [tracked[i].what, tracked[i].key];
    }
    return stringifyJSON(left);
  }

  // -- runs -----------------------------------------------------------------------------------
  function options(value, where) {
    if (value === undefined) return {};
    if (value === null || typeof value !== "object" || isArray(value)) {
      throw new TypeError(`${where}: the options must be an object`);
    }
    return value;
  }
  function checkKey(key, where) {
    if (typeof key !== "string" || !KEY.test(key)) {
      throw new TypeError_(`${where}: the key ${stringifyJSON(String_(key)).slice(0, 80)} must match ${KEY.source}`);
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
      const where = `runs.run(${stringifyJSON(key)})`;
      const p = plain(options(params, where), where);
      return start("run", { key, params: p }, childResult(key), "runs.run", key);
    },
    all(calls) {
      if (!isArray(calls)) throw new TypeError_("runs.all takes an array of {key, agent, task, ...}");
      if (calls.some(isThenable)) {
        if (!warnedPromises) {
          warnedPromises = true;
          G.console.warn("runs.all was given runs.run promises: they are awaited as Promise.all (no batch admission)");
        }
        const keys = calls.map((c, i) => (isThenable(c) ? `#${i}` : String(c && c.key)));
        const each = calls.map((c) => (isThenable(c) ? c : runs.run(c && c.key, withoutKey(c))));
        return Promise.all(each).then((values) => orderedArray(values, keys));
      }
      const checked = plain(calls, "runs.all");
      const keys = checked.map((c) => String_(c && c.key));
      return start("all", { calls: checked }, (values, resolve) => resolve(orderedArray(values, keys)), "runs.all", keys.join(", "));
    },
    lanes(lanes) {
      const checked = plain(lanes, "runs.lanes");
      return start("lanes", { lanes: checked }, (board, resolve) => resolve(board), "runs.lanes", "");
    },
    steer(key, message, opts) {
      checkKey(key, "runs.steer");
      const o = plain(options(opts, "runs.steer"), "runs.steer");
      const names = keysOf(o);
      for (let i = 0; i < names.length; i++) {
        if (names[i] !== "mode" && names[i] !== "index" && names[i] !== "ackTimeoutMs") {
          throw new TypeError_(`runs.steer: unknown option ${stringifyJSON(names[i])} (mode, index, ackTimeoutMs)`);
        }
      }
      if (typeof message !== "string") throw new TypeError_("runs.steer: the message must be a string");
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
    const rest = {};
    const names = keysOf(call);
    for (let i = 0; i < names.length; i++) if (names[i] !== "key") rest[names[i]] = call[names[i]];
    return rest;
  }
  if (setup.host) {
    runs.host = function (key, params) {
      checkKey(key, "runs.host");
      const where = `runs.host(${stringifyJSON(key)})`;
      const p = plain(options(params, where), where);
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
        const copied = plain(value, `state.set(${stringifyJSON(key)})`);
        return start("state.set", { key, value: copied }, (v, resolve) => resolve(undefined), "", key);
      },
    });
  }
  function emit(value) {
    ask("emit", plain(value, "emit"));
    return undefined;
  }
  function shown(v) {
    if (typeof v === "string") return v;
    let said;
    try {
      said = guardedStringify(v);
    } catch (e) {
      return `[a value JSON cannot show: ${text(() => e.message, "?")}]`;
    }
    return said === undefined ? text(() => v, "[a value that cannot be shown]") : said;
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
    Object.defineProperty(G, name, { value: refused, writable: false, configurable: false });
  }

  // -- builtins newer than this QuickJS (ES2022-2024), as scripts written for Node use them ------
  function method(target, name, fn) {
    if (!(name in target)) define(target, name, { value: fn, writable: true, configurable: true });
  }
  function relative(length, index) {
    const i = Math.trunc(index) || 0;
    return i < 0 ? length + i : i;
  }
  const indexables = [Array.prototype, String.prototype, protoOf(Int8Array.prototype)];
  for (const proto of indexables) {
    method(proto, "at", function at(index) {
      const i = relative(this.length, index);
      return i < 0 || i >= this.length ? undefined : this[i];
    });
  }
  for (const proto of [Array.prototype, protoOf(Int8Array.prototype)]) {
    method(proto, "findLast", function findLast(test, self) {
      for (let i = this.length - 1; i >= 0; i--) if (apply(test, self, [this[i], i, this])) return this[i];
      return undefined;
    });
    method(proto, "findLastIndex", function findLastIndex(test, self) {
      for (let i = this.length - 1; i >= 0; i--) if (apply(test, self, [this[i], i, this])) return i;
      return -1;
    });
  }
  method(Array.prototype, "toSorted", function toSorted(compare) {
    return Array.prototype.slice.call(this).sort(compare);
  });
  method(Array.prototype, "toReversed", function toReversed() {
    return Array.prototype.slice.call(this).reverse();
  });
  method(Array.prototype, "toSpliced", function toSpliced(...spliced) {
    const copy = Array.prototype.slice.call(this);
    apply(Array.prototype.splice, copy, spliced);
    return copy;
  });
  method(Array.prototype, "with", function with_(index, value) {
    const i = relative(this.length, index);
    if (i < 0 || i >= this.length) throw new RangeError("Invalid index : " + index);
    const copy = Array.prototype.slice.call(this);
    copy[i] = value;
    return copy;
  });
  method(Object, "hasOwn", function hasOwn(object, key) {
    return apply(ObjectProto.hasOwnProperty, Object(object), [key]);
  });
  method(Object, "groupBy", function groupBy(items, keyOf) {
    const groups = create(null);
    let i = 0;
    for (const item of items) {
      const key = keyOf(item, i++);
      (groups[key] = groups[key] || []).push(item);
    }
    return groups;
  });
  method(Promise, "withResolvers", function withResolvers() {
    let resolve, reject;
    const promise = new this((yes, no) => {
      resolve = yes;
      reject = no;
    });
    return { promise, resolve, reject };
  });

  const globals = { runs, emit, console, args: setup.args };
  if (setup.state) globals.state = state;
  for (const [name, value] of Object.entries(globals)) {
    Object.defineProperty(G, name, { value, writable: false, enumerable: false, configurable: false });
  }
  // -- the script's end: its value (boundary JSON) or its error, told to the host once --------
  function text(read, fallback) {
    try {
      const v = read();
      return v === undefined || v === null ? fallback : String_(v);
    } catch (e) {
      return fallback;
    }
  }
  function describeError(e) {
    if (e === null || (typeof e !== "object" && typeof e !== "function")) {
      return { name: "Error", message: text(() => e, String_(e)) };
    }
    const code = text(() => e.code, "") || null;
    return {
      name: text(() => e.name, "Error"),
      message: text(() => e.message, "(its message cannot be read)"),
      code,
      stack: text(() => e.stack, ""),
    };
  }
  function finish(outcome) {
    ask("finish", outcome);
  }
  function watch(promise) {
    apply(promiseThen, promise, [
      (value) => {
        let json;
        try {
          json = encode(value, "the workflow's return value");
        } catch (e) {
          return finish({ ok: false, error: describeError(e) });
        }
        finish({ ok: true, json });
      },
      (e) => finish({ ok: false, error: describeError(e) }),
    ]);
  }
  Object.defineProperty(G, "__pisub", {
    value: Object.freeze({ settled, unobserved, watch }),
    writable: false,
    enumerable: false,
    configurable: false,
  });
});
