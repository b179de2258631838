"""Canonical decoding for SentencePiece-style BPE, against the definition.

Vocabularies: Llama 2's (llama.cpp's ``llama-spm`` test vocabulary, 32,000 tokens, read by
transformers from its GGUF file as ``Metaspace(prepend_scheme="first")``), Phi-3's (the same
pieces and 64 added tokens, read as a ``Prepend("▁")`` + ``Replace(" ", "▁")`` normalizer, as
Llama 2's and Mistral's older ``tokenizer.json`` files are), and two tokenizers built in the test
from Llama 2's exactly as those families' ``tokenizer.json`` files are: Gemma's (a ``Replace``
normalizer alone: no ``"▁"`` put before the text) and ``Metaspace(prepend_scheme="always")``;
and a BPE trained here with Llama 2's steps (576 ids: every candidate is checked).

The definition is read with the tokenizer itself: a row (optionally led by beginning of
sequence) is its text's tokenization when some text that normalizes to its pieces is tokenized
as the row (the text is the pieces with ``"▁"`` as a space, with or without the ``"▁"`` the
tokenizer puts first); a candidate is allowed iff some continuation keeps the row a prefix of
such a tokenization.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import canonical_masker
from memfree.core.canonical_spm import SentencePieceMasker
from memfree.vocab.bpe import CanonicalUnsupportedError
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.sentencepiece import SPACE
from tests.conftest import LLAMA_CPP, llama_cpp_tokenizer, train_sentencepiece

pytestmark = pytest.mark.skipif(
    not (LLAMA_CPP / "ggml-vocab-llama-spm.gguf").exists(),
    reason="needs ggml-vocab-llama-spm.gguf in <venv>/vocab/llama.cpp (make setup fetches it)",
)

# Continuations tried after a banned candidate: none keeps it a prefix of a tokenization.
PROBES = ("", " ", "a", "x y", "\n", "日", "🦙", "<", "▁", "  z", "é", "\u0301")
# Texts the rows are cut from: spaces and newlines, code, CJK (mostly spelled in bytes), emoji,
# combining marks, the special tokens' text, and "▁" itself.
ALPHABET = st.sampled_from(
    [
        *"abcdefghij", "the", " the", "ing", " ", "  ", "\n", "\t", "    ", ".", ",", "'",
        "(", ")", "=", "0", "12", "日本", "語", "ẞ", "é", "\u0301", "🦙", "<", "s", ">", "</",
        "▁", "▁▁", "def ", "Hello", " world",
    ]
)  # fmt: skip


def _variant(name: str) -> Any:
    """The tokenizer of one variant (Llama 2's pieces throughout)."""
    if name in ("llama-spm", "phi-3"):
        return llama_cpp_tokenizer(name)
    if name == "trained":  # Llama 2's tokenizer.json steps, a BPE trained here (576 ids)
        return train_sentencepiece()
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(llama_cpp_tokenizer("llama-spm").backend_tokenizer.to_str())
    if name == "gemma":  # Gemma's tokenizer.json: spaces replaced, nothing put first
        spec["normalizer"] = {
            "type": "Replace", "pattern": {"String": " "}, "content": SPACE,
        }  # fmt: skip
        spec["pre_tokenizer"] = None
        spec["decoder"] = {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        }
    else:  # Metaspace, "▁" put before every segment that does not begin with one
        spec["pre_tokenizer"]["prepend_scheme"] = "always"
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


VARIANTS = ("llama-spm", "phi-3", "gemma", "metaspace-always", "trained")


@pytest.fixture(scope="module", params=VARIANTS)
def family(request: pytest.FixtureRequest) -> tuple[Any, SentencePieceMasker]:
    tokenizer = _variant(request.param)
    info = TokenizerInfo.of(tokenizer)
    masker = canonical_masker(info, [info.eos_token_id])
    assert isinstance(masker, SentencePieceMasker)
    return tokenizer, masker


# -- the definition, read with the tokenizer -----------------------------------------------------


def _normalized(
    masker: SentencePieceMasker, ids: list[int], added: dict[int, str] | None = None
) -> tuple[str, ...] | None:
    """The pieces of ``ids`` joined, bytes spelled as their characters and an added token as its
    content (``added``: id -> content; decode writes it so, and the tokenizer cuts its text
    there, as Phi-3's ``</s>``, an added token that is not special), cut into segments after
    each added token; None where the bytes are not whole UTF-8 characters."""
    bpe = masker.bpe
    added = added or {}
    segments: list[str] = []
    parts: list[str] = []
    raw = b""
    for token in [*ids, None]:  # None: the end, where bytes begun must be whole too
        byte = -1 if token is None else int(bpe.byte_of[token])
        if byte >= 0:
            raw += bytes([byte])
            continue
        if raw:
            try:
                parts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                return None
            raw = b""
        if token is None:
            break
        if token in added and bpe.pieces[token] is None:
            assert SPACE not in added[token]  # written as it is: no "▁" to read back as " "
            segments.append("".join([*parts, added[token]]))
            parts = []
        else:
            parts.append(bpe.pieces[token] or "")
    return (*segments, "".join(parts))


def _texts(normalized: tuple[str, ...]) -> list[str]:
    """The texts that may normalize to ``normalized`` (its segments, each but the last ending
    in an added token's content): each segment with or without its first "▁" (the normalizer
    puts one first, and one after an added token under ``Prepend``; elsewhere it is the text's
    space)."""
    variants = [""]
    for part in normalized:
        options = [part, part[1:]] if part.startswith(SPACE) else [part]
        variants = [v + o for v in variants for o in options]
    return [v.replace(SPACE, " ") for v in variants]


def _verdicts(
    tokenizer: Any,
    masker: SentencePieceMasker,
    rows: list[list[int]],
    extras: tuple[str, ...],
    written: bool = True,
) -> list[bool]:
    """For each row (led by beginning of sequence or not): whether some text that normalizes to
    its pieces, followed by one of ``extras``, is tokenized with the row as a prefix ("": as
    the row itself). The beginning of sequence is the tokenizer's (``tokenizer(text)``), or,
    where ``written``, the text's own (``"<s>Hello"``: a prompt that writes it; under
    ``prepend_scheme="first"`` its text then gets no "▁")."""
    bos_id = tokenizer.bos_token_id
    added = {int(i): t.content for i, t in tokenizer.added_tokens_decoder.items()}
    jobs: list[tuple[int, str, bool, str]] = []  # row, text, special tokens added, extra
    for index, row in enumerate(rows):
        bos = row[:1] == [bos_id]
        ids = row[1:] if bos else row
        normalized = _normalized(masker, ids, added)
        if normalized is None:
            continue
        for text in _texts(normalized) if ids else [""]:
            for extra in extras:
                if written or not bos:
                    head = tokenizer.bos_token if bos else ""
                    jobs.append((index, head + text + extra, False, extra))
                if bos:
                    jobs.append((index, text + extra, True, extra))
    backend = tokenizer.backend_tokenizer
    found = [False] * len(rows)
    for special in (False, True):
        batch = [job for job in jobs if job[2] == special]
        encoded = backend.encode_batch([job[1] for job in batch], add_special_tokens=special)
        for (index, _, _, extra), encoding in zip(batch, encoded, strict=True):
            ids, row = encoding.ids, rows[index]
            if special and ids[:1] != [bos_id]:
                continue
            if (ids[: len(row)] == row) if extra else (ids == row):
                found[index] = True
    return found


def _canonical(
    tokenizer: Any,
    masker: SentencePieceMasker,
    row: list[int],
    extra: str = "",
    written: bool = True,
) -> bool:
    """The row is its text's tokenization (``extra``: a prefix of the tokenization of its text
    and ``extra``)."""
    return _verdicts(tokenizer, masker, [row], (extra,), written)[0]


def _encode(tokenizer: Any, text: str, bos: bool) -> list[int]:
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids] if bos else ids


