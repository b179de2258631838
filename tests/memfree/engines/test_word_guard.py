"""The word guard: exact against a text-level reference, for every tokenizer family.

The reference reads text the way a user does: ``tokenizer.decode`` (special tokens skipped),
normalized by :func:`memfree.vocab.words.words`. A stored word n-gram is one of the exact set built from
the corpus texts; the filter answers for it with no false negative.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.engines.transformers import MemFreeLogitsProcessor, MemFreeWordLogitsProcessor
from memfree.errors import FilterMismatchError
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.filterfile.protocol import NgramSet
from memfree.testing import word_filter_from_texts
from memfree.vocab.token_bytes import UnsupportedTokenizerError, token_bytes
from memfree.vocab.words import (
    created_word_ngrams,
    new_word_ngrams,
    ngram_hash_rows,
    word_ngrams,
    words,
)
from tests.conftest import WORD_TEXTS

STYLES = {
    "original": lambda text: text,
    "upper": str.upper,
    "lower": str.lower,
    "two_spaces": lambda text: text.replace(" ", "  "),
    "comment": lambda text: "".join("# " + line for line in text.splitlines(keepends=True)),
    "underscore_names": lambda text: re.sub(r"\b([A-Za-z]\w*)", r"_\1", text),
}
FAMILIES = ("byte_bpe", "sentencepiece", "wordpiece")
SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def reference_blocked(filt: NgramFilter, before: str, after: str) -> bool:
    """Whether the text growing from ``before`` to ``after`` creates a word n-gram the filter
    answers yes to."""
    created = new_word_ngrams(before, after, filt.n)
    return bool(created) and bool(filt.contains(ngram_hash_rows(created)).any())


def row_bytes(table: list[bytes | None], ids: list[int]) -> bytes:
    return b"".join(table[i] or b"" for i in ids)


@pytest.fixture(scope="module", params=["prefix-index", "blocked-512"])
def word_filters(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, NgramSet]:
    """Word filters of the test texts in both layouts, at their default rates."""
    directory = tmp_path_factory.mktemp("word-filters")
    return {
        n: word_filter_from_texts(directory / f"{n}.memfree", WORD_TEXTS, n, layout=request.param)
        for n in (1, 2, 3)
    }


@pytest.fixture(scope="module")
def narrow_index(tmp_path_factory: pytest.TempPathFactory) -> dict[int, NgramSet]:
    """Word indexes whose next-word field is 8 bits wide: chance matches happen (a candidate
    word matches a stored next word 1 time in 256), and the guard must ban exactly what the
    index answers yes to, chance matches included."""
    directory = tmp_path_factory.mktemp("narrow-index")
    return {
        n: word_filter_from_texts(
            directory / f"{n}.memfree",
            WORD_TEXTS,
            n,
            layout="prefix-index",
            false_positive_rate=0.01,
        )
        for n in (1, 2, 3)
    }


# ------------------------------------------------------------------------------------------------
# Token bytes


@pytest.mark.parametrize("family", [*FAMILIES, "default"])
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_token_bytes_read_as_the_tokenizer_decodes(
    family: str, data: Any, word_tokenizers: dict[str, Any], default_tokenizer: Any
) -> None:

    tok = default_tokenizer if family == "default" else word_tokenizers[family]
    table = _table(tok)
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=30))
    if family == "sentencepiece":
        # tokenizers' ByteFallback turns every byte token of an invalid run into U+FFFD (even a
        # valid ASCII byte beside it), where memfree reads invalid UTF-8 as Python and Rust's
        # lossy decoding do. The readings agree on valid text: draw byte tokens as whole
        # characters.
        pieces = tok.convert_ids_to_tokens(ids)
        units = [[i] for i, piece in zip(ids, pieces, strict=True) if not piece.startswith("<0x")]
        for char in data.draw(st.lists(st.characters(exclude_categories=["Cs"]), max_size=4)):
            unit = [f"<0x{byte:02X}>" for byte in char.encode("utf-8")]
            units.insert(data.draw(st.integers(0, len(units))), tok.convert_tokens_to_ids(unit))
        ids = [i for unit in units for i in unit]
    text = row_bytes(table, ids).decode("utf-8", "replace")
    assert words(text) == words(tok.decode(ids, skip_special_tokens=True))


_TABLES: dict[int, list[bytes | None]] = {}


def _table(tok: Any) -> list[bytes | None]:
    if id(tok) not in _TABLES:
        _TABLES[id(tok)] = token_bytes(tok)
    return _TABLES[id(tok)]


def test_unsupported_tokenizers_are_refused_clearly(tokenizer: Any) -> None:
    from tokenizers import Tokenizer, decoders
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.decoder = decoders.CTC()
    odd = PreTrainedTokenizerFast(tokenizer_object=backend)
    with pytest.raises(UnsupportedTokenizerError, match="CTC"):
        token_bytes(odd)


# ------------------------------------------------------------------------------------------------
# The mask, candidate by candidate


@st.composite
def row_states(draw: Any, tokenizers: dict[str, Any]) -> tuple[str, int, list[int]]:
    family = draw(st.sampled_from(FAMILIES))
    tok = tokenizers[family]
    # Long texts too: the exact path then reads only the text's tail (from a safe cut).
    long_text = "\n".join(WORD_TEXTS)
    source = draw(st.sampled_from([*WORD_TEXTS, long_text, long_text[::-1]]))
    text = STYLES[draw(st.sampled_from(list(STYLES)))](source)
    cut = draw(st.integers(0, len(text)))
    ids = tok(text[:cut], add_special_tokens=False)["input_ids"]
    ids += draw(st.lists(st.integers(0, len(tok) - 1), max_size=3))  # odd tails: split bytes
    return family, draw(st.sampled_from([1, 2, 3])), ids


@settings(max_examples=120, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_mask_is_exact_for_every_candidate(
    data: Any,
    word_tokenizers: dict[str, Any],
    word_filters: dict[int, NgramSet],
    narrow_index: dict[int, NgramSet],
) -> None:
    family, n, ids = data.draw(row_states(word_tokenizers))
    word_filters = data.draw(st.sampled_from([word_filters, narrow_index]))
    tok = word_tokenizers[family]
    guard = MemFreeLogitsProcessor(word_filters[n], tok)
    assert guard.unit.name == "word"
    table = token_bytes(tok)
    vocab_size = len(tok) + 3  # a model's padded embedding rows add no text
    row = torch.tensor([ids or [tok.eos_token_id]])
    mask, _ = guard.blocked_mask(row, vocab_size)
    before = tok.decode(row[0].tolist(), skip_special_tokens=True)
    expected = [
        reference_blocked(
            word_filters[n], before, tok.decode([*row[0].tolist(), v], skip_special_tokens=True)
        )
        if v < len(table)
        else False
        for v in range(vocab_size)
    ]
    assert mask[0].tolist() == expected
    assert not mask[0, tok.eos_token_id]


@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_a_batch_masks_as_its_rows_do(
    data: Any,
    word_tokenizers: dict[str, Any],
    word_filters: dict[int, NgramSet],
    narrow_index: dict[int, NgramSet],
) -> None:
    """Every row's lookups go to the filter together: the batch's mask is its rows' masks."""
    word_filters = data.draw(st.sampled_from([word_filters, narrow_index]))
    family = data.draw(st.sampled_from(FAMILIES))
    tok = word_tokenizers[family]
    n = data.draw(st.sampled_from([1, 2, 3]))
    rows = []
    for _ in range(data.draw(st.integers(2, 5))):
        text = STYLES[data.draw(st.sampled_from(list(STYLES)))](
            data.draw(st.sampled_from(WORD_TEXTS))
        )
        ids = tok(text[: data.draw(st.integers(1, len(text)))], add_special_tokens=False)
        ids = ids["input_ids"] + data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=2))
        rows.append(ids or [tok.eos_token_id])
    width = min(len(ids) for ids in rows)
    batch = torch.tensor([ids[len(ids) - width :] for ids in rows])
    together, checked = MemFreeLogitsProcessor(word_filters[n], tok).blocked_mask(batch, len(tok))
    for index in range(batch.shape[0]):
        alone, alone_checked = MemFreeLogitsProcessor(word_filters[n], tok).blocked_mask(
            batch[index : index + 1], len(tok)
        )
        assert torch.equal(together[index], alone[0])
        assert bool(checked[index]) == bool(alone_checked[0])


