"""``memfree eval utility`` over a damaged filter: a block found damaged while the texts are
counted (a reader checks each block when it first reads it) is refused as every bad input is,
exit 2 and one message naming the filter, the problem and the fix, never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from memfree.cli import main as cli_main
from memfree.filterfile import open_filter
from memfree.filterfile.index.reader import IndexFilter
from tests.bloom_builder.test_build import WORDS


def test_a_block_found_damaged_while_counting_is_refused_naming_the_filter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index in range(8):
        (corpus / f"doc{index}.txt").write_text(" ".join(rng.choice(WORDS, 3000)) + "\n")
    path = tmp_path / "words.memfree"
    build_filter(
        [str(corpus)], path, BuildSettings(unit="word", ngram_size=3, workers=1), progress=False
    )
    argv = ["eval", "utility", str(corpus), "--filter", str(path), "--max-texts", "8"]
    assert cli_main(argv) == 0
    capsys.readouterr()
    # Damage the records of the last section: opening reads the header and the section table
    # only, so the damage is met while the texts (which hold every stored n-gram) are counted.
    data = bytearray(path.read_bytes())
    data[len(data) - 100] ^= 0x10
    path.write_bytes(bytes(data))
    opened = open_filter(path)
    assert isinstance(opened, IndexFilter)
    opened.close()

    assert cli_main(argv) == 2
    error = capsys.readouterr().err
    message = error[error.index("memfree: error:") :]
    assert message.startswith(f"memfree: error: {path}: section ")
    assert "checksum mismatch" in message and "rebuild it with `memfree build`" in message
    assert message.count("\n") == 1 and "Traceback" not in error


def test_a_default_filter_that_cannot_be_reused_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`memfree eval`'s default word filter, left damaged (or by an earlier memfree) in out/, is
    built again rather than failing every run until someone deletes it."""
    from eval.cli.evaluate import _default_filter
    from eval.cli.evaluate_options import DEFAULT_WORD_FILTER

    monkeypatch.chdir(tmp_path)
    stale = tmp_path / DEFAULT_WORD_FILTER
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"MEMFREE\x00" + bytes(4088))
    filt = _default_filter("word", None)
    assert filt.unit == "word" and len(filt) > 100_000
    assert "cannot reuse" in capsys.readouterr().err
