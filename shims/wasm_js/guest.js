// Conduit's wasm-js guest: runs one program inside a fresh SpiderMonkey component.
//
// Built by componentize-js and pre-initialised at build time (this module's top level
// runs then), so an instance starts with the engine and this shim already loaded.
//
// The host calls `run(request)` once per fresh instance, or once per step of a session,
// whose steps share the instance: what a step puts on the global object is there for
// the next (its `inputs` are its own; timers a step left pending may fire in a later
// step's event loop). The request is JSON:
//   {function, asynchronous, line_offset, inputs, timeout_ms}
// where `function` is the program already wrapped by the host as
// `(async function () { <program, line for line> })` with the value of its final
// expression returned (see conduit/executors/js_source.py), or, when the program
// cannot await, as a plain function (`asynchronous` false). The answer is JSON:
// {"result": <json>} or {"error": {"type", "message", "traceback"}}; a result
// JSON.stringify cannot encode (BigInt, cycles) is sent as String(value) and undefined
// becomes null, exactly as on the Deno executor.
//
// `run` answers at once when it can, and otherwise returns a promise: componentize-js
// then drives the event loop (promises, setTimeout) until it settles, so top-level
// `await` works. Either way, pending microtasks run before the call returns, and
// timers still pending when it settles never fire. A callback the program hands a
// timer, `queueMicrotask` or an event listener that throws ends the run with its error,
// as on Deno. The program reaches the daemon
// only through `tools`, whose `tools/call` and `tools/list` go through the `host-call`
// import as `calls/wait` (below): the host dispatches them under the execution's
// session token while the program runs on.
// Its files go through the same import as `fs/*` calls, which the host serves itself
// on the execution's working directory (see fs.js).

import hostCall from "host-call";
import {
  denoStack,
  eachErrorFrame,
  engineStack,
  installConsole,
  setLineOffset,
} from "./console.js";
import { makeFs } from "./fs.js";
import { makeTimers } from "./timers.js";
import { ToolError, encodeResult, makeTools, own, settleReply } from "./sandbox_sdk.js";

// Captured before any program code runs: the program may replace globals and
// prototypes, and nothing it does may change how its result or error is reported.
const stringify = JSON.stringify;
const parse = JSON.parse;
const toString = String;
const evaluate = globalThis.eval;
const defineProperty = Object.defineProperty;
const max = Math.max;
const toNumber = Number;
// Methods as plain functions, immune to a program replacing them on the prototypes.
const uncurry = (method) => Function.prototype.call.bind(method);
const NativePromise = Promise;
const NativeMap = Map;
const promiseThen = Promise.prototype.then;
const then = uncurry(promiseThen);
const apply = Reflect.apply;
const weakMapGet = uncurry(WeakMap.prototype.get);
const weakMapSet = uncurry(WeakMap.prototype.set);
const consoleObject = console;
const consoleLog = uncurry(console.log);
const consoleError = uncurry(console.error);
// One line on stdout, written by the engine itself.
const writeLine = (text) => consoleLog(consoleObject, text);
// The program's console writes Deno's text through the engine's own (console.js).
installConsole(consoleObject, writeLine, (text) => consoleError(consoleObject, text));
const clock = performance;
const dateNow = Date.now;
const clockNow = uncurry(clock.now);
const now = () => clockNow(clock);
const JSON_RPC_INTERNAL = -32603;

const mapGet = uncurry(Map.prototype.get);
const mapSet = uncurry(Map.prototype.set);
const mapDelete = uncurry(Map.prototype.delete);
const mapForEach = uncurry(Map.prototype.forEach);
const mapSize = uncurry(Object.getOwnPropertyDescriptor(Map.prototype, "size").get);
const realSetTimeout = globalThis.setTimeout;

// Tool calls run while the program goes on, as on Deno (executors/wasm_guest_calls.py).
// A call is sent with the next `calls/wait`, made by a poll (a timer of the engine's,
// not the program's) once the program has nothing left to run: that host call starts
// what was sent and waits until some call is done or the program's next timer is due,
// and answers the calls done. The poll goes on while any call is out. At most
// CALLS_OUT_MAX are out at once, as the host allows: the rest wait here, in order. Calls
// still to send when the run ends are sent then, as Deno sends what a program started.
const CALLS_OUT_MAX = 256;
const calls = {
  out: new Map(),
  waiting: new Map(), // beyond CALLS_OUT_MAX, by number from `first` to `next`
  first: 0,
  next: 0,
  tickets: 0,
  sending: "", // `{"ticket","call"}` texts, comma-separated
  sent: new Map(), // the calls in `sending`, by ticket
  polling: false,
};

function settleCall(call, reply) {
  settleReply(reply, call.resolve, call.reject, call.tool);
}

