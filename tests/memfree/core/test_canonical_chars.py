"""Canonical decoding writes characters the tokenizer writes with several tokens (issue 35): a
head (the first bytes of a character) is allowed iff some completion keeps the row canonical,
and a row inside a character allows exactly the continuations some completion keeps canonical.

Checked on SmolLM2's real tokenizer (the default model's; 239 heads, 74 continuation tokens,
none going on past its character) and GPT-2's real vocabulary (llama.cpp's test vocabulary, read
by transformers from its GGUF file; continuation tokens that go on past their character, such as
``"\xad\xe6"``), against the tokenizer itself: along texts in many scripts the tokenizer's own next
token is never banned; every head some completion keeps canonical is allowed; walks that take
allowed heads and continuations never reach a row with no way on, and every text they complete is
tokenized back to exactly their ids. Along llama.cpp's own tokenizer test texts, for each of its
GPT-2-pattern vocabularies, no next token is banned.
"""

from __future__ import annotations

import itertools
import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.core.canonical_chars import utf8_length
from memfree.vocab.bpe import LETTER, PUNCT
from memfree.vocab.info import TokenizerInfo
from tests.conftest import LLAMA_CPP, llama_cpp_tokenizer

SCRIPTS = [
    "日本語のテキストです。",
    "中文注释",
    "艾晨",
    "싱가포르",
    "Привет мир",
    "ภาษาไทย",
    "ភាសាខ្មែរ",
    "हिन्दी",
    "العربية",
    "עברית",
    "😀",
    "🎉🎉",
    "👩\u200d💻",
    "🇫🇷",
    "𝐀𝐁",
    "𝟘𝟙",
    "ꙮ",
    "\u3000",
    "“quoted” — ‘x’ … ™ ©",
    "naïve café",
    "a\u0301",
]
ASCII = ["def f(x):\n", "    return x", " ", "  ", "\n\n", "The end.", "it's", "'", "12", "(", ": "]


def _texts() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(SCRIPTS + ASCII), min_size=1, max_size=6).map("".join)


_NEEDS_LLAMA_CPP = pytest.mark.skipif(
    not (LLAMA_CPP / "ggml-vocab-gpt-2.gguf").exists(),
    reason="needs llama.cpp's test vocabularies in <venv>/vocab/llama.cpp (make setup fetches them)",
)


def _masker(tokenizer: Any) -> CanonicalMasker:
    info = TokenizerInfo.of(tokenizer)
    ends = [info.eos_token_id] if info.eos_token_id is not None else []
    return CanonicalMasker(info, ends)


@pytest.fixture(scope="module")
def smol(default_tokenizer: Any) -> tuple[Any, CanonicalMasker]:
    return default_tokenizer, _masker(default_tokenizer)


def _needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not (LLAMA_CPP / f"ggml-vocab-{name}.gguf").exists(),
        reason=f"needs ggml-vocab-{name}.gguf in <venv>/vocab/llama.cpp (make setup fetches it)",
    )


@pytest.fixture(
    scope="module",
    params=[
        "smollm2",
        *(pytest.param(name, marks=_needs(name)) for name in ("gpt-2", "llama-bpe", "qwen2")),
    ],
)
def vocab(request: pytest.FixtureRequest, default_tokenizer: Any) -> tuple[Any, CanonicalMasker]:
    """SmolLM2's tokenizer, GPT-2's vocabulary (whose continuation tokens go on past their
    character), and Llama 3's and Qwen 2's (split patterns: the chunks are read through the
    pre-tokenizer)."""
    if request.param == "smollm2":
        return default_tokenizer, _masker(default_tokenizer)
    tokenizer = llama_cpp_tokenizer(request.param)
    return tokenizer, _masker(tokenizer)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _allowed(masker: CanonicalMasker, row: list[int]) -> np.ndarray:
    """The candidates the step allows after ``row`` (end of sequence included)."""
    context = torch.tensor([row or [0]])[:, : len(row)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # rows here are all canonical
        banned, _ = masker.banned_mask(context, masker.info.vocab_size)
    allowed: np.ndarray = ~banned[0].numpy()
    return allowed


def test_the_vocabulary_is_read_as_heads_and_continuations(
    smol: tuple[Any, CanonicalMasker],
) -> None:
    _, masker = smol
    chars = masker._chars
    assert chars is not None
    assert int(chars.is_head.sum()) == 239 and int(chars.is_cont.sum()) == 74
    # Each head has a pseudo candidate per class of character it can begin: " \xe6" begins
    # CJK letters only; "\xf0\x9f" emoji (punctuation to the pattern), never a letter.
    ids = masker.bpe.ids_of
    heads = {data: token for token, data in enumerate(masker.bpe.token_bytes)}
    assert set(chars.columns[heads[b" \xe6"]]) == {LETTER}
    emoji = set(chars.columns[heads[b"\xf0\x9f"]])
    assert PUNCT in emoji and LETTER not in emoji
    assert "a" in ids  # sanity: whole tokens are not heads
    assert not chars.is_head[ids["a"]] and not chars.is_cont[ids["a"]]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=_texts())