@pytest.mark.parametrize(
    "text",
    [
        "def add(a, b):\n    return a +",
        "THE QUICK BROWN FOX JUMPS OVER THE",
        "# Café crème brû",
        "the quick brown fox 日本",  # ends inside a multi-byte character below
        # Long: the exact path (the default vocabulary has combining marks) reads a tail only.
        "\n".join(WORD_TEXTS[:-1]) + "\nThe Quick Brown Fox said: hello, WOR",
    ],
)
def test_mask_is_exact_with_the_default_tokenizer(
    text: str, default_tokenizer: Any, word_filters: dict[int, NgramFilter]
) -> None:
    tok = default_tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if text.endswith("日本"):
        ids = ids[:-1]  # cut the last character's bytes in two
    table = token_bytes(tok)
    before = row_bytes(table, ids)
    old = words(before.decode("utf-8", "replace"))
    # Each candidate's text read into words once, for both n (new_word_ngrams, in two steps).
    grown = [
        words((before + (table[v] or b"")).decode("utf-8", "replace")) for v in range(len(tok))
    ]
    for n in (2, 3):
        guard = MemFreeLogitsProcessor(word_filters[n], tok)
        mask, _ = guard.blocked_mask(torch.tensor([ids]), len(tok))
        blocked = set(np.flatnonzero(mask[0].numpy()).tolist())
        created, owners = [], []
        for v, new in enumerate(grown):
            found = created_word_ngrams(old, new, n)
            created += found
            owners += [v] * len(found)
        hits = word_filters[n].contains(ngram_hash_rows(created))
        expected = set(np.asarray(owners)[hits].tolist())
        assert blocked == expected
        exact = {g for stored in WORD_TEXTS for g in word_ngrams(stored, n)}
        completing = {v for v, g in zip(owners, created, strict=True) if g in exact}
        assert completing <= blocked
        # One token continues a stored text after the ASCII prompts (after "brû" and "日" no
        # single token of this vocabulary completes a stored word n-gram).
        assert completing or n == 3 or not text.isascii()


