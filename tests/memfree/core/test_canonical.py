"""Canonical decoding (issue 25): a candidate is allowed iff the row's ids with it appended are
exactly the tokenizer's own tokenization of their text.

Checked with Hypothesis against the definition itself (decode, tokenize again, compare), for
every candidate of random rows: random texts (code, prose, whitespace runs, digits, unicode,
contractions, special-token text) cut into canonical and non-canonical splits, on SmolLM2's real
tokenizer and on a byte-level BPE trained here. Other families are refused, never approximated.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import warnings
import weakref
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.storage import cache_dir
from memfree.units import stored_ngram_counts
from memfree.vocab.bpe import CanonicalUnsupportedError
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint
from tests.conftest import train_sentencepiece, train_wordpiece

PIECES = [
    "def f(x):\n",
    "    return x + 1\n",
    "\tif a:\n\t\tpass",
    "The quick brown fox",
    " jumps over",
    "it's",
    "we're",
    "they'll",
    "I've",
    "'d",
    "'",
    "''",
    "'r",
    "e",
    "l",
    "  ",
    "   ",
    " \n",
    "\n\n",
    "\r\n",
    " \t ",
    "12345",
    "3.14",
    " 42",
    "café",
    "naïve",
    "日本語",
    "😀",
    "a\u0301",
    "\u00a0",
    "\u2028",
    "!!",
    "...",
    " (",
    "{}",
    "x",
    "X",
    " ",
]
SPECIAL_PIECES = ["<|im_end|>", "<|im_start|>", "<file_sep>", "<|im", "<file", "<"]


def _texts(pieces: list[str]) -> st.SearchStrategy[str]:
    piece = st.sampled_from(pieces) | st.text(
        alphabet=st.sampled_from(list("ab 1'\n\t.é")), min_size=1, max_size=4
    )
    return st.lists(piece, min_size=1, max_size=8).map("".join)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _split(tokenizer: Any, text: str, how: int, cut: int) -> list[int]:
    """The text's ids: its tokenization (how 0), or a non-canonical split: the tokenizations
    of two halves (how 1), one token spelled as two (how 2), or a special or added token's
    content spelled in plain tokens, tokenized as two parts (how 3: the tokenizer would read
    it back as that token)."""
    ids = _encode(tokenizer, text)
    if how == 3:
        contents = {int(i): t.content for i, t in tokenizer.added_tokens_decoder.items()}
        spelled = [index for index, token in enumerate(ids) if len(contents.get(token, "")) > 1]
        if spelled:
            index = spelled[cut % len(spelled)]
            content = contents[ids[index]]
            at = 1 + cut % (len(content) - 1)
            plain = _encode(tokenizer, content[:at]) + _encode(tokenizer, content[at:])
            return ids[:index] + plain + ids[index + 1 :]
    if how == 1 and len(text) > 1:
        at = 1 + cut % (len(text) - 1)
        return _encode(tokenizer, text[:at]) + _encode(tokenizer, text[at:])
    if how == 2 and ids:
        index = cut % len(ids)
        piece = tokenizer.convert_ids_to_tokens(ids[index])
        if len(piece) > 1:
            parts = tokenizer.convert_tokens_to_ids([piece[:1], piece[1:]])
            if tokenizer.unk_token_id not in parts and None not in parts:
                return ids[:index] + [int(p) for p in parts] + ids[index + 1 :]
    return ids


# Texts that may follow a candidate's text: enough to find a witness for every split reading of
# a trailing whitespace run (a newline alone, a space joined to a letter, digit or punctuation).
PROBES = ("a", "A", "1", ".", "(", "'", "/", "\n", " ", "日", "😀", "\u0301")


def _definition(
    tokenizer: Any, info: TokenizerInfo, row: list[int], *, extendable: bool = True
) -> tuple[np.ndarray, bool]:
    """:func:`_encoded_definition`, kept in memfree's cache (``test-references``) under
    everything that decides it: the tokenizer's whole pipeline (its ``tokenizer.json``: model,
    merges, normalizer, pre-tokenizer, added tokens), the tokenizers library's version, the
    bytes each id writes, the reference's own source, the row and ``extendable``. A row's
    reference encodes every candidate's text with the real tokenizer (2 s for 151k ids): the
    parametrized tests check the same rows on every run. A kept answer that does not read back
    is computed again; the folder keeps the 8,000 answers used last (the parametrized rows, read
    on every run, stay; Hypothesis's rows, new each run, make way)."""
    key = hashlib.sha256(_tokenizer_key(tokenizer, info).encode())
    key.update(f"\0{row}\0{extendable}".encode())
    kept = _REFERENCES / f"{key.hexdigest()[:32]}.bin"
    size = info.vocab_size
    try:
        data = kept.read_bytes()
        if len(data) == (size + 7) // 8 + 1:
            allowed = np.unpackbits(np.frombuffer(data[1:], np.uint8), count=size).astype(bool)
            with contextlib.suppress(OSError):
                os.utime(kept)  # used now: the folder keeps its most recently used answers
            return allowed, data[0] == 1
    except OSError:
        pass
    allowed, ends = _encoded_definition(tokenizer, info, row, extendable=extendable)
    with contextlib.suppress(OSError):
        _REFERENCES.mkdir(parents=True, exist_ok=True)
        temporary = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        temporary.write_bytes(bytes([int(ends)]) + np.packbits(allowed).tobytes())
        os.replace(temporary, kept)  # whole or absent: two workers may write it at once
        _prune(_REFERENCES, 8000)
    return allowed, ends


_REFERENCES = cache_dir() / "test-references"
_WRITES: list[int] = []
_TOKENIZER_KEYS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _tokenizer_key(tokenizer: Any, info: TokenizerInfo) -> str:
    """What decides a reference besides the row (see :func:`_definition`), once per object."""
    known = _TOKENIZER_KEYS.get(tokenizer)
    if known is None:
        digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
        digest.update(b"\0".join(token or b"" for token in info.token_bytes))
        digest.update(f"\0{version('tokenizers')}\0{PROBES}".encode())
        for helper in (_encoded_definition, _added):
            digest.update(inspect.getsource(helper).encode())
        known = _TOKENIZER_KEYS[tokenizer] = digest.hexdigest()
    return known


def _prune(folder: Path, keep: int) -> None:
    """Drop the files of ``folder`` used least recently past the ``keep`` used last (checked
    every 64 writes)."""
    _WRITES.append(1)
    if len(_WRITES) % 64:
        return
    files = sorted(folder.glob("*.bin"), key=lambda p: p.stat().st_mtime)
    for stale in files[: max(len(files) - keep, 0)]:
        stale.unlink(missing_ok=True)


def _encoded_definition(
    tokenizer: Any, info: TokenizerInfo, row: list[int], *, extendable: bool = True
) -> tuple[np.ndarray, bool]:
    """(bool `(vocab,)`, bool): the candidates ``c`` for which some text ``w`` makes ``row +
    [c]`` a prefix of the tokenization of ``text(row + [c]) + w`` (special tokens written out,
    as decode writes them); and whether ``row`` is the tokenization of its text, ended here.

    ``w`` is the empty text (the row as it ends) or one of :data:`PROBES`. Probes are tried only
    where the text ends in whitespace: with these split patterns a chunk boundary moves with
    what follows only at a trailing whitespace run (``\\s+(?!\\S)`` leaves its last character
    to what follows; docs/canonical.md). Candidates that are not whole UTF-8 characters are
    left out (their text is not text): a masker that writes them is checked on them in
    ``test_canonical_chars.py``; the others must ban them.
    ``extendable=False``: the row as it ends only."""
    backend = tokenizer.backend_tokenizer
    token_bytes = list(info.token_bytes)
    for content, token in _added(tokenizer).items():
        token_bytes[token] = content.encode()
    base = b"".join(token_bytes[t] or b"" for t in row)
    ids, candidates = [], []
    for token, raw in enumerate(token_bytes):
        try:
            candidates.append((base + (raw or b"")).decode("utf-8"))
        except UnicodeDecodeError:
            continue
        ids.append(token)
    allowed = np.zeros(info.vocab_size, dtype=bool)
    encoded = backend.encode_batch(candidates, add_special_tokens=False)
    probed: list[tuple[int, str]] = []
    for token, text, encoding in zip(ids, candidates, encoded, strict=True):
        allowed[token] = encoding.ids == [*row, token]
        if extendable and not allowed[token] and text[-1:].isspace():
            probed.extend((token, text + probe) for probe in PROBES)
    if probed:
        found = backend.encode_batch([text for _, text in probed], add_special_tokens=False)
        for (token, _), encoding in zip(probed, found, strict=True):
            if encoding.ids[: len(row) + 1] == [*row, token]:
                allowed[token] = True
    try:
        ends = backend.encode(base.decode("utf-8"), add_special_tokens=False).ids == row
    except UnicodeDecodeError:
        ends = False
    return allowed, ends


def _added(tokenizer: Any) -> dict[str, int]:
    return {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}


def _check_rows(
    tokenizer: Any, masker: CanonicalMasker, rows: list[list[int]], *, extendable: bool = True
) -> None:
    """Each row's mask equals the definition's, candidate by candidate; end of sequence is
    allowed exactly where the row is its text's tokenization or nothing else is allowed."""
    info = masker.info
    special = list(info.special_token_ids)
    ends = list(masker.end_token_ids)
    for row in rows:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            context = torch.tensor([row or [0]])[:, : len(row)]
            banned, active = masker.banned_mask(context, info.vocab_size)
        assert active.all()
        expected, may_end = _definition(tokenizer, info, row, extendable=extendable)
        # The one deliberate difference: a special token is allowed only to end the output.
        expected[special] = False
        text = info.decode(row)
        got = ~banned[0].numpy()
        eos = got[ends].copy()
        got[ends] = False
        if masker._chars is not None:  # tokens that are not whole characters: test_canonical_chars
            partial = masker._chars.is_head | masker._chars.is_cont
            expected[partial] = got[partial]
        wrong = np.flatnonzero(got != expected)
        assert not wrong.size, (text, row, [(info.decode([int(t)]), got[t]) for t in wrong[:8]])
        assert (eos == (may_end or not expected.any())).all(), (text, row, may_end)


def check_both_ways(tokenizer: Any, masker: CanonicalMasker, rows: list[list[int]]) -> None:
    """:func:`_check_rows` over every prefix of a row in order (each advanced from the one
    before), then again from the longest (each read whole, with what the masker kept from the
    others: a verdict kept for one row must hold for the next; the definitions are kept)."""
    _check_rows(tokenizer, masker, rows)
    _check_rows(tokenizer, masker, rows[::-1])


@pytest.fixture(scope="module")
def smol(default_tokenizer: Any) -> tuple[Any, CanonicalMasker]:
    info = TokenizerInfo.of(default_tokenizer)
    return default_tokenizer, CanonicalMasker(info, [info.eos_token_id])


@settings(max_examples=14, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=_texts(PIECES + SPECIAL_PIECES),
    how=st.integers(0, 3),
    cut=st.integers(0, 10_000),
    at=st.integers(0, 10_000),
)
def test_smollm2_allowed_iff_canonical_for_every_candidate(
    smol: tuple[Any, CanonicalMasker], text: str, how: int, cut: int, at: int
) -> None:
    tokenizer, masker = smol
    ids = _split(tokenizer, text, how, cut)
    end = at % (len(ids) + 1)
    _check_rows(tokenizer, masker, [ids[:end], ids])


@pytest.mark.parametrize(
    "text",
    [
        "x = 1  \n\n    def f(a, b):\n\t\treturn a's + b're",
        "it'r", "it'l", "it'v", "'ll", "a \nb", "a  b", "a   b\t\tc \n d", "<|im", "日本",
        # A blank line before a line at column 0, a space run before a digit (issue 35).
        "Hello\n\nWorld", "x = 1\n\n# comment\n", "Hello world.\n\nThe end",
        "x\n\n\n\ndef g():", "a  1", "x \ny", "1.\n\n2. b\n\n\t\tc",
    ],
)  # fmt: skip
def test_smollm2_every_prefix_of_hard_texts(smol: tuple[Any, CanonicalMasker], text: str) -> None:
    tokenizer, masker = smol
    ids = _encode(tokenizer, text)
    _check_rows(tokenizer, masker, [ids[:end] for end in range(len(ids) + 1)])


def check_spelled_added(tokenizer: Any, new_masker: Any, content: str, after: str = "") -> None:
    """A row that spells an added token's content in plain tokens (then ``after``) is not
    canonical (the tokenizer cuts the content as its token), however the masker met it: read
    whole by a new masker, or after any of its beginnings (one token shorter: advanced; shorter
    still: read whole with the verdicts kept from the beginning)."""
    ids = _encode(tokenizer, content[:-1]) + _encode(tokenizer, content[-1] + after)
    assert ids != _encode(tokenizer, content + after)  # the tokenizer cuts the content
    for begun in range(len(ids)):
        _check_rows(tokenizer, new_masker(), [ids[:begun], ids])


@pytest.mark.parametrize("after", ["", " = 1"])
@pytest.mark.parametrize("content", ["<file_sep>", "<|im_start|>"])
def test_smollm2_a_row_that_spells_an_added_token_is_not_canonical(
    default_tokenizer: Any, content: str, after: str
) -> None:
    """Found by Hypothesis in a full run: after the row ``<file_sep`` (plain tokens), the
    row with ``>`` appended was advanced as canonical, and a row read whole reused a prefix's
    verdict kept from a row that did not complete the content."""
    info = TokenizerInfo.of(default_tokenizer)
    check_spelled_added(
        default_tokenizer, lambda: CanonicalMasker(info, [info.eos_token_id]), content, after
    )


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    # The trained tokenizer's special tokens, whole and begun (spelled where a row is cut in one).
    text=_texts([*PIECES, "<|endoftext|>", "<|endo", "<pad>"]),
    how=st.integers(0, 3),
    cut=st.integers(0, 10_000),
)
def test_trained_bpe_allowed_iff_canonical_for_every_candidate(
    tokenizer: Any, text: str, how: int, cut: int
) -> None:
    info = TokenizerInfo.of(tokenizer)
    masker = _trained_masker(tokenizer)
    ids = _split(tokenizer, text, how, cut)
    check_both_ways(tokenizer, masker, [ids[:end] for end in range(len(ids) + 1)])
    assert info.eos_token_id is not None


