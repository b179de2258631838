"""The local executor: a spawned process pool on this machine (or this process for one worker)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from bloom_builder.errors import WorkerDied
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
        """Yield ``(task, result)`` for every task in completion order (see ``Executor.run``).

        Raises:
            WorkerDied: a pool worker died (a signal, e.g. the out-of-memory killer's SIGKILL,
                or an exit): named with its process id and how it ended; the tasks that
                finished keep their markers.
        """
        finished, pending = split_finished(tasks)
        yield from finished
        if self._pool is None:
            for task in pending:
                yield task, record_done(task, function(task))
            return
        futures: dict[Future[ResultT], TaskT] = {}
        collected: set[Future[ResultT]] = set()
        try:
            for task in pending:
                futures[self._pool.submit(function, task)] = task
            for future in as_completed(futures):
                collected.add(future)
                yield futures[future], record_done(futures[future], future.result())
        except BrokenProcessPool as error:  # a worker died: name it, not the pool's internals
            raise _worker_died(self._pool) from error
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


def _worker_died(pool: ProcessPoolExecutor, wait_seconds: float = 2.0) -> WorkerDied:
    """The error of a pool broken by a worker's death, naming the worker and how it ended.

    The pool terminates its other workers (SIGTERM) once one has died, so a death by another
    signal, or by an exit status, is the cause; SIGTERM is named only when every death was one.
    The workers are read from the pool's process table (``_processes``, kept until shutdown);
    where it cannot be read the message says only that a worker died.
    """
    processes = list((getattr(pool, "_processes", None) or {}).values())
    deadline = time.monotonic() + wait_seconds
    deaths: list[tuple[int, int]] = []
    while True:
        deaths = [
            (process.pid, code)
            for process in processes
            if (code := process.exitcode) is not None and code != 0
        ]
        if any(code != -signal.SIGTERM for _, code in deaths) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # the dead worker is reaped by the pool's own thread: give it a moment
    if not deaths:
        return WorkerDied("a build worker process died before its tasks finished")
    pid, code = next(((p, c) for p, c in deaths if c != -signal.SIGTERM), deaths[0])
    if code > 0:
        return WorkerDied(
            f"a build worker process (pid {pid}) exited with status {code} before its tasks "
            "finished",
            pid=pid,
            exit_status=code,
        )
    number = -code
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "an unknown signal"
    message = f"a build worker process (pid {pid}) was killed by signal {number} ({name})"
    if number == signal.SIGKILL:
        message += (
            ", most likely by the kernel's out-of-memory killer: the build ran out of memory "
            "(`dmesg` names the process if so)"
        )
    return WorkerDied(message, pid=pid, signal=number)


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