# ------------------------------------------------------------------------------------------------
# Generation: never a stored word n-gram, at any cut, in any mode


MODES: dict[str, dict[str, Any]] = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "temperature": 1.3},
    "beam": {"num_beams": 3, "num_return_sequences": 2},
}


def memorizing_model(scripted_lm: Any, tok: Any, styled: str, seed: int) -> Any:
    """A scripted LM that continues the token 5-grams of ``styled``: it tries to copy it."""
    ids = tok(styled, add_special_tokens=False)["input_ids"]
    stored = [ids[i : i + 5] for i in range(len(ids) - 4)] or [[0] * 5]
    return scripted_lm(len(tok), stored, boost=12.0, seed=seed, eos=tok.eos_token_id)


def emitted_stored(tok: Any, prompt: list[int], out: list[int], exact: set[Any], n: int) -> Any:
    """Stored word n-grams in the decoded text at any cut of the output."""
    before = tok.decode(prompt, skip_special_tokens=True)
    found = []
    for cut in range(1, len(out) + 1):
        after = tok.decode(prompt + out[:cut], skip_special_tokens=True)
        found += [g for g in new_word_ngrams(before, after, n) if g in exact]
    return found


@pytest.mark.parametrize("mode", list(MODES))
@settings(max_examples=40, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_no_stored_word_ngram_is_ever_emitted(
    mode: str, data: Any, word_tokenizers: dict[str, Any], scripted_lm: Any
) -> None:
    family = data.draw(st.sampled_from(FAMILIES))
    tok = word_tokenizers[family]
    text = data.draw(st.sampled_from(WORD_TEXTS))
    style = data.draw(st.sampled_from(list(STYLES)))
    n = data.draw(st.sampled_from([2, 3, 4]))
    styled = STYLES[style](text)
    model = memorizing_model(scripted_lm, tok, styled, data.draw(st.integers(0, 3)))
    ids = tok(styled, add_special_tokens=False)["input_ids"]
    prompt = ids[: data.draw(st.integers(1, max(1, min(len(ids) - 1, 8))))]
    exact = {g for t in WORD_TEXTS for g in word_ngrams(t, n)}
    with tempfile.TemporaryDirectory() as directory:
        filt = word_filter_from_texts(Path(directory) / "w.memfree", WORD_TEXTS, n)
        guard = MemFreeLogitsProcessor(filt, tok)
        torch.manual_seed(0)
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            logits_processor=[guard],
            max_new_tokens=12,
            use_cache=False,
            pad_token_id=tok.eos_token_id,
            **MODES[mode],
        )
        for row in out.tolist():
            assert not emitted_stored(tok, prompt, row[len(prompt) :], exact, n), (style, row)
        filt.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_guard_is_what_stops_the_copy(
    family: str, word_tokenizers: dict[str, Any], scripted_lm: Any, tmp_path: Path
) -> None:
    """Non-vacuous: unguarded, the scripted model copies the stored text, restyled."""
    tok = word_tokenizers[family]
    # WordPiece reads unknown (here: upper-case) words as [UNK], which decodes to nothing.
    styled = STYLES["two_spaces" if family == "wordpiece" else "upper"](WORD_TEXTS[-1])
    model = memorizing_model(scripted_lm, tok, styled, 0)
    ids = tok(styled, add_special_tokens=False)["input_ids"]
    prompt = ids[:4]
    exact = {g for t in WORD_TEXTS for g in word_ngrams(t, 2)}
    filt = word_filter_from_texts(tmp_path / "w.memfree", WORD_TEXTS, 2)
    guard = MemFreeLogitsProcessor(filt, tok)
    runs = {}
    for name, processors in (("plain", []), ("guarded", [guard])):
        out = model.generate(
            torch.tensor([prompt]),
            logits_processor=processors,
            max_new_tokens=10,
            do_sample=False,
            use_cache=False,
            pad_token_id=tok.eos_token_id,
        )
        runs[name] = emitted_stored(tok, prompt, out[0, len(prompt) :].tolist(), exact, 2)
    assert runs["plain"] and not runs["guarded"]
    assert guard.stats.interventions()[0] >= 1


