"""Map and reduce results are frozen dataclasses that become JSON only in their task's marker, and
the markers keep the keys and values they always had: a work directory an earlier build left
resumes under this code, and the markers this code writes read the same."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bloom_builder.build import build_filter
from bloom_builder.counting import FileRecord, file_digest
from bloom_builder.executors.markers import record_done, reusable_result
from bloom_builder.map import MapResult, MapStats, MapTask
from bloom_builder.reduce import ReduceResult, ReduceTask
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit
from tests.bloom_builder.test_build import write_corpus

# Markers as builds before the typed results wrote them (`json.dumps(..., sort_keys=True)`),
# paths shortened.
MAP_MARKER = (
    '{"files": {"/w/map/shard-00000/ngrams/run-00000.keys": [336, "a9d330e3141a473e", '
    '1795472888832303364, 1795472888832303364], "/w/map/shard-00000/ngrams/run-00000.repeats": '
    '[672, "ee4c022f19303f99", 1795472888887838291, 1795472888887838291]}, "prefix_runs": [], '
    '"reused": false, "runs": ["/w/map/shard-00000/ngrams/run-00000"], "stats": '
    '{"cpu_seconds_hashing": 0.05336239799999998, "documents": 2, "input_bytes": 4172, '
    '"ngrams": 796, "problems": {"counts": {"binary": 1}, "examples": {"binary": '
    '["/c/bad.bin: NUL byte at offset 0: not a text file"]}}, "seconds_hashing": '
    '0.11119611200047075, "seconds_reading": 0.0031683510005677817, "seconds_tokenizing": '
    '0.3452031859997078, "tokens": 800}}'
)
REDUCE_MARKER = (
    '{"cpu_seconds": 0.004717576000000001, "distinct": 8, "kept": 8, "kept_file": [64, '
    '"b85abdf5a61ab324", 1795472888982365860, 1795472888983260807], "reused": false, '
    '"seconds": 0.006188047998875845}'
)


@pytest.mark.parametrize(
    ("text", "result_type"), [(MAP_MARKER, MapResult), (REDUCE_MARKER, ReduceResult)]
)
def test_an_earlier_marker_reads_into_a_typed_result_and_back_unchanged(
    text: str, result_type: type[MapResult] | type[ReduceResult]
) -> None:
    result = result_type.from_json(json.loads(text))
    assert dataclasses.is_dataclass(result) and not result.reused
    assert json.dumps(result.to_json(), sort_keys=True) == text
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reused = True  # type: ignore[misc]


def test_the_typed_results_hold_what_the_marker_said() -> None:
    mapped = MapResult.from_json(json.loads(MAP_MARKER))
    assert mapped.stats.documents == 2 and mapped.stats.cpu_seconds_hashing == 0.05336239799999998
    assert mapped.stats.problems.counts == {"binary": 1}
    assert mapped.runs == ("/w/map/shard-00000/ngrams/run-00000",) and mapped.prefix_runs == ()
    keys = mapped.files["/w/map/shard-00000/ngrams/run-00000.keys"]
    assert keys == FileRecord(336, "a9d330e3141a473e", (1795472888832303364,) * 2)
    reduced = ReduceResult.from_json(json.loads(REDUCE_MARKER))
    assert (reduced.distinct, reduced.kept, reduced.kept_file.size_bytes) == (8, 8, 64)
    # A record of size and xxh3 alone (no times: the file is read and hashed) stays so.
    assert FileRecord.from_json([64, "b85abdf5a61ab324"]).to_json() == [64, "b85abdf5a61ab324"]


def test_map_stats_add_up_in_order_and_merge_their_problems() -> None:
    first, second = ProblemLog(), ProblemLog()
    first.record("binary", "a", "NUL byte")
    second.record("binary", "b", "NUL byte")
    second.record("missing", "c", "no such file")
    total = MapStats(documents=1, tokens=5, seconds_reading=0.5, problems=first) + MapStats(
        documents=2, tokens=7, seconds_reading=0.25, problems=second
    )
    assert (total.documents, total.tokens, total.seconds_reading) == (3, 12, 0.75)
    assert total.problems.counts == {"binary": 2, "missing": 1}
    assert total.problems.examples["binary"] == ["a: NUL byte", "b: NUL byte"]
    assert first.counts == {"binary": 1}  # the terms are left as they were
    assert MapStats.from_json(total.to_json()) == total


def test_tasks_are_built_from_keywords_only() -> None:
    with pytest.raises(TypeError):
        MapTask(0, (), "/w", 10, 0, 64, 1 << 16, SourceOptions())  # type: ignore[misc]
    with pytest.raises(TypeError):
        ReduceTask(0, 0, 1, (), 1, 1, "/w/r")  # type: ignore[misc]


def test_a_marker_left_by_an_earlier_build_is_reused_as_a_typed_result(tmp_path: Path) -> None:
    """A map task's marker written in the earlier form (a dict without types) over intact run
    files: the task is not run again, and its result comes back typed and marked reused."""
    task = MapTask(
        index=0,
        units=(WorkUnit(str(tmp_path / "a.txt"), "text", "", size_bytes=10),),
        work_dir=str(tmp_path),
        ngram_size=4,
        hash_seed=0,
        batch_documents=64,
        buffer_entries=1 << 16,
        options=SourceOptions(),
        prefixes=False,
    )
    stem = task.run_dir / "ngrams" / "run-00000"
    stem.parent.mkdir(parents=True)
    files = {}
    for suffix, data in ((".keys", bytes(range(16))), (".repeats", b"")):
        path = Path(str(stem) + suffix)
        path.write_bytes(data)
        size, digest = file_digest(path)
        files[str(path)] = [size, digest, path.stat().st_mtime_ns, path.stat().st_ctime_ns]
    stats = {**dict.fromkeys(("documents", "tokens", "ngrams", "input_bytes"), 1)}
    stats |= dict.fromkeys(("seconds_reading", "seconds_tokenizing"), 0.5)
    stats |= dict.fromkeys(("seconds_hashing", "cpu_seconds_hashing"), 0.25)
    stats["problems"] = {"counts": {}, "examples": {}}
    payload = {"stats": stats, "runs": [str(stem)], "prefix_runs": [], "files": files}
    task.marker.write_text(json.dumps({**payload, "reused": False}, sort_keys=True))

    reused = reusable_result(task)
    assert isinstance(reused, MapResult) and reused.reused
    assert reused.stats.documents == 1 and reused.stats.seconds_hashing == 0.25
    recorded = record_done(task, dataclasses.replace(reused, reused=True))
    assert not recorded.reused  # a result recorded now is not a reused one
    assert json.loads(task.marker.read_text()) == {**payload, "reused": False}
    Path(str(stem) + ".keys").write_bytes(bytes(16))  # same size, other bytes
    assert reusable_result(task) is None


def test_the_markers_written_now_have_the_keys_they_always_had(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    write_corpus(tmp_path / "corpus", 3)
    output = tmp_path / "f.memfree"
    settings = BuildSettings(ngram_size=4, tokenizer=str(tokenizer_dir), workers=1)
    first = build_filter(
        [str(tmp_path / "corpus")], output, settings, keep_work=True, progress=False
    )
    expected = output.read_bytes()
    work = tmp_path / "f.memfree.work"
    stats_keys = {
        "documents", "tokens", "ngrams", "input_bytes", "seconds_reading", "seconds_tokenizing",
        "seconds_hashing", "cpu_seconds_hashing", "problems",
    }  # fmt: skip
    for marker in sorted((work / "map").glob("shard-*.json")):
        payload = json.loads(marker.read_text())
        assert set(payload) == {"stats", "runs", "prefix_runs", "files", "reused"}
        assert set(payload["stats"]) == stats_keys and payload["reused"] is False
        assert all(len(entry) == 4 for entry in payload["files"].values())
    for marker in sorted(work.glob("reduce-min1/*.json")):
        payload = json.loads(marker.read_text())
        # The index (the default layout) also counts the kept keys' top bits ("histogram").
        assert set(payload) == {
            "distinct",
            "kept",
            "kept_file",
            "seconds",
            "cpu_seconds",
            "reused",
            "histogram",
        }
    output.unlink()
    again = build_filter([str(tmp_path / "corpus")], output, settings, progress=False)
    assert again.reused_tasks == first.map_tasks > 0
    assert output.read_bytes() == expected