def _candidates(masker: SentencePieceMasker, seed: int) -> list[int]:
    """The candidates a row is checked on: every byte token, piece of one or two characters and
    piece with "<", ">" or "/", and 1,500 others at random (all of a small vocabulary)."""
    bpe = masker.bpe
    if bpe.vocab_size <= 2000:
        return sorted(set(range(bpe.vocab_size)) - masker._cuts)
    focus = [
        token
        for token, piece in enumerate(bpe.pieces)
        if bpe.byte_of[token] >= 0
        or (piece is not None and (len(piece) <= 2 or any(c in piece for c in "<>/")))
    ]
    rng = np.random.default_rng(seed)
    others = rng.choice(bpe.vocab_size, 1500, replace=False).tolist()
    return sorted((set(focus) | set(others)) - masker._cuts)


def _check_row(tokenizer: Any, masker: SentencePieceMasker, row: list[int], seed: int = 0) -> None:
    """Candidates of ``row`` against the definition, both ways, and end of sequence. A row led
    by beginning of sequence and no text yet reads it as the tokenizer's where the tokenizer
    adds one: its first token gets the "▁" the tokenizer puts first (a text that writes "<s>"
    itself is read so only where the prompt already is)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        allowed = masker.allowed(row)
        ends = masker.may_end(row)
    candidates = _candidates(masker, seed)
    grown = [[*row, token] for token in candidates]
    adds = tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
    written = len(row) > 1 or row[:1] != [tokenizer.bos_token_id] or not adds
    exact = _verdicts(tokenizer, masker, grown, ("",), written)
    for token, rows_ok, longer in zip(candidates, exact, grown, strict=True):
        if allowed[token] and not rows_ok:
            # Only inside a character, or a segment that is the "▁" put first: some
            # continuation makes it one.
            assert _verdicts(tokenizer, masker, [longer], PROBES[1:], written)[0] or (
                masker.bpe.byte_of[token] >= 0 and _completes(tokenizer, masker, longer, written)
            ), (row, token)
        if not allowed[token]:
            assert not rows_ok, (row, token)
    banned = [longer for token, longer in zip(candidates, grown, strict=True) if not allowed[token]]
    verdicts = _verdicts(tokenizer, masker, banned, PROBES[1:], written)
    for verdict, longer in zip(verdicts, banned, strict=True):
        assert not verdict, longer
    assert ends == (_canonical(tokenizer, masker, row) or not allowed.any()), row


_VOCABS: dict[int, dict[str, int]] = {}


def _vocab_of(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's vocabulary, read once (``get_vocab()`` builds a new dict each call)."""
    if id(tokenizer) not in _VOCABS:
        _VOCABS[id(tokenizer)] = tokenizer.get_vocab()
    return _VOCABS[id(tokenizer)]


