// Giving up every permission a worker was started with, before the program exists.
//
// A worker may start with permissions the shim needs and the program must never have:
// the daemon's callback address (net, plus read and write on a Unix socket's path),
// Pyodide's files. Once the shim has used them (the connection is open, the files are
// in memory), `dropPermissions` revokes them all, then checks that none is left, so a
// program can neither reach the daemon's socket file nor connect to it again.

// Not "import": Deno grants it to a few well-known hosts by default, --no-remote is
// what refuses remote modules, and revoking it would only turn that plain refusal into
// a permission error.
const NAMES = ["read", "write", "net", "env", "sys", "run", "ffi"];

// Revoke every permission; throw if any is still granted afterwards. `callback` (the
// job's) names the descriptors that were granted for it, which are checked one by one.
export function dropPermissions(permissions, callback) {
  for (const name of NAMES) permissions.revokeSync({ name });
  const checks = NAMES.map((name) => ({ name }));
  if (callback?.unix_path) {
    const path = callback.unix_path;
    checks.push({ name: "read", path }, { name: "write", path }, { name: "net", host: `unix:${path}` });
  } else if (callback?.tcp_host) {
    const host = callback.tcp_host.includes(":") ? `[${callback.tcp_host}]` : callback.tcp_host;
    checks.push({ name: "net", host: `${host}:${callback.tcp_port}` });
  }
  const kept = checks.filter((descriptor) => permissions.querySync(descriptor).state === "granted");
  if (kept.length > 0) {
    throw new Error(`the sandbox could not give up its permissions: ${JSON.stringify(kept)}`);
  }
}
