"""Files through a real daemon on the Wasmtime executors: `execute {files}` places
them in the program's working directory, what it leaves under out/ comes back in the
result, and a session's directory is reached with files/put, get and list."""

from __future__ import annotations

import base64
from typing import Any

import pytest

PROGRAMS = {
    "wasm-python": (
        "python",
        "import json, pathlib\n"
        "rows = json.loads(pathlib.Path('data/in.json').read_text())\n"
        "pathlib.Path('out').mkdir()\n"
        "pathlib.Path('out/sum.txt').write_text(str(sum(rows)))\n"
        "pathlib.Path('out/raw.bin').write_bytes(open('raw.bin', 'rb').read()[::-1])\n"
        "len(rows)",
    ),
    "wasm-js": (
        "javascript",
        "const rows = JSON.parse(fs.readFileSync('data/in.json', 'utf8'));\n"
        "fs.mkdirSync('out');\n"
        "fs.writeFileSync('out/sum.txt', String(rows.reduce((a, b) => a + b, 0)));\n"
        "fs.writeFileSync('out/raw.bin', fs.readFileSync('raw.bin').reverse());\n"
        "rows.length",
    ),
}


def _file(path: str, data: bytes) -> dict[str, str]:
    return {"path": path, "base64": base64.b64encode(data).decode("ascii")}


@pytest.mark.parametrize("executor", sorted(PROGRAMS))
async def test_execute_files_in_and_out(client: Any, executor: str) -> None:
    language, code = PROGRAMS[executor]
    files = [_file("data/in.json", b"[1, 2, 3]"), _file("raw.bin", bytes([0, 1, 254, 255]))]
    result = await client.call(
        "execute", {"language": language, "executor": executor, "code": code, "files": files}
    )
    assert (result["status"], result["result"]) == ("ok", 3), result
    assert result["executor"] == executor
    returned = {file["path"]: file for file in result["files"]}
    assert sorted(returned) == ["raw.bin", "sum.txt"]
    assert base64.b64decode(returned["sum.txt"]["base64"]) == b"6"
    assert base64.b64decode(returned["raw.bin"]["base64"]) == bytes([255, 254, 1, 0])
    assert returned["raw.bin"]["size"] == 4 and not returned["raw.bin"]["truncated"]


async def test_execute_disk_limit_is_reported(client: Any) -> None:
    code = "with open('big', 'wb') as f:\n    while True: f.write(bytes(1 << 20))"
    result = await client.call(
        "execute",
        {
            "language": "python",
            "executor": "wasm-python",
            "code": code,
            "limits": {"disk_mb": 2, "timeout_ms": 30_000},
        },
    )
    assert result["status"] == "disk_limit", result
    assert "limits.disk_mb" in result["error"]["message"]


@pytest.mark.parametrize("executor", sorted(PROGRAMS))
async def test_session_files_between_steps(client: Any, executor: str) -> None:
    language, _ = PROGRAMS[executor]
    session = await client.call("sessions/create", {"language": language, "executor": executor})
    session_id = session["session_id"]
    try:
        put = await client.call(
            "files/put", {"session_id": session_id, "files": [_file("in.txt", b"21")]}
        )
        assert put["put"] == [{"path": "in.txt", "size": 2}]
        code = {
            "python": "open('twice.txt', 'w').write(str(2 * int(open('in.txt').read())))",
            "javascript": "const n = fs.readFileSync('in.txt', 'utf8');\n"
            "fs.writeFileSync('twice.txt', String(2 * n))",
        }[language]
        result = await client.call("execute", {"session_id": session_id, "code": code})
        assert result["status"] == "ok", result
        got = await client.call("files/get", {"session_id": session_id, "path": "twice.txt"})
        assert base64.b64decode(got["base64"]) == b"42"
        listed = await client.call("files/list", {"session_id": session_id})
        assert listed["files"] == [{"path": "in.txt", "size": 2}, {"path": "twice.txt", "size": 2}]
    finally:
        await client.call("sessions/close", {"session_id": session_id})