def _first_point(begun: bytes) -> int:
    """A code point no later than the first whose UTF-8 bytes begin with ``begun`` (its lead
    byte and some continuation bytes): ``begun`` padded with the least continuation bytes, where
    that decodes; else the first code point of its length."""
    length = {0xC: 2, 0xD: 2, 0xE: 3, 0xF: 4}[begun[0] >> 4]
    try:
        return ord((begun + b"\x80" * (length - len(begun))).decode("utf-8"))
    except (UnicodeDecodeError, TypeError):  # overlong or surrogate padding: start lower
        return {2: 0x80, 3: 0x800, 4: 0x10000}[length]


def _completes(
    tokenizer: Any, masker: SentencePieceMasker, row: list[int], written: bool = True
) -> bool:
    """Some character's remaining bytes finish the row's last character into a canonical row
    (the first 16 characters that begin with its bytes and that the vocabulary lacks)."""
    bpe = masker.bpe
    byte_tokens = {int(bpe.byte_of[t]): t for t in masker._bytes.tolist()}
    begun = b""
    for token in reversed(row):  # the row's last bytes, back to the character's lead byte
        byte = int(bpe.byte_of[token])
        if byte < 0:
            break
        begun = bytes([byte]) + begun
        if byte >= 0xC0:
            break
    if not begun or begun[0] < 0xC0:
        return False
    tried = 0
    point = _first_point(begun)
    vocab = _vocab_of(tokenizer)
    while point < 0x110000 and tried < 16:  # UTF-8 keeps the order of code points
        data = chr(point).encode("utf-8", "surrogatepass")
        point += 1
        if data[: len(begun)] > begun:
            break
        if not data.startswith(begun) or 0xD800 <= point - 1 < 0xE000:
            continue
        if chr(point - 1) in vocab:
            continue
        tried += 1
        finished = [*row, *(byte_tokens[b] for b in data[len(begun) :])]
        if _canonical(tokenizer, masker, finished, written=written):
            return True
    return False


# -- tests -----------------------------------------------------------------------------------------