// A call to the daemon; a promise of its result, rejected with ToolError.
function startCall(method, params, tool) {
  return new NativePromise((resolve, reject) => {
    // Joined from strings: a `toJSON` the program planted on Object.prototype would
    // otherwise rewrite the whole call, its method included.
    const text = `{"method":${stringify(`${method}`)},"params":${stringify(params)}}`;
    const call = { text, tool, resolve, reject };
    if (mapSize(calls.out) < CALLS_OUT_MAX) send(call);
    else mapSet(calls.waiting, calls.next++, call);
  });
}

function send(call) {
  const ticket = ++calls.tickets;
  mapSet(calls.out, ticket, call);
  mapSet(calls.sent, ticket, call);
  const item = `{"ticket":${ticket},"call":${call.text}}`;
  calls.sending = calls.sending === "" ? item : `${calls.sending},${item}`;
  if (!calls.polling) {
    calls.polling = true;
    realSetTimeout(poll, 0);
  }
}

// A wait this long or longer goes on stdout (`calls/pipe`, executors/wasm_guest_calls.py)
// rather than in the host call: the bindings measure a string handed to `host-call` in a
// loop of JavaScript (~0.5 µs a character) and never free the copy they make of it, so
// each call's arguments stayed in memory for good. Below it, the two host calls more
// cost more than the loop, and what stays is a few hundred bytes.
const PIPE_MIN_CHARS = 512;

// `calls/wait` with `wait`, its JSON: a line on stdout, announced first, when long. No
// newline is in it (JSON.stringify escapes them), and no program code runs between the
// announcement and the wait, so the line is all and only what the host takes.
function hostWait(wait) {
  if (wait.length < PIPE_MIN_CHARS) return hostCall("calls/wait", wait);
  // UTF-8 takes at most 3 bytes for each UTF-16 unit.
  const pipe = parse(hostCall("calls/pipe", `{"length":${wait.length * 3}}`));
  if (own(pipe, "error") !== undefined) return hostCall("calls/wait", wait);
  writeLine(wait);
  return hostCall("calls/wait", "");
}

// What `run` answers with `text`, its JSON answer: the text itself, or "" once the text
// is written as a line on stdout (announced with `calls/pipe`), when long. The bindings
// measure the string `run` returns in the same loop as one handed to `host-call`.
function answered(text) {
  if (text.length < PIPE_MIN_CHARS) return text;
  const pipe = parse(hostCall("calls/pipe", `{"length":${text.length * 3}}`));
  if (own(pipe, "error") !== undefined) return text;
  writeLine(text);
  return "";
}

// Send what is to send, wait up to `timeout` (milliseconds, or "null" for as long as it
// takes) and settle the calls done; `last` as the run answers.
function exchange(timeout, last = false) {
  const sending = calls.sending;
  const sent = calls.sent;
  calls.sending = "";
  calls.sent = new NativeMap();
  const wait = `{"start":[${sending}],"timeout_ms":${timeout},"last":${last}}`;
  const answer = parse(hostWait(wait));
  const error = own(answer, "error");
  if (error) {
    // The run is being stopped, and no call it made will be answered; or the host
    // refused this wait (a call it could not read), whose calls were never made.
    const failed = own(error, "code") === JSON_RPC_INTERNAL ? calls.out : sent;
    mapForEach(failed, (call, ticket) => {
      mapDelete(calls.out, ticket);
      settleCall(call, answer);
    });
    return;
  }
  const done = own(answer, "result");
  for (let index = 0; index < done.length; index++) {
    const ticket = done[index][0]; // not destructured: that would take an iterator
    const reply = done[index][1];
    const call = mapGet(calls.out, ticket);
    if (call === undefined) continue;
    mapDelete(calls.out, ticket);
    settleCall(call, reply);
  }
  while (calls.first < calls.next && mapSize(calls.out) < CALLS_OUT_MAX) {
    const call = mapGet(calls.waiting, calls.first);
    mapDelete(calls.waiting, calls.first++);
    send(call);
  }
}

function poll() {
  calls.polling = false;
  exchange(nextTimerIn() ?? "null");
  if (mapSize(calls.out) > 0 && !calls.polling) {
    calls.polling = true;
    realSetTimeout(poll, 0);
  }
}

// The run ends: what it started and has not sent yet goes now.
function sendRest() {
  if (calls.sending !== "") exchange(0, true);
}

// Timers of the engine's own that the program set through a built-in
// (`AbortSignal.timeout`), each with when it is due: a wait for tool calls ends in time
// for the soonest of these and of the program's own (`programTimers`, below).
const engineTimersDue = new Map();

// Milliseconds until the program's next timer is due, or null if it has none.
function nextTimerIn() {
  let soonest = programTimers.nextDueIn() ?? Infinity;
  const at = now();
  mapForEach(engineTimersDue, (due) => {
    if (due - at < soonest) soonest = max(0, due - at);
  });
  return soonest === Infinity ? null : soonest;
}

