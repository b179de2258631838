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


def planted(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    insert_canaries([str(tmp_path / "a.txt")], tmp_path / "out", CanaryFormat("pin {dd}"))
    return tmp_path / "out"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{oops", r"manifest\.json: not JSON"),
        ("[]", r"manifest\.json: expected a JSON object, found a list"),
        ('{"format": "pin {dd}"}', r"manifest\.json: no 'canaries' field"),
        ('{"format": "pin", "canaries": []}', r"manifest\.json: .*has no hole"),
        ('{"format": "pin {dd}", "canaries": []}', r"manifest\.json: holds no canary"),
        (
            '{"format": "pin {dd}", "canaries": [{"text": "pin 12", "repetitions": 1}]}',
            r"manifest\.json: canary 1: no 'secret' field",
        ),
        (
            '{"format": "pin {dd}", "canaries": [{"text": "pin 12", "secret": ["1"], '
            '"repetitions": 1}]}',
            r"manifest\.json: canary 1: a secret of 1 part for a format of 2 holes",
        ),
        (
            '{"format": "pin {dd}", "canaries": [{"text": "pin 12", "secret": ["1", "2"], '
            '"repetitions": "x"}]}',
            r"manifest\.json: canary 1: field 'repetitions' is a string, expected an integer",
        ),
    ],
)
def test_a_damaged_manifest_is_refused_naming_it(tmp_path: Path, text: str, message: str) -> None:
    out = planted(tmp_path)
    (out / "manifest.json").write_text(text)
    with pytest.raises(ValueError, match=message) as caught:
        load_manifest(out)
    assert "memfree audit insert" in str(caught.value)  # how to get a good one back


def test_an_unreadable_manifest_says_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "dir/manifest.json").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"manifest\.json: is a directory"):
        load_manifest(tmp_path / "dir")
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(ValueError, match=r"loop: is a symbolic link loop"):
        load_manifest(tmp_path / "loop")


def test_insertion_never_replaces_a_manifest_or_a_corpus_unless_asked(tmp_path: Path) -> None:
    out = planted(tmp_path)
    manifest = (out / "manifest.json").read_bytes()
    corpus = (out / "corpus.jsonl").read_bytes()
    pin = CanaryFormat("pin {dd}")
    with pytest.raises(ValueError, match=rf"{out}: already holds manifest\.json.*--force"):
        insert_canaries([str(tmp_path / "a.txt")], out, pin, seed=1)
    assert (out / "manifest.json").read_bytes() == manifest
    assert (out / "corpus.jsonl").read_bytes() == corpus
    replaced = insert_canaries([str(tmp_path / "a.txt")], out, pin, seed=1, overwrite=True)
    assert json.loads((out / "manifest.json").read_text()) == replaced
    assert (out / "manifest.json").read_bytes() != manifest
    # A corpus.jsonl without a manifest is the user's own (e.g. the input itself): kept too.
    (out / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"already holds corpus\.jsonl"):
        insert_canaries([str(out / "corpus.jsonl")], out, pin)


def test_a_disk_with_no_room_is_named_with_the_fix_and_leaves_no_half_corpus(
    tmp_path: Path,
) -> None:
    """``memfree audit insert`` where writes fail for lack of room (the kernel's file-size
    limit, EFBIG, as a full disk fails with ENOSPC): exit 2 naming the output folder and the
    fix, no traceback, and no half-written corpus or manifest left to be read as a planted one."""
    from tests.conftest import run_with_file_limit

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [json.dumps({"text": f"a document of some words, number {i}"}) for i in range(300)]
    (corpus / "a.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "planted"
    argv = ["audit", "insert", str(corpus), "-o", str(out)]
    code = f"from memfree.cli import main\nraise SystemExit(main({argv!r}))\n"
    done = run_with_file_limit(code, 1024, {})
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(f"memfree: error: no room to write in {out} (File too large)"), error
    assert "-o on a disk with room" in error and "Traceback" not in done.stderr
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]