def test_the_loaded_vocabularies_tokenize_as_llama_cpp_does() -> None:
    """Llama 2's and Phi-3's tokenizers as transformers reads their GGUF files give llama.cpp's
    own ids for its test texts (``.gguf.out``), before anything is checked with them. llama.cpp
    always puts a "▁" first (as ``Prepend`` does, and Phi-3's reading); transformers reads Llama
    2's file as ``Metaspace(prepend_scheme="first")``, which puts none before a text that begins
    with a space: those texts (15 of 47) differ there, by design."""
    for name in ("llama-spm", "phi-3"):
        tokenizer = llama_cpp_tokenizer(name)
        texts = (LLAMA_CPP / f"ggml-vocab-{name}.gguf.inp").read_text()
        lines = (LLAMA_CPP / f"ggml-vocab-{name}.gguf.out").read_text().split("\n")
        pairs = list(zip(texts.split("\n__ggml_vocab_test__\n"), lines, strict=False))
        agreed = [
            text
            for text, line in pairs
            if tokenizer(text, add_special_tokens=False)["input_ids"]
            == [int(i) for i in line.split()]
        ]
        spaced = sum(text.startswith(" ") for text, _ in pairs)
        assert len(agreed) == len(pairs) - (spaced if name == "llama-spm" else 0), name


def test_the_rows_read_at_build_are_the_merges_own() -> None:
    """Llama 2's runs of "▁" (indentation, in code) have a late node on their right spine, so
    their merge-tree rows are read from the merges themselves: once, when the tables are built
    (read on first use, each stalled the step that met it for a sixth of a second). What the
    tables keep, and a pickle of them gives back, is the merges' own answer."""
    import dataclasses

    tree = canonical_masker(TokenizerInfo.of(llama_cpp_tokenizer("llama-spm"))).bpe.tree
    late = np.flatnonzero(tree.late[0])
    assert late.size and tree.late_rows is not None and sorted(tree.late_rows) == late.tolist()
    kept = pickle.loads(pickle.dumps(tree))  # as the tables' file keeps them
    fresh = dataclasses.replace(tree, late_rows=None)  # read from the merges on use
    for a in late.tolist():
        row = fresh.bigram_allowed(a)
        assert not row.all()  # a run of spaces goes on with some token: a real row
        assert np.array_equal(tree.bigram_allowed(a), row)
        assert np.array_equal(kept.bigram_allowed(a), row)


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_llama_cpp_test_texts_keep_every_next_token(name: str) -> None:
    """Along the tokenizer's own tokenization of llama.cpp's test texts (after beginning of
    sequence, as ``tokenizer(text)`` gives them), no next token is banned, and end of sequence
    is allowed exactly where the row is its text's tokenization."""
    tokenizer = llama_cpp_tokenizer(name)
    info = TokenizerInfo.of(tokenizer)
    masker = canonical_masker(info, [info.eos_token_id])
    texts = (LLAMA_CPP / f"ggml-vocab-{name}.gguf.inp").read_text().split("\n__ggml_vocab_test__\n")
    steps = 0
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        for end in range(1, len(ids) + 1):
            banned = masker.banned_mask(torch.tensor([ids[:end]]), info.vocab_size)[0][0].numpy()
            if end < len(ids):
                steps += 1
                assert not banned[ids[end]], (name, text, end)
            assert banned[info.eos_token_id] != _canonical(tokenizer, masker, ids[:end]), (
                name, text, end,
            )  # fmt: skip
    assert steps >= 450  # bytes of characters Llama 2 lacks, newlines (<0x0A>) and spaces


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(parts=st.lists(ALPHABET, min_size=1, max_size=10), cut=st.floats(0, 1), bos=st.booleans())
def test_every_candidate_against_the_definition(
    family: tuple[Any, SentencePieceMasker], parts: list[str], cut: float, bos: bool
) -> None:
    """On a prefix of a text's tokenization, with or without beginning of sequence: every
    allowed candidate keeps the row a prefix of a tokenization, every banned one does not
    (as the row ends, nor after any of 12 continuations), and end of sequence is allowed
    exactly where the row is its text's tokenization."""
    tokenizer, masker = family
    ids = _encode(tokenizer, "".join(parts), bos)
    row = ids[: int(cut * len(ids))]
    _check_row(tokenizer, masker, row)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), bos=st.booleans())
