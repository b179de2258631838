"""The local executor: a spawned process pool on this machine (or this process for one worker)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed, wait
from multiprocessing import get_context
from typing import Any

from bloom_builder.executors.base import WorkerSetup
from bloom_builder.executors.markers import ResultT, TaskT, record_done, split_finished


class LocalExecutor:
    """Runs step functions over tasks in this process (one worker) or in a spawned process pool.

    Results come back in completion order with their task, so progress can be shown as they land.
    Finished tasks (marker and outputs intact) are skipped; markers are written here, in the
    process that drives the build, once a task's result has come back.

    Args:
        workers: processes to run tasks in; 1 runs them in this process, without a pool.
        setup: run once in each worker process (in this process for one worker) before any task.

    Example:
        >>> with LocalExecutor(2, setup) as executor:  # doctest: +SKIP
        ...     for task, result in executor.run(map_shard, tasks):
        ...         print(task.index, result.reused)
    """

    def __init__(self, workers: int, setup: WorkerSetup | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"LocalExecutor needs workers >= 1, got {workers!r}; pass e.g. 2")
        self.workers = workers
        self.setup = setup
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LocalExecutor:
        if self.workers > 1:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=get_context("spawn"),  # no fork: workers share no tokenizer threads
                initializer=_start_worker,
                initargs=(self.setup,),
            )
        elif self.setup is not None:
            self.setup()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(
        self, function: Callable[[TaskT], ResultT], tasks: Sequence[TaskT]
    ) -> Iterator[tuple[TaskT, ResultT]]:
        """Yield ``(task, result)`` for every task in completion order (see ``Executor.run``)."""
        finished, pending = split_finished(tasks)
        yield from finished
        if self._pool is None:
            for task in pending:
                yield task, record_done(task, function(task))
            return
        futures: dict[Future[ResultT], TaskT] = {
            self._pool.submit(function, task): task for task in pending
        }
        collected: set[Future[ResultT]] = set()
        try:
            for future in as_completed(futures):
                collected.add(future)
                yield futures[future], record_done(futures[future], future.result())
        finally:
            _keep_finished(futures, collected)


def _keep_finished(futures: dict[Future[Any], Any], collected: set[Any]) -> None:
    """When a run stops early (Ctrl-C, another task's failure), mark every task that finished
    anyway, including those still running now, so that a rerun skips them (the tasks that had
    not started are cancelled)."""
    for future in futures:
        future.cancel()
    wait(futures)
    for future, task in futures.items():
        if future in collected or future.cancelled() or future.exception() is not None:
            continue
        record_done(task, future.result())


def _start_worker(setup: WorkerSetup | None) -> None:
    """A pool worker's start: tie its life to the build's, then the build's own setup."""
    _die_with_parent()
    if setup is not None:
        setup()


def _die_with_parent() -> None:
    """Have Linux kill this worker when the build that started it dies.

    A worker of a build killed with SIGKILL would otherwise wait on its task queue forever
    (it holds the queue's write end itself, so it never reads end-of-file), keeping its memory.
    Elsewhere the worker lives on as before.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the build died before the call: no signal will come
        os._exit(1)