_MASKERS: dict[int, CanonicalMasker] = {}


def _trained_masker(tokenizer: Any) -> CanonicalMasker:
    masker = _MASKERS.get(id(tokenizer))
    if masker is None:
        info = TokenizerInfo.of(tokenizer)
        masker = _MASKERS[id(tokenizer)] = CanonicalMasker(info, [info.eos_token_id])
    return masker


def _filter_for(tokenizer: Any, path: Path, ngrams: list[list[int]]) -> NgramFilter:
    return NgramFilter.from_ngrams(
        path,
        ngrams,
        false_positive_rate=1e-9,
        metadata={
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "special_token_ids": list(special_token_ids(tokenizer)),
        },
    )


def test_other_families_are_refused_naming_the_word_guard(tmp_path: Path) -> None:
    """WordPiece (BERT) is refused, naming the alternatives; SentencePiece-style BPE is read
    (:mod:`memfree.core.canonical_spm`, tested in test_canonical_spm.py)."""
    spm = train_sentencepiece()
    guard = MemFreeLogitsProcessor(_filter_for(spm, tmp_path / "s.memfree", [[5, 6, 7]]), spm)
    assert guard.canonical is True
    tokenizer = train_wordpiece()
    path = tmp_path / "f.memfree"
    ngram_filter = _filter_for(tokenizer, path, [[5, 6, 7]])
    with pytest.raises(CanonicalUnsupportedError, match="word filter") as error:
        MemFreeLogitsProcessor(ngram_filter, tokenizer)
    assert "canonical=False" in str(error.value)
    guard = MemFreeLogitsProcessor(ngram_filter, tokenizer, canonical=False)
    assert guard.canonical is False and "canonical=False" in repr(guard)


