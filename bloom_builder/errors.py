"""The builder's user-facing errors: why a build cannot produce a filter (and what to do), a task
that failed on every attempt, a local worker process that died, and a Ray cluster that cannot be
joined; and how a task is named in them. (A setting out of range is a
:class:`memfree.errors.SettingError`.)"""

from __future__ import annotations

import os
from typing import Any

# Files a task's name lists before "and N more": enough to find the shard, short enough to read.
SHOWN_FILES = 2


class BuildError(ValueError):
    """The build cannot produce a filter (nothing usable, bad output path, ...).

    The message names the input or path at fault and the fix; ``memfree build`` prints it
    without a traceback.
    """


class TaskFailed(RuntimeError):
    """A map or reduce task failed on every attempt (the executor's retries spent).

    The message names the task (its shard or key range) and the last error. Finished tasks stay
    in the work directory: fix the cause and rerun the same command to resume.
    """


class WorkerDied(TaskFailed):
    """A worker process of the local executor died while it ran tasks (a signal, or an exit
    without a result): the process pool breaks, and every task not finished fails with it.

    The message names the process and how it ended; SIGKILL with no error of its own is most
    often the kernel's out-of-memory killer. Finished tasks stay in the work directory: rerun
    the same command (with less memory per worker) to resume.

    Attributes:
        pid: the dead worker's process id (None when it could not be told).
        signal: the signal that ended it (None: it exited, or it could not be told).
        exit_status: its exit status when it exited without a signal (else None).
    """

    def __init__(
        self,
        message: str,
        pid: int | None = None,
        signal: int | None = None,
        exit_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.pid = pid
        self.signal = signal
        self.exit_status = exit_status

    @property
    def likely_out_of_memory(self) -> bool:
        """Whether the worker was killed by SIGKILL (the out-of-memory killer's signal)."""
        import signal as signals

        return self.signal == signals.SIGKILL


class RayUnavailable(ConnectionError):
    """The Ray cluster named by ``--ray-address`` cannot be joined (nothing answers there, or
    not Ray), or the local Ray cannot start.

    The message names the address and the fix; ``memfree build`` prints it without a traceback
    and exits with status 2. It is a ``ConnectionError``, not a :class:`BuildError`: a build
    that stops on it keeps its finished tasks, so a rerun against a reachable cluster resumes.
    """


def describe_task(task: Any) -> str:
    """A task named for an error message: a map task by its shard index and first files, a
    reduce task by its kind and partition, anything else by its type and index.

    A task with a ``describe()`` method names itself; tasks are read by their fields only, so
    this module imports none of the steps.

    Example:
        ``"map task 3 (/data/a.jsonl[0:4194304], /data/b.txt and 5 more units)"``
    """
    describe = getattr(task, "describe", None)
    if callable(describe):
        return str(describe())
    index = getattr(task, "index", None)
    units = getattr(task, "units", None)
    if isinstance(units, (tuple, list)):
        names = [_unit_name(unit) for unit in units[:SHOWN_FILES]]
        more = len(units) - len(names)
        listed = ", ".join(names) + (f" and {more} more units" if more > 0 else "")
        return f"map task {index} ({listed or 'no units'})"
    kind = getattr(task, "kind", None)
    if isinstance(kind, str) and hasattr(task, "low"):
        return f"reduce task {index} ({kind} partition {index})"
    name = type(task).__name__
    return f"{name} {index}" if index is not None else name


def _unit_name(unit: Any) -> str:
    """A work unit's full path with its range (``WorkUnit.describe`` names the file only)."""
    path = str(getattr(unit, "path", unit))
    describe = getattr(unit, "describe", None)
    if not callable(describe):
        return path
    return os.path.join(os.path.dirname(path), str(describe()))
