"""Task "done" markers: the JSON result a finished task left, written atomically after its outputs
and trusted only while they are intact, so a rerun (even after ``kill -9``) skips finished tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from memfree.fileio import atomic_write

MARKER_SUFFIX = ".json"


class MarkedTask(Protocol):
    """What an executor needs of a task, besides its being picklable.

    Attributes:
        marker: the task's marker file (a ``.json`` path in the shared work directory).
    """

    @property
    def marker(self) -> Path: ...

    def outputs_intact(self, result: dict[str, Any]) -> bool:
        """Whether the outputs a marker's ``result`` names are still complete on disk."""
        ...


TaskT = TypeVar("TaskT", bound=MarkedTask)


def read_marker(path: Path) -> dict[str, Any] | None:
    """A completion marker's payload, or None if absent or unreadable (then the task reruns)."""
    try:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def write_marker(path: Path, payload: dict[str, Any]) -> None:
    """Atomically write a JSON completion marker (fsynced, renamed into place)."""
    atomic_write(path, json.dumps(payload, sort_keys=True))


def reusable_result(task: MarkedTask) -> dict[str, Any] | None:
    """The result a finished ``task`` recorded (with ``"reused": True``), or None to run it.

    A marker whose outputs are gone or damaged, or whose payload lacks what the task's check
    reads, does not count: the task runs again and overwrites it.
    """
    done = read_marker(task.marker)
    try:
        intact = done is not None and task.outputs_intact(done)
    except (KeyError, TypeError, ValueError):
        intact = False
    if not intact or done is None:
        return None
    return {**done, "reused": True}


def split_finished(
    tasks: Iterable[TaskT],
) -> tuple[list[tuple[TaskT, dict[str, Any]]], list[TaskT]]:
    """``tasks`` split into those an earlier run finished (with their recorded results, see
    :func:`reusable_result`) and those to run, each in the given order."""
    finished: list[tuple[TaskT, dict[str, Any]]] = []
    pending: list[TaskT] = []
    for task in tasks:
        reused = reusable_result(task)
        if reused is None:
            pending.append(task)
        else:
            finished.append((task, reused))
    return finished, pending


def record_done(task: MarkedTask, result: dict[str, Any]) -> dict[str, Any]:
    """Write ``task``'s marker with its ``result``; returns the result with ``"reused": False``."""
    payload = {**result, "reused": False}
    write_marker(task.marker, payload)
    return payload


def any_done(directory: Path) -> bool:
    """Whether some task left a marker directly in ``directory`` (then a rerun can resume)."""
    return any(directory.glob(f"*{MARKER_SUFFIX}"))