// A tool call's failure that nothing handles ends the run, as an unhandled rejection
// does on Deno (StarlingMonkey's own tracking of rejections is not reachable from
// here). The program gets a promise of ours whose handlers can be seen: with no
// `constructor` of its own kind, `await` and `Promise.resolve` go through its `then`
// (as they do for any thenable) rather than past it. Unhandled by the end of the turn
// it failed in, or by the time the run answers (its turn may be the one that answers,
// when its answer came with the one awaited), its error is the run's. Once it is
// handled, or has succeeded, it is a plain promise again (`Promise.resolve(call) ===
// call`, so a settled call wins a `Promise.race` it comes first in, as on Deno).
const failedUnhandled = { calls: new NativeMap() }; // each failed call's watch: its error
const deleteProperty = Reflect.deleteProperty;
function plain(promise) {
  deleteProperty(promise, "constructor");
  deleteProperty(promise, "then");
}
function handed(inner) {
  const watch = { handled: false };
  const outer = new NativePromise((resolve, reject) => {
    const fulfilled = (value) => {
      plain(outer);
      resolve(value);
    };
    then(inner, fulfilled, (reason) => {
      reject(reason);
      if (watch.handled) return;
      const failed = failedUnhandled.calls;
      mapSet(failed, watch, reason);
      realSetTimeout(() => {
        mapDelete(failed, watch);
        if (!watch.handled) uncaught(reason);
      }, 0);
    });
  });
  defineProperty(outer, "constructor", { value: undefined, configurable: true });
  defineProperty(outer, "then", {
    value: {
      then(onFulfilled, onRejected) {
        watch.handled = true;
        plain(outer);
        return apply(promiseThen, this, [onFulfilled, onRejected]);
      },
    }.then,
    configurable: true,
  });
  return outer;
}

// The first tool call failure no handler has seen, as `{ reason }`, or null.
function unhandledCallFailure() {
  let first = null;
  mapForEach(failedUnhandled.calls, (reason, watch) => {
    if (first === null && !watch.handled) first = { reason };
  });
  return first;
}

const tools = makeTools(startCall, handed);
// Files in the execution's working directory, served by the host (see fs.js).
const fs = makeFs(hostCall, stringify, parse, writeLine);

// Only the program's own frames, at the user's own line numbers (`eachErrorFrame`).
// Built as a string, not an array: pushing onto an array sets its indices through
// whatever accessors a program planted on Array.prototype (a setter that drops the
// frame, a getter that answers for it), which would let it forge the report or run
// inside it.
function userTraceback(error) {
  let traceback = "";
  eachErrorFrame(error, (frame) => {
    traceback = traceback === "" ? frame : `${traceback}\n${frame}`;
  });
  return traceback;
}

function describeError(error) {
  if (error === null || (typeof error !== "object" && typeof error !== "function")) {
    return { type: "Error", message: toString(error), traceback: "" };
  }
  const type = toString(error.name ?? "Error");
  const message = toString(error.message ?? "");
  return { type, message, traceback: userTraceback(error) };
}

// A program that does not parse has no frames of its own: SpiderMonkey puts the place
// on the error, in lines of the wrapped function.
function describeSyntaxError(error, lineOffset) {
  const described = describeError(error);
  if (typeof error?.lineNumber === "number") {
    const line = max(1, error.lineNumber - lineOffset);
    described.traceback = `    at <program>:${line}:${error.columnNumber ?? 0}`;
  }
  return described;
}

// Assembled from strings: stringify on an object would consult a toJSON the program
// may have planted on Object.prototype.
function report(error, describe, lineOffset) {
  try {
    const { type, message, traceback } = describe(error, lineOffset);
    const fields = `"type":${stringify(type)},"message":${stringify(message)}`;
    return `{"error":{${fields},"traceback":${stringify(traceback)}}}`;
  } catch {
    return '{"error":{"type":"Error","message":"the error could not be described","traceback":""}}';
  }
}

// How long past the execution's end a shortened timer fires: a few epoch ticks, so the
// host's deadline check has certainly passed when the program runs again.
const TIMER_SLACK_MS = 50;
const abortSignal = AbortSignal;

// The execution's end on the clock of `now()`, which `run` sets: the clock traps until
// the component runs for real, so not at build time.
let executionEnd = 0;

// The host stops guest code at its deadline but cannot reach into the event loop's
// wait for a timer: a timer set past the execution's end would only hold its thread.
// Firing it just after the end changes nothing the program could observe, as it is
// stopped before its callback runs. And Deno waits at least a millisecond, as Node
// does: a timer of 0 set after one of 1 fires after it, on both.
function bound(delay) {
  const wanted = max(1, toNumber(delay) || 0);
  const left = max(0, executionEnd - now()) + TIMER_SLACK_MS;
  return wanted > left ? left : wanted;
}

// A built-in's method, or accessor, replaced by one of ours under the same name and
// attributes (an accessor keeps the engine's setter where ours has none).
function replaceMethod(owner, name, method) {
  defineProperty(owner, name, { value: method, writable: true, configurable: true });
}

