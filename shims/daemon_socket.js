// How a Deno-hosted sandbox reaches the daemon: JSON-RPC on ONE connection to the
// daemon's sandbox callback address, shared by every call (multiplexed by id), under
// the execution's session token. Used by the Deno and Pyodide workers.
//
// The connection is opened while the worker warms up, before any job or program
// exists; the worker then revokes every permission (permissions.js), so the program
// can neither connect again nor touch the address's path. What it can reach at most is
// this one connection, which carries only its own token and its own calls.
//
// Captured at import, before any program code runs.

import { ToolError, own, settleReply } from "./sandbox_sdk.js";

const stringify = JSON.stringify;
const parse = JSON.parse;
const encode = TextEncoder.prototype.encode.bind(new TextEncoder());
const decoder = new TextDecoder();
const decode = TextDecoder.prototype.decode.bind(decoder);
// Methods as plain functions: the program may replace them on the prototypes, and the
// replies it awaits must still reach it, and only it.
const uncurry = (method) => Function.prototype.call.bind(method);
const NativeMap = Map;
const mapGet = uncurry(Map.prototype.get);
const mapSet = uncurry(Map.prototype.set);
const mapDelete = uncurry(Map.prototype.delete);
const mapForEach = uncurry(Map.prototype.forEach);
const mapClear = uncurry(Map.prototype.clear);
const mapSize = uncurry(Object.getOwnPropertyDescriptor(Map.prototype, "size").get);
const indexOf = uncurry(String.prototype.indexOf);
const slice = uncurry(String.prototype.slice);
const subarray = uncurry(Uint8Array.prototype.subarray);
const NativePromise = Promise;

// The connection to `callback` (the worker's, from its prelude), opened now; null when
// there is no address. `connect` is Deno.connect, captured by the worker before any
// program could replace it. Never rejects: a failure shows on the first tool call.
export async function openChannel(callback, connect) {
  if (!callback) return null;
  try {
    return callback.unix_path
      ? await connect({ transport: "unix", path: callback.unix_path })
      : await connect({ hostname: callback.tcp_host, port: callback.tcp_port });
  } catch (error) {
    return { failure: `cannot reach the daemon for tool calls: ${String(error?.message ?? error)}` };
  }
}

// `request(method, params, tool)` on `channel` under `token`: a promise of the call's
// result; rejects with ToolError for an error answer, a lost connection, a channel
// that could not be opened, or a call longer than `maxBytes` (the daemon's
// `max_message_bytes`, which it would refuse with a reply naming no call). `token` may
// be a function giving the token for each call (a session's worker holds one
// connection for steps with tokens of their own).
export function requester(token, channel, maxBytes = null) {
  if (!channel) {
    return () => Promise.reject(new ToolError("tools are not available in this execution", -32006, null));
  }
  if (channel.failure) return () => Promise.reject(new ToolError(channel.failure, -32603, null));
  return socketRequester(token, channel, maxBytes);
}

function socketRequester(token, conn, maxBytes) {
  let nextId = 1;
  const pending = new NativeMap();
  let closed = false;
  // Waiting for replies must not keep the process alive when no call is: a program
  // whose promise never settles still ends the way it would without the connection.
  conn.unref();
  readReplies();

  async function readReplies() {
    const buffer = new Uint8Array(65536);
    let text = "";
    try {
      for (;;) {
        const n = await conn.read(buffer);
        if (n === null) break;
        text += decode(subarray(buffer, 0, n), { stream: true });
        let newline;
        while ((newline = indexOf(text, "\n")) >= 0) {
          settle(parse(slice(text, 0, newline)));
          text = slice(text, newline + 1);
        }
      }
    } catch {
      // Fall through: every call still waiting learns the connection is gone.
    }
    closed = true;
    mapForEach(pending, (waiter) => {
      waiter.reject(new ToolError("the connection to the daemon closed", -32603, null));
    });
    mapClear(pending);
  }

  function settle(reply) {
    const id = own(reply, "id");
    const waiter = mapGet(pending, id);
    if (!waiter) return;
    mapDelete(pending, id);
    if (mapSize(pending) === 0) conn.unref();
    settleReply(reply, waiter.resolve, waiter.reject, waiter.tool);
  }

  // Messages are written whole and in the order made (a large one takes several
  // writes, which another's must not split); `written()` is the last one's write, or
  // null, which a one-shot worker waits for before it reports and exits, and
  // `toolCallsWritten()` how many tool calls were written whole, which it reports: the
  // daemon reads that many before the execution's session ends.
  let writes = null;
  let toolCalls = 0;
  async function writeAfter(before, bytes, toolCall) {
    if (before !== null) {
      try {
        await before;
      } catch {
        // That call's caller learns of it; this message goes on.
      }
    }
    for (let offset = 0; offset < bytes.length; ) offset += await conn.write(subarray(bytes, offset));
    if (toolCall) toolCalls++;
  }

  async function request(method, params, tool) {
    if (closed) throw new ToolError("the connection to the daemon closed", -32603, null);
    const id = nextId++;
    const bearerToken = typeof token === "function" ? token() : token;
    // Joined from strings: a `toJSON` the program planted on Object.prototype would
    // otherwise rewrite the whole message (its method, its token) and leave the call
    // waiting for a reply that never comes.
    const auth = `{"bearerToken":${stringify(bearerToken ?? null)}}`;
    const head = `{"jsonrpc":"2.0","id":${id},"method":${stringify(`${method}`)}`;
    const message = `${head},"params":${stringify(params)},"auth":${auth}}`;
    const bytes = encode(message + "\n");
    if (maxBytes !== null && bytes.length - 1 > maxBytes) {
      const size = `the call is ${bytes.length - 1} bytes`;
      throw new ToolError(`${size}; the daemon reads at most ${maxBytes} (server.max_message_bytes)`, -32600, tool);
    }
    const reply = new NativePromise((resolve, reject) => mapSet(pending, id, { resolve, reject, tool }));
    conn.ref();
    const write = writeAfter(writes, bytes, method === "tools/call");
    writes = write;
    await write;
    return reply;
  }
  request.written = () => writes;
  request.toolCallsWritten = () => toolCalls;
  return request;
}
