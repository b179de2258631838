"""The builder's user-facing errors: why a build cannot produce a filter (and what to do), and a
task that failed on every attempt."""

from __future__ import annotations


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
