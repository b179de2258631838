"""Executors: run the builder's map and reduce steps over picklable tasks and own their markers
and resume (the protocol in base.py, markers in markers.py, the local process pool in local.py,
Ray Core tasks in ray.py, joining a running Ray cluster in ray_join.py).
"""

from __future__ import annotations

from bloom_builder.choices import EXECUTORS, ExecutorName
from bloom_builder.executors.base import Executor, StepFunction, WorkerSetup
from bloom_builder.executors.local import LocalExecutor
from bloom_builder.executors.markers import (
    MarkedTask,
    StepResult,
    any_done,
    read_marker,
    record_done,
    reusable_result,
    write_marker,
)


def make_executor(
    workers: int,
    setup: WorkerSetup | None = None,
    kind: ExecutorName = "local",
    address: str | None = None,
) -> Executor:
    """The executor a build runs on.

    Args:
        workers: tasks run at once (for Ray without an address: the CPUs of the Ray it starts).
        setup: run once per worker process before its first task.
        kind: "local" (a process pool on this machine) or "ray" (Ray Core tasks).
        address: for Ray, a running cluster's address (HOST:PORT, "auto" to join the one this
            node is part of, ray://HOST:PORT with ray[client]); None starts a local Ray of the
            build's own, even where a cluster runs.

    Raises:
        ValueError: an unknown kind, or a malformed Ray address.
    """
    if kind == "ray":
        from bloom_builder.executors.ray import RayExecutor

        return RayExecutor(workers, setup, address)
    if kind != "local":
        raise ValueError(f"unknown executor {kind!r}; one of {', '.join(EXECUTORS)}")
    return LocalExecutor(workers, setup)


__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorName",
    "LocalExecutor",
    "MarkedTask",
    "StepFunction",
    "StepResult",
    "WorkerSetup",
    "any_done",
    "make_executor",
    "read_marker",
    "record_done",
    "reusable_result",
    "write_marker",
]