def test_the_guard_is_canonical_by_default(tmp_path: Path, tokenizer: Any) -> None:
    ngram_filter = _filter_for(tokenizer, tmp_path / "f.memfree", [[5, 6, 7]])
    guard = MemFreeLogitsProcessor(ngram_filter, tokenizer)
    assert guard.canonical and "canonical=True" in repr(guard)
    assert "text tokenized again" in guard.setup.promise
    ids_only = MemFreeLogitsProcessor(ngram_filter, tokenizer, canonical=False)
    assert not ids_only.canonical and "not their text" in ids_only.setup.promise
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        MemFreeLogitsProcessor(ngram_filter, canonical=True, eos_token_id=0)
    assert not MemFreeLogitsProcessor(ngram_filter, eos_token_id=0).canonical
    with pytest.raises(ValueError, match="canonical must be"):
        MemFreeLogitsProcessor(ngram_filter, tokenizer, canonical="yes")  # type: ignore[arg-type]


def test_special_tokens_only_end_the_output(smol: tuple[Any, CanonicalMasker]) -> None:
    """A special token inside the text would split a stored n-gram in the ids while the text,
    with special tokens skipped, still holds it: only end of sequence is allowed."""
    tokenizer, masker = smol
    row = _encode(tokenizer, "the quick brown")
    banned, _ = masker.banned_mask(torch.tensor([row]), len(tokenizer))
    eos = tokenizer.eos_token_id
    specials = [t for t in special_token_ids(tokenizer) if t != eos]
    assert not banned[0, eos] and banned[0, specials].all()
    assert masker.allowed(row)[_encode(tokenizer, " fox")[0]]


