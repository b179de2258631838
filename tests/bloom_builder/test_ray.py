"""The Ray executor (a local Ray with 2 CPUs): the same filter bytes as the local executor, resume
from markers, a failing task retried, and a task that fails every time named in the error."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.errors import TaskFailed
from bloom_builder.executors.ray import RayExecutor
from bloom_builder.settings import BuildSettings
from tests.bloom_builder.test_executors import ToyTask, calls


@pytest.fixture(scope="module")
def local_ray() -> Any:
    """One local Ray for the module (starting one takes a few seconds); test functions travel
    by value, since Ray's workers cannot import this test module by name."""
    import ray.cloudpickle

    for name in (__name__, "tests.bloom_builder.test_executors"):
        ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def remember_prefix(prefix: str) -> None:
    """The worker setup. Test functions travel by value, each with its own copy of this module's
    globals, so the setup leaves its state where the step finds it: the worker's environment."""
    os.environ["MEMFREE_TEST_PREFIX"] = prefix


def toy_step(task: ToyTask) -> dict[str, Any]:
    """Write the task's output and log the call (the log counts runs across processes)."""
    prefix = os.environ.get("MEMFREE_TEST_PREFIX")
    if prefix is None:
        raise RuntimeError("the worker setup did not run")
    written = f"{prefix}{task.index}"
    task.output.write_text(written)
    with open(Path(task.directory) / "calls.log", "a", encoding="utf-8") as log:
        log.write(f"{task.index}\n")
    return {"written": written, "pid": os.getpid()}


def fail_first_attempt(task: ToyTask) -> dict[str, Any]:
    """Fails the first time each task runs (as a lost worker would), then succeeds."""
    flag = Path(task.directory) / f"attempted-{task.index}"
    if not flag.exists():
        flag.write_text("1")
        raise OSError(f"injected failure of task {task.index}")
    return toy_step(task)


def always_fail(task: ToyTask) -> dict[str, Any]:
    raise ValueError(f"task {task.index} cannot be done")


def test_ray_builds_the_same_bytes_as_the_local_pool(
    local_ray: Any, tmp_path: Path, tokenizer_dir: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "return",
        "self",
        "def",
        "class",
        "import",
        "for",
        "in",
        "range",
    ]
    for index in range(6):
        text = " ".join(words[(index * 7 + i * 3) % len(words)] for i in range(300))
        (corpus / f"doc{index}.txt").write_text(text + "\n", encoding="utf-8")
    outputs = {}
    for executor, workers in (("local", 1), ("ray", 2), ("ray", 1)):
        output = tmp_path / f"{executor}-{workers}.memfree"
        settings = BuildSettings(
            ngram_size=4,
            tokenizer=str(tokenizer_dir),
            workers=workers,
            executor=executor,
            shard_bytes=2000,
            num_partitions=4 if workers == 2 else 16,
        )
        build_filter([str(corpus)], output, settings, progress=False)
        outputs[executor, workers] = output.read_bytes()
    assert outputs["ray", 2] == outputs["local", 1] == outputs["ray", 1]


def test_ray_resumes_from_markers_and_retries_a_failing_task(
    local_ray: Any, tmp_path: Path
) -> None:
    tasks = [ToyTask(index, str(tmp_path)) for index in range(4)]
    with RayExecutor(2, partial(remember_prefix, "out-")) as executor:
        first = dict((task.index, result) for task, result in executor.run(toy_step, tasks[:2]))
    assert sorted(first) == [0, 1] and calls(tmp_path) == [0, 1]
    with RayExecutor(2, partial(remember_prefix, "out-"), max_retries=2) as executor:
        second = {t.index: r for t, r in executor.run(fail_first_attempt, tasks)}
    assert second[0]["reused"] and second[1]["reused"]  # finished before: not run again
    assert not second[2]["reused"] and second[3]["written"] == "out-3"
    assert calls(tmp_path) == [0, 1, 2, 3]  # 2 and 3 failed once, then ran once each
    assert all((tmp_path / f"attempted-{index}").exists() for index in (2, 3))


def test_a_task_failing_on_every_attempt_fails_the_run_named(
    local_ray: Any, tmp_path: Path
) -> None:
    tasks = [ToyTask(7, str(tmp_path))]
    with (
        RayExecutor(2, partial(remember_prefix, "out-"), max_retries=1) as executor,
        pytest.raises(TaskFailed, match=r"ToyTask\(index=7.*all 2 attempts.*cannot be done"),
    ):
        list(executor.run(always_fail, tasks))
    assert not tasks[0].marker.exists()


def test_the_settings_refuse_a_ray_address_without_ray() -> None:
    with pytest.raises(ValueError, match="--ray-address needs --executor ray"):
        BuildSettings(ray_address="auto")
    with pytest.raises(ValueError, match="--executor must be local or ray"):
        BuildSettings(executor="slurm")
