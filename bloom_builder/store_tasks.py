"""Running a build's tasks against a work directory on object storage.

Two ways, one executor (:class:`StoreSyncedExecutor`):

- **Through the driver** (the local executor: its tasks share the driver's disk). Tasks work in
  the driver's mirror of the work directory (:class:`~bloom_builder.store_work.StoreWork`); the
  driver uploads each finished task's outputs, then its marker, and before a step downloads
  what the store holds as finished and checks it (size and xxh3) before reuse.
- **From the tasks themselves** (the Ray executor: its tasks may run on nodes that share
  nothing but the bucket). Each task runs in a private temporary folder (:class:`OnStore`): a
  map task uploads its runs, and beside each run a small ``.bounds`` object, the run's offsets
  at the build's partition boundaries; a reduce task reads from every run only its partition's
  slice (one ranged request for the offsets, one for the keys, two for the repeated keys),
  counts it, and uploads its kept keys. Paths in a task and its result are the driver's mirror
  (rewritten on the way in and out), and the driver writes only the marker, once the task has
  returned. A task the store holds as finished is reused where its marker and every output it
  names (and, for a map task, the runs' bounds) are on the store with their recorded sizes: a
  listing, without reading the objects (their bytes are checked by the store's own transfer
  checks; the xxh3 in the marker is checked where the driver downloads a kept file). After the
  reduce step the driver downloads the kept keys, checked by xxh3, and writes the filter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bloom_builder.counting import KEY_BYTES, Run, partition_bounds
from bloom_builder.errors import BuildError
from bloom_builder.executors.base import Executor
from bloom_builder.executors.markers import ResultT, TaskT, result_payload
from bloom_builder.store_work import StoreWork

BOUNDS_SUFFIX = ".bounds"
_ROW = 3  # a bounds object's row per partition boundary: key offset, repeat offset, repeats


def relocated(task: Any, old: str, new: str) -> Any:
    """``task`` (a frozen dataclass) with every path under ``old`` in its string fields, and in
    tuples of strings, moved under ``new``."""

    def moved(value: Any) -> Any:
        if isinstance(value, str) and (value == old or value.startswith(old + os.sep)):
            return new + value[len(old) :]
        if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            return tuple(moved(v) for v in value)
        return value

    changes = {}
    for field in dataclasses.fields(task):
        value = getattr(task, field.name)
        if moved(value) is not value:
            changes[field.name] = moved(value)
    return dataclasses.replace(task, **changes)


def _result_moved(result: Any, old: str, new: str) -> Any:
    """A typed result with the paths it names moved from under ``old`` to under ``new``."""
    text = json.dumps(result_payload(result), sort_keys=True)
    text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    return type(result).from_json(json.loads(text))


def run_bounds(keys_path: Path, repeats_path: Path, partitions: int) -> np.ndarray:
    """uint64 `(partitions + 1, 3)`: for each partition boundary, the run's first key at or past
    it, the first repeated key's entry at or past that, and the run's number of repeated keys."""
    run = Run(keys_path.with_suffix(""))
    keys, repeated, _ = run.open()
    lows = [low for low, _ in partition_bounds(partitions)]
    offsets = np.searchsorted(keys, np.array(lows, dtype=np.uint64), side="left")
    offsets = np.append(offsets, keys.shape[0]).astype(np.uint64)
    repeat_offsets = np.searchsorted(repeated, offsets, side="left").astype(np.uint64)
    total = np.full(offsets.shape[0], repeated.shape[0], dtype=np.uint64)
    return np.column_stack([offsets, repeat_offsets, total]).astype("<u8")


@dataclass(frozen=True)
class OnStore:
    """A step run by a task that reaches the store itself, in a private temporary folder (see
    the module's docstring). Picklable: Ray ships it with each task.

    Attributes:
        function: the step (:func:`~bloom_builder.map.map_shard`, ``reduce_partition``).
        url: the work directory's URL.
        driver_root: the driver's mirror, under which the task's paths are planned.
        partitions: the build's partitions (a map task writes its runs' bounds for them).
    """

    function: Callable[[Any], Any]
    url: str
    driver_root: str
    partitions: int

    def __call__(self, task: Any) -> Any:
        work = StoreWork(self.url)
        with tempfile.TemporaryDirectory(prefix="memfree-task-") as private:
            moved = relocated(task, self.driver_root, private)
            for stem in getattr(moved, "runs", ()):  # a reduce task: its slice of every run
                self._fetch_slice(work, Path(stem), private, moved.index)
            result = self.function(moved)
            for path in moved.output_sizes(result):
                self._upload(work, Path(path), private)
                if path.endswith(".keys") and "/map/" in path.replace(os.sep, "/"):
                    self._upload_bounds(work, Path(path), private)
            return _result_moved(result, private, self.driver_root)

    def _key(self, work: StoreWork, path: Path, private: str) -> str:
        return f"{work.root}/{path.relative_to(private).as_posix()}"

    def _upload(self, work: StoreWork, path: Path, private: str) -> None:
        key = self._key(work, path, private)
        work._call("uploading a task's output", key, lambda: work.fs.put_file(str(path), key))

    def _upload_bounds(self, work: StoreWork, keys_path: Path, private: str) -> None:
        bounds = run_bounds(keys_path, keys_path.with_suffix(".repeats"), self.partitions)
        key = self._key(work, keys_path.with_suffix(BOUNDS_SUFFIX), private)
        data = bounds.tobytes()
        work._call("uploading a run's bounds", key, lambda: work.fs.pipe_file(key, data))

    def _fetch_slice(self, work: StoreWork, stem: Path, private: str, partition: int) -> None:
        """Write the run ``stem`` (a private path) as the slice of it that ``partition`` counts:
        its keys there, and its repeated keys there (entries shifted to the slice)."""
        base = self._key(work, stem, private)
        row = _ROW * KEY_BYTES
        raw = work._call(
            "reading a run's bounds", base + BOUNDS_SUFFIX,
            lambda: work.fs.cat_file(
                base + BOUNDS_SUFFIX, start=partition * row, end=(partition + 2) * row
            ),
        )  # fmt: skip
        if len(raw) != 2 * row:
            raise BuildError(
                f"{work.url}: a run's bounds ({base}{BOUNDS_SUFFIX}) are cut short; delete the "
                "work directory's objects and build again"
            )
        (begin, repeat_begin, total), (end, repeat_end, _) = np.frombuffer(raw, "<u8").reshape(2, 3)
        keys = self._range(work, base + ".keys", int(begin), int(end))
        indices = self._range(work, base + ".repeats", int(repeat_begin), int(repeat_end))
        counts = self._range(
            work, base + ".repeats", int(total + repeat_begin), int(total + repeat_end)
        )
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".keys").write_bytes(keys.astype("<u8").tobytes())
        shifted = (indices - np.uint64(begin)).astype("<u8")
        stem.with_suffix(".repeats").write_bytes(np.concatenate([shifted, counts]).tobytes())

    def _range(self, work: StoreWork, key: str, first: int, stop: int) -> np.ndarray:
        """uint64 entries [first, stop) of the object at ``key``."""
        if stop <= first:
            return np.empty(0, dtype=np.uint64)
        data = work._call(
            "reading a run", key,
            lambda: work.fs.cat_file(key, start=first * KEY_BYTES, end=stop * KEY_BYTES),
        )  # fmt: skip
        if len(data) != (stop - first) * KEY_BYTES:
            raise BuildError(f"{work.url}: {key} is shorter than its bounds say; build again")
        return np.frombuffer(data, dtype="<u8").astype(np.uint64)


class StoreSyncedExecutor:
    """An executor whose finished tasks are kept on the store (see the module's docstring).

    Args:
        inner: the executor that runs the tasks.
        work: the work directory on the store.
        partitions: the build's partitions (for a map task's runs' bounds).
        tasks_reach_store: each task reads and writes the store itself (a Ray build); else the
            driver moves every file (the local executor, whose tasks share its disk).
    """

    def __init__(
        self, inner: Executor, work: StoreWork, partitions: int, tasks_reach_store: bool
    ) -> None:
        self.inner = inner
        self.work = work
        self.partitions = partitions
        self.tasks_reach_store = tasks_reach_store
        self.workers = inner.workers

    def __enter__(self) -> StoreSyncedExecutor:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.inner.__exit__(*exc_info)

    def run(
        self, function: Callable[[TaskT], ResultT], tasks: Sequence[TaskT]
    ) -> Iterator[tuple[TaskT, ResultT]]:
        kept = [task for task in tasks if hasattr(task, "output_sizes")]
        if len(kept) != len(tasks):  # tasks that write the final file in place: the driver's
            yield from self.inner.run(function, tasks)
            return
        if not self.tasks_reach_store:
            self.work.restore(kept)
            for task, result in self.inner.run(function, tasks):
                if not getattr(result, "reused", False):
                    self.work.publish(task, result)
                yield task, result
            return
        finished, pending = self.work.finished_on_store(tasks, BOUNDS_SUFFIX)
        yield from finished
        step = OnStore(function, self.work.url, str(self.work.local), self.partitions)
        for task, result in self.inner.run(step, pending):
            if not getattr(result, "reused", False):
                self.work.publish(task, result, uploaded=True)
            yield task, result


__all__ = ["BOUNDS_SUFFIX", "OnStore", "StoreSyncedExecutor", "relocated", "run_bounds"]