function replaceAccessor(owner, name, holder) {
  const engines = Object.getOwnPropertyDescriptor(owner, name);
  const ours = Object.getOwnPropertyDescriptor(holder, name);
  const set = ours.set ?? engines.set;
  defineProperty(owner, name, { get: ours.get, set, enumerable: engines.enumerable, configurable: true });
}

// A date as text names its time zone, and without ICU SpiderMonkey calls UTC "UTC"
// where Deno says "Coordinated Universal Time" (both keep time in UTC): the same
// method, under the same name and attributes, with Deno's words. `String(date)` and
// `${date}` reach it too.
const dateProto = Date.prototype;
const endsWith = uncurry(String.prototype.endsWith);
const slice = uncurry(String.prototype.slice);
for (const name of ["toString", "toTimeString"]) {
  const engines = uncurry(dateProto[name]);
  const method = {
    [name]() {
      const text = engines(this);
      return endsWith(text, " (UTC)") ? `${slice(text, 0, -5)}(Coordinated Universal Time)` : text;
    },
  }[name];
  replaceMethod(dateProto, name, method);
}

// Built-ins that behave as Deno's once replaced by the same methods (names, lengths,
// attributes) doing part of the work in JavaScript first:
// - two whose errors StarlingMonkey cannot throw as catchable ones (the run ends as if
//   its promise never settled): `signal.throwIfAborted()` once aborted, and `encode`
//   of a value whose conversion to a string throws;
// - an abort with no reason, whose DOMException says what happened, as Deno's does,
//   where StarlingMonkey's only repeats its name ("AbortError: AbortError"), and which
//   `AbortSignal.abort()` refused outright.
const getter = (proto, name) => uncurry(Object.getOwnPropertyDescriptor(proto, name).get);
const signalAborted = getter(AbortSignal.prototype, "aborted");
const signalReason = getter(AbortSignal.prototype, "reason");
const encode = uncurry(TextEncoder.prototype.encode);
const abortController = uncurry(AbortController.prototype.abort);
const abortSignalAbort = uncurry(AbortSignal.abort);
const domException = DOMException;
const reasonOr = (reason) =>
  reason === undefined ? new domException("The signal has been aborted", "AbortError") : reason;
const methods = {
  throwIfAborted() {
    if (signalAborted(this)) throw signalReason(this);
  },
  encode(input = "") {
    return encode(this, `${input}`);
  },
  abort(reason) {
    return abortController(this, reasonOr(reason));
  },
};
// - signals made from others, as Deno makes them: StarlingMonkey's `AbortSignal.any`
//   reads back no reason (or garbage), never fires, and takes no signals as aborted; its
//   `timeout`'s reason says only "TimeoutError". Each is a controller's signal here.
const AbortControllerClass = AbortController;
const controllerSignal = getter(AbortController.prototype, "signal");
const statics = {
  // A default, so that its length is 0, as Deno's is.
  abort(reason = undefined) {
    return abortSignalAbort(abortSignal, reasonOr(reason));
  },
  any(signals) {
    const sources = new NativeMap(); // not an array: its prototype is the program's
    for (const signal of signals) {
      signalAborted(signal); // the engine's check that it is a signal
      mapSet(sources, signal, true);
    }
    const controller = new AbortControllerClass();
    const dependent = controllerSignal(controller);
    let aborted = null;
    mapForEach(sources, (_, signal) => {
      if (aborted === null && signalAborted(signal)) aborted = signal;
    });
    if (aborted !== null) {
      abortController(controller, signalReason(aborted));
      return dependent;
    }
    mapForEach(sources, (_, signal) => {
      addListener(signal, "abort", () => {
        if (!signalAborted(dependent)) abortController(controller, signalReason(signal));
      });
    });
    return dependent;
  },
  // Its timer is the engine's: a wait for tool calls ends in time for it.
  timeout(delay) {
    const wait = bound(delay);
    const controller = new AbortControllerClass();
    const key = {};
    mapSet(engineTimersDue, key, now() + wait);
    realSetTimeout(() => {
      mapDelete(engineTimersDue, key);
      const reason = new domException("The operation was aborted due to timeout", "TimeoutError");
      abortController(controller, reason);
    }, wait);
    return controllerSignal(controller);
  },
};
for (const [owner, name, method] of [
  [AbortSignal.prototype, "throwIfAborted", methods.throwIfAborted],
  [TextEncoder.prototype, "encode", methods.encode],
  [AbortController.prototype, "abort", methods.abort],
  [AbortSignal, "abort", statics.abort],
  [AbortSignal, "any", statics.any],
  [AbortSignal, "timeout", statics.timeout],
]) {
  replaceMethod(owner, name, method);
}

