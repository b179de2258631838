"""Builds stopped from outside: a local worker killed (the out-of-memory killer's SIGKILL) is named
with its signal and the fix, without a traceback, and a rerun resumes to the same bytes; a build
killed mid-reduce or mid-write leaves temporaries that the next build of the same output removes,
so interrupted builds of a multi-GB filter do not pile up multi-GB files beside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.errors import WorkerDied
from bloom_builder.executors import LocalExecutor
from bloom_builder.outputs import remove_stale_temporaries, temporaries_of
from memfree.cli import main as cli_main
from tests.bloom_builder.test_build import WORDS

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads the build's workers from /proc"
)


def write_corpus(directory: Path, files: int, words: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        (directory / f"doc{index:03d}.txt").write_text(" ".join(rng.choice(WORDS, words)) + "\n")
    return directory


def build_args(corpus: Path, output: Path, *extra: str) -> list[str]:
    """A word build (no tokenizer to load: quick to start), written as the prefix index."""
    return [
        "build", str(corpus), "-o", str(output), "--unit", "word", "--n", "3",
        "--shard-size", "1", "--no-progress", "--json", *extra,
    ]  # fmt: skip


def memfree_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "memfree.cli", *args]


def killed_at(hook: str, *args: str) -> list[str]:
    """``memfree ARGS`` in a process that kills itself (SIGKILL, as ``kill -9`` does) when the
    build reaches ``hook``: a test's patch, nothing in the builder's own code."""
    module, _, name = hook.rpartition(".")
    owner, _, attribute = name.partition(":")
    script = (
        "import importlib, os, signal, sys\n"
        f"target = importlib.import_module({module!r})\n"
        f"owner = getattr(target, {owner!r}) if {attribute!r} else target\n"
        "def die(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"setattr(owner, {attribute or owner!r}, die)\n"
        "from memfree.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return [sys.executable, "-c", script, *args]


def stray_temporaries(*folders: Path) -> list[Path]:
    return sorted(path for folder in folders if folder.exists() for path in folder.rglob(".*.tmp"))


# ------------------------------------------------------------------------------------------------
# A worker killed


@dataclass(frozen=True)
class DyingTask:
    index: int
    directory: str

    @property
    def marker(self) -> Path:
        return Path(self.directory) / f"task-{self.index}.json"

    def outputs_intact(self, result: dict[str, Any]) -> bool:
        return True


def die_on_task_one(task: DyingTask) -> dict[str, Any]:
    """Task 1 kills its own worker with SIGKILL, as the out-of-memory killer would."""
    if task.index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    return {"index": task.index}


def test_a_killed_pool_worker_is_named_with_its_signal(tmp_path: Path) -> None:
    tasks = [DyingTask(index, str(tmp_path)) for index in range(4)]
    with pytest.raises(WorkerDied) as died, LocalExecutor(2) as executor:
        for _ in executor.run(die_on_task_one, tasks):
            pass
    error = died.value
    assert error.signal == signal.SIGKILL and error.likely_out_of_memory
    assert error.pid is not None and error.pid != os.getpid()
    assert f"(pid {error.pid}) was killed by signal 9 (SIGKILL)" in str(error)
    assert "out-of-memory killer" in str(error)


def _pool_workers(pid: int) -> list[int]:
    """The build's pool workers (its spawned children; not multiprocessing's resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and b"spawn_main" in command:
            found.append(int(entry.name))
    return found