def test_a_prompt_that_ends_mid_word_stays_canonical(smol: tuple[Any, CanonicalMasker]) -> None:
    """A prompt given as text is its text's tokenization, also mid-word: each allowed token
    keeps prompt + output the tokenization of their text, so a word the prompt began is
    finished only where the tokenizer would spell it that way."""
    tokenizer, masker = smol
    prompt = _encode(tokenizer, "The quick bro")
    allowed = masker.allowed(prompt)
    info = masker.info
    whole = np.array([text is not None for text in masker.bpe.texts])  # others: chars tests
    for token in np.flatnonzero(allowed & whole)[:: max(1, int(allowed.sum()) // 200)]:
        ids = [*prompt, int(token)]
        assert _encode(tokenizer, info.decode(ids)) == ids
    assert not allowed[_encode(tokenizer, "wn")[0]] or _encode(tokenizer, "The quick brown")[
        -2:
    ] == [prompt[-1], _encode(tokenizer, "wn")[0]]


def test_a_prompt_not_tokenized_from_its_text_warns_and_allows_only_repairs(
    smol: tuple[Any, CanonicalMasker],
) -> None:
    """Prompt ids that are not their text's tokenization: no output keeps the row canonical
    unless it repairs the prompt's last chunks, so usually only end of sequence is left; the
    guard warns once and never allows a token the definition refuses."""
    tokenizer, masker = smol
    good = _encode(tokenizer, "Hello there, general Kenobi")
    broken = _encode(tokenizer, "Hello") + _encode(tokenizer, " the") + _encode(tokenizer, "re")
    broken += _encode(tokenizer, ", general Kenobi")
    assert broken != good
    fresh = CanonicalMasker(masker.info, masker.end_token_ids)
    with pytest.warns(RuntimeWarning, match="prompt"):
        banned, _ = fresh.banned_mask(torch.tensor([broken]), len(tokenizer))
    allowed = ~banned[0].numpy()
    assert allowed.sum() == 1 and allowed[tokenizer.eos_token_id]


def test_a_special_token_does_not_hide_an_earlier_segment(
    smol: tuple[Any, CanonicalMasker],
) -> None:
    """Special tokens cut the text, but the row before the last one must be canonical too: a
    chat template's earlier message tokenized by hand leaves nothing to allow."""
    tokenizer, masker = smol
    row = _encode(tokenizer, "d") + _encode(tokenizer, "ef f(x):\n<|im_end|>")
    _check_rows(tokenizer, masker, [row, _encode(tokenizer, "def f(x):\n<|im_end|>")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert not masker.allowed(row).any()


def test_a_prompt_cut_before_a_word_and_the_text_count(
    smol: tuple[Any, CanonicalMasker], tmp_path: Path
) -> None:
    """A prompt cut from a longer text can end in a whitespace run split as it is before the
    next word (its text alone would not be so split). Canonical decoding allows only a word
    that keeps that split; the text count blames the output only for windows holding one of its
    own tokens, not for the prompt's own ids."""
    tokenizer, masker = smol
    ids = _encode(tokenizer, "a\n    1000")
    prompt, output = ids[:3], ids[3:]
    assert _encode(tokenizer, tokenizer.decode(prompt)) != prompt
    allowed = masker.allowed(prompt)
    assert allowed[output[0]] and not allowed[_encode(tokenizer, " ")[0]]
    own = _filter_for(tokenizer, tmp_path / "own.memfree", [prompt])
    assert stored_ngram_counts(own, prompt, output, tokenizer=tokenizer, text=True)[0] == 0
    crossing = _filter_for(tokenizer, tmp_path / "crossing.memfree", [ids[1:4]])
    assert stored_ngram_counts(crossing, prompt, output, tokenizer=tokenizer, text=True)[0] == 1