// `error.stack` reads as Deno's (`denoStack`): SpiderMonkey's lists the guest's own
// frames, and the host's path to its files, in its own notation. What the engine
// captured is read through its own getter still, by the console and the report alike.
replaceAccessor(Error.prototype, "stack", {
  get stack() {
    const captured = engineStack(this);
    return typeof captured === "string" ? denoStack(this) : captured;
  },
});

// An error's own names, as V8's: `stack` (its own there, the accessor above here) and
// not SpiderMonkey's `fileName`, `lineNumber` and `columnNumber`, which name the guest's
// files. So `JSON.stringify(error, Object.getOwnPropertyNames(error))`, a common way to
// log an error whole, writes what it writes on Deno.
const ownNames = Object.getOwnPropertyNames;
const PLACE_FIELDS = new Set(["fileName", "lineNumber", "columnNumber", "stack"]);
const setHas = uncurry(Set.prototype.has);
replaceMethod(Object, "getOwnPropertyNames", {
  getOwnPropertyNames(value) {
    const names = ownNames(value);
    let captured;
    try {
      captured = engineStack(value);
    } catch {
      return names;
    }
    // (an object that only inherits from Error.prototype gets an empty stack)
    if (typeof captured !== "string" || captured === "") return names;
    const shown = ["stack"];
    for (let i = 0; i < names.length; i++) {
      if (setHas(PLACE_FIELDS, names[i])) continue;
      const item = { value: names[i], writable: true, enumerable: true, configurable: true };
      defineProperty(shown, shown.length, item); // not `push`: the program's to replace
    }
    return shown;
  },
}.getOwnPropertyNames);
// And the stack `Error.captureStackTrace` gives an object, as V8's: the object's name
// and message, then the program's frames where it was called (below the function
// named, if one is).
const ErrorCtor = Error;
const capture = {
  captureStackTrace(target, below) {
    const here = new ErrorCtor();
    defineProperty(here, "name", { value: target?.name ?? "Error" });
    defineProperty(here, "message", { value: target?.message ?? "" });
    let stack = denoStack(here);
    const name = typeof below === "function" ? below.name : "";
    const mark = name ? stack.indexOf(`\n    at ${name} (`) : -1;
    if (mark >= 0) {
      const rest = stack.indexOf("\n", mark + 1);
      stack = stack.slice(0, stack.indexOf("\n")) + (rest < 0 ? "" : stack.slice(rest));
    }
    defineProperty(target, "stack", { value: stack, writable: true, configurable: true });
  },
};
replaceMethod(ErrorCtor, "captureStackTrace", capture.captureStackTrace);

// SpiderMonkey's `too much recursion` is an InternalError, where V8 throws a RangeError
// ("Maximum call stack size exceeded"): made one, so a program catches it as Deno's
// does (`e instanceof RangeError`, `e.name`, `e.constructor`) and it is reported so.
const internalProto = globalThis.InternalError?.prototype;
if (internalProto !== undefined) {
  Object.setPrototypeOf(internalProto, RangeError.prototype);
  for (const [key, value] of [["name", "RangeError"], ["constructor", RangeError]]) {
    defineProperty(internalProto, key, { value, writable: true, configurable: true });
  }
}

// The component is built without outgoing HTTP; StarlingMonkey's fetch would trap.
async function noFetch() {
  throw new TypeError("fetch is not available in this sandbox; tools are the way out");
}

// The run under way: its line offset, the answer its first uncaught background error
// makes, and how to give that answer while the run is still pending.
let current = null;

// Deno fails an execution with the first error a timer's callback, a microtask or an
// event listener throws: nothing can catch it, and the program is stopped. StarlingMonkey
// would report it and go on, or stop its event loop with the program's promise pending;
// so each callback the program hands over runs guarded, and its error is the run's
// answer, handed to the host, which stops the program there. In a session's step the
// host refuses the call (the instance goes on, as Deno's worker does): the step ends
// with the error as soon as it can. Later errors, and errors after the run is
// answered, change nothing.
function uncaught(error) {
  const run = current;
  if (run === null || run.failure !== null) return;
  run.failure = report(error, describeError, run.lineOffset);
  sendRest();
  hostCall("program/uncaught", run.failure);
  if (run.answer !== null) run.answer(run.failure);
}

function guarded(callback) {
  if (typeof callback !== "function") return callback; // the engine's own error
  return function (...args) {
    try {
      return apply(callback, this, args);
    } catch (error) {
      uncaught(error);
    }
  };
}

// A listener object's `handleEvent` is looked up at each event, as the engine would.
function guardedListener(listener) {
  if (typeof listener === "function") return guarded(listener);
  if (listener === null || typeof listener !== "object") return listener;
  return guarded(function (event) {
    return apply(listener.handleEvent, listener, [event]);
  });
}

// One guard per listener, so that adding it twice adds it once and removing it removes
// the guard that was added.
const listenerGuards = new WeakMap();
function guardOf(listener) {
  if (listener === null || (typeof listener !== "object" && typeof listener !== "function")) {
    return listener;
  }
  let guard = weakMapGet(listenerGuards, listener);
  if (guard === undefined) {
    guard = guardedListener(listener);
    weakMapSet(listenerGuards, listener, guard);
  }
  return guard;
}