def test_the_tokenizers_own_next_token_is_never_banned(
    vocab: tuple[Any, CanonicalMasker], text: str
) -> None:
    """Along the tokenizer's own tokenization of text in many scripts, every next token is
    allowed (heads and continuations of characters without a token of their own included), and
    end of sequence exactly at the end of each whole character (the row is then its text's
    tokenization) or a whitespace run."""
    tokenizer, masker = vocab
    ids = _encode(tokenizer, text)
    eos = masker.info.eos_token_id
    for end in range(len(ids) + 1):
        allowed = _allowed(masker, ids[:end])
        if end < len(ids):
            assert allowed[ids[end]], (text, end, masker.info.token_bytes[ids[end]])
        data = b"".join(masker.info.token_bytes[t] for t in ids[:end])
        try:
            ended = _encode(tokenizer, data.decode("utf-8")) == ids[:end]
        except UnicodeDecodeError:
            ended = False
        assert allowed[eos] == ended, (text, end)


def _completions(begun: bytes, rng: random.Random, count: int = 96) -> list[str]:
    """Characters that begin with ``begun``: all of them where few, else a sample."""
    rest = utf8_length(begun[0]) - len(begun)
    tails = list(itertools.product(range(0x80, 0xC0), repeat=rest))
    if len(tails) > count:
        tails = rng.sample(tails, count)
    found = []
    for tail in tails:
        try:
            found.append((begun + bytes(tail)).decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return found


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=_texts(), at=st.integers(0, 10_000), seed=st.integers(0, 2**16))
def test_a_head_some_character_completes_is_allowed(
    vocab: tuple[Any, CanonicalMasker], text: str, at: int, seed: int
) -> None:
    """No over-ban: for every head, the characters it can begin (all, or a sample of 96 for
    3- and 4-byte characters) are tried after the row; where one keeps ``row + [head]`` a
    prefix of the tokenization, the head is allowed."""
    tokenizer, masker = vocab
    chars = masker._chars
    assert chars is not None
    ids = _encode(tokenizer, text)
    row = ids[: at % (len(ids) + 1)]
    data = b"".join(masker.info.token_bytes[t] for t in row)
    try:
        base = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # a row inside a character: the walks test those
    allowed = _allowed(masker, row)
    rng = random.Random(seed)
    texts, heads = [], []
    for head, (whole, begun) in chars.parts.items():
        for char in _completions(begun, rng):
            texts.append(base + whole + char)
            heads.append(head)
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    witnesses: dict[int, list[str]] = {}
    for head, text, encoding in zip(heads, texts, encoded, strict=True):
        if encoding.ids[: len(row) + 1] == [*row, head]:
            witnesses.setdefault(head, []).append(text[len(base) :])
    missed = [h for h in witnesses if not allowed[h]]
    # The one over-ban docs/canonical.md states: a whitespace character written with several
    # tokens, after a whitespace run, read as the run's split reading ("   ", "\x85" before
    # "x" with Qwen 2's vocabulary). Any other miss fails.
    stated = [h for h in missed if base[-1:].isspace() and all(w.isspace() for w in witnesses[h])]
    missed = [masker.info.token_bytes[h] for h in missed if h not in stated]
    assert not missed, (base, missed[:8])
    assert witnesses  # the sample reached some head


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    start=st.sampled_from(["", "Hello", "日本", " x = ", "a\n\n", "'", "中", "😀 "]), data=st.data()
)
def test_walks_through_characters_never_dead_end_and_stay_canonical(
    vocab: tuple[Any, CanonicalMasker], start: str, data: st.DataObject
) -> None:
    """Safety: a walk that takes allowed tokens (heads and continuations first) always has a
    token to take but end of sequence, is never allowed to end inside a character, and every
    text it completes (ending in a character that is not whitespace) is tokenized back to
    exactly its ids."""
    tokenizer, masker = vocab
    chars = masker._chars
    assert chars is not None
    info = masker.info
    eos = info.eos_token_id
    row = _encode(tokenizer, start)
    for _ in range(data.draw(st.integers(1, 10))):
        allowed = _allowed(masker, row)
        ends = bool(allowed[eos])
        allowed[eos] = False
        choices = np.flatnonzero(allowed[: info.vocab_size])
        assert choices.size, (start, row)
        partial = [int(t) for t in choices if chars.is_head[t] or chars.is_cont[t]]
        pool = partial if partial and data.draw(st.integers(0, 9)) < 7 else choices.tolist()
        raw = b"".join(info.token_bytes[t] for t in row)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            assert not ends and all(chars.is_cont[t] for t in choices)
        row = [*row, int(data.draw(st.sampled_from(pool)))]
        raw = b"".join(info.token_bytes[t] for t in row)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text and not text[-1].isspace():
            assert _encode(tokenizer, text) == row, (text, row)


