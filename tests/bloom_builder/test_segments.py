"""Long documents are tokenized in bounded windows, yet get exactly the ids of their whole text
(issue 34): a multi-megabyte single line, read from a text file (in segments) or from a JSONL
row, with long whitespace runs and multibyte characters at the cuts, for SmolLM2's byte-level
BPE, a SentencePiece-style BPE ("▁" prepended to every text it is given, no pre-tokenizer), a
Metaspace Unigram and Llama 3's split pattern (``\\s+(?!\\S)``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.encode import encoded_batches, spans_encoder
from bloom_builder.segments import SEGMENT_BYTES, Document, split_long
from bloom_builder.sources import ProblemLog, SourceOptions, discover
from bloom_builder.windows import batch_windows
from memfree.filterfile.sliding import sliding_fingerprints_np
from memfree.units import TokenizerPayload
from tests.conftest import WORD_TEXTS, train_sentencepiece, train_split_bpe

NGRAM = 10
SEED = 7
WORDS = ["alpha", "beta", "gamma", "delta", "return", "self", "def", "class", "print", "total"]
# Multibyte and tricky characters: accents (one and two code points), CJK, emoji, Hangul, a
# ligature NFKC splits, a digit run, no-break and ideographic spaces.
ODD = ["é", "naïve", "a\u0301", "日本語", "😀", "한국어", "ﬁ", "12345678", "\u00a0", "\u3000", "€"]


@pytest.fixture(scope="module")
def families(default_tokenizer: Any) -> dict[str, Any]:
    """SmolLM2's tokenizer and three families built here (no hub download)."""
    return {
        "smollm2": default_tokenizer,
        "sentencepiece": train_sentencepiece(),
        "unigram": metaspace_unigram(),
        "llama3": train_split_bpe("llama3"),
    }


def metaspace_unigram() -> Any:
    """A T5/ALBERT-style tokenizer: NFKC, a Metaspace pre-tokenizer ("▁" before the first word
    of every text it is given), a Unigram model."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.Unigram())
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["<unk>"], unk_token="<unk>")
    backend.train_from_iterator(WORD_TEXTS * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def minified_json(size: int) -> str:
    """One line of minified JSON records, ``size`` characters or a little more."""
    rng = random.Random(SEED)
    records, total = [], 0
    while total < size:
        record = json.dumps(
            {
                "id": rng.randrange(10**9),
                "name": " ".join(rng.choices(WORDS + ODD, k=rng.randrange(1, 6))),
                "tags": rng.choices(WORDS, k=3),
                "score": round(rng.random() * 100, 3),
                "ok": rng.random() < 0.5,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        records.append(record)
        total += len(record) + 1
    return "[" + ",".join(records) + "]"


def hard_line(size: int, seed: int = SEED, longest_run: int = 3000, runs: float = 0.03) -> str:
    """One line (no newline) of words, multibyte characters and whitespace runs (a share
    ``runs`` of the gaps) of up to ``longest_run`` spaces and tabs, about ``size`` characters."""
    rng = random.Random(seed)
    parts, total = [], 0
    while total < size:
        word = rng.choice(WORDS + ODD)
        gap = rng.random()
        if gap < runs:
            space = "".join(rng.choices(" \t", weights=[9, 1], k=rng.randrange(16, longest_run)))
        elif gap < 0.2:
            space = rng.choice(["  ", "\t", " \t ", "   ", ",", ":", "", "\u3000"])
        else:
            space = " "
        parts.append(word + space)
        total += len(word) + len(space)
    return "".join(parts)


def exact_ids(tokenizer: Any, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def built_pieces(
    path: Path, tokenizer: Any, options: SourceOptions | None = None, batch_bytes: int = 1 << 20
) -> list[tuple[Document, np.ndarray]]:
    """The document pieces and ids the map step gets for the file at ``path`` (one unit)."""
    options = options or SourceOptions()
    problems = ProblemLog()
    (unit,) = discover([str(path)], options, problems)
    encoder = TokenizerPayload.from_tokenizer(tokenizer).encoder()
    batches = encoded_batches(unit, options, problems, encoder, 64, batch_bytes)
    pieces = [piece for batch in batches for piece in batch]
    assert problems.total() == 0
    assert [document.continues for document, _ in pieces] == [True] * (len(pieces) - 1) + [False]
    return pieces


def not_in(values: np.ndarray, others: np.ndarray) -> np.ndarray:
    """The values (sorted, unique) that ``others`` (sorted, unique, not empty) lacks."""
    found = others[np.minimum(np.searchsorted(others, values), others.size - 1)]
    return values[found != values]


def assert_every_ngram_stored(pieces: list[tuple[Document, np.ndarray]], exact: np.ndarray) -> None:
    """The windows the builder stores for these pieces (its carry-over across pieces included)
    are exactly the n-grams of the whole text's tokenization, and its ids are that tokenization."""
    stored = batch_windows(
        [(ids, document.continues) for document, ids in pieces],
        None,
        NGRAM,
        SEED,
        np.empty(0, dtype=np.uint32),
    ).fingerprints
    expected = np.unique(sliding_fingerprints_np(exact.astype(np.uint32), NGRAM, SEED))
    stored = np.unique(stored)
    missing, extra = not_in(expected, stored), not_in(stored, expected)
    assert (missing.size, extra.size) == (0, 0), (
        f"{missing.size} of the text's {expected.size} {NGRAM}-grams are not stored, "
        f"{extra.size} stored ones are not the text's"
    )
    built = np.concatenate([ids for _, ids in pieces]).astype(np.int64)
    assert np.array_equal(built, exact)


