// An interpreter's working directory and what its files may take: imported by the
// interpreter (pyodide_interpreter.js), on Pyodide's in-memory file system (MEMFS).
//
// A program runs in WORK_DIR, empty when its interpreter is new (every fresh
// execution's is: the file system lives in the interpreter's Web Worker and ends
// with it; a session's stays from step to step). Its input files are placed there
// before it runs and what it leaves under out/ is collected after it. Nothing of the
// host's file system is mounted: no path leads outside the interpreter's memory.
//
// MEMFS keeps every file in the worker's memory, so a disk bomb would be a memory
// bomb: `FileQuota` sees every new entry, write and truncation before MEMFS makes or
// grows it, and refuses (ENOSPC, as a full disk) one that would make what was written
// in this interpreter, anywhere in its file system, take more than the limit: files'
// bytes, plus ENTRY_BYTES an entry, so neither large files nor many empty ones pass.
//
// Paths come checked from the daemon (relative, plain names). Placing, reading and
// listing walk them one name at a time and never follow a link.

export const WORK_DIR = "/work";
const OUT_DIR = "out";
// As core/files.py: at most this many files come back, this deep.
const MAX_FILES = 1000;
const MAX_DEPTH = 32;
// Emscripten's errno for "no space left on device".
const ENOSPC = 51;
// What an entry (a file, a directory, a link) counts for beyond a file's bytes, as
// on wasm-python.
const ENTRY_BYTES = 512;

// Counts what every entry made or file written in this interpreter takes, and refuses
// an entry or a write that would take it past `limit`. A running count is kept
// cheaply; only when it says the limit is passed is it counted again (entries deleted
// since drop out).
export class FileQuota {
  constructor(FS) {
    this.FS = FS;
    this.written = new Set();
    this.counted = 0;
    this.limit = Infinity;
    this.hit = false;
    const memfs = FS.filesystems.MEMFS;
    const fileOps = memfs.ops_table.file;
    const write = memfs.stream_ops.write;
    const setattr = memfs.node_ops.setattr;
    const createNode = memfs.createNode;
    const quota = this;
    memfs.createNode = function (parent, ...rest) {
      if (parent !== null) quota.charge(ENTRY_BYTES);
      const node = createNode.call(this, parent, ...rest);
      quota.written.add(node);
      return node;
    };
    const guardedWrite = function (stream, buffer, offset, length, position, canOwn) {
      quota.admit(stream.node, position + length);
      return write.call(this, stream, buffer, offset, length, position, canOwn);
    };
    const guardedSetattr = function (node, attr) {
      if (attr?.size !== undefined) quota.admit(node, attr.size, true);
      return setattr.call(this, node, attr);
    };
    memfs.stream_ops.write = fileOps.stream.write = guardedWrite;
    memfs.node_ops.setattr = fileOps.node.setattr = guardedSetattr;
  }

  // A new job's limit; whether it was hit is the job's own to report.
  begin(limitBytes) {
    this.limit = limitBytes;
    this.hit = false;
  }

  // Throws ENOSPC unless `node` may hold `size` bytes (a write may only grow it).
  admit(node, size, exact = false) {
    const grown = exact ? size - node.usedBytes : Math.max(0, size - node.usedBytes);
    this.written.add(node);
    if (grown > 0) this.charge(grown);
  }

  // Throws ENOSPC unless `grown` more bytes fit.
  charge(grown) {
    if (this.counted + grown > this.limit) this.counted = this.usage();
    if (this.counted + grown > this.limit) {
      this.hit = true;
      throw new this.FS.ErrnoError(ENOSPC);
    }
    this.counted += grown;
  }

  // What the entries made or written in this interpreter take now: those still linked
  // in a directory, or held open.
  usage() {
    const open = new Set(this.FS.streams.filter(Boolean).map((stream) => stream.node));
    let total = 0;
    for (const node of this.written) {
      if (node.parent?.contents?.[node.name] === node || open.has(node)) {
        total += ENTRY_BYTES + (isFileMode(node.mode) ? node.usedBytes : 0);
      } else {
        this.written.delete(node);
      }
    }
    return total;
  }
}

// The working directory made (if new) and made current, for the next program.
export function enterWorkDir(FS) {
  if (!FS.analyzePath(WORK_DIR).exists) FS.mkdir(WORK_DIR);
  FS.chdir(WORK_DIR);
}

// Captured as the module loads, before any program: what runs after a program reads
// its directory with these and plain loops, never with what it may have replaced (a
// prototype's methods, a global), and walks MEMFS's own nodes, not FS's path lookups.
const Bytes = Uint8Array;
const keysOf = Object.keys;
const hasOwn = Object.hasOwn;
const sliceBytes = Function.prototype.call.bind(Uint8Array.prototype.slice);
const splitPath = Function.prototype.call.bind(String.prototype.split);
const S_IFMT = 0o170000;
const isFileMode = (mode) => (mode & S_IFMT) === 0o100000;
const isDirMode = (mode) => (mode & S_IFMT) === 0o040000;

