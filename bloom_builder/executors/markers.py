"""Task "done" markers: the JSON of a finished task's result, written atomically after its outputs
and trusted only while they are intact, so a rerun (even after ``kill -9``) skips finished tasks.

A step's typed result (a frozen dataclass such as :class:`~bloom_builder.map.MapResult`) becomes
JSON here and is read back here: nowhere else does a result travel as a dict.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from memfree.fileio import atomic_write

MARKER_SUFFIX = ".json"
# A marker that does not hold what its task's result reads: the task runs again.
_UNREADABLE = (KeyError, TypeError, ValueError, AttributeError)


@runtime_checkable
class StepResult(Protocol):
    """A step's typed result: ``to_json()`` gives its marker's payload, and the class's
    ``from_json(payload)`` reads one back; ``reused`` says it came from an earlier run's marker."""

    @property
    def reused(self) -> bool: ...

    def to_json(self) -> dict[str, Any]: ...


class ResultReader(Protocol):
    """A typed result's class, as a task names it (``result_type``): it reads a marker's payload."""

    def from_json(self, payload: Mapping[str, Any]) -> Any: ...


class MarkedTask(Protocol):
    """What an executor needs of a task, besides its being picklable.

    A task may also name the class of its step's results, ``result_type`` (a
    :class:`ResultReader`): its results are typed, and become JSON only in its marker. A task that
    names none has plain JSON results (dicts), recorded as they are.

    Attributes:
        marker: the task's marker file (a ``.json`` path in the shared work directory).
    """

    @property
    def marker(self) -> Path: ...

    def outputs_intact(self, result: Any) -> bool:
        """Whether the outputs a recorded ``result`` names are still complete on disk."""
        ...


TaskT = TypeVar("TaskT", bound=MarkedTask)
ResultT = TypeVar("ResultT")


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


def result_payload(result: Any) -> dict[str, Any]:
    """The JSON a marker records of a step's result: a typed result's ``to_json()``, a plain
    JSON mapping as it is."""
    return result.to_json() if isinstance(result, StepResult) else dict(result)


def result_of(task: MarkedTask, payload: dict[str, Any]) -> Any:
    """A marker's payload as ``task``'s step returns its results: read by the task's
    ``result_type``, or the payload itself for a task that names none.

    Raises:
        KeyError, TypeError, ValueError, AttributeError: the payload is not such a result.
    """
    reader: ResultReader | None = getattr(task, "result_type", None)
    return payload if reader is None else reader.from_json(payload)


def reusable_result(task: MarkedTask) -> Any | None:
    """The result a finished ``task`` recorded (reused: ``reused`` is true), or None to run it.

    A marker whose outputs are gone or damaged, or whose payload lacks what the task's result
    holds, does not count: the task runs again and overwrites it.
    """
    done = read_marker(task.marker)
    if done is None:
        return None
    try:
        result = result_of(task, {**done, "reused": True})
        intact = task.outputs_intact(result)
    except _UNREADABLE:
        return None
    return result if intact else None


def split_finished(tasks: Iterable[TaskT]) -> tuple[list[tuple[TaskT, Any]], list[TaskT]]:
    """``tasks`` split into those an earlier run finished (with their recorded results, see
    :func:`reusable_result`) and those to run, each in the given order."""
    finished: list[tuple[TaskT, Any]] = []
    pending: list[TaskT] = []
    for task in tasks:
        reused = reusable_result(task)
        if reused is None:
            pending.append(task)
        else:
            finished.append((task, reused))
    return finished, pending


def record_done(task: MarkedTask, result: ResultT) -> ResultT:
    """Write ``task``'s marker with its ``result``; returns the result as the marker holds it
    (``reused`` false): what a later run reading the marker gets, but for that flag."""
    payload = {**result_payload(result), "reused": False}
    write_marker(task.marker, payload)
    recorded: ResultT = result_of(task, payload)
    return recorded


def any_done(directory: Path) -> bool:
    """Whether some task left a marker directly in ``directory`` (then a rerun can resume)."""
    return any(directory.glob(f"*{MARKER_SUFFIX}"))
