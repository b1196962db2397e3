// A Deno worker's two pipes to the daemon. Stdin brings a one-line prelude as soon as
// the worker starts (what it may set up before any job exists), then the job, whole, up
// to the end of the pipe (a session's worker reads its steps instead, one line each);
// everything goes out on stdout with synchronous writes. Shared by the Deno and Pyodide workers; each passes the pipe functions it
// captured before any program ran.

const parse = JSON.parse;
const decode = TextDecoder.prototype.decode.bind(new TextDecoder());

// Write every byte of `bytes` with `write` (a captured `Deno.stdout.writeSync`).
export function writeAll(write, bytes) {
  let offset = 0;
  while (offset < bytes.length) offset += write(bytes.subarray(offset));
}

// Stdin as the prelude's line, then the job (or a session's steps, one a line): `read` is
// a captured `Deno.stdin.read`.
export function stdinReader(read) {
  let pending = new Uint8Array(0);

  async function more() {
    const buffer = new Uint8Array(65536);
    const n = await read(buffer);
    if (n === null) return false;
    const joined = new Uint8Array(pending.length + n);
    joined.set(pending);
    joined.set(buffer.subarray(0, n), pending.length);
    pending = joined;
    return true;
  }

  // The next line, parsed; null once stdin has ended.
  async function line() {
    for (;;) {
      const newline = pending.indexOf(10);
      if (newline >= 0) {
        const text = pending.subarray(0, newline);
        pending = pending.subarray(newline + 1);
        return parse(decode(text));
      }
      if (!(await more())) return null;
    }
  }

  return {
    // The first line, parsed; throws if stdin ends before it.
    async prelude() {
      const prelude = await line();
      if (prelude === null) throw new Error("stdin ended before the worker's prelude");
      return prelude;
    },
    line,
    // Everything after the prelude, to the end of stdin, parsed as the job.
    async job() {
      while (await more());
      return parse(decode(pending));
    },
  };
}