def test_a_multi_megabyte_json_line_gets_every_ngram_of_its_tokenization(
    tmp_path: Path, default_tokenizer: Any
) -> None:
    """SmolLM2, a 2.1 MB minified-JSON line in a text file: the reader hands it over in 256 KiB
    segments; the ids are those of the whole line, yet no text beyond a segment is tokenized at
    once."""
    text = minified_json(2_100_000)
    assert len(text) > 2_000_000 and "\n" not in text
    path = tmp_path / "minified.json.txt"
    path.write_text(text, encoding="utf-8")
    lengths: list[int] = []
    encoder = TokenizerPayload.from_tokenizer(default_tokenizer).encoder()
    spans = spans_encoder(encoder)
    assert spans is not None

    class Recording:
        """The real encoder, recording the length of every text it tokenizes."""

        special_ids, vocab_size = encoder.special_ids, encoder.vocab_size

        def encode(self, texts: list[str]) -> list[np.ndarray]:
            lengths.extend(len(text) for text in texts)
            return encoder.encode(texts)

        def encode_spans(self, text: str) -> Any:
            lengths.append(len(text))
            assert spans is not None
            return spans(text)

    problems = ProblemLog()
    options = SourceOptions()
    (unit,) = discover([str(path)], options, problems)
    batches = encoded_batches(unit, options, problems, Recording(), 64, 1 << 20)
    pieces = [piece for batch in batches for piece in batch]
    assert max(lengths) <= SEGMENT_BYTES and sum(lengths) < 1.1 * len(text)
    assert_every_ngram_stored(pieces, exact_ids(default_tokenizer, text))


def test_a_long_jsonl_row_of_words_gets_every_ngram_of_its_tokenization(
    tmp_path: Path, default_tokenizer: Any
) -> None:
    """SmolLM2, a 1.5 MB row of space-separated words in a JSONL file: cut into windows by the
    encode step itself (not by the reader)."""
    rng = np.random.default_rng(SEED)
    text = " ".join(rng.choice(WORDS, size=250_000))
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    pieces = built_pieces(path, default_tokenizer)
    assert len(pieces) > 5
    assert_every_ngram_stored(pieces, exact_ids(default_tokenizer, text))


