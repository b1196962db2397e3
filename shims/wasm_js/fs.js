// A Node-style synchronous `fs` for the wasm-js guest's programs.
//
// StarlingMonkey has no file system module, and the guest is given no WASI directory:
// every call goes through the `host-call` import as an `fs/*` method, which the host
// serves on the execution's own working directory (executors/wasm_files.py): paths
// are relative to it, links are never followed, writes count against limits.disk_mb.
// A failure throws an Error whose `code` is Node's ("ENOENT", "EISDIR", ...).
//
// Data crosses as base64 (or, read as text, as the text), turned into bytes and back by
// the engine's own `TextEncoder`, `Uint8Array.fromBase64` and `toBase64`: a loop over
// the bytes in JavaScript runs in the interpreter, hundreds of times slower. A read's
// comes in the host's answer. A write's goes out on stdout, through `writeLine` (the
// engine's `console.log`, captured before any program ran), between an `fs/pipe` call
// that announces its size and the `fs/write` that places it: a string handed to
// `host-call` is turned into UTF-8 by a loop in the component's bindings, which took
// most of a second for a megabyte's base64 (see executors/wasm_fs.py).

import { own } from "./sandbox_sdk.js";

export function makeFs(hostCall, stringify, parse, writeLine) {
  const U8 = Uint8Array;
  // Taken now: a program may replace them later, not change what `fs` does.
  const toBase64 = Function.prototype.call.bind(U8.prototype.toBase64);
  const fromBase64 = U8.fromBase64.bind(U8);
  const utf8 = TextEncoder.prototype.encode.bind(new TextEncoder());
  const isView = ArrayBuffer.isView;
  const ErrorClass = Error;
  const keysOf = Object.keys;
  const defineProperty = Object.defineProperty;

  // Between `fs/pipe` and the host call after it, any program code that runs (an
  // accessor or `toJSON` it planted on a prototype) could print into the pipe or keep
  // the call from being made. So nothing here consults a prototype the program can
  // reach: params are object literals (own properties, set without setters), their
  // JSON is assembled by hand (`stringify` of an object would consult a `toJSON`), and
  // an answer's fields are read only if they are its own.

  // `params` (never empty), with `bytes` if given piped on stdout ahead of it.
  function call(method, params, bytes) {
    if (bytes === undefined) return request(method, encode(params, ""), params.path);
    const text = toBase64(bytes);
    const sent = encode(params, '"piped":true');
    request("fs/pipe", `{"path":${stringify(params.path)},"length":${text.length}}`, params.path);
    writeLine(text);
    return request(method, sent, params.path);
  }

  // The JSON of `params`, whose own fields are primitives, and of the field `extra`.
  function encode(params, extra) {
    const names = keysOf(params);
    let text = "";
    for (let i = 0; i < names.length; i++) {
      const value = params[names[i]];
      if (value === undefined) continue;
      const field = `${stringify(names[i])}:${stringify(value)}`;
      text = text === "" ? field : `${text},${field}`;
    }
    if (extra !== "") text = text === "" ? extra : `${text},${extra}`;
    return `{${text}}`;
  }

  function request(method, json, path) {
    const answer = parse(hostCall(method, json));
    const failure = own(answer, "error");
    if (failure !== undefined) {
      const error = new ErrorClass(own(failure, "message"));
      fieldOf(error, "code", own(own(failure, "data"), "code") ?? "EIO");
      if (path !== undefined) fieldOf(error, "path", path);
      throw error;
    }
    return own(answer, "result");
  }

  // Set as assignment would on a fresh Error, without a setter planted on a prototype.
  function fieldOf(error, name, value) {
    defineProperty(error, name, { value, writable: true, enumerable: true, configurable: true });
  }

  function pathOf(path) {
    if (typeof path === "string") return path;
    if (path instanceof URL && path.protocol === "file:") return decodeURIComponent(path.pathname);
    throw new TypeError('The "path" argument must be of type string');
  }

  function encodingOf(options) {
    if (typeof options === "string") return options;
    return options?.encoding ?? null;
  }

  // What a write sends: the bytes of a buffer or view, else of the text as UTF-8 (a
  // lone surrogate written as U+FFFD, as Node does).
  function bytesOf(data) {
    if (isView(data)) return new U8(data.buffer, data.byteOffset, data.byteLength);
    if (data instanceof ArrayBuffer) return new U8(data);
    return utf8(typeof data === "string" ? data : String(data));
  }

  function stats(info) {
    return {
      size: info.size,
      isFile: () => info.kind === "file",
      isDirectory: () => info.kind === "directory",
      isSymbolicLink: () => info.kind === "link",
    };
  }

  return Object.freeze({
    readFileSync(path, options) {
      const encoding = encodingOf(options);
      const answer = call("fs/read", { path: pathOf(path), encoding });
      const data = own(answer, "data");
      return encoding === null ? fromBase64(data) : data;
    },
    writeFileSync(path, data, options) {
      const flag = typeof options === "object" && options !== null ? options.flag : undefined;
      const append = flag === "a" || flag === "a+";
      call("fs/write", { path: pathOf(path), append }, bytesOf(data));
    },
    appendFileSync(path, data) {
      call("fs/write", { path: pathOf(path), append: true }, bytesOf(data));
    },
    existsSync(path) {
      try {
        return call("fs/stat", { path: pathOf(path) }) !== null;
      } catch {
        return false;
      }
    },
    statSync(path) {
      const info = call("fs/stat", { path: pathOf(path) });
      if (info === null) {
        const error = new ErrorClass(`ENOENT: no such file or directory, stat '${path}'`);
        error.code = "ENOENT";
        throw error;
      }
      return stats(info);
    },
    mkdirSync(path, options) {
      call("fs/mkdir", { path: pathOf(path), recursive: Boolean(options?.recursive) });
    },
    readdirSync(path = ".") {
      return call("fs/readdir", { path: pathOf(path) });
    },
    rmSync(path, options) {
      call("fs/rm", {
        path: pathOf(path),
        recursive: Boolean(options?.recursive),
        force: Boolean(options?.force),
      });
    },
    unlinkSync(path) {
      call("fs/rm", { path: pathOf(path), recursive: false, force: false, file: true });
    },
  });
}
