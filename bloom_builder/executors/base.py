"""The Executor protocol: what runs the builder's steps over small picklable tasks, owns their
markers and resumes from them; :class:`~bloom_builder.executors.local.LocalExecutor` (a process
pool) and :class:`~bloom_builder.executors.ray.RayExecutor` (Ray Core tasks) implement it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from bloom_builder.executors.markers import ResultT, TaskT

# A step: a picklable task in, its result out (a typed result, or a JSON-able dict; see
# :class:`~bloom_builder.executors.markers.MarkedTask`).
StepFunction = Callable[[TaskT], ResultT]

# Run once in every worker process before its first task (e.g. build the tokenizer there);
# a picklable zero-argument callable, such as ``functools.partial(init_worker, payload)``.
WorkerSetup = Callable[[], None]


class Executor(Protocol):
    """Runs step functions over tasks; resumes from and records their markers.

    An executor takes a step function (module-level, so that any process can import it) and a
    list of small picklable tasks, runs the function once per unfinished task, and owns the
    "done" markers: it skips a task whose marker and outputs are intact (returning the recorded
    result) and writes the marker when a task finishes. Tasks communicate only through files in
    the work directory (map tasks write sorted runs, reduce tasks read every run's slice of their
    key range: the shuffle), so an executor moves nothing but task descriptions and small
    results. Every executor takes ``workers`` and ``setup``, runs ``setup`` once per worker
    process before its first task, and gives the same filter bytes with any number of workers;
    the Ray executor needs a work directory every node sees: shared storage, or a bucket
    (``--work-dir s3://...``, :mod:`bloom_builder.store_tasks`).

    Used as a context manager: entering starts the workers (running the setup in each),
    leaving stops them, cancelling tasks not started.

    Attributes:
        workers: how many tasks may run at once.
    """

    workers: int

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def run(
        self, function: Callable[[TaskT], ResultT], tasks: Sequence[TaskT]
    ) -> Iterator[tuple[TaskT, ResultT]]:
        """Yield ``(task, result)`` for every task, in completion order.

        A task finished by an earlier run is not run again: its recorded result comes back
        with ``reused`` true; the others come back with ``reused`` false once their marker is
        written. Callers sort by task index where order matters.

        Args:
            function: the step, importable by every worker.
            tasks: picklable task descriptions with a ``marker`` path.
        """
        ...
