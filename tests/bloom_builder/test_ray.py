"""The Ray executor (a local Ray with 2 CPUs): the same filter bytes as the local executor, resume
from markers (also after `kill -9` of the driver and its Ray), a failing task retried, and a task
that fails every time named in the error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.errors import TaskFailed
from bloom_builder.executors.ray import RayExecutor
from bloom_builder.settings import BuildSettings
from tests.bloom_builder.test_build import WORDS, write_corpus
from tests.bloom_builder.test_executors import ToyTask, calls


@pytest.fixture(scope="module")
def local_ray() -> Any:
    """One local Ray for the module (starting one takes a few seconds); test functions travel
    by value, since Ray's workers cannot import this test module by name."""
    import ray.cloudpickle

    for name in (__name__, "tests.bloom_builder.test_executors"):
        ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    ray.init(  # "local": its own Ray even where `ray start` left a cluster on this node
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
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


@pytest.mark.parametrize(
    ("layout", "unit"),
    [("blocked-512", "token"), ("prefix-index", "token"), ("prefix-index", "word")],
)
def test_ray_builds_the_same_bytes_as_the_local_pool(
    local_ray: Any, tmp_path: Path, tokenizer_dir: Path, layout: str, unit: str
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = WORDS[:12]  # alpha ... range
    for index in range(6):
        text = " ".join(words[(index * 7 + i * 3) % len(words)] for i in range(300))
        (corpus / f"doc{index}.txt").write_text(text + "\n", encoding="utf-8")
    outputs = {}
    for executor, workers in (("local", 1), ("ray", 2), ("ray", 1)):
        output = tmp_path / f"{executor}-{workers}.memfree"
        settings = BuildSettings(
            ngram_size=4,
            unit=unit,  # type: ignore[arg-type]
            tokenizer=str(tokenizer_dir) if unit == "token" else None,
            workers=workers,
            executor=executor,
            shard_bytes=2000,
            num_partitions=4 if workers == 2 else 16,
            layout=layout,  # type: ignore[arg-type]
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
        pytest.raises(TaskFailed, match=r"^ToyTask 7 failed on all 2 attempts: .*cannot be done"),
    ):
        list(executor.run(always_fail, tasks))
    assert not tasks[0].marker.exists()


def test_the_settings_refuse_a_ray_address_without_ray() -> None:
    with pytest.raises(ValueError, match="ray_address needs executor ray"):
        BuildSettings(ray_address="auto")
    with pytest.raises(ValueError, match="executor must be local or ray"):
        BuildSettings(executor="slurm")


def test_killing_the_driver_and_its_ray_then_rerunning_reuses_finished_tasks(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """`kill -9` of a `memfree build --executor ray` and of the local Ray it started (the whole
    process group: driver, raylet, workers), mid-map; the rerun reuses every task marked done
    and writes the bytes a local build writes."""
    write_corpus(tmp_path / "corpus", 60, words_per_file=2000)
    command = [
        sys.executable, "-m", "memfree.cli", "build", str(tmp_path / "corpus"),
        "--tokenizer", str(tokenizer_dir), "--n", "4", "--shard-size", "1", "--no-progress",
        "--json",
    ]  # fmt: skip
    reference = tmp_path / "reference.memfree"
    subprocess.run([*command, "-o", str(reference), "--workers", "1"], check=True)
    output, work = tmp_path / "resumed.memfree", tmp_path / "resumed.memfree.work"
    on_ray = [*command, "-o", str(output), "--executor", "ray", "--workers", "2"]
    process = subprocess.Popen(
        on_ray, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(list((work / "map").glob("shard-*.json"))) < 5:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    finished_before = len(list((work / "map").glob("shard-*.json")))
    assert 5 <= finished_before < 60, "the kill must land in the middle of the map stage"
    assert not output.exists()

    rerun = subprocess.run(on_ray, check=True, capture_output=True, text=True)
    summary = json.loads(rerun.stdout)
    assert summary["reused_tasks"] >= finished_before
    assert output.read_bytes() == reference.read_bytes()