@pytest.mark.parametrize("mode", ["greedy", "beam"])
@pytest.mark.parametrize("style", ["original", "upper"])
def test_token_and_word_guards_compose(
    mode: str, style: str, word_tokenizers: dict[str, Any], scripted_lm: Any, tmp_path: Path
) -> None:
    """Both guards in one generate() (each only removes candidates, so both promises hold):
    neither a stored token n-gram nor a stored word n-gram comes out."""
    tok = word_tokenizers["byte_bpe"]
    token_n, word_n = 4, 3
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in WORD_TEXTS]
    token_ngrams = {tuple(r[i : i + token_n]) for r in rows for i in range(len(r) - token_n + 1)}
    token_filter = NgramFilter.from_ngrams(tmp_path / "t.memfree", np.array(sorted(token_ngrams)))
    word_filter = word_filter_from_texts(tmp_path / "w.memfree", WORD_TEXTS, word_n)
    exact_words = {g for t in WORD_TEXTS for g in word_ngrams(t, word_n)}
    styled = STYLES[style](WORD_TEXTS[0])
    model = memorizing_model(scripted_lm, tok, styled, 0)
    prompt = tok(styled, add_special_tokens=False)["input_ids"][:4]
    found: dict[str, tuple[int, int]] = {}
    for name, processors in (
        ("plain", []),
        (
            "both",
            [MemFreeLogitsProcessor(token_filter, tok), MemFreeLogitsProcessor(word_filter, tok)],
        ),
    ):
        out = model.generate(
            torch.tensor([prompt]),
            logits_processor=processors,
            max_new_tokens=14,
            use_cache=False,
            pad_token_id=tok.eos_token_id,
            **MODES[mode],
        )
        tokens_found = words_found = 0
        for row in out.tolist():
            ids = row[: len(prompt)] + [t for t in row[len(prompt) :] if t != tok.eos_token_id]
            tokens_found += sum(
                tuple(ids[i : i + token_n]) in token_ngrams
                for i in range(max(len(prompt) - token_n + 1, 0), len(ids) - token_n + 1)
            )
            words_found += len(emitted_stored(tok, prompt, ids[len(prompt) :], exact_words, word_n))
        found[name] = (tokens_found, words_found)
    assert found["both"] == (0, 0)
    # Unguarded, the model copies: token n-grams in the original style, word n-grams in both.
    assert found["plain"][1] > 0 and (style != "original" or found["plain"][0] > 0)