const eventTarget = EventTarget.prototype;
const addListener = uncurry(eventTarget.addEventListener);
const removeListener = uncurry(eventTarget.removeEventListener);
const realQueueMicrotask = queueMicrotask;
for (const [name, method] of [["addEventListener", addListener], ["removeEventListener", removeListener]]) {
  const replacement = {
    [name](type, listener, options) {
      return method(this, type, guardOf(listener), options);
    },
  }[name];
  replaceMethod(eventTarget, name, replacement);
}

// `signal.onabort = handler` is a listener too, guarded as one; read back, it is the
// handler the program set (StarlingMonkey's own getter answers null whatever was set).
const engineOnabort = Object.getOwnPropertyDescriptor(AbortSignal.prototype, "onabort");
const onabortGet = uncurry(engineOnabort.get);
const onabortSet = uncurry(engineOnabort.set);
const handlers = new WeakMap();
replaceAccessor(AbortSignal.prototype, "onabort", {
  get onabort() {
    const engines = onabortGet(this); // the engine's check that this is a signal
    const handler = weakMapGet(handlers, this);
    return handler === undefined ? engines : handler;
  },
  set onabort(handler) {
    onabortSet(this, typeof handler === "function" ? guardOf(handler) : handler);
    weakMapSet(handlers, this, typeof handler === "function" ? handler : null);
  },
});

// The program's timers fire in the order they fall due, as Deno's (timers.js).
const programTimers = makeTimers({
  engine: { setTimeout: realSetTimeout, clearTimeout: globalThis.clearTimeout },
  now,
  bound,
  guarded,
});

// The globals a program finds, set here once: pre-initialisation keeps them in every
// instance, so `run` only sets what depends on the execution.
const timers = {
  queueMicrotask(callback) {
    if (current !== null && typeof callback === "function") current.queued = true;
    return realQueueMicrotask(guarded(callback));
  },
};
globalThis.setTimeout = programTimers.setTimeout;
globalThis.setInterval = programTimers.setInterval;
globalThis.clearTimeout = programTimers.clearTimeout;
globalThis.clearInterval = programTimers.clearInterval;
globalThis.queueMicrotask = timers.queueMicrotask;
// Deno's web classes name themselves to `Object.prototype.toString`; these of
// StarlingMonkey's do not (or, `performance`'s, in lower case).
for (const name of [
  "AbortSignal", "AbortController", "URL", "URLSearchParams", "Headers", "FormData",
  "EventTarget", "WritableStream", "TransformStream", "Performance",
]) {
  const prototype = globalThis[name]?.prototype;
  if (prototype !== undefined) {
    defineProperty(prototype, Symbol.toStringTag, { value: name, configurable: true });
  }
}
Reflect.deleteProperty(performance, Symbol.toStringTag); // its own, which hides the above
// `performance.timeOrigin` is the epoch time `performance.now()` counts from, as on
// Deno (`timeOrigin + now()` is the time of day); StarlingMonkey's counts from a clock
// of its own. Read once, if the program asks: every execution starts from the built
// instance, where it is unread, and a session's steps share it, as Deno's process does.
let timeOrigin = null;
const originGetter = {
  get timeOrigin() {
    timeOrigin ??= dateNow() - now();
    return timeOrigin;
  },
};
// (performance holds its own, shadowing its prototype's)
for (const holder of [performance, Object.getPrototypeOf(performance)]) {
  if (Object.hasOwn(holder, "timeOrigin")) replaceAccessor(holder, "timeOrigin", originGetter);
}
globalThis.fetch = noFetch;

const TypeErrorCtor = TypeError;

// Deno's streams are async iterables (`for await (const chunk of stream)`, `values()`)
// and may be made from one (`ReadableStream.from`); StarlingMonkey's are neither.
const ReadableStreamCtor = ReadableStream;
const readableProto = ReadableStream.prototype;
const getReader = uncurry(readableProto.getReader);
const readerProto = Object.getPrototypeOf(new ReadableStreamCtor().getReader());
const readerRead = uncurry(readerProto.read);
const readerCancel = uncurry(readerProto.cancel);
const readerRelease = uncurry(readerProto.releaseLock);
const asyncIteratorSymbol = Symbol.asyncIterator;
const iteratorSymbol = Symbol.iterator;

async function* streamValues(stream, preventCancel) {
  const reader = getReader(stream);
  let leftEarly = true; // by `break`, `return` or a throw in the loop: cancel the stream
  try {
    for (;;) {
      let step;
      try {
        step = await readerRead(reader);
      } catch (error) {
        leftEarly = false; // the stream failed: nothing to cancel
        throw error;
      }
      if (step.done) {
        leftEarly = false;
        return;
      }
      yield step.value;
    }
  } finally {
    if (leftEarly && !preventCancel) await readerCancel(reader);
    readerRelease(reader);
  }
}

