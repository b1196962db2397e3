// The `tools` SDK and result encoding every JavaScript sandbox shares (the Deno worker
// and the wasm-js guest). Only how a request reaches the daemon differs: each shim
// passes its own `request(method, params, tool)`, which returns the JSON-RPC result
// (or a promise of it) and throws ToolError for an error answer.
//
// Captured at import, before any program code runs: a program may replace globals
// and prototypes, and nothing it does may change how its result is reported.

const stringify = JSON.stringify;
const toString = String;
const hasOwn = Object.hasOwn;
// The daemon's UpstreamError: the code of a tool's own failure.
const TOOL_FAILED = -32007;
const JSON_RPC_INTERNAL = -32603;

// `object[key]` if it is the object's own: never a getter the program planted on a
// prototype, which would run (and could throw) inside the shim reading an answer.
export function own(object, key) {
  return object !== null && typeof object === "object" && hasOwn(object, key) ? object[key] : undefined;
}

// Settle a call with the daemon's JSON-RPC `reply`: `resolve` its result, or `reject`
// a ToolError. A setter the program planted (on Error.prototype, say) may throw as the
// error is made: the call fails with that, and the shim goes on reading answers.
export function settleReply(reply, resolve, reject, tool) {
  try {
    const error = own(reply, "error");
    if (!error) return resolve(own(reply, "result"));
    const data = own(error, "data");
    const code = own(error, "code") ?? JSON_RPC_INTERNAL;
    reject(new ToolError(own(error, "message"), code, own(data, "tool") ?? tool, data));
  } catch (thrown) {
    reject(thrown);
  }
}

export class ToolError extends Error {
  constructor(message, code, tool, data) {
    super(message);
    this.name = "ToolError";
    this.code = code;
    this.tool = tool;
    this.data = data;
  }
}

// `tools.<ns>.<tool>(args)` and `tools.$discover()` over `request`. Calls are async, as
// in the TypeScript SDK: a failure rejects the promise rather than throwing at the call
// site, so the same program behaves the same on every executor. `handed(promise)` is
// what the program gets for each call's promise (the wasm-js guest watches whether a
// failure is handled).
export function makeTools(request, handed = (promise) => promise) {
  async function call(path, args) {
    const params = { name: path, arguments: args ?? {}, shape: "value" };
    const result = await request("tools/call", params, path);
    const failure = own(result, "error");
    if (failure) throw new ToolError(own(failure, "message"), TOOL_FAILED, own(failure, "tool") ?? path);
    return own(result, "value");
  }

  // The shape the generated declarations promise for `tools.$discover()`.
  async function discover() {
    const { tools: listed } = await request("tools/list", {}, null);
    return listed.map((tool) => ({
      id: tool.name,
      path: tool._meta?.["conduit/path"],
      description: tool.description,
      inputSchema: tool.inputSchema,
      ...(tool.outputSchema ? { outputSchema: tool.outputSchema } : {}),
    }));
  }

  // `then` is never a tool: a namespace must not look like a promise to `await`.
  const namespace = (ns) =>
    new Proxy(Object.create(null), {
      get: (_, fn) =>
        typeof fn === "string" && fn !== "then"
          ? (args) => handed(call(`${ns}.${fn}`, args))
          : undefined,
    });
  return new Proxy(Object.create(null), {
    get: (_, ns) => {
      if (ns === "$discover") return () => handed(discover());
      return typeof ns === "string" && ns !== "then" ? namespace(ns) : undefined;
    },
  });
}

// A result as JSON text: what JSON.stringify cannot encode (BigInt, cycles, a throwing
// toJSON) as String(value), undefined as null.
export function encodeResult(value) {
  if (value === undefined) return "null";
  try {
    const json = stringify(value);
    if (json !== undefined) return json;
  } catch {
    // Fall through to the string form.
  }
  try {
    return stringify(toString(value));
  } catch {
    return stringify("[result could not be converted to a string]");
  }
}
