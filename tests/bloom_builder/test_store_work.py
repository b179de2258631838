"""A build's work directory on object storage (issue 37, work): ``--work-dir s3://...`` against
a real S3 API server (moto's) on 127.0.0.1. The filter is the local work directory's, byte for
byte; finished tasks are kept on the store (outputs, then a marker naming their size and xxh3)
and resumed from there by a build with an empty cache, after kill -9 too; a damaged object
reruns its task; another build's lock, objects no build wrote and work of other settings are
handled as a local work directory's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.errors import BuildError
from bloom_builder.store_work import LOCK_OBJECT, STALE_S, WORK_OBJECT
from tests.bloom_builder.test_build import settings_for, write_corpus

pytest.importorskip("s3fs", reason="the s3 extra is not installed: run `make setup`")
pytest.importorskip("moto", reason="moto is not installed: run `make setup`")


def _keys(s3: Any, prefix: str) -> list[str]:
    s3.invalidate_cache()
    try:
        return sorted(s3.find(prefix))
    except FileNotFoundError:
        return []


def _kept_build(tmp_path: Path, tokenizer_dir: Path, name: str) -> tuple[Any, str, Any]:
    """A build of 8 documents whose work is kept on the bucket at ``s3://corpus/work/NAME``
    (its filter: ``a.memfree``): its settings, the work directory's URL and its summary."""
    write_corpus(tmp_path / "corpus", 8)
    settings = settings_for(tokenizer_dir, output_format="memfree")
    url = f"s3://corpus/work/{name}"
    first = build_filter(
        [str(tmp_path / "corpus")], tmp_path / "a.memfree", settings, work_dir=url,
        keep_work=True, progress=False,
    )  # fmt: skip
    return settings, url, first


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_work_on_a_bucket_gives_the_local_bytes_and_resumes_from_an_empty_cache(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same bytes as a local work directory (two workers, a prefix section); the store then
    holds each map and reduce task's outputs and marker; a build on another machine (another,
    empty cache) reuses every task from the store; a build that keeps no work leaves nothing
    under the URL."""
    write_corpus(tmp_path / "corpus", 12)
    settings = settings_for(tokenizer_dir, workers=2, num_partitions=4, output_format="memfree")
    reference = tmp_path / "reference.memfree"
    build_filter([str(tmp_path / "corpus")], reference, settings, progress=False)

    url = "s3://corpus/work/web"
    first = build_filter(
        [str(tmp_path / "corpus")], tmp_path / "a.memfree", settings, work_dir=url,
        keep_work=True, progress=False,
    )  # fmt: skip
    assert (tmp_path / "a.memfree").read_bytes() == reference.read_bytes()
    keys = _keys(s3, "corpus/work/web")
    assert f"corpus/work/web/{WORK_OBJECT}" in keys
    markers = [
        k for k in keys if k.startswith("corpus/work/web/map/shard-") and k.endswith(".json")
    ]
    assert len(markers) == first.map_tasks > 1
    assert any("/reduce-min" in k and k.endswith(".u64") for k in keys)
    marker = json.loads(s3.cat_file(markers[0]))
    assert str(cache) not in json.dumps(marker)  # paths relative to the work directory
    assert not (tmp_path / "a.memfree.work").exists()  # nothing beside the output

    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "elsewhere"))  # another machine
    again = build_filter(
        [str(tmp_path / "corpus")], tmp_path / "b.memfree", settings, work_dir=url,
        progress=False,
    )  # fmt: skip
    assert again.reused_tasks == again.map_tasks == first.map_tasks
    assert (tmp_path / "b.memfree").read_bytes() == reference.read_bytes()
    assert _keys(s3, "corpus/work/web") == []  # no work kept: nothing left on the store


def test_a_damaged_object_on_the_store_reruns_its_task(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output object rewritten with other bytes of its size (and one deleted): their tasks run
    again from an empty cache; the others are reused; the same bytes."""
    settings, url, first = _kept_build(tmp_path, tokenizer_dir, "damaged")
    runs = [k for k in _keys(s3, "corpus/work/damaged/map") if k.endswith(".keys")]
    data = bytearray(s3.cat_file(runs[0]))
    data[0] ^= 0xFF
    s3.pipe_file(runs[0], bytes(data))
    s3.rm(runs[-1])
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "elsewhere"))
    again = build_filter(
        [str(tmp_path / "corpus")], tmp_path / "b.memfree", settings, work_dir=url,
        keep_work=True, progress=False,
    )  # fmt: skip
    damaged = {k.split("/map/")[1].split("/")[0] for k in (runs[0], runs[-1])}
    assert again.reused_tasks == first.map_tasks - len(damaged)
    assert (tmp_path / "b.memfree").read_bytes() == (tmp_path / "a.memfree").read_bytes()


