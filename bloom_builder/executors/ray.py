"""The Ray executor: the builder's map and reduce steps as Ray Core tasks, on a local Ray started
with ``workers`` CPUs or on a running cluster (``address``), with retries; markers and resume as
the local executor's. The shuffle stays sorted run files in the work directory (DESIGN.md,
"Executors"), which must be on storage every node sees (a shared folder, or a bucket: with
``--work-dir s3://...`` each task reads and writes its part of it, :mod:`bloom_builder.store_tasks`):
Ray moves only task descriptions and small results, never one object per (map task, partition)
pair.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from bloom_builder.errors import TaskFailed, describe_task
from bloom_builder.executors.base import WorkerSetup
from bloom_builder.executors.markers import ResultT, TaskT, record_done, split_finished
from bloom_builder.executors.ray_join import (
    ADDRESS_FIX,
    CONNECT_TIMEOUT_ENV,
    DEFAULT_CONNECT_TIMEOUT_S,
    connect_timeout_s,
    join,
    ray_address_problem,
)
from memfree.errors import SettingError

DEFAULT_MAX_RETRIES = 3

# The setup this worker process last ran (a key per executor run): Ray reuses worker processes
# across tasks, so the setup (building the tokenizer) runs once per process, not once per task.
_SETUP_DONE: str | None = None


def _run_step(
    setup: WorkerSetup | None,
    setup_key: str,
    function: Callable[[Any], Any],
    task: Any,
    driver_cwd: str,
) -> Any:
    """What every Ray task runs: the worker's setup once per process, then the step.

    A worker's working directory is the one its node's ``ray start`` ran in: the task moves to
    the build's own, so that a relative path in it means what it means to the build (the build
    passes absolute ones; where that directory does not exist on this node, it stays put).
    """
    global _SETUP_DONE
    try:
        if os.getcwd() != driver_cwd:
            os.chdir(driver_cwd)
    except OSError:
        pass
    if setup is not None and setup_key != _SETUP_DONE:
        setup()
        _SETUP_DONE = setup_key
    return function(task)


class RayExecutor:
    """Runs the builder's steps as Ray tasks (see :class:`~bloom_builder.executors.Executor`).

    Args:
        workers: CPUs of the local Ray it starts when given no address (each task takes one CPU).
        setup: run once in every Ray worker process before its first task.
        address: a running cluster's address (``"HOST:PORT"``, ``"auto"``: the one this node
            belongs to, as ``ray start`` or ``RAY_ADDRESS`` set it up, or ``"ray://HOST:PORT"``
            with ``ray[client]``), left on exit; None starts a local Ray for this build, even
            where a cluster runs already, and stops it on exit. A Ray this process initialized
            already is used as it is.
        max_retries: attempts after the first for a task that fails (a lost worker or node, or
            an exception); a task that fails every time fails the build, named.

    While it runs, SIGTERM stops the build as Ctrl-C does (finished tasks kept, Ray shut down,
    exit status 143) instead of letting Ray print a native stack dump; a second SIGTERM kills.

    Raises:
        SettingError: a malformed address (a ``ValueError`` naming the setting ``ray_address``;
            see :func:`ray_address_problem`).
        MissingDependencyError: ray is not installed (``pip install 'memfree[ray]'``).
        RayUnavailable: on entering, nothing that answers as Ray at ``address`` within
            ``MEMFREE_RAY_CONNECT_TIMEOUT`` seconds (10 by default), or Ray refused to join it.
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
        problem = ray_address_problem(address)
        if problem:
            raise SettingError(problem, field="ray_address")
        self.workers = workers
        self.setup = setup
        self.address = address
        self.max_retries = max_retries
        self._initialized_ray = False
        self._setup_ref: Any = None
        self._setup_key = ""
        self._sigterm_caught = False
        self._previous_sigterm: Any = None

    def __enter__(self) -> RayExecutor:
        from memfree.errors import require

        require("ray", "ray")
        import ray

        if not ray.is_initialized():
            if self.address is None:
                # "local": a Ray of our own even where `ray start` (or a stale record of it in
                # Ray's temp directory, or RAY_ADDRESS) names a cluster, which would refuse
                # num_cpus; --ray-address auto joins that one.
                ray.init(
                    address="local",
                    num_cpus=self.workers,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            else:
                join(self.address)
            self._initialized_ray = True  # ours to stop (a cluster joined: to leave) on exit
        self._catch_sigterm()
        self._setup_ref = ray.put(self.setup)  # shipped once, not with every task
        self._setup_key = uuid.uuid4().hex
        return self

    def __exit__(self, *exc_info: object) -> None:
        import ray

        self._setup_ref = None
        try:
            if self._initialized_ray:
                ray.shutdown()
                self._initialized_ray = False
        finally:
            self._release_sigterm()

    def run(
        self, function: Callable[[TaskT], ResultT], tasks: Sequence[TaskT]
    ) -> Iterator[tuple[TaskT, ResultT]]:
        """Yield ``(task, result)`` for every task in completion order (see ``Executor.run``).

        Raises:
            TaskFailed: a task failed on every attempt (the task and the error named).
        """
        import ray

        finished, pending = split_finished(tasks)
        yield from finished
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=True)(
            _run_step
        )
        cwd = os.getcwd()
        refs = {
            remote.remote(self._setup_ref, self._setup_key, function, task, cwd): task
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

    def _result(self, ref: Any, task: Any) -> Any:
        import ray

        attempts = f"failed on all {self.max_retries + 1} attempts"
        try:
            result = ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            cause = error.cause if getattr(error, "cause", None) is not None else error
            raise TaskFailed(
                f"{describe_task(task)} {attempts}: {type(cause).__name__}: {cause}"
            ) from error
        except ray.exceptions.RayError as error:  # a worker or node lost every time
            raise TaskFailed(f"{describe_task(task)} {attempts}: {error}") from error
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

    def _catch_sigterm(self) -> None:
        """Turn SIGTERM into SystemExit(143) while this executor runs.

        Ray's driver installs a native failure handler that prints a C++ stack dump on SIGTERM,
        which reads as a crash; raising instead unwinds the build (finished tasks marked, Ray
        shut down) as Ctrl-C does. Python can only set handlers from the main thread.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_sigterm = signal.signal(signal.SIGTERM, _stop_on_sigterm)
        self._sigterm_caught = True

    def _release_sigterm(self) -> None:
        if not self._sigterm_caught:
            return
        self._sigterm_caught = False
        if signal.getsignal(signal.SIGTERM) is _stop_on_sigterm:  # else a SIGTERM came
            previous = self._previous_sigterm  # None: a handler set outside Python
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Stop the build; a second SIGTERM (while it unwinds) kills at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise SystemExit(128 + signum)


__all__ = [
    "ADDRESS_FIX",
    "CONNECT_TIMEOUT_ENV",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "RayExecutor",
    "connect_timeout_s",
    "ray_address_problem",
]
