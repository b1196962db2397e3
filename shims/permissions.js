// Giving up every permission a worker was started with, before the program exists.
//
// A worker may start with permissions the shim needs and the program must never have:
// the daemon's callback address (net, plus read and write on a Unix socket's path),
// Pyodide's files. Once the shim has used them (the connection is open, the files are
// in memory), `dropPermissions` revokes them all, then checks that none is left, so a
// program can neither reach the daemon's socket file nor connect to it again.
//
// The one thing a program may keep is its working directory (`workdir`, the worker's
// own, made empty for it): read and write there, and nowhere else. Deno revokes a
// path-scoped grant by its path, so the socket's grants are revoked one by one and
// the directory's stay; the checks then make sure nothing else is readable or writable.

// Not "import": Deno grants it to a few well-known hosts by default, --no-remote is
// what refuses remote modules, and revoking it would only turn that plain refusal into
// a permission error.
const NAMES = ["read", "write", "net", "env", "sys", "run", "ffi"];
const FILES = ["read", "write"];

// Revoke every permission but `workdir`'s; throw if any other is still granted
// afterwards, or `workdir`'s is not. `callback` (the job's) names the descriptors that
// were granted for it, which are checked one by one.
export function dropPermissions(permissions, callback, workdir = null) {
  for (const name of NAMES) {
    if (!(workdir && FILES.includes(name))) permissions.revokeSync({ name });
  }
  const checks = NAMES.map((name) => ({ name }));
  if (callback?.unix_path) {
    const path = callback.unix_path;
    if (workdir) for (const name of FILES) permissions.revokeSync({ name, path });
    checks.push({ name: "read", path }, { name: "write", path }, { name: "net", host: `unix:${path}` });
  } else if (callback?.tcp_host) {
    const host = callback.tcp_host.includes(":") ? `[${callback.tcp_host}]` : callback.tcp_host;
    checks.push({ name: "net", host: `${host}:${callback.tcp_port}` });
  }
  if (workdir) {
    const parent = workdir.slice(0, workdir.lastIndexOf("/")) || "/";
    for (const name of FILES) checks.push({ name, path: parent }, { name, path: "/" });
  }
  const kept = checks.filter((descriptor) => permissions.querySync(descriptor).state === "granted");
  if (kept.length > 0) {
    throw new Error(`the sandbox could not give up its permissions: ${JSON.stringify(kept)}`);
  }
  const lost = workdir
    ? FILES.filter((name) => permissions.querySync({ name, path: workdir }).state !== "granted")
    : [];
  if (lost.length > 0) {
    throw new Error(`the sandbox lost its working directory's permissions: ${lost.join(", ")}`);
  }
}
