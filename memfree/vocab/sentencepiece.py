"""A SentencePiece-style BPE tokenizer's tables, as canonical decoding reads them.

Llama 2, Mistral (up to v0.3), Phi-3 and Gemma tokenize with a ``tokenizers`` BPE model over
the whole text at once: no pre-tokenizer cuts it into chunks. Spaces become ``"▁"`` (a
``Replace`` normalizer or a ``Metaspace`` pre-tokenizer that does not split), a ``"▁"`` may be
put before the text (``Prepend``; ``Metaspace``'s ``prepend_scheme``), and a character the
vocabulary lacks is written as its UTF-8 bytes, one ``<0xNN>`` token each (byte fallback).

Text is cut at added tokens only. Inside a segment, BPE starts from the characters (the bytes
of a character the vocabulary lacks stand alone: no merge holds a byte token), so a segment's
tokens are the tokenizer's own exactly when (Vieira et al., ICML 2025) every token that is not
a byte is BPE's own for its piece, every adjacent pair of such tokens is
(:meth:`~memfree.vocab.merge_tree.MergeTree.bigram_allowed`), every run of byte tokens spells
characters the vocabulary lacks, and the segment starts with ``"▁"`` where the tokenizer puts
one there. :class:`SentencePieceBpe` holds what those tests read;
:mod:`memfree.core.canonical_spm` decides with them.

Read only where every step is modelled: a BPE model (no dropout, no subword prefix or suffix,
no ``ignore_merges``), a normalizer of ``Prepend("▁")`` and ``Replace(" ", "▁")`` steps or a
``Metaspace`` pre-tokenizer that does not split, and added tokens that strip nothing. Any other
tokenizer is refused with :class:`~memfree.vocab.bpe.CanonicalUnsupportedError`.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from memfree.vocab.bpe import WORD_GUARD, CanonicalUnsupportedError, tokenizer_spec
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.merge_tree import MergeTree
from memfree.vocab.text_search import ids_starting_with

SPACE = "\u2581"  # "▁": SentencePiece's space
_BYTE = re.compile(r"<0x([0-9A-F]{2})>")
# Where the tokenizer puts a "▁" before a segment of text (a stretch between added tokens).
PREPEND_ALWAYS = "always"  # Prepend("▁"): before every segment, even one that starts with "▁"
PREPEND_UNLESS_SPACE = "unless-space"  # Metaspace "always": before every segment not so begun
PREPEND_FIRST = "first"  # Metaspace "first": before the text's first segment, not so begun
PREPEND_NEVER = "never"  # Gemma: nowhere


def is_sentencepiece(info: TokenizerInfo) -> bool:
    """Whether ``info``'s tokenizer looks SentencePiece-style (byte fallback, ``Metaspace`` or a
    normalizer that writes spaces as ``"▁"``): the family :class:`SentencePieceBpe` reads."""
    backend = getattr(info.tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return False
    text = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
    return bool(model.get("byte_fallback")) or "Metaspace" in text or SPACE in text


@dataclass(frozen=True, eq=False)
class SentencePieceBpe:
    """The tables of one SentencePiece-style BPE tokenizer (build with :meth:`of`).

    Attributes:
        vocab_size: ids the tokenizer can produce.
        pieces: each id's piece as the model writes it (``"▁"`` for a space); None for byte
            tokens, special and added tokens.
        byte_of: int16 `(vocab_size,)`: the byte a ``<0xNN>`` token writes (-1: not one).
        self_ok: bool `(vocab_size,)`: BPE gives ``[id]`` back for the id's piece.
        spaced: bool `(vocab_size,)`: the piece starts with ``"▁"``.
        chars: the code points the vocabulary has as one-character pieces, sorted (every other
            character is written as its bytes).
        prepend: where the tokenizer puts a ``"▁"`` before a segment (``PREPEND_*``).
        added: added tokens (special or not): content -> id. The tokenizer cuts text at them.
        tree: the merges, for the pair test.
    """

    vocab_size: int
    pieces: tuple[str | None, ...]
    byte_of: np.ndarray
    self_ok: np.ndarray
    spaced: np.ndarray
    chars: np.ndarray
    prepend: str
    added: dict[str, int]
    tree: MergeTree
    _tokenizer: Any

    @classmethod
    def of(cls, info: TokenizerInfo) -> SentencePieceBpe:
        """The tables of ``info``'s tokenizer (about a second for a 32k vocabulary).

        Raises:
            CanonicalUnsupportedError: the tokenizer is not of the family read here.
        """
        backend, spec = tokenizer_spec(info)
        prepend = _check_family(info.name, spec)
        model = spec["model"]
        vocab: dict[str, int] = model["vocab"]
        size = info.vocab_size
        added = {entry["content"]: int(entry["id"]) for entry in spec.get("added_tokens", [])}
        cut = set(added.values()) | set(info.special_token_ids)
        pieces: list[str | None] = [None] * size
        byte_of = np.full(size, -1, dtype=np.int16)
        for piece, token in vocab.items():
            if token >= size or token in cut:
                continue
            match = _BYTE.fullmatch(piece) if model.get("byte_fallback") else None
            if match:
                byte_of[token] = int(match.group(1), 16)
            else:
                pieces[token] = piece
        self_ok = np.zeros(size, dtype=bool)
        tokenize = backend.model.tokenize
        for token, written in enumerate(pieces):
            if written is not None:
                self_ok[token] = [t.id for t in tokenize(written)] == [token]
        spaced = np.array([p is not None and p.startswith(SPACE) for p in pieces], dtype=bool)
        chars = np.array(sorted({ord(p) for p in pieces if p is not None and len(p) == 1}))
        tree = MergeTree.of(
            vocab, model["merges"], size, byte_fallback=bool(model.get("byte_fallback"))
        )
        return cls(
            size, tuple(pieces), byte_of, self_ok, spaced, chars.astype(np.int64), prepend,
            added, tree, info.tokenizer,
        )  # fmt: skip

    def bigram_allowed(self, a: int) -> np.ndarray:
        """bool `(vocab_size,)`: BPE gives ``[a, b]`` back for the piece of ``a`` then that of
        ``b`` (for every ``b`` BPE gives back alone; the caller checks that)."""
        return self.tree.bigram_allowed(a)

    def has_char(self, char: str) -> bool:
        """Whether the vocabulary has ``char`` as a piece (else BPE writes its bytes)."""
        point = ord(char)
        at = bisect.bisect_left(self.chars, point)
        return at < len(self.chars) and int(self.chars[at]) == point

    def lacks_some(self, low: int, high: int) -> bool:
        """Whether some character from code point ``low`` to ``high`` (surrogates apart) is not
        a piece: one that byte tokens may spell."""
        if low > high:
            return False
        total = high - low + 1 - max(0, min(high, 0xDFFF) - max(low, 0xD800) + 1)
        start = bisect.bisect_left(self.chars, low)
        end = bisect.bisect_right(self.chars, high)
        return total > end - start

    def tokenize(self, normalized: str) -> list[int]:
        """The model's ids for a segment as the normalizer left it (``"▁"`` for spaces)."""
        return [t.id for t in self._tokenizer.backend_tokenizer.model.tokenize(normalized)]

    @functools.cached_property
    def sorted_pieces(self) -> tuple[list[str], np.ndarray]:
        """The pieces' texts (``"▁"`` as a space) in order, with their ids: for a search by
        prefix."""
        pairs = sorted(
            (piece.replace(SPACE, " "), token)
            for token, piece in enumerate(self.pieces)
            if piece is not None
        )
        return [text for text, _ in pairs], np.array([t for _, t in pairs], dtype=np.int64)

    def starting_with(self, prefix: str) -> np.ndarray:
        """bool `(vocab_size,)`: the pieces whose text (``"▁"`` as a space) starts with
        ``prefix``."""
        texts, ids = self.sorted_pieces
        return ids_starting_with(texts, ids, prefix, self.vocab_size)