@linux_only
def test_a_build_whose_worker_is_killed_names_it_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus(tmp_path / "corpus", 240, 3000)
    reference = tmp_path / "reference.memfree"
    assert cli_main(build_args(corpus, reference, "--workers", "1")) == 0
    capsys.readouterr()

    output = tmp_path / "out.memfree"
    args = build_args(corpus, output, "--workers", "2", "--memory-limit", "512M")
    process = subprocess.Popen(
        memfree_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    map_dir = tmp_path / "out.memfree.work" / "map"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(map_dir.glob("shard-*.json")):
        time.sleep(0.01)
    workers = _pool_workers(process.pid)
    assert workers, "the pool's workers run as the build's children"
    os.kill(workers[0], signal.SIGKILL)
    _, raw_error = process.communicate(timeout=120)
    error = raw_error.decode()
    assert process.returncode == 1, error
    assert "Traceback" not in error and "BrokenProcessPool" not in error
    assert f"memfree: error: a build worker process (pid {workers[0]}) was killed by signal 9 " in (
        error
    )
    assert "out-of-memory killer" in error
    assert "a lower --memory-limit (now 512M) or fewer --workers (now 2)" in error
    assert "finished tasks are kept" in error  # the build said so before the error
    assert not output.exists()

    rerun = subprocess.run(memfree_command(*args), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["reused_tasks"] >= 1
    assert output.read_bytes() == reference.read_bytes()


# ------------------------------------------------------------------------------------------------
# Temporaries of a build killed mid-write or mid-reduce


def test_only_this_output_s_temporaries_are_its_own(tmp_path: Path) -> None:
    output = tmp_path / "f.memfree"
    ours = [tmp_path / ".f.memfree.ab_cd123.tmp", tmp_path / ".f.memfree.zzzzzzzz.tmp"]
    sidecar = tmp_path / ".f.memfree.json.abcdefgh.tmp"
    others = [
        tmp_path / ".f.memfree.lock",
        tmp_path / ".f.memfree.abcdefg.tmp",  # not mkstemp's 8 characters
        tmp_path / ".f.memfreeX.abcdefgh.tmp",  # another output's
        tmp_path / ".g.memfree.abcdefgh.tmp",
        tmp_path / "f.memfree.abcdefgh.tmp",  # not hidden: not a temporary memfree writes
    ]
    for path in [*ours, sidecar, *others]:
        path.write_bytes(b"x" * 3)
    folder = tmp_path / ".f.memfree.dirdirdi.tmp"
    folder.mkdir()  # not a regular file: never a build's
    assert temporaries_of(output) == sorted([*ours, folder])
    removed = remove_stale_temporaries(output, pybloom=False)
    assert removed == [(path, 3) for path in sorted(ours)]
    assert sidecar.exists() and folder.is_dir() and all(path.exists() for path in others)
    assert remove_stale_temporaries(output, pybloom=True) == [(sidecar, 3)]


@pytest.mark.parametrize(
    ("hook", "layout"),
    [
        ("memfree.filterfile.index.writer.IndexFileWriter:commit", "prefix-index"),
        ("memfree.filterfile.bloom.writer.FilterFileWriter:commit", "blocked-512"),
    ],
)
def test_a_build_killed_mid_write_leaves_no_temporary_after_its_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], hook: str, layout: str
) -> None:
    corpus = write_corpus(tmp_path / "corpus", 6, 2000)
    reference_dir = tmp_path / "reference"
    reference = reference_dir / "f.memfree"
    assert cli_main(build_args(corpus, reference, "--workers", "1", "--layout", layout)) == 0
    capsys.readouterr()
    assert not stray_temporaries(reference_dir), "a build that finishes leaves no temporary"

    out_dir = tmp_path / "out"
    output = out_dir / "f.memfree"
    args = build_args(corpus, output, "--workers", "1", "--layout", layout)
    killed = subprocess.run(killed_at(hook, *args), capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = temporaries_of(output)
    assert len(left) == 1 and not output.exists()
    assert left[0].stat().st_size >= reference.stat().st_size // 2  # the filter, sized

    rerun = subprocess.run(memfree_command(*args), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"memfree: removed {left[0]} (" in rerun.stderr
    assert not stray_temporaries(out_dir)
    assert output.read_bytes() == reference.read_bytes()


def test_a_build_killed_mid_reduce_leaves_no_temporary_in_its_kept_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus(tmp_path / "corpus", 6, 2000)
    reference = tmp_path / "reference" / "f.memfree"
    assert cli_main(build_args(corpus, reference, "--workers", "1")) == 0
    capsys.readouterr()

    out_dir = tmp_path / "out"
    output = out_dir / "f.memfree"
    args = build_args(corpus, output, "--workers", "1", "--keep-work")
    killed = subprocess.run(
        killed_at("bloom_builder.reduce.count_range", *args), capture_output=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert stray_temporaries(out_dir / "f.memfree.work"), "the reduce task's kept file, begun"

    rerun = subprocess.run(memfree_command(*args), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert not stray_temporaries(out_dir)
    assert output.read_bytes() == reference.read_bytes()
