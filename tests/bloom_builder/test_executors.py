"""The local executor: runs every task once, records markers, and on a rerun skips exactly the
tasks whose marker and outputs are intact, in this process and in a spawned pool."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.executors import LocalExecutor, any_done, make_executor

_PREFIX: str | None = None  # set by the worker setup, read by the step


def remember_prefix(prefix: str) -> None:
    global _PREFIX
    _PREFIX = prefix


@dataclass(frozen=True)
class ToyTask:
    index: int
    directory: str

    @property
    def marker(self) -> Path:
        return Path(self.directory) / f"task-{self.index}.json"

    @property
    def output(self) -> Path:
        return Path(self.directory) / f"task-{self.index}.out"

    def outputs_intact(self, result: dict[str, Any]) -> bool:
        return self.output.exists() and self.output.read_text() == result["written"]


def toy_step(task: ToyTask) -> dict[str, Any]:
    """Write the task's output and log the call (the log counts runs across processes)."""
    if _PREFIX is None:
        raise RuntimeError("the worker setup did not run")
    written = f"{_PREFIX}{task.index}"
    task.output.write_text(written)
    with open(Path(task.directory) / "calls.log", "a", encoding="utf-8") as log:
        log.write(f"{task.index}\n")
    return {"written": written, "pid": os.getpid()}


def run_all(workers: int, tasks: list[ToyTask]) -> dict[int, dict[str, Any]]:
    with LocalExecutor(workers, partial(remember_prefix, "out-")) as executor:
        return {task.index: result for task, result in executor.run(toy_step, tasks)}


def calls(directory: Path) -> list[int]:
    log = directory / "calls.log"
    return sorted(int(line) for line in log.read_text().split()) if log.exists() else []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_rerun_skips_finished_tasks_and_redoes_damaged_ones(tmp_path: Path, workers: int) -> None:
    tasks = [ToyTask(index, str(tmp_path)) for index in range(5)]
    first = run_all(workers, tasks)
    assert sorted(first) == [0, 1, 2, 3, 4]
    assert all(result["reused"] is False for result in first.values())
    assert [first[i]["written"] for i in range(5)] == [f"out-{i}" for i in range(5)]
    assert calls(tmp_path) == [0, 1, 2, 3, 4]
    assert json.loads(tasks[2].marker.read_text())["written"] == "out-2"
    assert any_done(tmp_path)
    if workers > 1:
        assert all(result["pid"] != os.getpid() for result in first.values())

    second = run_all(workers, tasks)
    assert all(result["reused"] is True for result in second.values())
    assert {i: second[i]["written"] for i in second} == {i: first[i]["written"] for i in first}
    assert calls(tmp_path) == [0, 1, 2, 3, 4]  # nothing ran again

    tasks[1].output.unlink()  # outputs gone: the marker no longer counts
    tasks[3].marker.write_text("{not json")  # an unreadable marker
    tasks[4].marker.write_text("{}")  # a marker without what the task's check reads
    third = run_all(workers, tasks)
    assert {i for i, result in third.items() if not result["reused"]} == {1, 3, 4}
    assert calls(tmp_path) == [0, 1, 1, 2, 3, 3, 4, 4]
    assert tasks[1].output.read_text() == "out-1"
    assert json.loads(tasks[3].marker.read_text())["written"] == "out-3"


def test_make_executor_gives_a_local_pool_and_refuses_bad_worker_counts(tmp_path: Path) -> None:
    executor = make_executor(3)
    assert isinstance(executor, LocalExecutor) and executor.workers == 3
    assert not any_done(tmp_path)
    with pytest.raises(ValueError, match="workers >= 1"):
        LocalExecutor(0)


def slow_or_failing_step(task: ToyTask) -> dict[str, Any]:
    """Task 0 fails at once; the others take a moment, so they are still running (or done but
    not yet collected) when the failure reaches the driver."""
    import time

    if task.index == 0:
        raise RuntimeError("task 0 fails")
    time.sleep(0.5)
    return toy_step(task)


def test_tasks_finished_when_another_fails_keep_their_markers(tmp_path: Path) -> None:
    tasks = [ToyTask(index, str(tmp_path)) for index in range(3)]
    with (
        pytest.raises(RuntimeError, match="task 0 fails"),
        LocalExecutor(2, partial(remember_prefix, "out-")) as executor,
    ):
        for _ in executor.run(slow_or_failing_step, tasks):
            pass
    finished = calls(tmp_path)
    assert finished, "no task finished besides the failing one"
    # Every task that finished is marked, so a rerun does not redo it.
    assert all(tasks[index].marker.exists() for index in finished)
    rerun = run_all(2, tasks)
    assert all(rerun[index]["reused"] for index in finished)
    assert calls(tmp_path) == [0, 1, 2]  # each task ran once in all: nothing finished ran twice
