"""`conduit serve` as a process: its JSON log names the metrics URL, which answers."""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon.test_metrics import scrape, value
from tests.e2e.helpers import NO_EXECUTORS, call, conduit_serve

CONFIG = '[metrics]\nlisten = "127.0.0.1:0"\n' + NO_EXECUTORS


async def test_the_log_names_the_metrics_url_and_it_answers(
    tmp_path: Path, short_dir: Path
) -> None:
    config = tmp_path / "conduit.toml"
    config.write_text(CONFIG)
    sock = str(short_dir / "c.sock")
    async with conduit_serve(tmp_path, sock, "--config", str(config)) as daemon:
        assert (await call(sock, "ping"))["result"] == {}
        # stderr is a file, not a terminal: every line is one JSON event.
        events = [json.loads(line) for line in daemon.log().splitlines()]
        started = next(e for e in events if e["msg"] == "conduit listening")
        url = started["metrics"]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        status = await call(sock, "daemon/status")
        assert status["result"]["metrics"]["url"] == url
        port = int(url.removeprefix("http://127.0.0.1:").removesuffix("/metrics"))
        families = await scrape(("127.0.0.1", port))
    assert value(families, "conduit_rpc_requests_total", method="ping", code="ok") == 1
    assert value(families, "conduit_build_info") == 1
