"""`executors/list`: the runtimes, their versions, availability and pool state."""

from __future__ import annotations

import dataclasses
from typing import Any

from conduit.daemon.dispatcher import CallContext, MethodRouter, NoParams

router = MethodRouter()


@router.method("executors/list", params=NoParams, scope="execute")
async def list_executors(params: NoParams, ctx: CallContext) -> dict[str, Any]:
    """Each executor: languages, version, available or why not, pool, start-up progress.

    `progress` is what the executor's start-up is building: the step under way and each
    step done, with its seconds (see `wasm_build.BuildProgress.snapshot`).
    """
    registry = ctx.executions.registry
    return {
        "executors": [dataclasses.asdict(info) for info in registry.infos()],
        "defaults": registry.defaults(),
    }
