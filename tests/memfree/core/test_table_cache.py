"""Canonical decoding's tables kept on disk (memfree.core.table_cache): the next process reads
them back and answers exactly as a fresh build; a damaged, cut or foreign file is never trusted
(rebuilt with a warning, and rewritten whole); a cache that cannot be written costs a warning,
not the guard; ``memfree tables`` lists and builds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memfree.core import canonical, table_cache
from memfree.core.canonical import canonical_masker
from memfree.core.table_cache import MAGIC, kept_tables, read_header, tables_dir
from memfree.vocab.info import TokenizerInfo

TEXTS = ["def f(x):\n\n    return x  + 1\n", "Hello\n\nWorld  it's 12345 日本 😀", "a  b\n \n c"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory, and a process that has built no tables yet."""
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(canonical, "_TABLES", {})
    monkeypatch.setattr(canonical, "_VOCABULARIES", {})
    return tmp_path / "cache" / "canonical"


def _new_process() -> None:
    """Forget the tables this process holds (what another process starts without)."""
    canonical._TABLES.clear()
    canonical._VOCABULARIES.clear()


def _answers(tokenizer: Any) -> list[np.ndarray]:
    """The masker's allowed candidates after every prefix of the texts' tokenizations."""
    masker = canonical_masker(TokenizerInfo.of(tokenizer))
    found = []
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        found += [masker.allowed(ids[:end]).copy() for end in range(1, len(ids) + 1)]
    return found


def _count_builds(
    monkeypatch: pytest.MonkeyPatch, tables: Any = canonical.ByteLevelBpe
) -> list[int]:
    """A counter of the builds of ``tables`` (a family's tables class) from here on."""
    built = [0]
    real = tables.of

    def counted(info: Any) -> Any:
        built[0] += 1
        return real(info)

    monkeypatch.setattr(tables, "of", counted)
    return built


