"""Pre-tokenized corpora: a token-id column (Parquet, a saved ``datasets`` directory) and
Megatron indexed datasets (.bin + .idx) give the same filter bits as the same corpus as text;
ids outside the tokenizer's vocabulary are refused with the file and the position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bloom_builder.build import BuildError, build_filter
from bloom_builder.encode import _in_range
from bloom_builder.settings import BuildSettings
from bloom_builder.sources.megatron import read_index, write_megatron
from memfree import NgramFilter
from memfree.cli import main as cli_main

WORDS = ["alpha", "beta", "gamma", "delta", "return", "self", "def", "class", "import", "total"]


def corpus_texts(count: int = 12, seed: int = 3) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(20, 200)))) for _ in range(count)]
    texts[4] += " <|endoftext|> def add(a, b): return a + b"  # a special token inside a document
    texts[7] = texts[2]  # a repeated document: --min-count 2 keeps its n-grams
    return texts


def ids_of(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def bits(path: Path) -> tuple[str, str | None, int]:
    """What decides a filter's answers: its bits (Bloom layout) or its sections (the index)."""
    metadata = NgramFilter.open(path).metadata
    return (
        metadata.get("bits_xxh3") or metadata["section_table_xxh3"],
        (metadata.get("prefix") or {}).get("bits_xxh3"),
        metadata["num_ngrams"],
    )


def build(tmp_path: Path, corpus: Path, tokenizer_dir: Path, name: str, **overrides: Any) -> Path:
    values: dict[str, Any] = {
        "ngram_size": 4,
        "tokenizer": str(tokenizer_dir),
        "workers": 1,
        "min_count": 2,
    }
    values.update(overrides)
    output = tmp_path / f"{name}.memfree"
    build_filter([str(corpus)], output, BuildSettings(**values), progress=False)
    return output


