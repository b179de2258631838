"""Bad input to `memfree build --executor ray`: malformed addresses refused before any work,
unreachable ones refused within the connect timeout (exit status 2, the address named), a Ray of
the build's own beside a running cluster, relative paths from a driver whose working directory is
not the cluster's, SIGTERM without Ray's native stack dump (and a rerun resumes), and a failing
task named by its shard rather than its repr.

The tests that need a cluster share one `ray start --head` (one CPU) that this module starts in a
directory of its own, with its own Ray temp directory, so `--ray-address auto` finds it and no
other Ray on the machine sees it; it is stopped by killing its process group (`ray stop` would
stop every Ray of this user).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.errors import RayUnavailable, TaskFailed, describe_task
from bloom_builder.executors.ray import (
    ADDRESS_FIX,
    CONNECT_TIMEOUT_ENV,
    DEFAULT_CONNECT_TIMEOUT_S,
    RayExecutor,
    _stop_on_sigterm,
    connect_timeout_s,
    ray_address_problem,
)
from bloom_builder.map import MapTask
from bloom_builder.reduce import ReduceTask
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import SourceOptions, WorkUnit
from memfree.cli import main as cli_main
from tests.bloom_builder.test_build import write_corpus
from tests.bloom_builder.test_executors import ToyTask

HAS_RAY_CLIENT = importlib.util.find_spec("grpc") is not None


# ------------------------------------------------------------------------------------------------
# Malformed addresses: refused by the settings, before any work.


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("", "ray_address is empty"),
        ("   ", "ray_address is empty"),
        ("garbage::::", "'garbage::::' is not HOST:PORT"),
        ("head-node", "'head-node' is not HOST:PORT"),
        (":6379", "':6379' is not HOST:PORT"),
        ("head:0", "'head:0' is not HOST:PORT"),
        ("head:65536", "'head:65536' is not HOST:PORT"),
        ("http://127.0.0.1:8265", "is a http:// URL"),
        ("https://head:6379", "is a https:// URL"),
        ("ray://", "a Ray Client address is ray://HOST:PORT"),
    ],
)
def test_malformed_addresses_are_refused_by_the_settings(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        BuildSettings(executor="ray", ray_address=address)
    if not address.startswith("ray://"):
        assert str(refused.value).endswith(ADDRESS_FIX)
    with pytest.raises(ValueError, match=message):
        RayExecutor(1, address=address)


@pytest.mark.parametrize("address", ["auto", "localhost:6379", "10.0.0.7:6379", "[::1]:6379"])
def test_well_formed_addresses_pass_the_settings(address: str) -> None:
    assert ray_address_problem(address) is None
    assert BuildSettings(executor="ray", ray_address=address).ray_address == address


@pytest.mark.skipif(HAS_RAY_CLIENT, reason="ray[client] is installed here")
def test_a_ray_client_address_without_ray_client_names_the_extra() -> None:
    with pytest.raises(ValueError, match=r"pip install 'ray\[client\]'"):
        BuildSettings(executor="ray", ray_address="ray://head:10001")


def test_the_connect_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONNECT_TIMEOUT_ENV, raising=False)
    assert connect_timeout_s() == DEFAULT_CONNECT_TIMEOUT_S
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "2.5")
    assert connect_timeout_s() == 2.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        monkeypatch.setenv(CONNECT_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"{CONNECT_TIMEOUT_ENV}='{bad}' must be a number"):
            BuildSettings(executor="ray", ray_address="auto")


def test_the_cli_refuses_a_malformed_address_before_reading_the_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "f.memfree"
    command = ["build", str(tmp_path / "missing"), "-o", str(output), "--unit", "word"]
    assert cli_main([*command, "--executor", "ray", "--ray-address", "garbage::::"]) == 2
    error = capsys.readouterr().err
    assert "--ray-address 'garbage::::' is not HOST:PORT" in error
    assert "Traceback" not in error and "missing" not in error
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# Unreachable addresses: refused within the connect timeout, named, exit status 2.


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    with socket.socket() as server:
        server.bind(("", 0))
        server.listen(8)
        yield int(server.getsockname()[1])


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # pragma: no cover - HTTP/2's preface is no GET
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def web_port() -> Iterator[int]:
    """A port where a web server (such as Ray's dashboard) answers."""
    server = HTTPServer(("", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_an_unreachable_address_is_refused_fast_and_named(
    monkeypatch: pytest.MonkeyPatch, silent_port: int, web_port: int
) -> None:
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cases = {
        f"127.0.0.1:{closed_port()}": "connection refused: nothing listens on port",
        f"127.0.0.1:{silent_port}": "does not answer as Ray within 1 s",
        f"localhost:{web_port}": "something answers there, but not Ray",
        "no-such-host.invalid:6379": "cannot resolve the host 'no-such-host.invalid'",
    }
    for address, reason in cases.items():
        started = time.monotonic()
        with (
            pytest.raises(RayUnavailable, match=reason) as refused,
            RayExecutor(1, address=address),
        ):
            pass
        assert time.monotonic() - started < 5
        assert str(refused.value).startswith(f"cannot join the Ray cluster at {address}")
    import ray

    assert not ray.is_initialized()


def test_the_cli_exits_2_naming_an_unreachable_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    address = f"127.0.0.1:{closed_port()}"
    output = tmp_path / "f.memfree"
    command = ["build", str(tmp_path / "corpus"), "-o", str(output), "--unit", "word"]
    started = time.monotonic()
    assert cli_main([*command, "--executor", "ray", "--ray-address", address]) == 2
    assert time.monotonic() - started < 10
    error = capsys.readouterr().err
    assert f"memfree: error: cannot join the Ray cluster at {address}" in error
    assert "Traceback" not in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus"]  # no work left


# ------------------------------------------------------------------------------------------------
# A failing task is named by its shard.


def units(count: int) -> tuple[WorkUnit, ...]:
    return tuple(
        WorkUnit(f"/corpus/part-{index}.jsonl", "jsonl", "", 0, 4096, 4096)
        for index in range(count)
    )


def map_task(index: int, count: int, work_dir: str, buffer_entries: int = 1 << 16) -> MapTask:
    """A map task of ``count`` units (n=10, seed 0, 64 documents a batch)."""
    return MapTask(
        index=index,
        units=units(count),
        work_dir=work_dir,
        ngram_size=10,
        hash_seed=0,
        batch_documents=64,
        buffer_entries=buffer_entries,
        options=SourceOptions(),
    )


def test_tasks_are_named_by_shard_and_partition_not_by_repr() -> None:
    shard = map_task(3, 5, "/work/f.memfree.work")
    assert len(repr(shard)) > 500
    assert describe_task(shard) == (
        "map task 3 (/corpus/part-0.jsonl[0:4096], /corpus/part-1.jsonl[0:4096] and 3 more units)"
    )
    assert describe_task(map_task(0, 1, "/w", buffer_entries=1)) == (
        "map task 0 (/corpus/part-0.jsonl[0:4096])"
    )
    partition = ReduceTask(
        index=5,
        low=0,
        high=1 << 60,
        runs=("/w/map/shard-00000/ngrams-0",) * 40,
        min_count=1,
        max_entries=1,
        out_dir="/w/r",
    )
    assert describe_task(partition) == "reduce task 5 (ngrams partition 5)"
    assert describe_task(ToyTask(7, "/tmp")) == "ToyTask 7"


# ------------------------------------------------------------------------------------------------
# A running cluster (`ray start --head`, elsewhere).


@dataclass(frozen=True)
class Head:
    address: str  # HOST:PORT as `ray start` recorded it
    ray_tmpdir: str  # its Ray temp directory (RAY_TMPDIR): where `auto` finds it
    cwd: Path  # where `ray start` ran: its workers' working directory


@pytest.fixture(scope="module")
def ray_head() -> Iterator[Head]:
    """`ray start --head --block` with one CPU, in a directory of its own; killed after."""
    import ray.cloudpickle

    for name in (__name__, "tests.bloom_builder.test_executors"):  # not importable there
        ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    # Short: Ray's socket paths live under it (108 bytes at most).
    root = Path(tempfile.mkdtemp(prefix="mfray", dir="/tmp"))
    head_cwd, ray_tmpdir = root / "head-cwd", root / "t"
    head_cwd.mkdir()
    ray_tmpdir.mkdir()
    port = closed_port()
    environment = {**os.environ, "RAY_TMPDIR": str(ray_tmpdir)}
    environment.pop("RAY_ADDRESS", None)
    command = [
        str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}",
        "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats", "--block",
    ]  # fmt: skip
    with open(root / "head.log", "wb") as log:
        head = subprocess.Popen(
            command, cwd=head_cwd, env=environment, stdout=log, stderr=log, start_new_session=True
        )
    try:
        recorded = ray_tmpdir / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 120
        while not recorded.exists() and head.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not recorded.exists():
            pytest.fail(f"`ray start --head` did not start: {(root / 'head.log').read_text()}")
        yield Head(recorded.read_text().strip(), str(ray_tmpdir), head_cwd)
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # SIGTERM takes Ray half a minute on 2 cores
        head.wait()
        shutil.rmtree(root, ignore_errors=True)


def at_head(monkeypatch: pytest.MonkeyPatch, head: Head) -> None:
    """This process sees the head as `ray start` on this node left it."""
    monkeypatch.setenv("RAY_TMPDIR", head.ray_tmpdir)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def where_am_i(task: ToyTask) -> dict[str, Any]:
    """Write the task's output where its relative path leads; report the worker's cwd."""
    task.output.write_text("done")
    return {"written": "done", "cwd": os.getcwd()}


def always_fail(task: Any) -> dict[str, Any]:
    raise ValueError("this shard cannot be read")


def test_without_an_address_the_build_starts_its_own_ray_beside_a_cluster(
    ray_head: Head, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cluster that `ray start` recorded on this node (live or stale, the same record) made
    `ray.init(num_cpus=...)` refuse; without --ray-address a build starts a Ray of its own."""
    import ray

    at_head(monkeypatch, ray_head)
    with RayExecutor(2) as executor:
        assert signal.getsignal(signal.SIGTERM) is _stop_on_sigterm
        assert ray.get_runtime_context().gcs_address != ray_head.address
        assert ray.cluster_resources()["CPU"] == 2  # ours: the head has one
        results = list(executor.run(where_am_i, [ToyTask(0, str(tmp_path))]))
    assert results[0][1]["written"] == "done"
    assert not ray.is_initialized()
    assert signal.getsignal(signal.SIGTERM) is not _stop_on_sigterm  # given back


def test_tasks_resolve_relative_paths_against_the_builds_directory(
    ray_head: Head, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cluster's workers run in the directory `ray start` ran in; a relative path in a task
    still means what it means to the build (the build itself passes absolute ones)."""
    import ray

    at_head(monkeypatch, ray_head)
    (tmp_path / "relative").mkdir()
    monkeypatch.chdir(tmp_path)
    with RayExecutor(1, address="auto", max_retries=0) as executor:
        [(_, result)] = list(executor.run(where_am_i, [ToyTask(0, "relative")]))
    assert not ray.is_initialized()  # a cluster joined is left on exit
    assert result["cwd"] == str(tmp_path)
    assert (tmp_path / "relative" / "task-0.out").read_text() == "done"
    assert (tmp_path / "relative" / "task-0.json").exists()
    assert list(ray_head.cwd.iterdir()) == []


def test_a_task_failing_on_a_cluster_is_named_by_its_shard(
    ray_head: Head, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    at_head(monkeypatch, ray_head)
    shard = map_task(3, 5, str(tmp_path))
    with (
        RayExecutor(1, address="auto", max_retries=0) as executor,
        pytest.raises(TaskFailed) as failed,
    ):
        list(executor.run(always_fail, [shard]))
    message = str(failed.value)
    assert message == (
        "map task 3 (/corpus/part-0.jsonl[0:4096], /corpus/part-1.jsonl[0:4096] and 3 more "
        "units) failed on all 1 attempts: ValueError: this shard cannot be read"
    )


def memfree_build(
    *arguments: str, cwd: Path, head: Head, **variables: str
) -> subprocess.Popen[str]:
    """`memfree build --unit word --n 4 ARGUMENTS` on this node of the head's cluster, with Ray's
    token authentication as a fresh shell has it (unset) unless ``variables`` set it."""
    environment = {**os.environ, "RAY_TMPDIR": head.ray_tmpdir}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", CONNECT_TIMEOUT_ENV):
        environment.pop(name, None)
    environment.update(variables)
    command = [sys.executable, "-m", "memfree.cli", "build", "--unit", "word", "--n", "4"]
    return subprocess.Popen(
        [*command, "--no-progress", "--json", *arguments],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_relative_output_and_work_dir_build_on_a_cluster_started_elsewhere(
    ray_head: Head, tmp_path: Path
) -> None:
    write_corpus(tmp_path / "corpus", 4)
    driver_cwd = tmp_path / "driver"
    driver_cwd.mkdir()
    build = memfree_build(
        "../corpus", "-o", "out/f.memfree", "--work-dir", "f.work", "--keep-work",
        "--shard-size", "1", "--executor", "ray", "--ray-address", "auto",
        cwd=driver_cwd, head=ray_head,
    )  # fmt: skip
    stdout, stderr = build.communicate(timeout=120)
    assert build.returncode == 0, stderr
    assert json.loads(stdout)["map_tasks"] == 4
    assert (driver_cwd / "out" / "f.memfree").exists()
    assert len(list((driver_cwd / "f.work" / "map").glob("shard-*.json"))) == 4
    assert list(ray_head.cwd.iterdir()) == []  # nothing written where `ray start` ran


def test_sigterm_stops_a_ray_build_without_a_stack_dump_and_the_rerun_resumes(
    ray_head: Head, tmp_path: Path
) -> None:
    write_corpus(tmp_path / "corpus", 24, words_per_file=2000)
    output = tmp_path / "f.memfree"
    arguments = (str(tmp_path / "corpus"), "-o", str(output), "--shard-size", "1")
    on_ray = (*arguments, "--executor", "ray", "--ray-address", ray_head.address)
    build = memfree_build(*on_ray, cwd=tmp_path, head=ray_head, RAY_AUTH_MODE="token")
    markers = tmp_path / "f.memfree.work" / "map"
    deadline = time.monotonic() + 120
    while len(list(markers.glob("shard-*.json"))) < 3 and time.monotonic() < deadline:
        assert build.poll() is None, build.communicate()[1]
        time.sleep(0.02)
    build.send_signal(signal.SIGTERM)
    _, stderr = build.communicate(timeout=60)
    finished_before = len(list(markers.glob("shard-*.json")))
    assert build.returncode == 128 + signal.SIGTERM, stderr
    assert "SIGTERM received" not in stderr and "PC: @" not in stderr, stderr
    assert "finished tasks are kept" in stderr
    assert 3 <= finished_before < 24 and not output.exists()

    rerun = memfree_build(*on_ray, cwd=tmp_path, head=ray_head, RAY_AUTH_MODE="token")
    stdout, stderr = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, stderr
    assert json.loads(stdout)["reused_tasks"] >= finished_before
    reference = tmp_path / "reference.memfree"
    settings = BuildSettings(unit="word", ngram_size=4, workers=1, shard_bytes=1)
    build_filter([str(tmp_path / "corpus")], reference, settings, progress=False)
    assert output.read_bytes() == reference.read_bytes()


def test_an_explicit_address_to_a_token_cluster_names_the_setting(
    ray_head: Head, tmp_path: Path
) -> None:
    """`ray start` turns token authentication on; Ray sends the token to an explicit address
    only with RAY_AUTH_MODE=token (`auto` finds it alone)."""
    write_corpus(tmp_path / "corpus", 1)
    arguments = (str(tmp_path / "corpus"), "-o", str(tmp_path / "f.memfree"))
    on_ray = (*arguments, "--executor", "ray", "--ray-address", ray_head.address)
    started = time.monotonic()
    build = memfree_build(*on_ray, cwd=tmp_path, head=ray_head, **{CONNECT_TIMEOUT_ENV: "2"})
    _, stderr = build.communicate(timeout=60)
    assert build.returncode == 2, stderr
    assert time.monotonic() - started < 20
    assert f"memfree: error: cannot join the Ray cluster at {ray_head.address}: the " in stderr
    assert "set RAY_AUTH_MODE=token" in stderr and "Traceback" not in stderr