def test_the_next_process_reads_the_tables_and_answers_the_same(
    cache: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _count_builds(monkeypatch)
    fresh = _answers(tokenizer)
    assert built[0] == 1
    (kept,) = kept_tables()
    assert kept["whole"] and kept["kind"] == "byte-level"
    assert kept["tokenizer_fingerprint"] == TokenizerInfo.of(tokenizer).fingerprint
    _new_process()
    again = _answers(tokenizer)
    assert built[0] == 1  # read back, not built
    assert all(np.array_equal(a, b) for a, b in zip(again, fresh, strict=True))
    assert any(not a.all() for a in fresh)  # the answers ban something


def test_split_pattern_tables_read_back_answer_the_same_and_hold_the_callers_tokenizer(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split-pattern family's tables (Qwen 2's rules: SplitChunks, two BPE models made again on
    reading) answer as built; the file names the tokenizer instead of holding it, keeps no cache,
    and holds ids and ranks as int32 (read back as int64)."""
    import pickle

    from memfree.vocab.bpe import tables_key
    from tests.conftest import train_split_bpe

    tokenizer = train_split_bpe("qwen2")
    built = _count_builds(monkeypatch)
    fresh = _answers(tokenizer)
    info = TokenizerInfo.of(tokenizer)
    tables = (canonical._TABLES[tables_key(info)], canonical._VOCABULARIES[tables_key(info)])
    _new_process()
    again = _answers(tokenizer)
    assert built[0] == 1
    assert all(np.array_equal(a, b) for a, b in zip(again, fresh, strict=True))
    bpe = canonical._TABLES[tables_key(info)]
    assert bpe._tokenizer is tokenizer  # the caller's, not a copy
    assert bpe.tree.left.dtype == np.int64 and bpe.tree.members[1].dtype == np.int64
    (kept,) = kept_tables()
    assert kept["bytes"] < len(pickle.dumps(tables, protocol=pickle.HIGHEST_PROTOCOL))
    # The file as written: the tokenizer named (given back by the reader), caches empty.
    assert tables[0]._encoded  # filled while the answers were read
    _, offset = read_header(Path(kept["path"]))
    payload = Path(kept["path"]).read_bytes()[offset:]
    other = object()
    read, _ = table_cache._loads(payload, {"tokenizer": other})
    # (the merges-only model is made again on reading, for the split rules: not from the file)
    assert read._tokenizer is other and read._encoded == {} and read.tree._late_rows == {}


def test_sentencepiece_tables_are_kept_and_read_back_with_their_late_rows(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Llama 2's tables (SentencePiece-style BPE) are kept as the byte-level families' are: the
    next process reads them back instead of building them (3-5 s, most of it the rows of its
    runs of spaces read from the merges) and answers the same, with the caller's tokenizer."""
    from memfree.core import canonical_spm
    from tests.conftest import LLAMA_CPP, llama_cpp_tokenizer

    if not (LLAMA_CPP / "ggml-vocab-llama-spm.gguf").exists():
        pytest.skip("needs ggml-vocab-llama-spm.gguf (make setup fetches it)")
    tokenizer = llama_cpp_tokenizer("llama-spm")
    monkeypatch.setattr(canonical_spm, "_TABLES", {})
    built = _count_builds(monkeypatch, canonical_spm.SentencePieceBpe)
    fresh = _answers(tokenizer)
    (kept,) = kept_tables()
    assert kept["whole"] and kept["kind"] == "sentencepiece" and built[0] == 1
    canonical_spm._TABLES.clear()  # another process
    again = _answers(tokenizer)
    assert built[0] == 1  # read back, not built
    assert all(np.array_equal(a, b) for a, b in zip(again, fresh, strict=True))
    assert any(not a.all() for a in fresh)
    (tables,) = canonical_spm._TABLES.values()
    assert tables._tokenizer is tokenizer and tables.tree._late_rows == {}
    assert tables.tree.late_rows and sorted(tables.tree.late_rows) == (
        np.flatnonzero(tables.tree.late[0]).tolist()
    )


def test_writing_a_tokenizers_tables_removes_those_another_version_wrote(
    cache: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade leaves no tables behind: the files of the same family and tokenizer under
    another key go when the new ones are written; another tokenizer's file stays."""
    fingerprint = TokenizerInfo.of(tokenizer).fingerprint
    cache.mkdir(parents=True)
    for name, owner in (("byte-level-old", fingerprint), ("byte-level-other", "another")):
        header = {"format": 2, "kind": "byte-level", "key": name, "tokenizer_fingerprint": owner}
        (cache / f"{name}.tables").write_bytes(MAGIC + json.dumps(header).encode() + b"\nx")
    _answers(tokenizer)
    names = sorted(path.name for path in cache.glob("*.tables"))
    assert "byte-level-old.tables" not in names and "byte-level-other.tables" in names
    assert len(names) == 2


@pytest.mark.parametrize(
    "damage",
    ["flip a payload byte", "cut short", "not a tables file", "another format", "other tables"],
)
def test_a_damaged_file_is_rebuilt_with_a_warning_and_rewritten(
    cache: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    fresh = _answers(tokenizer)
    (path,) = cache.glob("*.tables")
    data = bytearray(path.read_bytes())
    header, offset = read_header(path)
    if damage == "flip a payload byte":
        data[offset + len(data[offset:]) // 2] ^= 0x10
    elif damage == "cut short":
        data = data[: offset + 100]
    elif damage == "not a tables file":
        data[:4] = b"\x00\x00\x00\x00"
    else:
        header = (
            {**header, "format": 99} if damage == "another format" else {**header, "key": "0" * 32}
        )
        data = MAGIC + json.dumps(header).encode() + b"\n" + data[offset:]
    path.write_bytes(bytes(data))
    _new_process()
    built = _count_builds(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = _answers(tokenizer)
    assert built[0] == 1  # never trusted: built again
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(str(path) in m and "built again" in m for m in messages), messages
    assert all(np.array_equal(a, b) for a, b in zip(again, fresh, strict=True))
    (kept,) = kept_tables()
    assert kept["whole"]  # rewritten whole


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only directory")
def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_guard(
    cache: Path, tokenizer: Any
) -> None:
    cache.parent.mkdir(parents=True)
    cache.parent.chmod(0o500)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            answers = _answers(tokenizer)
        assert any("MEMFREE_CACHE" in str(w.message) for w in caught)
        assert answers
    finally:
        cache.parent.chmod(0o700)


def test_a_cache_path_that_is_a_file_costs_a_warning_not_the_guard(
    cache: Path, tokenizer: Any
) -> None:
    """(A full or read-only disk fails the same way: the write raises OSError.)"""
    cache.parent.mkdir(parents=True)
    cache.write_text("not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answers = _answers(tokenizer)
    messages = [str(w.message) for w in caught]
    assert any("cannot keep" in m and "MEMFREE_CACHE" in m for m in messages), messages
    assert answers and kept_tables() == []


def test_memfree_tables_builds_and_lists(cache: Path, tokenizer_dir: Path) -> None:
    env = {**os.environ, "MEMFREE_CACHE": str(cache.parent)}
    command = [sys.executable, "-m", "memfree.cli", "tables"]
    out = subprocess.run(
        [*command, "--tokenizer", str(tokenizer_dir)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "tables ready" in out.stdout and "byte-level" in out.stdout and "whole" in out.stdout
    listed = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    (entry,) = json.loads(listed.stdout)
    assert entry["whole"] and Path(entry["path"]).parent == cache
    assert tables_dir() == cache
    missing = subprocess.run(
        [*command, "--tokenizer", str(cache / "nowhere")], capture_output=True, text=True, env=env
    )
    assert missing.returncode == 2 and "memfree: error:" in missing.stderr
    assert "Traceback" not in missing.stderr
