"""Bad input the builder's sources must name, not swallow: an output that is a corpus file met by
a walk, ``--ids-field`` on text and JSON lines, a Megatron ``.bin`` named on the command line,
hidden files, bad ids in Parquet and saved datasets, and damaged Megatron indexes."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.build import BuildError, build_filter
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import STDLIB, ProblemLog, SourceOptions, discover, read_unit
from bloom_builder.sources.megatron import write_megatron
from memfree import NgramFilter
from memfree.cli import main as cli_main
from tests.bloom_builder.test_build import settings_for, write_corpus
from tests.bloom_builder.test_pretokenized import corpus_texts, ids_of


def cli_build(
    capsys: pytest.CaptureFixture[str], tokenizer_dir: Path, *arguments: str
) -> tuple[int, str, str]:
    """Run ``memfree build ARGUMENTS`` with a tiny build's settings: (rc, stdout, stderr)."""
    options = ["--tokenizer", str(tokenizer_dir), "--n", "4", "--workers", "1", "--no-progress"]
    code = cli_main(["build", *arguments, *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def discovered(paths: list[Path | str], options: SourceOptions | None = None) -> tuple[Any, Any]:
    problems = ProblemLog()
    units = discover([str(path) for path in paths], options or SourceOptions(), problems)
    return units, problems


def read_everything(
    paths: list[Path | str], options: SourceOptions | None = None
) -> tuple[list[Any], ProblemLog]:
    options = options or SourceOptions()
    units, problems = discovered(paths, options)
    documents = [document for unit in units for document in read_unit(unit, options, problems)]
    return documents, problems


# ------------------------------------------------------------------------------------------------
# 1. An output that is a corpus file is refused however discovery reaches it


@pytest.mark.parametrize("how", ["directory", "glob", "symlink"])
def test_an_output_that_a_walk_or_glob_reaches_is_refused_even_with_force(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    corpus = tmp_path / "c"
    write_corpus(corpus, 2)
    victim = corpus / "doc000.txt"
    original = victim.read_bytes()
    source, output = str(corpus), victim
    if how == "glob":
        source = str(corpus / "*.txt")
    elif how == "symlink":  # -o a link to a corpus file, outside the corpus
        output = tmp_path / "out" / "link.memfree"
        output.parent.mkdir()
        output.symlink_to(victim)
    code, _, err = cli_build(capsys, tokenizer_dir, source, "-o", str(output), "--force")
    assert code == 2
    assert "is also an input" in err and "doc000.txt" in err and "Choose another -o" in err
    assert victim.read_bytes() == original


def test_a_previous_filter_and_sidecar_inside_the_corpus_are_skipped_silently(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, extra in [
        (".hidden-name.memfree", []),  # its lock file is a hidden name beside it
        ("f.bloom", ["--format", "pybloomfiltermmap3"]),
    ]:
        corpus = tmp_path / name.strip(".")
        write_corpus(corpus, 2)
        for _ in range(2):  # the first build writes it, the second meets it in the walk
            arguments = [str(corpus), "-o", str(corpus / name), "--keep-work", "--json", *extra]
            code, out, err = cli_build(capsys, tokenizer_dir, *arguments)
            assert code == 0, err
            summary = json.loads(out)
            assert summary["documents"] == 2 and summary["skipped"]["counts"] == {}


# ------------------------------------------------------------------------------------------------
# 7. --ids-field: JSON lines are read as ids, plain text is refused per file


def test_ids_field_reads_token_ids_from_jsonl_and_refuses_text_files(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any
) -> None:
    texts = corpus_texts()
    text_corpus = tmp_path / "text"
    text_corpus.mkdir()
    lines = [json.dumps({"text": text}) for text in texts]
    (text_corpus / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ids_corpus = tmp_path / "ids"
    ids_corpus.mkdir()
    bad = [
        {"input_ids": "1 2 3"},
        {"input_ids": [1, True, 3]},
        {"input_ids": [1, 2.0, 3]},
        {"input_ids": [1, None, 3]},
        {"text": "no ids here"},
        {"input_ids": [1, 2**70, 3]},
    ]
    lines = [json.dumps({"input_ids": ids, "text": "x"}) for ids in ids_of(tokenizer, texts)]
    lines[3:3] = [json.dumps(record) for record in bad]
    (ids_corpus / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (ids_corpus / "notes.txt").write_text("plain text holds no ids\n", encoding="utf-8")
    settings: dict[str, Any] = {"ngram_size": 4, "tokenizer": str(tokenizer_dir), "min_count": 2}
    from_text = build_filter(
        [str(text_corpus)],
        tmp_path / "t.memfree",
        BuildSettings(**settings, workers=1),
        progress=False,
    )
    from_ids = build_filter(
        [str(ids_corpus)],
        tmp_path / "i.memfree",
        BuildSettings(**settings, workers=1, ids_field="input_ids"),
        progress=False,
    )
    assert from_ids.documents == from_text.documents == len(texts)
    for name in ("section_table_xxh3", "num_ngrams"):  # the default layout: the index
        assert (
            NgramFilter.open(tmp_path / "i.memfree").metadata[name]
            == NgramFilter.open(tmp_path / "t.memfree").metadata[name]
        )
    counts, examples = from_ids.skipped["counts"], from_ids.skipped["examples"]
    assert counts == {"no ids": 1, "missing field": 2, "bad ids": 3, "ids out of range": 1}
    assert "notes.txt" in examples["no ids"][0] and "--ids-field" in examples["no ids"][0]
    jsonl = str(ids_corpus / "corpus.jsonl")
    assert examples["bad ids"] == [
        f"{jsonl}:5: position 1 holds a boolean, not an integer token id",
        f"{jsonl}:6: position 1 holds the number 2.0, not an integer token id",
        f"{jsonl}:7: position 1 holds null, not an integer token id",
    ]
    assert examples["missing field"] == [
        f"{jsonl}:4: field 'input_ids' holds a JSON string, not a list of token ids",
        f"{jsonl}:8: no field 'input_ids' (fields: text); set --ids-field",
    ]
    assert examples["ids out of range"][0].startswith(f"{jsonl}:9: id {2**70} at position 1")


# ------------------------------------------------------------------------------------------------
# 8. A Megatron .bin named on the command line is read through its .idx, once


def test_naming_a_megatron_bin_reads_the_dataset_once(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    write_megatron(str(directory / "data"), [[1, 2, 3], [4, 5], [6]])
    bin_file, idx_file = directory / "data.bin", directory / "data.idx"
    for paths in ([bin_file], [bin_file, idx_file], [idx_file, bin_file, directory]):
        documents, problems = read_everything(list(paths))
        assert [document.ids.tolist() for document in documents] == [[1, 2, 3], [4, 5], [6]]
        assert problems.total() == 0


# ------------------------------------------------------------------------------------------------
# 9. Hidden files are skipped and counted; the build's own paths and stdlib's caches are not


def test_hidden_files_and_folders_are_counted_not_read(tmp_path: Path, tokenizer_dir: Path) -> None:
    corpus = tmp_path / "c"
    write_corpus(corpus, 1)
    (corpus / ".notes.txt").write_text("hidden text", encoding="utf-8")
    (corpus / ".git").mkdir()
    (corpus / ".git" / "config").write_text("[core]", encoding="utf-8")
    (corpus / "sub").mkdir()
    (corpus / "sub" / ".cache.txt").write_text("hidden", encoding="utf-8")
    (corpus / "sub" / ".skipped.log").write_text("excluded", encoding="utf-8")
    output = corpus / "f.memfree"  # its lock, .f.memfree.lock, exists while discovery walks
    settings = settings_for(tokenizer_dir, exclude=("*.log",))
    summary = build_filter([str(corpus)], output, settings, progress=False)
    assert summary.documents == 1
    assert summary.skipped["counts"] == {"hidden": 3}
    examples = summary.skipped["examples"]["hidden"]
    assert [example.split(": ")[0] for example in examples] == [
        str(corpus / ".git"),
        str(corpus / ".notes.txt"),
        str(corpus / "sub" / ".cache.txt"),
    ]
    assert "hidden" in examples[0] and "name it" in examples[1]
    # Each is counted once, however many named folders hold it.
    _, problems = discovered([corpus, corpus / "sub", corpus], SourceOptions(exclude=("*.log",)))
    assert problems.counts == {"hidden": 3}
    # A hidden file named on the command line is read.
    units, problems = discovered([corpus / ".notes.txt"])
    assert len(units) == 1 and problems.total() == 0
    # The standard library's walk leaves out what is not Python source, hidden or not, unsaid.
    units, problems = discovered([STDLIB])
    assert len(units) > 500 and "hidden" not in problems.counts


# ------------------------------------------------------------------------------------------------
# 11. Null ids and uint64 ids past int64 skip the document, named, and the build goes on


def test_null_and_huge_ids_in_parquet_and_datasets_skip_only_their_document(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any
) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = ids_of(tokenizer, corpus_texts()[:3])
    parquet_dir = tmp_path / "p"
    parquet_dir.mkdir()
    column = pa.array([good[0], [1, None, 2], good[1], [1, 2**64 - 1, 2], good[2]],
                      type=pa.list_(pa.uint64()))  # fmt: skip
    pq.write_table(pa.table({"input_ids": column}), parquet_dir / "ids.parquet")
    dataset_dir = tmp_path / "d"
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64"))})
    rows = {"input_ids": [good[0], [None, 5], good[1]]}
    saved = datasets.Dataset.from_dict(rows, features=features)
    saved.set_format("numpy")  # kept by save_to_disk: the reader must still see lists of ints
    saved.save_to_disk(dataset_dir)
    settings = BuildSettings(
        ngram_size=4, tokenizer=str(tokenizer_dir), workers=1, ids_field="input_ids"
    )
    summary = build_filter(
        [str(parquet_dir), str(dataset_dir)], tmp_path / "f.memfree", settings, progress=False
    )
    assert summary.documents == 5
    assert summary.skipped["counts"] == {"bad ids": 2, "ids out of range": 1}
    where = str(parquet_dir / "ids.parquet")
    assert sorted(summary.skipped["examples"]["bad ids"]) == [
        f"{dataset_dir}:row 1: position 0 holds null, not an integer token id",
        f"{where}:row 1: position 1 holds null, not an integer token id",
    ]
    (huge,) = summary.skipped["examples"]["ids out of range"]
    assert huge.startswith(f"{where}:row 3: id {2**64 - 1} at position 1 is outside")


# ------------------------------------------------------------------------------------------------
# 17. Damaged Megatron datasets are named with what is wrong


HEADER_BYTES = 34


def megatron(directory: Path, documents: list[list[int]], dtype: type = np.uint16) -> Path:
    directory.mkdir(exist_ok=True)
    write_megatron(str(directory / "data"), documents, dtype=dtype)
    return directory / "data.idx"


def patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def only_problem(paths: list[Path]) -> tuple[str, str]:
    documents, problems = read_everything(list(paths))
    assert documents == []
    ((kind, (example,)),) = problems.examples.items()
    assert problems.counts == {kind: 1}
    return kind, example


def test_an_index_without_its_bin_names_the_missing_file(tmp_path: Path) -> None:
    idx = megatron(tmp_path / "m", [[1, 2, 3]])
    (tmp_path / "m" / "data.bin").unlink()
    for paths in ([idx], [idx.parent]):
        kind, example = only_problem(paths)
        assert kind == "missing"
        assert example == (
            f"{idx}: a Megatron index without its .bin: {tmp_path / 'm' / 'data.bin'} does not "
            "exist; put the .bin beside it"
        )


def test_a_dataset_with_no_documents_says_so(tmp_path: Path) -> None:
    idx = megatron(tmp_path / "m", [])
    kind, example = only_problem([idx.parent])
    assert kind == "empty" and example == f"{idx}: a Megatron dataset with no documents"


def test_a_pointer_past_int64_is_a_damaged_index_named(tmp_path: Path) -> None:
    idx = megatron(tmp_path / "m", [[1, 2, 3], [4, 5]])
    pointers_at = HEADER_BYTES + 4 * 2
    patch(idx, pointers_at + 8, struct.pack("<q", 2**63 - 2))
    kind, example = only_problem([idx])
    assert kind == "unreadable"
    assert example.startswith(f"{idx}: damaged .idx: sequence 1 ")
    assert "outside the 10-byte .bin" in example


@pytest.mark.parametrize(("code", "itemsize"), [(1, 1), (4, 4)])
def test_a_dtype_code_that_disagrees_with_the_data_is_refused(
    tmp_path: Path, code: int, itemsize: int
) -> None:
    for name, documents in [("many", [[1, 2, 3], [4, 5]]), ("one", [[1, 2, 3, 4]])]:
        idx = megatron(tmp_path / name, documents)  # uint16: 2 bytes an id
        patch(idx, 17, bytes([code]))
        kind, example = only_problem([idx])
        assert kind == "unreadable" and example.startswith(f"{idx}: damaged .idx: ")
        assert f"{itemsize}-byte" in example and "dtype code" in example


def test_a_damaged_range_found_while_reading_is_named(tmp_path: Path) -> None:
    """The reader checks the range it reads again (the files may change after discovery)."""
    idx = megatron(tmp_path / "m", [[1, 2, 3], [4, 5]])
    options = SourceOptions()
    units, problems = discovered([idx])
    patch(idx, HEADER_BYTES + 4 * 2 + 8, struct.pack("<q", 2**63 - 2))
    assert list(read_unit(units[0], options, problems)) == []
    (example,) = problems.examples["unreadable"]
    assert example.startswith(f"{idx}: damaged .idx: sequence 1 ")


def test_a_megatron_build_with_only_damaged_input_fails_with_the_reason(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    idx = megatron(tmp_path / "m", [[1, 2, 3, 4, 5]])
    patch(idx, 17, bytes([1]))
    with pytest.raises(BuildError, match=r"damaged \.idx"):
        build_filter(
            [str(idx.parent)], tmp_path / "f.memfree", settings_for(tokenizer_dir), progress=False
        )
    assert not os.path.exists(tmp_path / "f.memfree")