def test_inside_a_character_only_continuations_and_no_special_token(
    vocab: tuple[Any, CanonicalMasker],
) -> None:
    """After the head of a character that has no token of its own, only continuation tokens
    that keep the row canonical are allowed: no whole token, no special token, no end."""
    tokenizer, masker = vocab
    chars = masker._chars
    assert chars is not None
    ids = next(  # a character this vocabulary writes with several tokens
        ids
        for ids in (_encode(tokenizer, text) for text in ("Hello 😀", "Hello 🦙", "Hello ꙮ"))
        if chars.is_head[ids].any()
    )
    cut = next(i for i, t in enumerate(ids) if chars.is_head[t]) + 1
    allowed = _allowed(masker, ids[:cut])
    assert allowed[ids[cut]]
    assert not allowed[list(masker.info.special_token_ids)].any()
    assert chars.is_cont[np.flatnonzero(allowed)].all()
    # The characters it completes: each allowed continuation makes one whose chain is its
    # text's tokenization.
    for token in np.flatnonzero(allowed).tolist():
        raw = b"".join(masker.info.token_bytes[t] for t in [*ids[:cut], token])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert _encode(tokenizer, text) == [*ids[:cut], token]


# llama.cpp's vocabularies of byte-level BPE that transformers reads, and how many of the steps
# along their test texts are a head or a continuation (at least).
_PARTIAL = {
    "gpt-2": 90, "starcoder": 90, "deepseek-coder": 90, "deepseek-llm": 90, "falcon": 50,
    "llama-bpe": 60, "qwen2": 30, "qwen35": 30,
}  # fmt: skip


def llama_cpp_texts(tokenizer: Any, name: str) -> list[str]:
    """llama.cpp's tokenizer test texts (the ``.gguf.inp`` beside test vocabulary ``name``) that
    ``tokenizer`` tokenizes as llama.cpp does (its ids in the ``.gguf.out``)."""
    texts = (LLAMA_CPP / f"ggml-vocab-{name}.gguf.inp").read_text().split("\n__ggml_vocab_test__\n")
    lines = (LLAMA_CPP / f"ggml-vocab-{name}.gguf.out").read_text().split("\n")
    return [
        text
        for text, line in zip(texts, lines, strict=False)
        if _encode(tokenizer, text) == [int(i) for i in line.split()]
    ]