def _check_family(name: str, spec: dict[str, Any]) -> str:
    """Raise unless every step of this tokenizer is one modelled here; where it puts a "▁"."""
    model = spec.get("model") or {}
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"a {model.get('type')} model (not BPE)")
    else:
        if model.get("dropout") not in (None, 0, 0.0):
            problems.append("BPE dropout")
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            problems.append("a subword prefix or suffix")
        if model.get("ignore_merges"):
            problems.append("ignore_merges")
    normalizer = spec.get("normalizer") or {}
    steps = (
        normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    )
    prepend, spaces = PREPEND_NEVER, False
    for step in steps:
        kind = step.get("type")
        if kind is None:
            continue
        if kind == "Prepend" and step.get("prepend") == SPACE:
            prepend = PREPEND_ALWAYS
        elif kind == "Replace" and step.get("pattern") == {"String": " "}:
            spaces = step.get("content") == SPACE
            if not spaces:
                problems.append(f"a Replace normalizer to {step.get('content')!r}")
        else:
            problems.append(f"a {kind} normalizer")
    pre = spec.get("pre_tokenizer")
    if pre is not None:
        if pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE:
            if pre.get("split", True):
                problems.append("a Metaspace pre-tokenizer that splits at spaces")
            scheme = pre.get("prepend_scheme", "always")
            if prepend == PREPEND_NEVER:
                prepend = {"always": PREPEND_UNLESS_SPACE, "first": PREPEND_FIRST}.get(
                    scheme, PREPEND_NEVER
                )
            spaces = True
        else:
            problems.append(f"the pre-tokenizer {pre.get('type')}")
    if not spaces and not problems:
        problems.append('no step that writes spaces as "▁"')
    for entry in spec.get("added_tokens", []):
        if entry.get("lstrip") or entry.get("rstrip") or entry.get("single_word"):
            problems.append(f"the added token {entry.get('content')!r} strips spaces")
            break
        if entry.get("normalized") and " " in entry.get("content", ""):
            problems.append(f"the added token {entry.get('content')!r} is normalized")
            break
    if problems:
        raise CanonicalUnsupportedError(
            f"canonical decoding is exact for SentencePiece-style BPE tokenizers (Llama 2, "
            f"Mistral up to v0.3, Phi-3, Gemma: spaces written as '▁' by a Replace normalizer "
            f"or a Metaspace pre-tokenizer that does not split, byte fallback); {name} has "
            f"{'; '.join(problems)}. " + WORD_GUARD
        )
    return prepend


__all__ = [
    "PREPEND_ALWAYS",
    "PREPEND_FIRST",
    "PREPEND_NEVER",
    "PREPEND_UNLESS_SPACE",
    "SPACE",
    "SentencePieceBpe",
    "is_sentencepiece",
]
