// How a Deno-hosted sandbox reaches the daemon: JSON-RPC on ONE connection to the
// daemon's sandbox socket, opened on first use and shared by every call (multiplexed
// by id), under the execution's session token. Used by the Deno and Pyodide workers.
//
// Captured at import, before any program code runs.

import { ToolError } from "./sandbox_sdk.js";

const stringify = JSON.stringify;
const parse = JSON.parse;
const encode = TextEncoder.prototype.encode.bind(new TextEncoder());
const decoder = new TextDecoder();
const decode = TextDecoder.prototype.decode.bind(decoder);

// `request(method, params, tool)`: a promise of the call's result; rejects with
// ToolError for an error answer or a lost connection. `connect` is Deno.connect,
// captured by the worker before the program could replace it.
export function socketRequester(token, callback, connect) {
  let connection = null;
  let nextId = 1;
  const pending = new Map();

  async function open() {
    if (!callback) throw new ToolError("tools are not available in this execution", -32006, null);
    const conn = callback.unix_path
      ? await connect({ transport: "unix", path: callback.unix_path })
      : await connect({ hostname: callback.tcp_host, port: callback.tcp_port });
    readReplies(conn);
    return conn;
  }

  async function readReplies(conn) {
    const buffer = new Uint8Array(65536);
    let text = "";
    try {
      for (;;) {
        const n = await conn.read(buffer);
        if (n === null) break;
        text += decode(buffer.subarray(0, n), { stream: true });
        let newline;
        while ((newline = text.indexOf("\n")) >= 0) {
          settle(parse(text.slice(0, newline)));
          text = text.slice(newline + 1);
        }
      }
    } catch {
      // Fall through: every call still waiting learns the connection is gone.
    }
    for (const { reject } of pending.values()) {
      reject(new ToolError("the connection to the daemon closed", -32603, null));
    }
    pending.clear();
  }

  function settle(reply) {
    const waiter = pending.get(reply.id);
    if (!waiter) return;
    pending.delete(reply.id);
    if (reply.error) {
      const { code, message, data } = reply.error;
      waiter.reject(new ToolError(message, code, data?.tool ?? waiter.tool, data));
    } else {
      waiter.resolve(reply.result);
    }
  }

  return async function request(method, params, tool) {
    connection ??= open();
    const conn = await connection;
    const id = nextId++;
    const message = { jsonrpc: "2.0", id, method, params, auth: { bearerToken: token } };
    const reply = new Promise((resolve, reject) => pending.set(id, { resolve, reject, tool }));
    const bytes = encode(stringify(message) + "\n");
    for (let offset = 0; offset < bytes.length; ) offset += await conn.write(bytes.subarray(offset));
    return reply;
  };
}
