// A one-shot Deno worker's two pipes to the daemon: the job arrives whole on stdin, and
// everything goes out on stdout with synchronous writes. Shared by the Deno and
// Pyodide workers; each passes the pipe functions it captured before any program ran.

const parse = JSON.parse;
const decode = TextDecoder.prototype.decode.bind(new TextDecoder());

// Write every byte of `bytes` with `write` (a captured `Deno.stdout.writeSync`).
export function writeAll(write, bytes) {
  let offset = 0;
  while (offset < bytes.length) offset += write(bytes.subarray(offset));
}

// Read `read` (a captured `Deno.stdin.read`) to its end and parse it as the job.
export async function readJob(read) {
  const chunks = [];
  let total = 0;
  for (;;) {
    const buffer = new Uint8Array(65536);
    const n = await read(buffer);
    if (n === null) break;
    chunks.push(buffer.subarray(0, n));
    total += n;
  }
  const all = new Uint8Array(total);
  let offset = 0;
  for (const chunk of chunks) {
    all.set(chunk, offset);
    offset += chunk.length;
  }
  return parse(decode(all));
}
