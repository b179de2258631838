"""The Ray executor: the builder's map and reduce steps as Ray Core tasks, on a local Ray started
with ``workers`` CPUs or on a running cluster (``address``), with retries; markers and resume as
the local executor's. The shuffle stays sorted run files in the work directory (DESIGN.md,
"Executors"), which must be on storage every node sees: Ray moves only task descriptions and
small JSON results, never one object per (map task, partition) pair.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bloom_builder.errors import TaskFailed
from bloom_builder.executors.base import TaskT, WorkerSetup
from bloom_builder.executors.markers import record_done, split_finished

DEFAULT_MAX_RETRIES = 3

# The setup this worker process last ran (a key per executor run): Ray reuses worker processes
# across tasks, so the setup (building the tokenizer) runs once per process, not once per task.
_SETUP_DONE: str | None = None


def _run_step(
    setup: WorkerSetup | None, setup_key: str, function: Callable[[Any], dict[str, Any]], task: Any
) -> dict[str, Any]:
    """What every Ray task runs: the worker's setup once per process, then the step."""
    global _SETUP_DONE
    if setup is not None and setup_key != _SETUP_DONE:
        setup()
        _SETUP_DONE = setup_key
    return function(task)


class RayExecutor:
    """Runs the builder's steps as Ray tasks (see :class:`~bloom_builder.executors.Executor`).

    Args:
        workers: CPUs of the local Ray it starts when given no address (each task takes one CPU).
        setup: run once in every Ray worker process before its first task.
        address: a running cluster's address (``"auto"``: the one this node belongs to, as
            ``ray start`` set it up); None starts a local Ray for this build and stops it after.
        max_retries: attempts after the first for a task that fails (a lost worker or node, or
            an exception); a task that fails every time fails the build, named.

    Raises:
        MissingDependencyError: ray is not installed (``pip install 'memfree[ray]'``).
    """

    def __init__(
        self,
        workers: int,
        setup: WorkerSetup | None = None,
        address: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"RayExecutor needs workers >= 1, got {workers!r}; pass e.g. 2")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.workers = workers
        self.setup = setup
        self.address = address
        self.max_retries = max_retries
        self._started_ray = False
        self._setup_ref: Any = None
        self._setup_key = ""

    def __enter__(self) -> RayExecutor:
        from memfree.errors import require

        require("ray", "ray")
        import ray

        if not ray.is_initialized():
            if self.address is None:
                ray.init(
                    num_cpus=self.workers,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
                self._started_ray = True
            else:
                ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        self._setup_ref = ray.put(self.setup)  # shipped once, not with every task
        self._setup_key = uuid.uuid4().hex
        return self

    def __exit__(self, *exc_info: object) -> None:
        import ray

        self._setup_ref = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def run(
        self, function: Callable[[TaskT], dict[str, Any]], tasks: Sequence[TaskT]
    ) -> Iterator[tuple[TaskT, dict[str, Any]]]:
        """Yield ``(task, result)`` for every task in completion order (see ``Executor.run``).

        Raises:
            TaskFailed: a task failed on every attempt (its description and the error named).
        """
        import ray

        finished, pending = split_finished(tasks)
        yield from finished
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=True)(
            _run_step
        )
        refs = {
            remote.remote(self._setup_ref, self._setup_key, function, task): task
            for task in pending
        }
        waiting = list(refs)
        try:
            while waiting:
                done, waiting = ray.wait(waiting, num_returns=1)
                task = refs[done[0]]
                yield task, record_done(task, self._result(done[0], task))
        finally:
            self._keep_finished(refs, waiting)

    def _result(self, ref: Any, task: Any) -> dict[str, Any]:
        import ray

        try:
            result: dict[str, Any] = ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            cause = error.cause if getattr(error, "cause", None) is not None else error
            raise TaskFailed(
                f"{task!r} failed on all {self.max_retries + 1} attempts: "
                f"{type(cause).__name__}: {cause}"
            ) from error
        except ray.exceptions.RayError as error:  # a worker or node lost every time
            raise TaskFailed(
                f"{task!r} failed on all {self.max_retries + 1} attempts: {error}"
            ) from error
        return result

    def _keep_finished(self, refs: dict[Any, Any], waiting: list[Any]) -> None:
        """When a run stops early, mark the tasks that finished anyway (a rerun skips them) and
        cancel the others."""
        import ray

        if not waiting:
            return
        ready, not_ready = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        for ref in not_ready:
            ray.cancel(ref)
        for ref in ready:
            try:
                record_done(refs[ref], ray.get(ref))
            except ray.exceptions.RayError:
                continue


__all__ = ["RayExecutor"]
