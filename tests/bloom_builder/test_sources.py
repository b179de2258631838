"""Tests of bloom_builder.sources: discovery, streaming reads and every kind of bad input."""

from __future__ import annotations

import gzip
import json
import os
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bloom_builder.sources import (
    STDLIB,
    Document,
    ProblemLog,
    SourceOptions,
    WorkUnit,
    discover,
    read_unit,
    saved_datasets,
)

OPTIONS = SourceOptions()
CHARACTERS = st.characters(exclude_categories=["Cs"])  # any code point UTF-8 can encode


def read_all(
    paths: Sequence[str | Path], options: SourceOptions = OPTIONS
) -> tuple[list[WorkUnit], list[Document], ProblemLog]:
    """Discover ``paths`` and read every unit, as the pipeline does."""
    problems = ProblemLog()
    units = discover([str(path) for path in paths], options, problems)
    documents = [doc for unit in units for doc in read_unit(unit, options, problems)]
    return units, documents, problems


def texts(documents: list[Document]) -> list[str]:
    return [document.text for document in documents]


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def zstd_frames(data: bytes, frames: int = 1) -> list[bytes]:
    import zstandard

    step = -(-len(data) // frames)
    compressor = zstandard.ZstdCompressor()
    return [compressor.compress(data[i : i + step]) for i in range(0, len(data), step)]


def zstd_compress(data: bytes, frames: int = 1) -> bytes:
    return b"".join(zstd_frames(data, frames))


def hex_lines(count: int) -> list[str]:
    """Incompressible-ish lines, so that a truncated compressed file still holds many of them."""
    return [os.urandom(24).hex() for _ in range(count)]


# ------------------------------------------------------------------------------------------------
# Settings and small structures


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"text_field": ""}, "text_field"),
        ({"segment_bytes": 1023}, "segment_bytes"),
        ({"split_bytes": 0}, "split_bytes"),
        ({"segment_bytes": True}, "segment_bytes"),
        ({"include": "*.txt"}, "include"),
        ({"exclude": ("*.txt", 3)}, "exclude"),
    ],
)
def test_bad_options_raise_naming_the_option(arguments: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SourceOptions(**arguments)  # type: ignore[arg-type]


def test_options_accept_pattern_lists_as_tuples() -> None:
    options = SourceOptions(include=["*.txt"])  # type: ignore[arg-type]
    assert options.include == ("*.txt",)
    assert hash(options) == hash(SourceOptions(include=("*.txt",)))


def test_discover_rejects_a_bare_string(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="list of paths"):
        discover(str(tmp_path), OPTIONS, ProblemLog())


@pytest.mark.parametrize(
    "arguments",
    [
        {"kind": "csv", "compression": ""},
        {"kind": "text", "compression": "bz2"},
        {"kind": "jsonl", "compression": "gzip", "start": 10},
        {"kind": "parquet", "compression": "zstd"},
        {"kind": "jsonl", "compression": "", "start": 10, "stop": 5},
    ],
)
def test_work_unit_rejects_what_no_reader_can_do(arguments: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="bad work unit"):
        WorkUnit(path="/x", **arguments)  # type: ignore[arg-type]


def test_describe_is_short_and_names_the_range() -> None:
    assert (
        WorkUnit("/d/data.jsonl", "jsonl", "", 0, 67108864).describe() == "data.jsonl[0:67108864]"
    )
    assert WorkUnit("/d/data.jsonl", "jsonl", "", 64).describe() == "data.jsonl[64:]"
    assert WorkUnit("/d/a.txt.gz", "text", "gzip").describe() == "a.txt.gz"
    assert WorkUnit("/d/t.parquet", "parquet", "", 3, 4).describe() == "t.parquet[row group 3]"
    assert WorkUnit("/d/ds", "dataset", "", 0, 10).describe() == "ds[rows 0:10]"


def test_problem_log_caps_examples_and_merges_in_order() -> None:
    first, second = ProblemLog(), ProblemLog()
    for index in range(5):
        first.record("empty", f"a{index}", "blank")
    assert first.counts == {"empty": 5}
    assert first.examples == {"empty": ["a0: blank", "a1: blank", "a2: blank"]}

    left, right = ProblemLog(), ProblemLog()
    left.record("missing", "l0", "gone")
    left.record("missing", "l1", "gone")
    for index in range(3):
        right.record("missing", f"r{index}", "gone")
    right.record("binary", "r.bin", "NUL")
    left.merge(right)
    assert left.counts == {"missing": 5, "binary": 1}
    assert left.examples["missing"] == ["l0: gone", "l1: gone", "r0: gone"]
    assert left.examples["binary"] == ["r.bin: NUL"]
    assert left.total() == 6
    second.merge(left)
    assert second == left


def test_problem_log_round_trips_through_json() -> None:
    log = ProblemLog()
    log.record("not utf-8", "x.txt", "invalid UTF-8 at byte 3")
    log.record("missing", "y", "no such file or directory")
    data = json.loads(json.dumps(log.to_dict()))
    assert list(data) == ["counts", "examples"]
    assert ProblemLog.from_dict(data) == log
    with pytest.raises(ValueError, match="counts"):
        ProblemLog.from_dict({"examples": {}})


# ------------------------------------------------------------------------------------------------
# Each kind


def test_text_file_is_one_document(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("héllo\nworld\n", encoding="utf-8")
    units, documents, problems = read_all([path])
    assert units == [WorkUnit(str(path), "text", "", size_bytes=len("héllo\nworld\n".encode()))]
    assert documents == [Document("héllo\nworld\n", continues=False)]
    assert problems.total() == 0


def test_jsonl_reads_the_field_and_records_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    lines = [
        json.dumps({"text": "first", "id": 1}),
        "",
        "{not json",
        json.dumps({"body": "no text field"}),
        json.dumps({"text": 7}),
        json.dumps(["an", "array"]),
        json.dumps({"text": "   "}),
        json.dumps({"text": "last"}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    units, documents, problems = read_all([path])
    assert [unit.kind for unit in units] == ["jsonl"]
    assert texts(documents) == ["first", "last"]
    assert problems.counts == {"malformed json": 1, "missing field": 3, "empty": 1}
    assert problems.examples["malformed json"][0].startswith(f"{path}:3: ")
    assert f"{path}:4: no field 'text' (fields: body)" in problems.examples["missing field"][0]
    assert "number" in problems.examples["missing field"][1]
    assert "array" in problems.examples["missing field"][2]


def test_text_field_option_picks_another_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.ndjson", [{"body": "x"}, {"body": "y"}])
    (tmp_path / "e.json").write_text('{"body": "z"}', encoding="utf-8")  # no final newline
    units, documents, problems = read_all([tmp_path], SourceOptions(text_field="body"))
    assert [unit.kind for unit in units] == ["jsonl", "jsonl"]
    assert units[0].path == str(path)
    assert texts(documents) == ["x", "y", "z"]
    assert problems.total() == 0


def test_parquet_is_one_unit_per_row_group(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    table = pa.table({"id": [0, 1, 2, 3, 4], "text": ["a", "b", None, "d", "e"]})
    pq.write_table(table, path, row_group_size=2)
    units, documents, problems = read_all([path])
    assert [(unit.kind, unit.start, unit.stop) for unit in units] == [
        ("parquet", 0, 1),
        ("parquet", 1, 2),
        ("parquet", 2, 3),
    ]
    assert all(unit.size_bytes > 0 for unit in units)
    assert texts(documents) == ["a", "b", "d", "e"]
    assert problems.counts == {"empty": 1}
    assert problems.examples["empty"] == [f"{path}:row 2: null value"]


def test_parquet_without_the_column_is_recorded_and_others_still_read(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "other.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    pq.write_table(pa.table({"text": ["kept"]}), tmp_path / "good.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 this is not parquet")
    _, documents, problems = read_all([tmp_path])
    assert texts(documents) == ["kept"]
    assert problems.counts == {"missing column": 2, "unreadable": 1}
    missing = sorted(problems.examples["missing column"])
    assert "ints.parquet" in missing[0] and "int64" in missing[0]
    assert "other.parquet" in missing[1] and "columns: body" in missing[1]
    assert "junk.parquet" in problems.examples["unreadable"][0]
    # A unit made before the file changed records the problem at read time instead.
    problems = ProblemLog()
    stale = WorkUnit(str(tmp_path / "other.parquet"), "parquet", "", 0, 1)
    assert list(read_unit(stale, OPTIONS, problems)) == []
    assert problems.counts == {"missing column": 1}


def test_gzip_and_zstd_are_streamed(tmp_path: Path) -> None:
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"gzip text\n"))
    lines = b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n" for i in range(50))
    (tmp_path / "b.jsonl.zst").write_bytes(zstd_compress(lines, frames=3))
    (tmp_path / "c.zstd").write_bytes(zstd_compress(b"zstd text"))
    units, documents, problems = read_all([tmp_path])
    assert [(unit.kind, unit.compression) for unit in units] == [
        ("text", "gzip"),
        ("jsonl", "zstd"),
        ("text", "zstd"),
    ]
    assert texts(documents) == ["gzip text\n", *[f"doc {i}" for i in range(50)], "zstd text"]
    assert problems.total() == 0


def test_corrupt_compressed_streams_keep_documents_already_read(tmp_path: Path) -> None:
    lines = hex_lines(20_000)  # several 128 KiB zstd blocks survive the cut
    data = "".join(json.dumps({"text": line}) + "\n" for line in lines).encode()
    packed = gzip.compress(data)
    (tmp_path / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    (tmp_path / "junk.txt.gz").write_bytes(b"this is not gzip at all")
    packed = zstd_compress(data)
    (tmp_path / "cut.jsonl.zst").write_bytes(packed[: len(packed) // 2])
    frames = zstd_frames(data, frames=4)
    frames[2] = bytes(8) + frames[2][8:]  # a damaged frame header
    (tmp_path / "damaged.jsonl.zst").write_bytes(b"".join(frames))
    units, _, _ = read_all([tmp_path])
    for unit in units:
        problems = ProblemLog()
        got = texts(list(read_unit(unit, OPTIONS, problems)))
        assert problems.counts == {"unreadable": 1}, unit
        assert os.path.basename(unit.path) in problems.examples["unreadable"][0]
        if unit.path.endswith(".jsonl.gz") or unit.path.endswith(".jsonl.zst"):
            assert 0 < len(got) < len(lines), unit
            assert got == lines[: len(got)]
    cut_zstd = [unit for unit in units if unit.path.endswith("cut.jsonl.zst")]
    problems = ProblemLog()
    list(read_unit(cut_zstd[0], OPTIONS, problems))
    assert "truncated" in problems.examples["unreadable"][0]


def test_dataset_saved_to_disk_is_read_in_row_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    monkeypatch.setattr(saved_datasets, "ROWS_PER_UNIT", 2)
    rows = ["zero", "one", None, "three", "four"]
    datasets.Dataset.from_dict({"text": rows, "id": list(range(5))}).save_to_disk(tmp_path / "ds")
    (tmp_path / "plain.txt").write_text("plain", encoding="utf-8")
    units, documents, problems = read_all([tmp_path])
    dataset_units = [unit for unit in units if unit.kind == "dataset"]
    assert [(unit.path, unit.start, unit.stop) for unit in dataset_units] == [
        (str(tmp_path / "ds"), 0, 2),
        (str(tmp_path / "ds"), 2, 4),
        (str(tmp_path / "ds"), 4, 5),
    ]
    assert texts(documents) == ["zero", "one", "three", "four", "plain"]
    assert problems.counts == {"empty": 1}
    assert problems.examples["empty"] == [f"{tmp_path / 'ds'}:row 2: null value"]


def test_dataset_dict_becomes_units_per_split(tmp_path: Path) -> None:
    import datasets

    splits = {
        "train": datasets.Dataset.from_dict({"text": ["t1", "t2"]}),
        "test": datasets.Dataset.from_dict({"text": ["e1"]}),
    }
    datasets.DatasetDict(splits).save_to_disk(tmp_path / "dd")
    units, documents, problems = read_all([tmp_path / "dd"])
    assert [os.path.relpath(unit.path, tmp_path) for unit in units] == ["dd/test", "dd/train"]
    assert texts(documents) == ["e1", "t1", "t2"]
    assert problems.total() == 0


def test_dataset_without_the_column_names_its_columns(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"content": ["x"], "id": [1]}).save_to_disk(tmp_path / "ds")
    units, _, problems = read_all([tmp_path / "ds"])
    assert units == []
    assert problems.counts == {"missing column": 1}
    assert "ds: no column 'text'; columns: content, id" in problems.examples["missing column"][0]


# ------------------------------------------------------------------------------------------------
# Discovery: directories, globs, selection, the standard library


def make_tree(root: Path) -> None:
    for relative in [
        "b.txt",
        "a.txt",
        "sub/c.txt",
        "sub/deeper/d.jsonl",
        "sub/skip_me.txt",
        ".hidden.txt",
        ".git/config.txt",
    ]:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".jsonl":
            write_jsonl(path, [{"text": relative}])
        else:
            path.write_text(relative, encoding="utf-8")


def relative_paths(units: list[WorkUnit], root: Path) -> list[str]:
    return [os.path.relpath(unit.path, root) for unit in units]


def test_directory_walk_is_sorted_skips_hidden_and_deduplicates(tmp_path: Path) -> None:
    make_tree(tmp_path)
    os.symlink(tmp_path / "a.txt", tmp_path / "sub" / "z_link.txt")
    units, documents, problems = read_all([tmp_path / "sub", tmp_path, tmp_path / "a.txt"])
    assert relative_paths(units, tmp_path) == [
        "a.txt",
        "b.txt",
        "sub/c.txt",
        "sub/deeper/d.jsonl",
        "sub/skip_me.txt",
    ]
    assert texts(documents)[0] == "a.txt"
    assert problems.counts == {"hidden": 2}  # .git/ and .hidden.txt: skipped, but said
    reversed_units, _, _ = read_all([tmp_path / "a.txt", tmp_path, tmp_path / "sub"])
    assert reversed_units == units


def test_globs_expand_recursively_and_unmatched_ones_are_missing(tmp_path: Path) -> None:
    make_tree(tmp_path)
    patterns = [tmp_path / "**" / "*.txt", tmp_path / "*.nothing", tmp_path / "no_such_file"]
    units, _, problems = read_all(patterns)
    assert relative_paths(units, tmp_path) == ["a.txt", "b.txt", "sub/c.txt", "sub/skip_me.txt"]
    assert problems.counts == {"missing": 2}
    assert problems.examples["missing"] == [
        f"{tmp_path / '*.nothing'}: the glob pattern matched nothing",
        f"{tmp_path / 'no_such_file'}: no such file or directory",
    ]


@pytest.mark.parametrize(
    ("include", "exclude", "expected"),
    [
        (("*.txt",), (), ["a.txt", "b.txt", "sub/c.txt", "sub/skip_me.txt"]),
        (("*.txt",), ("skip*",), ["a.txt", "b.txt", "sub/c.txt"]),
        (("sub/*",), ("*.jsonl",), ["sub/c.txt", "sub/skip_me.txt"]),
        ((), ("sub/*",), ["a.txt", "b.txt"]),
        (("d.jsonl",), (), ["sub/deeper/d.jsonl"]),
    ],
)
def test_include_and_exclude(
    tmp_path: Path, include: tuple[str, ...], exclude: tuple[str, ...], expected: list[str]
) -> None:
    make_tree(tmp_path)
    options = SourceOptions(include=include, exclude=exclude)
    units, _, _ = read_all([tmp_path], options)
    assert relative_paths(units, tmp_path) == expected


def test_patterns_select_walked_and_globbed_files_but_never_a_named_one(tmp_path: Path) -> None:
    make_tree(tmp_path)
    options = SourceOptions(include=("*.jsonl",), exclude=("b.*",))
    named = [tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "*.txt", tmp_path / "sub"]
    units, _, _ = read_all(named, options)
    assert relative_paths(units, tmp_path) == ["a.txt", "b.txt", "sub/deeper/d.jsonl"]
    units, _, _ = read_all([tmp_path / "*.txt", tmp_path / "sub"], options)
    assert relative_paths(units, tmp_path) == ["sub/deeper/d.jsonl"]


def test_stdlib_source_is_the_standard_library_python_files() -> None:
    problems = ProblemLog()
    units = discover([STDLIB], OPTIONS, problems)
    root = sysconfig.get_paths()["stdlib"]
    assert len(units) > 500
    assert all(unit.path.endswith(".py") and unit.kind == "text" for unit in units)
    assert not any("site-packages" in unit.path or "dist-packages" in unit.path for unit in units)
    assert all(unit.path.startswith(root) for unit in units)
    assert [unit.path for unit in units] == sorted(unit.path for unit in units)
    os_module = [unit for unit in units if unit.path == os.path.join(root, "os.py")]
    (document,) = read_unit(os_module[0], OPTIONS, problems)
    assert "def makedirs(" in document.text


# ------------------------------------------------------------------------------------------------
# Large files: text segments and JSONL byte ranges


def test_large_text_is_read_in_line_aligned_segments(tmp_path: Path) -> None:
    lines = [f"line {i} {'é' * (i % 37)} {'x' * (i % 53)}\n" for i in range(400)]
    text = "".join(lines)
    path = tmp_path / "big.txt"
    path.write_text(text, encoding="utf-8")
    options = SourceOptions(segment_bytes=1024)
    _, documents, problems = read_all([path], options)
    assert len(documents) > 10
    assert "".join(texts(documents)) == text
    assert [doc.continues for doc in documents] == [True] * (len(documents) - 1) + [False]
    assert all(0 < len(doc.text.encode()) <= 1024 for doc in documents)
    assert all(doc.text.endswith("\n") for doc in documents)
    assert problems.total() == 0


def test_a_file_of_exactly_segment_bytes_is_one_document(tmp_path: Path) -> None:
    path = tmp_path / "exact.txt"
    path.write_bytes(b"a\n" * 512)
    _, documents, _ = read_all([path], SourceOptions(segment_bytes=1024))
    assert documents == [Document("a\n" * 512)]


def test_a_huge_line_is_cut_at_spaces_or_character_boundaries(tmp_path: Path) -> None:
    text = "€" * 1500 + " " + "word " * 400 + "€" * 2000
    path = tmp_path / "one_line.txt"
    path.write_text(text, encoding="utf-8")
    _, documents, problems = read_all([path], SourceOptions(segment_bytes=1024))
    assert "".join(texts(documents)) == text
    assert all(len(doc.text.encode()) <= 1024 for doc in documents)
    assert [doc.continues for doc in documents][-1] is False
    assert problems.total() == 0


@settings(max_examples=40, deadline=None)
@given(
    text=st.text(CHARACTERS, min_size=1, max_size=3000),
    segment_bytes=st.integers(1024, 2048),
)
def test_segments_concatenate_to_the_file(text: str, segment_bytes: int) -> None:
    text = "x" + text.replace("\0", "")  # no NUL (binary); a visible start is never dropped
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "t.txt"
        path.write_bytes(text.encode("utf-8"))
        _, documents, problems = read_all([path], SourceOptions(segment_bytes=segment_bytes))
    assert "".join(texts(documents)) == text
    assert [doc.continues for doc in documents] == [True] * (len(documents) - 1) + [False]
    assert problems.total() == 0


def test_segmented_text_cut_by_bad_utf8_ends_cleanly(tmp_path: Path) -> None:
    good = "".join(f"good line {i}\n" for i in range(300)).encode()
    path = tmp_path / "late_error.txt"
    path.write_bytes(good + b"bad \xff byte\n")
    _, documents, problems = read_all([path], SourceOptions(segment_bytes=1024))
    assert documents and documents[-1].continues is False
    assert good.decode().startswith("".join(texts(documents)))
    assert problems.examples["not utf-8"] == [
        f"{path}: invalid UTF-8 at byte {len(good) + 4}",
    ]


jsonl_texts = st.lists(
    st.text(CHARACTERS, min_size=1, max_size=120).filter(str.strip),
    min_size=1,
    max_size=80,
)


def write_texts(path: Path, items: list[str], blank_every: int) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for index, item in enumerate(items):
            ensure_ascii = index % 2 == 0  # mix escaped and raw multibyte UTF-8
            out.write(json.dumps({"text": item}, ensure_ascii=ensure_ascii) + "\n")
            if blank_every and index % blank_every == 0:
                out.write("\n")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(items=jsonl_texts, split_bytes=st.integers(1024, 3000), blank_every=st.integers(0, 5))
def test_split_jsonl_reads_every_line_once(
    items: list[str], split_bytes: int, blank_every: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "data.jsonl"
        write_texts(path, items, blank_every)
        size = path.stat().st_size
        units, documents, problems = read_all([path], SourceOptions(split_bytes=split_bytes))
        _, whole, _ = read_all([path])
    assert len(units) == -(-size // split_bytes)
    assert sum(unit.size_bytes for unit in units) == size
    assert texts(documents) == texts(whole) == items
    assert problems.total() == 0


@settings(max_examples=60, deadline=None)
@given(
    items=jsonl_texts, cuts=st.lists(st.floats(0, 1), max_size=12), blank_every=st.integers(0, 3)
)
def test_any_byte_ranges_read_every_line_once(
    items: list[str], cuts: list[float], blank_every: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "data.jsonl"
        write_texts(path, items, blank_every)
        size = path.stat().st_size
        bounds = sorted({0, *(int(cut * size) for cut in cuts)})
        stops = [*bounds[1:], -1]
        units = [WorkUnit(str(path), "jsonl", "", a, b) for a, b in zip(bounds, stops, strict=True)]
        problems = ProblemLog()
        got = [doc.text for unit in units for doc in read_unit(unit, OPTIONS, problems)]
    assert got == items
    assert problems.total() == 0


def test_problems_in_a_later_byte_range_carry_the_true_line_number(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    lines = [json.dumps({"text": f"document number {i}"}) for i in range(200)]
    lines[150] = "{broken"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    units, documents, problems = read_all([path], SourceOptions(split_bytes=1024))
    assert len(units) > 3
    assert len(documents) == 199
    assert problems.counts == {"malformed json": 1}
    assert problems.examples["malformed json"][0].startswith(f"{path}:151: ")


# ------------------------------------------------------------------------------------------------
# Bad inputs mixed with good ones


def test_every_bad_input_is_counted_and_good_documents_still_come(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("good text\n", encoding="utf-8")
    (tmp_path / "image.txt").write_bytes(b"GIF89a\x00\x01\x02 binary")
    (tmp_path / "latin1.txt").write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    (tmp_path / "blank.txt").write_text("  \n\t\n", encoding="utf-8")
    (tmp_path / "zero.txt").write_bytes(b"")
    (tmp_path / "bad.txt.gz").write_bytes(b"\x1f\x8b but not really gzip")
    write_jsonl(tmp_path / "mixed.jsonl", [{"text": "json good"}, {"title": "no text"}])
    with open(tmp_path / "mixed.jsonl", "a", encoding="utf-8") as out:
        out.write("{oops\n")
    paths = [tmp_path, tmp_path / "gone.txt", tmp_path / "*.missing"]
    _, documents, problems = read_all(paths)
    assert texts(documents) == ["good text\n", "json good"]
    assert problems.counts == {
        "binary": 1,
        "empty": 2,
        "malformed json": 1,
        "missing": 2,
        "missing field": 1,
        "not utf-8": 1,
        "unreadable": 1,
    }
    examples = problems.examples
    assert examples["binary"] == [
        f"{tmp_path / 'image.txt'}: NUL byte at offset 6: not a text file"
    ]
    assert examples["not utf-8"] == [f"{tmp_path / 'latin1.txt'}: invalid UTF-8 at byte 6"]
    assert [example.split(":")[0] for example in examples["empty"]] == [
        str(tmp_path / "blank.txt"),
        str(tmp_path / "zero.txt"),
    ]
    assert examples["malformed json"][0].startswith(f"{tmp_path / 'mixed.jsonl'}:3: ")
    assert examples["missing field"][0].startswith(f"{tmp_path / 'mixed.jsonl'}:2: ")
    assert examples["unreadable"][0].startswith(f"{tmp_path / 'bad.txt.gz'}: ")
    assert examples["missing"][0] == f"{tmp_path / 'gone.txt'}: no such file or directory"


def test_an_unreadable_unit_is_recorded_not_raised(tmp_path: Path) -> None:
    problems = ProblemLog()
    for kind in ("text", "jsonl"):
        assert list(read_unit(WorkUnit(str(tmp_path), kind, ""), OPTIONS, problems)) == []
    assert problems.counts == {"unreadable": 2}
    assert "IsADirectoryError" in problems.examples["unreadable"][0]


def test_a_leading_byte_order_mark_is_not_text(tmp_path: Path) -> None:
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfhello")
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "hi"}\n')
    _, documents, problems = read_all([tmp_path])
    assert texts(documents) == ["hi", "hello"]
    assert problems.total() == 0