const streamIteration = {
  values(options = undefined) {
    return streamValues(this, !!options?.preventCancel);
  },
}.values;
replaceMethod(readableProto, "values", streamIteration);
replaceMethod(readableProto, asyncIteratorSymbol, streamIteration);
replaceMethod(
  ReadableStreamCtor,
  "from",
  {
    from(source) {
      const asyncMethod = source?.[asyncIteratorSymbol];
      const method = asyncMethod ?? source?.[iteratorSymbol];
      if (typeof method !== "function") {
        throw new TypeErrorCtor("ReadableStream.from: the argument is not iterable");
      }
      const iterator = apply(method, source, []);
      return new ReadableStreamCtor({
        async pull(controller) {
          const step = await iterator.next();
          if (step.done) controller.close();
          else controller.enqueue(asyncMethod ? step.value : await step.value);
        },
        async cancel(reason) {
          await iterator.return?.(reason);
        },
      });
    },
  }.from,
);

// A body read as bytes (`Response`, `Request`: the Fetch standard's `bytes()`, Deno's
// too), where StarlingMonkey has only `arrayBuffer()`.
const Uint8ArrayCtor = Uint8Array;
for (const owner of [Response.prototype, Request.prototype]) {
  if (owner.bytes !== undefined) continue;
  const arrayBuffer = uncurry(owner.arrayBuffer);
  const method = {
    async bytes() {
      return new Uint8ArrayCtor(await arrayBuffer(this));
    },
  }.bytes;
  // enumerable, as a web interface's operations are
  const operation = { value: method, writable: true, enumerable: true, configurable: true };
  defineProperty(owner, "bytes", operation);
}

// What the web's functions refuse, refused as Deno does, with a DOMException of the
// same name and message where the engine throws its own error (a RangeError from
// `btoa`, a TypeError from `structuredClone`) or accepts more (MD5 digests): a program
// that checks `error.name` or `instanceof DOMException` reads the same on both.
const RangeErrorCtor = RangeError;
const stringOf = String;

function refusing(owner, name, refusal) {
  const native = owner[name];
  const held = Object.getOwnPropertyDescriptor(owner, name);
  const wrapped = {
    [name](...args) {
      let answer;
      try {
        answer = apply(native, this, args);
      } catch (error) {
        throw refusal(error, args) ?? error;
      }
      return answer;
    },
  }[name];
  defineProperty(wrapped, "length", { value: native.length });
  defineProperty(owner, name, {
    value: wrapped,
    writable: held.writable,
    enumerable: held.enumerable,
    configurable: held.configurable,
  });
}

refusing(globalThis, "btoa", (error) =>
  error instanceof RangeErrorCtor
    ? new domException(
        "Cannot encode string: string contains characters outside of the Latin1 range",
        "InvalidCharacterError",
      )
    : null,
);
refusing(globalThis, "atob", (error) =>
  error instanceof RangeErrorCtor
    ? new domException("Failed to decode base64", "InvalidCharacterError")
    : null,
);
refusing(globalThis, "structuredClone", (error, [value]) => {
  const cloning = error instanceof TypeErrorCtor ||
    (error instanceof domException && error.name === "DataCloneError");
  if (!cloning) return null;
  let text;
  try {
    text = stringOf(value);
  } catch {
    text = "The object";
  }
  return new domException(`${text} could not be cloned.`, "DataCloneError");
});
const subtleDigest = SubtleCrypto.prototype.digest;
const upperCase = uncurry(String.prototype.toUpperCase);
const PromiseCtor = Promise;
const promiseReject = Promise.reject;
replaceMethod(SubtleCrypto.prototype, "digest", {
  digest(algorithm, data) {
    const name = typeof algorithm === "string" ? algorithm : algorithm?.name;
    if (typeof name === "string" && upperCase(name) === "MD5") {
      const refused = new domException(`Algorithm '${name}' is not supported`, "NotSupportedError");
      return apply(promiseReject, PromiseCtor, [refused]);
    }
    return apply(subtleDigest, this, [algorithm, data]);
  },
}.digest);
defineProperty(globalThis, "tools", { value: tools, enumerable: true });
defineProperty(globalThis, "ToolError", { value: ToolError, enumerable: true });
defineProperty(globalThis, "fs", { value: fs, enumerable: true });

