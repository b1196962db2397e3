// A Node-style synchronous `fs` for the wasm-js guest's programs.
//
// StarlingMonkey has no file system module, and the guest is given no WASI directory:
// every call goes through the `host-call` import as an `fs/*` method, which the host
// serves on the execution's own working directory (executors/wasm_files.py): paths
// are relative to it, links are never followed, writes count against limits.disk_mb.
// A failure throws an Error whose `code` is Node's ("ENOENT", "EISDIR", ...).
//
// Data crosses as text (UTF-8) or base64: `atob`/`btoa` are native, so binary files
// cost no JavaScript loop but the one turning bytes into a binary string and back.

export function makeFs(hostCall, stringify, parse) {
  const fromCharCode = String.fromCharCode;
  const charCodeAt = Function.prototype.call.bind(String.prototype.charCodeAt);
  const encode = btoa;
  const decode = atob;
  const U8 = Uint8Array;
  const isView = ArrayBuffer.isView;
  const ErrorClass = Error;
  const CHUNK = 0x8000;

  function call(method, params) {
    const answer = parse(hostCall(method, stringify(params)));
    if (answer.error) {
      const { message, data } = answer.error;
      const error = new ErrorClass(message);
      error.code = data?.code ?? "EIO";
      if (params.path !== undefined) error.path = params.path;
      throw error;
    }
    return answer.result;
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

  function bytesToBase64(bytes) {
    let binary = "";
    for (let i = 0; i < bytes.length; i += CHUNK) {
      binary += fromCharCode(...bytes.subarray(i, i + CHUNK));
    }
    return encode(binary);
  }

  function base64ToBytes(text) {
    const binary = decode(text);
    const bytes = new U8(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = charCodeAt(binary, i);
    return bytes;
  }

  // What a write sends: text as it is, anything else as base64 of its bytes.
  function dataParams(data) {
    if (typeof data === "string") return { text: data };
    if (isView(data)) {
      return { base64: bytesToBase64(new U8(data.buffer, data.byteOffset, data.byteLength)) };
    }
    if (data instanceof ArrayBuffer) return { base64: bytesToBase64(new U8(data)) };
    return { text: String(data) };
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
      return encoding === null ? base64ToBytes(answer.data) : answer.data;
    },
    writeFileSync(path, data, options) {
      const flag = typeof options === "object" && options !== null ? options.flag : undefined;
      const append = flag === "a" || flag === "a+";
      call("fs/write", { path: pathOf(path), append, ...dataParams(data) });
    },
    appendFileSync(path, data) {
      call("fs/write", { path: pathOf(path), append: true, ...dataParams(data) });
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