# ------------------------------------------------------------------------------------------------
# One filter, every tokenizer


def test_one_filter_answers_the_same_for_every_tokenizer(
    word_tokenizers: dict[str, Any], default_tokenizer: Any, word_filters: dict[int, NgramFilter]
) -> None:
    """Teacher-force each stored text, styled, through each tokenizer: the guard flags exactly
    the steps that complete a stored word n-gram, and the same n-grams for every tokenizer."""
    tokenizers = {**word_tokenizers, "default": default_tokenizer}
    filt = word_filters[3]
    for style in ("original", "upper", "two_spaces", "comment", "underscore_names"):
        flagged: dict[str, set[tuple[str, ...]]] = {}
        for name, tok in tokenizers.items():
            guard = MemFreeLogitsProcessor(filt, tok)
            found: set[tuple[str, ...]] = set()
            for text in WORD_TEXTS[-2:]:
                styled = STYLES[style](text)
                ids = tok(styled, add_special_tokens=False)["input_ids"]
                for k in range(1, len(ids)):
                    mask, _ = guard.blocked_mask(torch.tensor([ids[:k]]), len(tok))
                    before = tok.decode(ids[:k], skip_special_tokens=True)
                    after = tok.decode(ids[: k + 1], skip_special_tokens=True)
                    created = [
                        g
                        for g in new_word_ngrams(before, after, 3)
                        if filt.contains(ngram_hash_rows([g]))[0]
                    ]
                    assert bool(mask[0, ids[k]]) == bool(created), (name, style, k)
                    found.update(created)
            flagged[name] = found
        expected = {g for t in WORD_TEXTS[-2:] for g in word_ngrams(t, 3)}
        for name, found in flagged.items():
            if name == "wordpiece" and style != "original":
                # Its vocabulary was trained on the original casing: other words are [UNK],
                # which decodes to nothing. Fewer n-grams then, never one that is not there.
                assert found <= expected, style
            else:
                assert found == expected, (name, style)


# ------------------------------------------------------------------------------------------------
# Errors


def test_word_guard_errors(tmp_path: Path, tokenizer: Any) -> None:
    words_filter = word_filter_from_texts(tmp_path / "w.memfree", WORD_TEXTS, 2)
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        MemFreeLogitsProcessor(words_filter)
    tokens = NgramFilter.from_ngrams(tmp_path / "t.memfree", [[1, 2]])
    with pytest.raises(FilterMismatchError, match="is a token filter"):
        MemFreeWordLogitsProcessor(tokens, tokenizer)
    other = NgramFilter.from_ngrams(
        tmp_path / "o.memfree", [[1, 2]], metadata={"unit": "word", "normalizer": "other-v9"}
    )
    with pytest.raises(FilterMismatchError, match="other-v9"):
        MemFreeLogitsProcessor(other, tokenizer)
    with pytest.raises(FilterMismatchError, match="holds 2-grams"):
        MemFreeLogitsProcessor(words_filter, tokenizer, ngram_size=3)
    guard = MemFreeLogitsProcessor(str(tmp_path / "w.memfree"), tokenizer)  # a path works too
    assert guard.unit.name == "word" and "normalizer" in repr(guard)