@pytest.fixture
def text_corpus(tmp_path: Path) -> Path:
    directory = tmp_path / "text"
    directory.mkdir()
    lines = [json.dumps({"text": text}) for text in corpus_texts()]
    (directory / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def test_a_parquet_ids_column_gives_the_text_builds_bits(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, text_corpus: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = corpus_texts()
    directory = tmp_path / "ids"
    directory.mkdir()
    table = pa.table({"input_ids": ids_of(tokenizer, texts), "text": ["unused"] * len(texts)})
    pq.write_table(table, directory / "corpus.parquet", row_group_size=5)
    from_text = build(tmp_path, text_corpus, tokenizer_dir, "text")
    from_ids = build(tmp_path, directory, tokenizer_dir, "ids", ids_field="input_ids", workers=2)
    assert bits(from_ids) == bits(from_text) and bits(from_text)[2] > 0
    # Without --ids-field the same file is read as text: another filter.
    as_text = build(tmp_path, directory, tokenizer_dir, "as-text")
    assert bits(as_text) != bits(from_text)


def test_a_saved_dataset_ids_column_gives_the_text_builds_bits(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, text_corpus: Path
) -> None:
    import datasets

    directory = tmp_path / "saved"
    datasets.Dataset.from_dict({"input_ids": ids_of(tokenizer, corpus_texts())}).save_to_disk(
        str(directory)
    )
    from_text = build(tmp_path, text_corpus, tokenizer_dir, "text")
    from_ids = build(tmp_path, directory, tokenizer_dir, "ids", ids_field="input_ids")
    assert bits(from_ids) == bits(from_text)


def test_a_megatron_dataset_gives_the_text_builds_bits(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, text_corpus: Path
) -> None:
    directory = tmp_path / "megatron"
    directory.mkdir()
    documents = ids_of(tokenizer, corpus_texts())
    write_megatron(str(directory / "pile_text_document"), documents)
    index = read_index(str(directory / "pile_text_document.idx"))
    assert index.num_documents == len(documents) and index.dtype == np.uint16
    from_text = build(tmp_path, text_corpus, tokenizer_dir, "text")
    from_megatron = build(tmp_path, directory, tokenizer_dir, "megatron")
    assert bits(from_megatron) == bits(from_text)
    # Through the command line too, with the pybloomfiltermmap3 format reading the same windows.
    output = tmp_path / "cli.bloom"
    arguments = [str(directory), "-o", str(output), "--tokenizer", str(tokenizer_dir)]
    options = ["--n", "4", "--min-count", "2", "--format", "pybloomfiltermmap3", "--no-progress"]
    assert cli_main(["build", *arguments, *options]) == 0
    text_bloom = tmp_path / "text.bloom"
    text_arguments = [str(text_corpus), "-o", str(text_bloom), "--tokenizer", str(tokenizer_dir)]
    assert cli_main(["build", *text_arguments, *options]) == 0
    assert (
        NgramFilter.open(output).metadata["bits_xxh3"]
        == (NgramFilter.open(text_bloom).metadata["bits_xxh3"])
    )


def test_ids_out_of_range_are_refused_with_the_file_and_position(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "megatron"
    directory.mkdir()
    documents = ids_of(tokenizer, corpus_texts()[:4])
    documents[2][5] = 60_000  # the test tokenizer has 300 ids
    write_megatron(str(directory / "corpus"), documents)
    arguments = [
        str(directory),
        "-o",
        str(tmp_path / "f.memfree"),
        "--tokenizer",
        str(tokenizer_dir),
    ]
    assert cli_main(["build", *arguments, "--n", "4", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 3
    assert summary["skipped"]["counts"] == {"ids out of range": 1}
    (example,) = summary["skipped"]["examples"]["ids out of range"]
    assert "corpus.bin:document 2: id 60000 at position 5 is outside" in example
    kept = NgramFilter.open(tmp_path / "f.memfree").metadata["corpus"]
    assert kept["documents"] == 3  # the bad document is left out whole, not cut at the bad id
    all_bad = tmp_path / "bad"
    all_bad.mkdir()
    write_megatron(str(all_bad / "corpus"), [[1, 2, 3, 60_000]], dtype=np.uint16)
    with pytest.raises(BuildError) as refused:
        build(tmp_path, all_bad, tokenizer_dir, "bad", min_count=1)
    message = str(refused.value)
    assert "corpus.bin:document 0" in message and "id 60000 at position 3" in message


def test_ids_need_the_token_unit_and_damaged_indexes_are_named(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    with pytest.raises(ValueError, match="ids_field reads token ids: it needs unit token"):
        BuildSettings(unit="word", ids_field="input_ids")
    directory = tmp_path / "megatron"
    directory.mkdir()
    write_megatron(str(directory / "corpus"), [[1, 2, 3, 4, 5]])
    idx = directory / "corpus.idx"
    idx.write_bytes(idx.read_bytes()[:-4])  # truncated
    with pytest.raises(BuildError, match="truncated or damaged"):
        build(tmp_path, directory, tokenizer_dir, "damaged", min_count=1)
    # A word build reads text: a Megatron dataset's ids are refused, named.
    write_megatron(str(directory / "corpus"), [[1, 2, 3, 4, 5]])
    with pytest.raises(BuildError, match="pre-tokenized documents need --unit token"):
        build_filter(
            [str(directory)],
            tmp_path / "w.memfree",
            BuildSettings(unit="word", ngram_size=2, min_count=1),
            progress=False,
        )


def test_long_id_documents_are_cut_into_continued_pieces() -> None:
    from bloom_builder.segments import Document, split_long

    ids = np.arange(10, dtype=np.int64)
    pieces = list(split_long(iter([Document("", ids=ids, where="f:0"), Document("x")]), limit=4))
    assert [piece.ids.tolist() for piece in pieces[:3] if piece.ids is not None] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
    ]
    assert [piece.continues for piece in pieces] == [True, True, False, False]
    assert pieces[3].text == "x" and {piece.where for piece in pieces[:3]} == {"f:0"}


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(-40_000, 70_000), min_size=1, max_size=30),
    dtype=st.sampled_from(["int16", "int32", "int64", "uint16", "uint32", "uint64"]),
)
def test_the_range_check_agrees_with_comparing_every_id(ids: list[int], dtype: str) -> None:
    info = np.iinfo(dtype)
    array = np.array([i for i in ids if info.min <= i <= info.max] or [0], dtype=dtype)
    expected = bool(((array.astype(np.int64) >= 0) & (array.astype(np.int64) < 49_152)).all())
    assert _in_range(array, 49_152) == expected
