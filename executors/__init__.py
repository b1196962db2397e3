"""Executors: the interface every runtime implements, the registry, and the runtimes.

An executor runs one program in a fresh sandbox (`Executor.run(job, bridge) -> Outcome`)
and knows nothing about sockets or tokens beyond the `ToolBridge` it is handed.
"""

from conduit.executors.base import (
    CallbackAddress,
    ErrorInfo,
    Executor,
    ExecutorInfo,
    Job,
    Limits,
    Outcome,
    Status,
    ToolBridge,
)
from conduit.executors.deno import DenoExecutor
from conduit.executors.pool import PoolState, WarmPool
from conduit.executors.registry import ExecutorRegistry

__all__ = [
    "CallbackAddress",
    "DenoExecutor",
    "ErrorInfo",
    "Executor",
    "ExecutorInfo",
    "ExecutorRegistry",
    "Job",
    "Limits",
    "Outcome",
    "PoolState",
    "Status",
    "ToolBridge",
    "WarmPool",
]
