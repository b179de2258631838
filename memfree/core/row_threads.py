"""The threads a step on the CPU splits its rows over.

numpy lets the interpreter go while it works on an array (unpacking a row, banning a row's
scores), so past a few MiB the parts of a step's rows run at once: :func:`over_rows`. A step
uses as many threads as torch's own count (what the model's CPU kernels use between steps), at
most :data:`_THREADS` (memory bandwidth, not cores, bounds such passes); one pool serves every
step of the process, made again in a forked child, whose copy has none of its threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

_THREADS = 4  # threads at most

_POOL: tuple[int, ThreadPoolExecutor] | None = None  # its process, the pool
_POOL_LOCK = threading.Lock()


def step_threads() -> int:
    """Threads a step's rows may be split over: torch's count, at most :data:`_THREADS`."""
    return max(1, min(torch.get_num_threads(), _THREADS))


def over_rows(rows: int, size: int, least: int, work: Callable[[int, int], None]) -> None:
    """``work(start, stop)`` over rows ``0..rows``, in parts run at once: as many parts as
    :func:`step_threads`, but none of fewer than ``least`` of the step's ``size`` (bytes or
    entries: what one pass over the rows touches). The calling thread runs the first part; an
    exception in any part is raised here, after all have ended. ``work`` must not call this
    function itself: a part waiting on the pool from inside it could wait forever."""
    parts = min(step_threads(), max(1, size // least), max(1, rows))
    if parts == 1:
        work(0, rows)
        return
    bounds = [rows * part // parts for part in range(parts + 1)]
    pool = _pool()
    done = [pool.submit(work, *bounds[part : part + 2]) for part in range(1, parts)]
    try:
        work(bounds[0], bounds[1])
    finally:
        for future in done:
            future.exception()  # wait for every part before anything is raised
    for future in done:
        future.result()


def _pool() -> ThreadPoolExecutor:
    """The threads that run the other parts of a step's rows: :data:`_THREADS` - 1, started
    as parts need them; more parts than that wait their turn.
    One pool a process, never shut down (another thread's step could be handing it work),
    made again in a forked child."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            pool = ThreadPoolExecutor(_THREADS - 1, thread_name_prefix="memfree-rows")
            _POOL = (os.getpid(), pool)
        return _POOL[1]


__all__ = ["over_rows", "step_threads"]
