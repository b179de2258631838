"""Executors: run the builder's map and reduce steps over picklable tasks and own their markers
and resume (the protocol in base.py, markers in markers.py, the local process pool in local.py).
"""

from __future__ import annotations

from bloom_builder.executors.base import Executor, StepFunction, WorkerSetup
from bloom_builder.executors.local import LocalExecutor
from bloom_builder.executors.markers import (
    MarkedTask,
    any_done,
    read_marker,
    record_done,
    reusable_result,
    write_marker,
)


def make_executor(workers: int, setup: WorkerSetup | None = None) -> Executor:
    """The executor a build runs on: today always the local process pool.

    Args:
        workers: tasks run at once.
        setup: run once per worker process before its first task.
    """
    return LocalExecutor(workers, setup)


__all__ = [
    "Executor",
    "LocalExecutor",
    "MarkedTask",
    "StepFunction",
    "WorkerSetup",
    "any_done",
    "make_executor",
    "read_marker",
    "record_done",
    "reusable_result",
    "write_marker",
]