@example(seed=475, bos=False)  # Phi-3: the walk ended in "</s>" when the guard wrote it
def test_walks_stay_canonical(
    family: tuple[Any, SentencePieceMasker], seed: int, bos: bool
) -> None:
    """Walks that pick allowed candidates at random (bytes and spaces often) never dead-end,
    and each row is a prefix of a tokenization: its text's own wherever no character is left
    unfinished. The step's state, advanced token by token, agrees with a fresh read."""
    tokenizer, masker = family
    rng = np.random.default_rng(seed)
    row = [tokenizer.bos_token_id] if bos else []
    bpe = masker.bpe
    favoured = np.flatnonzero((bpe.byte_of >= 0) | bpe.spaced)
    for _ in range(24):
        allowed = masker.allowed(row)
        assert allowed.any(), row
        pool = np.flatnonzero(allowed)
        lucky = np.intersect1d(pool, favoured)
        token = int(rng.choice(lucky if lucky.size and rng.random() < 0.5 else pool))
        before = masker.state(row)
        row.append(token)
        assert masker.advance(before, token) == masker.state(row), row
        if masker.may_end(row):
            assert _canonical(tokenizer, masker, row), row


@pytest.mark.parametrize(
    "text",
    [
        "Hello\n\nWorld",
        "def f(x):\n    return x\n",
        "  two spaces",
        "日本語 ok",
        "🦙 llama",
        "a\u0301",
    ],
)
def test_rows_of_ordinary_text(family: tuple[Any, SentencePieceMasker], text: str) -> None:
    """Rows of ordinary text (blank lines before column 0, indentation, characters spelled in
    bytes), four prefixes each against the definition."""
    tokenizer, masker = family
    ids = _encode(tokenizer, text, True)
    for end in sorted({2, len(ids) // 2, len(ids) - 1, len(ids)}):
        _check_row(tokenizer, masker, ids[:end])


def test_a_special_tokens_text_is_never_spelled(family: tuple[Any, SentencePieceMasker]) -> None:
    """``"</s"`` then ``">"``: the text would read back as end of sequence, so ``">"`` (every
    piece that begins with it, and its byte token) is banned there. Special tokens are allowed
    only to end."""
    tokenizer, masker = family
    row = _encode(tokenizer, "x </s", True)
    assert row[-1] != tokenizer.eos_token_id
    allowed = masker.allowed(row)
    closing = masker.bpe.starting_with(">") | (masker.bpe.byte_of == ord(">"))
    assert closing.any() and not (allowed & closing).any()
    assert not allowed[list(masker.info.special_token_ids)].any()


@pytest.mark.parametrize("text", ["a</s>b", "x</s> y z", "Hi<s>日本", "a<unk>\n\nb"])
def test_text_after_a_special_token(family: tuple[Any, SentencePieceMasker], text: str) -> None:
    """Special tokens written in a prompt's text cut it: along the tokenizer's tokenization no
    next token is banned, and right after the cut a piece without "▁" is allowed exactly where
    the tokenizer puts no "▁" before a segment that is not the text's first (Metaspace "first",
    Gemma), and banned where it does (Prepend, Metaspace "always")."""
    tokenizer, masker = family
    ids = _encode(tokenizer, text, True)
    for end in range(1, len(ids)):
        if ids[end] not in masker._cuts:
            assert masker.allowed(ids[:end])[ids[end]], (text, end)
    cut = max(i for i, token in enumerate(ids) if token in masker._cuts and i > 0)
    allowed = masker.allowed(ids[: cut + 1])
    bare = masker.bpe.self_ok & ~masker.bpe.spaced
    assert allowed[bare].any() == (masker.bpe.prepend in ("first", "never"))
    assert allowed[masker.bpe.spaced & masker.bpe.self_ok].any()


@pytest.mark.parametrize("name", VARIANTS[:4])
def test_byte_tokens_spell_only_characters_the_vocabulary_lacks(name: str) -> None:
    """A newline (``<0x0A>``: Llama 2 has no piece for it) is allowed; the bytes of ``"a"`` or
    of ``"日"`` (pieces of their own) are not; inside ``"ẞ"`` (spelled in bytes) only its
    continuations are allowed, and end of sequence is refused until it is whole (Llama 2's
    pieces)."""
    tokenizer = _variant(name)
    masker = canonical_masker(TokenizerInfo.of(tokenizer), [tokenizer.eos_token_id])
    assert isinstance(masker, SentencePieceMasker)
    bpe = masker.bpe
    byte = {int(bpe.byte_of[t]): t for t in masker._bytes.tolist()}
    row = _encode(tokenizer, "Hello", True)
    allowed = masker.allowed(row)
    assert allowed[byte[0x0A]] and not allowed[byte[ord("a")]]
    assert not allowed[byte[0xE6]] or bpe.lacks_some(0x6000, 0x6FFF)
    inside = [*row, byte[0xE1], byte[0xBA]]
    allowed = masker.allowed(inside)
    assert allowed[byte[0x9E]] and not allowed[bpe.self_ok].any()
    assert not masker.may_end(inside) and masker.may_end([*inside, byte[0x9E]])


def test_the_prepended_space_alone_may_go_on_but_not_end() -> None:
    """With ``Prepend("▁")`` (Phi-3), a segment that is that ``"▁"`` alone has no text: the row
    ``[<s>, "▁"]`` may go on (``"▁", "日"`` is the tokenization of ``"日"``), but end of sequence
    is refused there; with ``Metaspace`` it is the tokenization of the text ``" "``."""
    for name, ends in (("phi-3", False), ("llama-spm", True)):
        tokenizer = llama_cpp_tokenizer(name)
        info = TokenizerInfo.of(tokenizer)
        masker = canonical_masker(info, [info.eos_token_id])
        space = tokenizer.convert_tokens_to_ids(SPACE)
        row = [tokenizer.bos_token_id, space]
        assert masker.may_end(row) == ends, name
        assert masker.allowed(row).any()
        assert _canonical(tokenizer, masker, row) == ends


def test_steps_read_rows_as_fresh_reads_do(family: tuple[Any, SentencePieceMasker]) -> None:
    """A batch of rows growing a token a step (the engine's case, advanced from the last step)
    bans exactly what fresh reads ban (by a pickled copy, as engines ship the guard to their
    workers); padding on the left adds no text."""
    tokenizer, masker = family
    texts = ["Hello\n\nWorld and more", "日本語 is spelled", "x = [1,  2]\n\tdone"]
    rows = [_encode(tokenizer, text, True) for text in texts]
    width = masker.info.vocab_size
    fresh = pickle.loads(pickle.dumps(masker))  # its own caches: each row below read afresh
    for end in range(2, min(len(r) for r in rows)):
        batch = [row[:end] for row in rows]
        longest = max(len(r) for r in batch)
        padded = torch.tensor([[-1] * (longest - len(r)) + r for r in batch])
        banned = masker.banned_mask(padded, width)[0].numpy()
        for index, row in enumerate(batch):
            expected = fresh.banned_mask(torch.tensor([row]), width)[0][0].numpy()
            assert np.array_equal(banned[index], expected), (index, end)


def test_other_sentencepiece_steps_are_refused_by_name() -> None:
    """A Metaspace that splits at spaces, or an NFKC normalizer, is refused with the reason and
    the alternatives (never approximated)."""
    spec = json.loads(llama_cpp_tokenizer("llama-spm").backend_tokenizer.to_str())
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    for change, words in (
        (lambda s: s["pre_tokenizer"].update(split=True), "splits at spaces"),
        (lambda s: s.update(normalizer={"type": "NFKC"}), "NFKC normalizer"),
    ):
        changed = json.loads(json.dumps(spec))
        change(changed)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(json.dumps(changed))
        )
        with pytest.raises(CanonicalUnsupportedError, match=words) as raised:
            canonical_masker(TokenizerInfo.of(tokenizer))
        assert "canonical=False" in str(raised.value) and "--unit word" in str(raised.value)


# -- generate() with a SentencePiece-style tokenizer ---------------------------------------------

PASSAGE = "the quick brown fox jumps over the lazy dog and runs far away"
PROMPT = "the quick"


def _stored_in(ids: list[int], stored: set[tuple[int, ...]]) -> int:
    return sum(tuple(ids[i : i + 3]) in stored for i in range(len(ids) - 2))


def _greedy(model: Any, tokenizer: Any, guard: Any | None) -> list[int]:
    ids = tokenizer(PROMPT, return_tensors="pt").to(model.device)
    out = model.generate(
        **ids,
        logits_processor=[guard] if guard is not None else None,
        max_new_tokens=30,
        do_sample=False,
        pad_token_id=tokenizer.eos_token_id,
    )
    row: list[int] = out[0].tolist()
    return row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row


@pytest.mark.parametrize("name", ["phi-3", "llama-spm"])
def test_generate_spelling_a_stored_passage_another_way(name: str, tmp_path: Path) -> None:
    check_spelled_passage(name, tmp_path, "cpu")


def check_spelled_passage(name: str, tmp_path: Path, device: str) -> None:
    """A tiny Llama trained here to continue ``"the quick"`` with the rest of a stored passage
    spelled one character piece at a time (``"▁", "b", "r", ...``: ids no tokenizer would give
    that text). Guarded over the ids only, its copy goes through (no stored n-gram in its ids)
    and its text, tokenized again, holds the stored n-grams. Guarded canonically (the default),
    the output is its text's tokenization and that text holds no stored n-gram."""
    from memfree import MemFreeLogitsProcessor, NgramFilter
    from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint
    from tests.conftest import train_on_rows

    tokenizer = llama_cpp_tokenizer(name)
    prompt = tokenizer(PROMPT)["input_ids"]
    spelled = [
        tokenizer.convert_tokens_to_ids(c) for c in PASSAGE[len(PROMPT) :].replace(" ", SPACE)
    ]
    model = train_on_rows(tokenizer, [prompt + spelled], window=len(prompt + spelled), steps=120)
    model = model.to(device)
    canonical = tokenizer(PASSAGE, add_special_tokens=False)["input_ids"]
    stored = {tuple(canonical[i : i + 3]) for i in range(len(canonical) - 2)}
    filt = NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array(sorted(stored)),
        false_positive_rate=1e-9,
        metadata={
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "special_token_ids": list(special_token_ids(tokenizer)),
        },
    )
    ids_only = _greedy(
        model, tokenizer, MemFreeLogitsProcessor(filt, tokenizer=tokenizer, canonical=False)
    )
    assert ids_only[len(prompt) :] == spelled[: len(ids_only) - len(prompt)]  # the copy
    assert _stored_in(ids_only, stored) == 0
    again = tokenizer(tokenizer.decode(ids_only, skip_special_tokens=True))["input_ids"]
    assert _stored_in(again, stored) > 5  # the text holds the passage's n-grams
    guarded = _greedy(model, tokenizer, MemFreeLogitsProcessor(filt, tokenizer=tokenizer))
    again = tokenizer(tokenizer.decode(guarded, skip_special_tokens=True))["input_ids"]
    assert len(guarded) >= len(prompt) + 10, guarded  # it writes on, not only end of sequence
    assert again == guarded  # prompt and output: their text's tokenization
    assert _stored_in(again, stored) == 0