@pytest.mark.parametrize("family", ["smollm2", "sentencepiece", "unigram", "llama3"])
def test_whitespace_runs_and_multibyte_characters_at_the_cuts(
    tmp_path: Path, families: dict[str, Any], family: str
) -> None:
    """A 0.8 MB line of words, multibyte characters (each several tokens in byte-level BPE, at
    one offset) and whitespace runs, with a run of 16,000 spaces and tabs across the end of the
    first window (longer than the first overlap, which grows): the ids are the whole line's,
    for a tokenizer that prepends "▁" to every text, one whose split of a whitespace run
    depends on what follows it, a Metaspace one and byte-level BPE."""
    tokenizer = families[family]
    head = hard_line(SEGMENT_BYTES - 12_000, runs=0.002)
    run = "".join(random.Random(SEED).choices(" \t", weights=[9, 1], k=16_000))
    text = head + run + hard_line(2 * SEGMENT_BYTES, seed=SEED + 4, runs=0.002)
    assert len(head) < SEGMENT_BYTES < len(head) + len(run)
    path = tmp_path / "hard.txt"
    path.write_text(text, encoding="utf-8")
    assert_every_ngram_stored(built_pieces(path, tokenizer), exact_ids(tokenizer, text))


@pytest.mark.parametrize("family", ["smollm2", "sentencepiece", "unigram", "llama3"])
def test_many_small_windows_splice_exactly(families: dict[str, Any], family: str) -> None:
    """Windows of 8 KiB (hundreds of splices) over a line whose whitespace runs reach past the
    first overlap (256 characters): the overlap grows until the windows agree."""
    tokenizer = families[family]
    text = hard_line(400_000, seed=SEED + 1, longest_run=1500)
    spans = spans_encoder(TokenizerPayload.from_tokenizer(tokenizer).encoder())
    pieces = list(split_long([Document(text)], limit=8 << 10, encode=spans))
    assert len(pieces) > 50 and all(piece.ids is not None for piece in pieces)
    built = np.concatenate([piece.ids for piece in pieces if piece.ids is not None])
    assert np.array_equal(built.astype(np.int64), exact_ids(tokenizer, text))


def test_the_ids_do_not_depend_on_segment_or_batch_sizes(
    tmp_path: Path, default_tokenizer: Any
) -> None:
    """The same file read in segments of 1 KiB or 256 KiB, tokenized in batches of 256 KiB or
    4 MiB: the same ids, the whole text's."""
    text = hard_line(SEGMENT_BYTES + 50_000, seed=SEED + 2, longest_run=600)
    path = tmp_path / "line.txt"
    path.write_text(text, encoding="utf-8")
    exact = exact_ids(default_tokenizer, text)
    for segment_bytes, batch_bytes in [(1024, SEGMENT_BYTES), (SEGMENT_BYTES, 4 << 20)]:
        options = SourceOptions(segment_bytes=segment_bytes)
        pieces = built_pieces(path, default_tokenizer, options, batch_bytes)
        built = np.concatenate([ids for _, ids in pieces]).astype(np.int64)
        assert np.array_equal(built, exact), (segment_bytes, batch_bytes)


def test_a_chain_followed_by_ids_carries_over_and_short_texts_pass(default_tokenizer: Any) -> None:
    """Continued text segments are joined and spliced; a pre-tokenized document after them is
    kept as it is (the pieces before it still continue), and a short text passes unchanged."""
    spans = spans_encoder(TokenizerPayload.from_tokenizer(default_tokenizer).encoder())
    text = hard_line(30_000, seed=SEED + 3, longest_run=200)
    parts = [text[:7_000], text[7_000:7_001], text[7_001:]]
    ids = np.arange(5, dtype=np.int64)
    documents = [
        Document(parts[0], continues=True, where="f:0"),
        Document(parts[1], continues=True),
        Document(parts[2], continues=True),
        Document("", ids=ids, where="f:1"),
        Document("short text"),
    ]
    pieces = list(split_long(documents, limit=4096, encode=spans))
    assert pieces[-1] == Document("short text")
    assert pieces[-2].ids is ids
    spliced = pieces[:-2]
    assert all(piece.continues and piece.where == "f:0" for piece in spliced)
    built = np.concatenate([piece.ids for piece in spliced if piece.ids is not None])
    assert np.array_equal(built.astype(np.int64), exact_ids(default_tokenizer, text))
