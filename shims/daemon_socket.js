// How a Deno-hosted sandbox reaches the daemon: JSON-RPC on ONE connection to the
// daemon's sandbox callback address, shared by every call (multiplexed by id), under
// the execution's session token. Used by the Deno and Pyodide workers.
//
// The connection is opened when the job arrives, before the program's code exists;
// the worker then revokes every permission (permissions.js), so the program can
// neither connect again nor touch the address's path. What it can reach at most is
// this one connection, which carries only its own token and its own calls.
//
// Captured at import, before any program code runs.

import { ToolError } from "./sandbox_sdk.js";

const stringify = JSON.stringify;
const parse = JSON.parse;
const encode = TextEncoder.prototype.encode.bind(new TextEncoder());
const decoder = new TextDecoder();
const decode = TextDecoder.prototype.decode.bind(decoder);

// `request(method, params, tool)` over a connection opened now: a promise of the
// call's result; rejects with ToolError for an error answer, a lost connection, or an
// address that could not be reached. `connect` is Deno.connect, captured by the worker
// before the program could replace it. Never rejects itself.
export async function openRequester(token, callback, connect) {
  if (!callback) {
    return () => Promise.reject(new ToolError("tools are not available in this execution", -32006, null));
  }
  try {
    const conn = callback.unix_path
      ? await connect({ transport: "unix", path: callback.unix_path })
      : await connect({ hostname: callback.tcp_host, port: callback.tcp_port });
    const request = socketRequester(token, conn);
    // The daemon closes a connection that presents no valid token within seconds of
    // connecting (server.auth_timeout_s), and a program may think longer than that
    // before its first call: present the token now. Not awaited: the program starts
    // at once, and a failure here shows on its first call.
    request("ping", {}, null).catch(() => {});
    return request;
  } catch (error) {
    const reason = `cannot reach the daemon for tool calls: ${String(error?.message ?? error)}`;
    return () => Promise.reject(new ToolError(reason, -32603, null));
  }
}

function socketRequester(token, conn) {
  let nextId = 1;
  const pending = new Map();
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
    closed = true;
    for (const { reject } of pending.values()) {
      reject(new ToolError("the connection to the daemon closed", -32603, null));
    }
    pending.clear();
  }

  function settle(reply) {
    const waiter = pending.get(reply.id);
    if (!waiter) return;
    pending.delete(reply.id);
    if (pending.size === 0) conn.unref();
    if (reply.error) {
      const { code, message, data } = reply.error;
      waiter.reject(new ToolError(message, code, data?.tool ?? waiter.tool, data));
    } else {
      waiter.resolve(reply.result);
    }
  }

  return async function request(method, params, tool) {
    if (closed) throw new ToolError("the connection to the daemon closed", -32603, null);
    const id = nextId++;
    const message = { jsonrpc: "2.0", id, method, params, auth: { bearerToken: token } };
    const reply = new Promise((resolve, reject) => pending.set(id, { resolve, reject, tool }));
    conn.ref();
    const bytes = encode(stringify(message) + "\n");
    for (let offset = 0; offset < bytes.length; ) offset += await conn.write(bytes.subarray(offset));
    return reply;
  };
}
