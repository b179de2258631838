"""Canary formats, their randomness space, and insertion into a corpus with a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eval.canaries import CanaryFormat, insert_canaries, load_manifest


def test_format_space_prefix_and_fill() -> None:
    ssn = CanaryFormat("my social security number is {ddd}-{dd}-{dddd}")
    assert ssn.space_size == 10**9 and ssn.prefix == "my social security number is "
    assert ssn.fill(list("123456789")) == "my social security number is 123-45-6789"
    assert ssn.secret_text(list("123456789")) == "123-45-6789"
    words = CanaryFormat("the {word} code is {xx}", words=("red", "blue", "red"))
    assert words.space_size == 2 * 256
    assert sorted(words.all_secrets())[0] == ("blue", "0", "0")
    assert len(list(CanaryFormat("pin {dd}").all_secrets())) == 100
    with pytest.raises(ValueError, match="has no hole"):
        CanaryFormat("no holes here")
    with pytest.raises(ValueError, match="at least two distinct words"):
        CanaryFormat("a {word}")


def test_random_secrets_are_distinct_and_seeded() -> None:
    pin = CanaryFormat("pin {dd}")
    first = pin.random_secrets(100, np.random.default_rng(3))
    assert len(set(first)) == 100
    assert pin.random_secrets(5, np.random.default_rng(3)) == first[:5]
    with pytest.raises(ValueError, match="distinct secrets from a space of 100"):
        pin.random_secrets(101, np.random.default_rng(0))


def test_insertion_writes_the_corpus_and_a_manifest(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(5):
        (corpus / f"d{index}.txt").write_text(f"line one of {index}\nline two\nline three\n")
    fmt = CanaryFormat("my pin is {dddd}")
    manifest = insert_canaries([str(corpus)], tmp_path / "out", fmt, repetitions=(1, 3, 8))
    rows = [json.loads(line)["text"] for line in (tmp_path / "out/corpus.jsonl").open()]
    assert len(rows) == 5
    assert [c["repetitions"] for c in manifest["canaries"]] == [1, 3, 8]
    everything = "\n".join(rows)
    for canary in manifest["canaries"]:
        assert everything.count(canary["text"]) == canary["repetitions"]
        for document, offset in canary["positions"]:
            assert rows[document][offset:].startswith(canary["text"] + "\n")
    # the original lines are all still there, in order
    for index in range(5):
        original = f"line one of {index}\nline two\nline three\n".split("\n")
        kept = [line for line in rows[index].split("\n") if not line.startswith("my pin is")]
        assert kept == original
    loaded_format, canaries, data = load_manifest(tmp_path / "out")
    assert loaded_format == fmt and [c.repetitions for c in canaries] == [1, 3, 8]
    assert data["space_size"] == 10_000
    with pytest.raises(FileNotFoundError, match="memfree audit insert"):
        load_manifest(tmp_path / "nowhere")