@pytest.mark.parametrize("name", [pytest.param(n, marks=_needs(n)) for n in _PARTIAL])
def test_llama_cpp_test_texts_keep_every_next_token(name: str) -> None:
    """llama.cpp's tokenizer test texts (the ``.gguf.inp`` beside each test vocabulary): the
    tokenizer transformers reads from the GGUF file is checked against llama.cpp's own ids
    (``.gguf.out``) first; then, along its tokenization of each text it agrees on, no next token
    is banned (heads and continuations of characters included: 90 to 188 of the steps per
    vocabulary) and end of sequence is allowed exactly where the row is its text's
    tokenization. Before issue 35 the guard banned the next token at 116 of GPT-2's 473 steps."""
    tokenizer = llama_cpp_tokenizer(name)
    agreed = llama_cpp_texts(tokenizer, name)
    assert len(agreed) >= 38, (name, len(agreed))  # transformers' reading of the GGUF file
    masker = _masker(tokenizer)
    info = masker.info
    eos = info.eos_token_id
    partial = 0
    for text in agreed:
        ids = _encode(tokenizer, text)
        for end in range(len(ids) + 1):
            context = torch.tensor([ids[:end] or [0]])[:, :end]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                banned = masker.banned_mask(context, info.vocab_size)[0][0].numpy()
            if end < len(ids):
                assert not banned[ids[end]], (name, text, end, info.token_bytes[ids[end]])
                partial += masker._chars is not None and bool(
                    masker._chars.is_head[ids[end]] or masker._chars.is_cont[ids[end]]
                )
            if eos is not None:
                raw = b"".join(info.token_bytes[t] for t in ids[:end])
                try:
                    ended = _encode(tokenizer, raw.decode("utf-8")) == ids[:end]
                except UnicodeDecodeError:
                    ended = False
                assert banned[eos] != ended, (name, text, end)
    assert partial >= _PARTIAL[name]  # the texts hold characters written with several tokens


@pytest.mark.parametrize(
    "text, head",
    [
        ("שלי", b"\xd7"),  # SmolLM2: a Hebrew letter here would join the row's last token
        ("Hello ", b"\xf0\x9f"),
        ("中", b"\xe6"),
        ("x = ", b"\xe2\x80"),
        ("日本", b"\xe8"),
        ("Привет", b"\xd0"),
    ],
)
def test_inside_a_character_each_completion_is_allowed_iff_canonical(
    vocab: tuple[Any, CanonicalMasker], text: str, head: bytes
) -> None:
    """Exact, both ways: after a row and the first bytes of a character, each continuation
    token that finishes the character is allowed iff the row with it is its text's
    tokenization. After "שלי" the byte ``\\xd7`` can begin punctuation (``׳``) but not a letter
    (SmolLM2 merges ``"\\xd7\\x99\\xd7"`` then): only completions that are not letters stay."""
    tokenizer, masker = vocab
    chars = masker._chars
    assert chars is not None
    info = masker.info
    ids = {data: token for token, data in enumerate(info.token_bytes) if data}
    row = [*_encode(tokenizer, text), ids[head]]
    allowed = _allowed(masker, row)
    rest = utf8_length(head[0]) - len(head)
    checked = 0
    for token, data, lead in chars.conts:
        if lead != rest:
            continue
        try:
            full = (b"".join(info.token_bytes[t] for t in row) + data).decode("utf-8")
        except UnicodeDecodeError:
            continue  # ends inside a later character: the walks test those
        checked += 1
        assert allowed[token] == (_encode(tokenizer, full) == [*row, token]), (full, data)
    assert checked


def test_a_pickled_masker_answers_rows_inside_characters_alike(
    vocab: tuple[Any, CanonicalMasker],
) -> None:
    """Engines copy guards into workers: a pickled masker (its caches and the rules' columns
    made anew) answers every prefix of a text with characters of several tokens as the
    original does."""
    import pickle

    tokenizer, masker = vocab
    copy = pickle.loads(pickle.dumps(masker))
    ids = _encode(tokenizer, "日本語 😀 ok ꙮ")
    for end in range(len(ids) + 1):
        assert (_allowed(copy, ids[:end]) == _allowed(masker, ids[:end])).all(), end