// The working directory's node, or null if the program took it away.
function workNode(FS) {
  const root = FS.root;
  const name = WORK_DIR.slice(1);
  const node = hasOwn(root.contents, name) ? root.contents[name] : null;
  return node !== null && isDirMode(node.mode) ? node : null;
}

// The entry `name` in directory node `dir`, or null.
function childOf(dir, name) {
  return hasOwn(dir.contents, name) ? dir.contents[name] : null;
}

// A file's place in the working directory: its full path, the node there (null if
// none) and how many directories on the way are missing; with `make`, they are made.
// Throws a refusal naming the path if a directory on the way is not one, or the path
// itself is a directory or a link.
function placeOf(FS, path, make) {
  const names = splitPath(path, "/");
  const full = `${WORK_DIR}/${path}`;
  let dir = workNode(FS);
  let where = WORK_DIR;
  for (let i = 0; i < names.length - 1; i++) {
    where += `/${names[i]}`;
    const node = childOf(dir, names[i]);
    if (node === null && !make) return { full, node: null, missing: names.length - 1 - i };
    if (node === null) dir = FS.mkdir(where);
    else if (isDirMode(node.mode)) dir = node;
    else throw new Refused(`file path '${path}' is under '${where.slice(WORK_DIR.length + 1)}', which is not a directory`);
  }
  const node = childOf(dir, names[names.length - 1]);
  if (node !== null && !isFileMode(node.mode)) {
    throw new Refused(`file path '${path}' is taken by a directory, a link or a special file`);
  }
  return { full, node, missing: 0 };
}

export class Refused extends Error {}

// Places `files` ({path, data}) in the working directory, replacing files by the same
// path; or none of them, if one may not be placed or, with `limit`, if what was
// written in the interpreter would then take more than that.
export function placeFiles(FS, quota, files, limit = null) {
  let total = quota.usage();
  for (const { path, data } of files) {
    const { node, missing } = placeOf(FS, path, false);
    total += node === null ? data.length + (missing + 1) * ENTRY_BYTES : data.length - node.usedBytes;
  }
  if (limit !== null && total > limit) {
    throw new Refused(`the files would take ${total} bytes in all, more than limits.disk_mb allows (${limit} bytes)`);
  }
  for (const { path, data } of files) FS.writeFile(placeOf(FS, path, true).full, data);
}

// Every regular file under `root` (a path relative to the working directory, "" for
// all of it), at most `max`, as [path relative to root, node]; links never followed.
function regularFiles(root, FS, max = Infinity) {
  const found = [];
  const start = root ? resolve(FS, root, isDirMode) : workNode(FS);
  if (start === null) return found;
  const walk = (dir, prefix, depth) => {
    const names = keysOf(dir.contents);
    for (let i = 0; i < names.length && found.length < max; i++) {
      const node = dir.contents[names[i]];
      const path = prefix + names[i];
      if (isFileMode(node.mode)) found[found.length] = [path, node];
      else if (isDirMode(node.mode) && depth < MAX_DEPTH) walk(node, `${path}/`, depth + 1);
    }
  };
  walk(start, "", 1);
  return found;
}

// The node at `path` in the working directory if `is(mode)` holds for it, walking
// directories only (no link followed); else null.
function resolve(FS, path, is) {
  let node = workNode(FS);
  const names = splitPath(path, "/");
  for (let i = 0; i < names.length && node !== null; i++) {
    node = isDirMode(node.mode) ? childOf(node, names[i]) : null;
  }
  return node !== null && is(node.mode) ? node : null;
}

// What the program left under out/: [{path, data}], paths relative to out/.
export function collectOut(FS) {
  const found = regularFiles(OUT_DIR, FS, MAX_FILES);
  const files = [];
  for (let i = 0; i < found.length; i++) files[i] = { path: found[i][0], data: bytesOf(found[i][1]) };
  return files;
}

// Every regular file in the working directory: [{path, size}].
export function listFiles(FS) {
  const found = regularFiles("", FS);
  const files = [];
  for (let i = 0; i < found.length; i++) files[i] = { path: found[i][0], size: found[i][1].usedBytes };
  return files;
}

// The bytes of the regular file at `path`, or null.
export function readFile(FS, path) {
  const node = resolve(FS, path, isFileMode);
  return node === null ? null : bytesOf(node);
}

// A copy of a file's bytes. MEMFS may hold them in any typed array (an Int8Array
// sliced from the WebAssembly heap, often).
function bytesOf(node) {
  const { buffer, byteOffset } = node.contents;
  return sliceBytes(new Bytes(buffer, byteOffset, node.usedBytes));
}