export function run(requestText) {
  const job = parse(requestText);
  executionEnd = now() + (job.timeout_ms ?? 0);
  const lineOffset = job.line_offset ?? 0;
  setLineOffset(lineOffset, job.column_shift ?? null);
  // A plain global, so a program may also declare its own `inputs`.
  globalThis.inputs = job.inputs ?? null;
  const run = { lineOffset, failure: null, answer: null, queued: false };
  current = run;
  // A session's step: the calls a step before left out are its execution's, and their
  // answers are never collected here (a poll it left pending may still fire).
  if (calls.tickets !== 0) { // only after a step that called: nothing to do otherwise
    calls.out = new NativeMap();
    calls.waiting = new NativeMap();
    calls.sent = new NativeMap();
    failedUnhandled.calls = new NativeMap();
  }
  calls.first = calls.next = calls.tickets = 0;
  calls.sending = "";
  calls.polling = false;
  const answer = runProgram(job);
  if (run.failure !== null) return answered(run.failure);
  if (typeof answer === "string") {
    sendRest();
    return answered(answer);
  }
  const settled = new NativePromise((resolve) => {
    run.answer = (text) => {
      const failed = run.failure === null ? unhandledCallFailure() : null;
      if (failed !== null) return uncaught(failed.reason); // which answers with it
      sendRest();
      resolve(answered(text));
    };
  });
  // `then` makes its promise with the constructor a promise names, which a program
  // could have replaced (Promise.prototype.constructor, Promise[Symbol.species]) with
  // one that throws: ours name none, so the engine's own is used.
  defineProperty(answer, "constructor", { value: undefined });
  then(answer, run.answer);
  defineProperty(settled, "constructor", { value: undefined });
  // componentize-js takes the answer with the promise's `then`, which a program could
  // replace on Promise.prototype to answer in its place: this one has its own.
  defineProperty(settled, "then", { value: promiseThen });
  return settled;
}

// An async function's way of settling a plain function's outcome, tick for tick: the
// same promise an async function's `return value` or `throw error` makes.
const settledAsReturned = async (value) => value;
const settledAsThrown = async (error) => {
  throw error;
};

// Results encoded the same whenever they are encoded: nothing a microtask does can
// change them (a BigInt's JSON form consults BigInt.prototype.toJSON, so it is not).
function isPlainPrimitive(value) {
  const type = typeof value;
  return (
    value === null || type === "undefined" || type === "boolean" || type === "number" ||
    type === "string"
  );
}

// The program evaluated and run: the JSON answer, or a promise of it (never rejected).
// An async function's value is awaited. A plain function's primitive value is answered
// at once: awaiting it would only let queued microtasks run first, and they run before
// the instance is done anyway (unless `queueMicrotask` queued one, whose error would be
// the run's). Any other value or error is settled as the async function's would have
// been, so the program sees the same order of events.
function runProgram(job) {
  let program;
  try {
    program = evaluate(job.function);
  } catch (error) {
    return report(error, describeSyntaxError, job.line_offset);
  }
  // Called inside `settle`: a program that closes the wrapper early may leave
  // `program` anything at all, and calling it is then the program's error.
  if (job.asynchronous) return settle(() => program(), job.line_offset);
  let value;
  try {
    value = program();
  } catch (error) {
    return settle(() => settledAsThrown(error), job.line_offset);
  }
  if (isPlainPrimitive(value) && !current?.queued) return `{"result":${encodeResult(value)}}`;
  return settle(() => settledAsReturned(value), job.line_offset);
}

// The JSON answer for the value or error of `body()`'s promise.
async function settle(body, lineOffset) {
  try {
    return `{"result":${encodeResult(await body())}}`;
  } catch (error) {
    return report(error, describeError, lineOffset);
  }
}

// Pre-initialisation keeps whatever this top level leaves in the engine, so it runs
// the paths every execution takes once, here, rather than in every fresh instance:
// - componentize-js's bindings (which lift `run`'s string and await its promise) run
//   in a global of their own that nothing else touches at build time, and SpiderMonkey
//   sets up a global's built-ins on first use: Promise, async functions, String,
//   typed arrays and DataView were being set up again on each instance's one call.
//   `hostCall` is a function of that global, so its constructor makes code there;
// - `runProgram` on a result, a thrown error and a syntax error, as an async and as a
//   plain function, compiling this shim's own functions once.
// A trivial program's first (and only) call into an instance went from 0.31 to 0.21
// ms in-process. `run` itself is left out: `performance.now()` traps until the
// component runs for real.
function warmUp() {
  const bindingsFunction = hostCall.constructor;
  bindingsFunction(`
    const lift = async (pending) => {
      await pending;
      const view = new DataView(new ArrayBuffer(8));
      view.setUint32(0, "a".charCodeAt(0), true);
      return view.getUint32(0, true) + new Uint8Array(view.buffer).length;
    };
    lift(Promise.resolve());
  `)();
  const programs = [
    [true, "return { a: [1] };"],
    [true, "throw new TypeError('x');"],
    [true, ")"],
    [false, "return 1;"],
    [false, "return { a: [1] };"],
    [false, "throw new TypeError('x');"],
  ];
  for (const [asynchronous, body] of programs) {
    const head = asynchronous ? "(async function () {" : "(function () {";
    runProgram({ asynchronous, function: `${head}\n${body}\n})`, line_offset: 1 });
  }
}

warmUp();