def test_kill_9_with_the_work_directory_on_a_bucket_then_a_rerun_elsewhere_gives_the_same_bytes(
    s3: Any, tmp_path: Path, tokenizer_dir: Path
) -> None:
    """kill -9 in the middle of the map step; a rerun with another (empty) cache, as on another
    machine, reuses the tasks whose markers reached the store and writes the same bytes. The
    killed build's lock is stale only after a while: the rerun takes it over once it is."""
    write_corpus(tmp_path / "corpus", 40, words_per_file=2000)
    command = [
        sys.executable, "-m", "memfree.cli", "build", str(tmp_path / "corpus"),
        "--tokenizer", str(tokenizer_dir), "--n", "4", "--workers", "1", "--shard-size", "1",
        "--no-progress", "--json",
    ]  # fmt: skip
    env = {**os.environ, "MEMFREE_CACHE": str(tmp_path / "cache-a")}
    reference = tmp_path / "reference.memfree"
    subprocess.run([*command, "-o", str(reference)], check=True, capture_output=True, env=env)

    url = "s3://corpus/work/killed"
    output = tmp_path / "resumed.memfree"
    process = subprocess.Popen(
        [*command, "-o", str(output), "--work-dir", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 120

    def finished() -> int:
        return sum(
            k.endswith(".json") and "/map/shard-" in k for k in _keys(s3, "corpus/work/killed")
        )

    while time.monotonic() < deadline and finished() < 5 and process.poll() is None:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    finished_before = finished()
    assert 5 <= finished_before < 40, "the kill must land in the middle of the map stage"
    assert not output.exists()

    lock = f"corpus/work/killed/{LOCK_OBJECT}"
    held = json.loads(s3.cat_file(lock))
    refused = subprocess.run(
        [*command, "-o", str(output), "--work-dir", url], capture_output=True, text=True,
        env={**os.environ, "MEMFREE_CACHE": str(tmp_path / "cache-b")},
    )  # fmt: skip
    assert refused.returncode != 0 and "another build is using this work directory" in (
        refused.stderr
    )
    held["heartbeat"] -= STALE_S + 1  # as if it had been dead that long
    s3.pipe_file(lock, json.dumps(held).encode())
    rerun = subprocess.run(
        [*command, "-o", str(output), "--work-dir", url], check=True, capture_output=True,
        text=True, env={**os.environ, "MEMFREE_CACHE": str(tmp_path / "cache-b")},
    )  # fmt: skip
    assert json.loads(rerun.stdout)["reused_tasks"] >= finished_before
    assert output.read_bytes() == reference.read_bytes()
    assert _keys(s3, "corpus/work/killed") == []


def test_a_prefix_no_build_wrote_is_refused_and_other_settings_clear_old_work(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, cache: Path
) -> None:
    write_corpus(tmp_path / "corpus", 4)
    s3.pipe_file("corpus/work/theirs/notes.txt", b"keep me")
    with pytest.raises(BuildError, match="not a memfree work directory"):
        build_filter(
            [str(tmp_path / "corpus")], tmp_path / "a.memfree", settings_for(tokenizer_dir),
            work_dir="s3://corpus/work/theirs", progress=False,
        )  # fmt: skip
    assert _keys(s3, "corpus/work/theirs") == ["corpus/work/theirs/notes.txt"]
    assert not (tmp_path / "a.memfree").exists()

    url = "s3://corpus/work/settings"
    for n in (4, 3):
        build_filter(
            [str(tmp_path / "corpus")], tmp_path / f"n{n}.memfree",
            settings_for(tokenizer_dir, ngram_size=n), work_dir=url, keep_work=True,
            progress=False,
        )  # fmt: skip
    kept = json.loads(s3.cat_file(f"corpus/work/settings/{WORK_OBJECT}"))
    assert kept["config"]["ngram_size"] == 3
    local = build_filter(
        [str(tmp_path / "corpus")], tmp_path / "n3-local.memfree",
        settings_for(tokenizer_dir, ngram_size=3), progress=False,
    )  # fmt: skip
    assert local.kept_ngrams > 0
    assert (tmp_path / "n3.memfree").read_bytes() == (tmp_path / "n3-local.memfree").read_bytes()


def test_a_store_that_fails_while_tasks_are_kept_stops_the_build_and_loses_nothing(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every upload of the third map task's outputs is reset (after its client's retries): the
    build stops with a StorageError naming the work directory's URL and no filter is written;
    the two tasks kept before it are reused by a rerun from an empty cache once the store
    answers, which writes the bytes of a local build."""
    from urllib.parse import urlsplit

    import s3fs

    from memfree.errors import StorageError
    from tests.bloom_builder.test_object_storage import _Flaky, _through

    write_corpus(tmp_path / "corpus", 6)
    settings = settings_for(tokenizer_dir, output_format="memfree")
    reference = tmp_path / "reference.memfree"
    build_filter([str(tmp_path / "corpus")], reference, settings, progress=False)
    url = "s3://corpus/work/failing"
    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    watch = b"PUT /corpus/work/failing/map/shard-00002/"
    flaky = _Flaky((endpoint.hostname or "", endpoint.port or 80), 0, watch)
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache-a"))
    _through(flaky, monkeypatch)
    out = tmp_path / "f.memfree"
    try:
        with pytest.raises(StorageError, match=r"s3://corpus/work/failing/map/shard-00002/.*store"):
            build_filter([str(tmp_path / "corpus")], out, settings, work_dir=url, progress=False)
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
    assert not out.exists() and flaky.reset >= 1
    kept = [k for k in _keys(s3, "corpus/work/failing/map") if k.endswith(".json")]
    assert [k.rsplit("/", 1)[1] for k in kept] == ["shard-00000.json", "shard-00001.json"]
    assert f"corpus/work/failing/{LOCK_OBJECT}" not in _keys(s3, "corpus/work/failing")  # released
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache-b"))
    again = build_filter([str(tmp_path / "corpus")], out, settings, work_dir=url, progress=False)
    assert again.reused_tasks == 2
    assert out.read_bytes() == reference.read_bytes()


def test_ray_tasks_that_share_only_the_bucket_give_the_local_bytes_and_resume(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Ray each task reaches the store itself, in a private temporary folder: a map task
    uploads its runs and their partition bounds, a reduce task reads only its partition's slice
    of each run (ranged requests) and uploads its kept keys; the driver's mirror receives no run
    at all, only markers and the kept keys it writes the filter from. Two workers, four
    partitions, a prefix section: the local executor's bytes; a rerun from an empty cache
    reuses every task from the store."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    write_corpus(tmp_path / "corpus", 10)
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache-a"))
    local = settings_for(tokenizer_dir, workers=1, num_partitions=4, output_format="memfree")
    reference = tmp_path / "reference.memfree"
    build_filter([str(tmp_path / "corpus")], reference, local, progress=False)
    url = "s3://corpus/work/ray"
    on_ray = settings_for(
        tokenizer_dir, workers=2, executor="ray", num_partitions=4, output_format="memfree"
    )
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
        configure_logging=False,
    )  # fmt: skip
    try:
        first = build_filter(
            [str(tmp_path / "corpus")], tmp_path / "a.memfree", on_ray, work_dir=url,
            keep_work=True, progress=False,
        )  # fmt: skip
        assert (tmp_path / "a.memfree").read_bytes() == reference.read_bytes()
        mirror = next((tmp_path / "cache-a" / "work").iterdir())
        assert not [p for p in mirror.rglob("*") if p.suffix in (".keys", ".repeats")]
        keys = _keys(s3, "corpus/work/ray")
        assert sum(k.endswith(".bounds") for k in keys) == sum(k.endswith(".keys") for k in keys)
        monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache-b"))
        again = build_filter(
            [str(tmp_path / "corpus")], tmp_path / "b.memfree", on_ray, work_dir=url,
            progress=False,
        )  # fmt: skip
    finally:
        ray.shutdown()
    assert again.reused_tasks == again.map_tasks == first.map_tasks > 1
    assert (tmp_path / "b.memfree").read_bytes() == reference.read_bytes()
    assert _keys(s3, "corpus/work/ray") == []


def test_a_work_directory_in_a_missing_bucket_is_refused_naming_it(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No such bucket: the build stops before any task with an error naming the URL (no
    traceback), and writes no filter."""
    from memfree.cli import main

    write_corpus(tmp_path / "corpus", 2)
    out = tmp_path / "f.memfree"
    code = main(
        ["build", str(tmp_path / "corpus"), "-o", str(out), "--tokenizer", str(tokenizer_dir),
         "--work-dir", "s3://no-such-bucket/work"]
    )  # fmt: skip
    error = capsys.readouterr().err
    assert code == 2 and "Traceback" not in error
    assert "s3://no-such-bucket/work" in error and "bucket" in error.lower()
    assert not out.exists()


def test_corpus_work_and_output_all_on_a_bucket(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, cache: Path
) -> None:
    """The corpus, the work directory and the output all on the bucket: the local build's bytes
    at the output key, and nothing left under the work directory's URL."""
    write_corpus(tmp_path / "corpus", 6)
    for path in sorted((tmp_path / "corpus").iterdir()):
        s3.put_file(str(path), f"corpus/all/in/{path.name}")
    settings = settings_for(tokenizer_dir, workers=2)
    build_filter([str(tmp_path / "corpus")], tmp_path / "here.memfree", settings, progress=False)
    build_filter(
        ["s3://corpus/all/in"], "s3://corpus/all/out/f.memfree", settings,
        work_dir="s3://corpus/all/work", progress=False,
    )  # fmt: skip
    from tests.bloom_builder.test_object_storage import _payload

    (tmp_path / "there.memfree").write_bytes(s3.cat_file("corpus/all/out/f.memfree"))
    assert _payload(tmp_path / "there.memfree") == _payload(tmp_path / "here.memfree")
    assert _keys(s3, "corpus/all/work") == []


def test_a_cache_with_no_room_for_the_mirror_stops_the_build_and_loses_nothing(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, cache: Path
) -> None:
    """A build on a machine whose disk refuses the mirror's downloads (the kernel's file-size
    limit, EFBIG, as a full disk gives ENOSPC): it stops saying there is no room in memfree's
    cache and what to set; the finished tasks on the store are kept, and a build with room
    reuses them all and gives the same bytes."""
    from tests.conftest import run_with_file_limit

    settings, url, first = _kept_build(tmp_path, tokenizer_dir, "roomless")
    kept = _keys(s3, "corpus/work/roomless")
    output = tmp_path / "b.memfree"
    argv = [
        "build", str(tmp_path / "corpus"), "-o", str(output), "--tokenizer", str(tokenizer_dir),
        "--n", "4", "--workers", "1", "--memory-limit", "16MiB", "--shard-size", "2000",
        "--format", "memfree", "--work-dir", url, "--keep-work", "--no-progress",
    ]  # fmt: skip
    code = f"from memfree.cli import main\nraise SystemExit(main({argv!r}))\n"
    elsewhere = tmp_path / "elsewhere"
    done = run_with_file_limit(code, 4 * 1024, {"MEMFREE_CACHE": str(elsewhere)})
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert "no room" in error and "MEMFREE_CACHE" in error, error
    assert "Traceback" not in done.stderr
    assert not output.exists()
    assert _keys(s3, "corpus/work/roomless") == kept  # nothing lost on the store
    assert not [p for p in elsewhere.rglob("*.tmp")]  # no half download in the mirror
    os.environ["MEMFREE_CACHE"] = str(elsewhere)
    again = build_filter([str(tmp_path / "corpus")], output, settings, work_dir=url, progress=False)
    assert again.reused_tasks == first.map_tasks
    assert output.read_bytes() == (tmp_path / "a.memfree").read_bytes()


def test_builds_that_take_the_lock_at_once_on_s3_let_exactly_one_through(
    s3: Any, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3's conditional writes make the lock exact: of four builds that take it at the same
    instant (a barrier), exactly one holds it, every round; a build whose stale lock another
    took over finds out at its next heartbeat and writes no more tasks."""
    import threading

    import bloom_builder.store_work as store_work
    from bloom_builder.store_work import StoreLock, StoreWork

    work = StoreWork("s3://corpus/work/raced")
    for _ in range(6):
        barrier = threading.Barrier(4)
        locks = [StoreLock(work) for _ in range(4)]
        outcomes: list[str] = []

        def take(lock: StoreLock, barrier: Any, outcomes: list[str]) -> None:
            barrier.wait()
            try:
                lock.acquire()
                outcomes.append("held")
            except BuildError as error:
                outcomes.append(str(error))

        threads = [threading.Thread(target=take, args=(lock, barrier, outcomes)) for lock in locks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes.count("held") == 1, outcomes
        assert all("another build" in o for o in outcomes if o != "held")
        for lock in locks:
            lock.release()
        assert f"corpus/work/raced/{LOCK_OBJECT}" not in _keys(s3, "corpus/work/raced")

    monkeypatch.setattr(store_work, "HEARTBEAT_S", 0.2)
    stalled = StoreLock(work)
    stalled.acquire()
    held = json.loads(s3.cat_file(f"corpus/work/raced/{LOCK_OBJECT}"))
    stalled._stop.set()  # the build stalls: its heartbeat stops...
    stalled._thread.join()  # type: ignore[union-attr]
    held["heartbeat"] -= STALE_S + 1  # ...for longer than the lock stays fresh
    s3.pipe_file(f"corpus/work/raced/{LOCK_OBJECT}", json.dumps(held).encode())
    other = StoreLock(work)
    other.acquire()  # takes the stale lock over
    stalled._stop.clear()
    stalled._thread = threading.Thread(target=stalled._beat, daemon=True)
    stalled._thread.start()  # the stalled build wakes: its next beat finds the lock taken
    stalled._thread.join(timeout=10)
    assert stalled.lost is not None and stalled.lost.get("token") == other.token
    with pytest.raises(BuildError, match="took this work directory over"):
        stalled.check()
    stalled.release()  # leaves the other build's lock alone
    assert json.loads(s3.cat_file(f"corpus/work/raced/{LOCK_OBJECT}"))["token"] == other.token
    other.release()