def test_generate_changes_nothing_where_nothing_stored_is_at_stake(tmp_path: Path) -> None:
    """A tiny Llama trained on the passage's own tokenization (Phi-3's reading: Prepend), and a
    filter that stores nothing it writes: canonical decoding changes no greedy output."""
    from memfree import MemFreeLogitsProcessor, NgramFilter
    from memfree.vocab.tokenizer import tokenizer_fingerprint
    from tests.conftest import train_on_rows

    tokenizer = llama_cpp_tokenizer("phi-3")
    rows = [tokenizer(PASSAGE + "\n\nThe end.\n")["input_ids"]]
    model = train_on_rows(tokenizer, rows, window=len(rows[0]), steps=120)
    filt = NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array([[7, 8, 9]]),
        metadata={"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)},
    )
    plain = _greedy(model, tokenizer, None)
    assert plain[: len(rows[0])] == rows[0][: len(plain)]  # it learned the passage
    assert _greedy(model, tokenizer, MemFreeLogitsProcessor(filt, tokenizer=tokenizer)) == plain


def test_an_added_token_is_not_written_where_the_text_after_it_would_not_read_back() -> None:
    """Phi-3's ``</s>`` is an added token that is not special, and its normalizer puts "▁"
    before every segment: ``"x</s>Just"`` is ``x, </s>, ▁Just``, which decodes as
    ``"x</s> Just"``, tokenized ``x, </s>, ▁, Just``. No text after the token reads back as its
    ids, so the guard never writes it (as a special token other than end of sequence); a
    prompt that holds it is continued as its tokenizer reads it."""
    tokenizer = _variant("phi-3")
    info = TokenizerInfo.of(tokenizer)
    masker = canonical_masker(info, [info.eos_token_id])
    assert isinstance(masker, SentencePieceMasker)
    added = masker.bpe.added["</s>"]
    assert added not in info.special_token_ids
    ids = _encode(tokenizer, "x</s>Just", False)
    assert ids[1] == added and _encode(tokenizer, tokenizer.decode(ids), False) != ids
    for row in ([], ids[:1], _encode(tokenizer, "Hello world.\n", True)):
        assert not masker.allowed(row)[added], row
    assert masker.allowed(ids[:2])[ids[2]]
