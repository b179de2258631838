"""A byte-level BPE tokenizer's tables, as canonical decoding reads them.

Canonical decoding (:mod:`memfree.core.canonical`) allows a candidate only when the row's ids
with it appended are exactly the tokenizer's own tokenization of their text. Its tables:

- per token: its text (None for special tokens and for bytes that are not whole UTF-8
  characters), whether the tokenizer gives that token back for its own text (``self_ok``), the
  class of its first character and, when the whole text is one run of one class, that class
  (``run``): the pre-tokenizer's chunks are runs of letters, numbers, punctuation or whitespace;
- the character classes as the tokenizer's own pre-tokenizer sees them: each character is probed
  through it once, so Unicode tables can never disagree with it;
- the merges, for :meth:`ByteLevelBpe.bigram_allowed`: the tokens ``b`` such that BPE gives
  ``[a, b]`` back for the text of ``a`` followed by that of ``b`` (Vieira et al., "Language
  Models over Canonical Byte-Pair Encodings", ICML 2025). A merge across the junction fires
  exactly when some pair (x on the right spine of ``a``'s merge tree, y on the left spine of
  ``b``'s) is a merge whose rank comes before the merges that consume x and y (ties go to the
  leftmost pair, as in Hugging Face ``tokenizers``) while both stand there; no such pair, no
  cross merge. Vocabularies converted from tiktoken's ranks (Llama 3: a merge for every split
  of a token) are read exactly too: a token's tree is the one its own bytes build, and the few
  tokens whose spines the ranks cannot time are read from the merges themselves.

Only the family whose every step memfree models exactly is read: a ``tokenizers`` BPE model
(no dropout, no byte fallback, no subword prefix or suffix) and added tokens that strip nothing,
with either the ``ByteLevel`` pre-tokenizer on GPT-2's split pattern, no prefix space and no
normalizer (SmolLM2, GPT-2, GPT-NeoX/Pythia, StarCoder), or a ``Split`` step on Llama 3's
(cl100k's), Qwen 2's, Mistral Tekken's or OpenAI o200k's pattern before ``ByteLevel``
(``ignore_merges`` and an NFC normalizer allowed: Llama 3, Qwen 2 and 2.5, Mistral Nemo and
later, gpt-oss), or DeepSeek V3's three ``Split`` steps before ``ByteLevel``. Any other
tokenizer is refused with :class:`CanonicalUnsupportedError`, never approximated.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfree.errors import CanonicalUnsupportedError
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.merge_tree import MergeTree
from memfree.vocab.text_search import ids_starting_with

# Character classes, as GPT-2's split pattern sees them:
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
SP, WS, LETTER, NUMBER, APOSTROPHE, PUNCT = range(6)
NONE = -1
# Runs: a token whose whole text is one run of letters, numbers, punctuation (apostrophe
# included) or whitespace.
RUN_LETTERS, RUN_NUMBERS, RUN_PUNCT, RUN_SPACE = range(4)
_RUN_OF = {
    LETTER: RUN_LETTERS,
    NUMBER: RUN_NUMBERS,
    APOSTROPHE: RUN_PUNCT,
    PUNCT: RUN_PUNCT,
    SP: RUN_SPACE,
    WS: RUN_SPACE,
}
WORD_GUARD = (
    "Pass canonical=False (--no-canonical) to guard the token ids only, or build a word filter "
    "(`memfree build --unit word`): the word guard's promise is over the text for every tokenizer."
)


@dataclass(frozen=True, eq=False)
class ByteLevelBpe:
    """The tables of one byte-level BPE tokenizer (build with :meth:`of`).

    Attributes:
        vocab_size: ids the tokenizer can produce.
        texts: each id's text; None for special tokens and partial UTF-8 characters.
        self_ok: bool `(vocab_size,)`: the tokenizer gives ``[id]`` for the id's text.
        first: int8 `(vocab_size,)`: the class of the text's first character (NONE: no text,
            or an added token).
        run: int8 `(vocab_size,)`: the run the whole text is (NONE: it is not one run).
        added: added tokens (special or not): content -> id. The tokenizer cuts text at them.
        ids_of: text -> id, for the base vocabulary's tokens with a text.
        token_bytes: each id's bytes (b"" for special tokens).
        pattern: the split pattern's name when it is a ``Split`` step before ``ByteLevel``
            (Llama 3, Qwen 2: chunks read by :mod:`memfree.core.canonical_split`); None for
            GPT-2's pattern inside ``ByteLevel``.
        model: the tokenizer's BPE model, as its JSON (vocabulary, merges, ``ignore_merges``).
        nfc: the tokenizer normalizes text to NFC first (Qwen 2).
    """

    vocab_size: int
    texts: tuple[str | None, ...]
    self_ok: np.ndarray
    first: np.ndarray
    run: np.ndarray
    added: dict[str, int]
    ids_of: dict[str, int]
    token_bytes: tuple[bytes, ...]
    pattern: str | None
    model: dict[str, Any]
    nfc: bool
    _tokenizer: Any
    tree: MergeTree  # the merges, for the pair test
    _classes: dict[str, int]
    _encoded: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def caches(self) -> tuple[Any, ...]:
        """What these tables fill as they are used (encodings read, the merges-only model,
        late tokens' answers): left empty where the tables are kept on disk."""
        return self._encoded, *self.tree.caches()

    @classmethod
    def of(cls, info: TokenizerInfo) -> ByteLevelBpe:
        """The tables of ``info``'s tokenizer (about a second for a 49k vocabulary).

        Raises:
            CanonicalUnsupportedError: the tokenizer is not of the family read here.
        """
        backend, spec = tokenizer_spec(info)
        pattern = _check_family(info.name, spec)
        model = spec["model"]
        vocab: dict[str, int] = model["vocab"]
        size = info.vocab_size
        token_bytes = info.token_bytes
        texts: list[str | None] = []
        for raw in token_bytes:
            try:
                texts.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        added = {entry["content"]: int(entry["id"]) for entry in spec.get("added_tokens", [])}
        for content, token in added.items():
            if token < size and token not in info.special_token_ids:
                texts[token] = content
        special = set(info.special_token_ids) | {t for t in added.values() if t < size}
        ids = [i for i, text in enumerate(texts) if text is not None]
        encoded = backend.encode_batch([texts[i] for i in ids], add_special_tokens=False)
        self_ok = np.zeros(size, dtype=bool)
        for token, encoding in zip(ids, encoded, strict=True):
            self_ok[token] = encoding.ids == [token]
        classes = _probe_classes(backend.pre_tokenizer, {c for i in ids for c in texts[i] or ""})
        first = np.full(size, NONE, dtype=np.int8)
        run = np.full(size, NONE, dtype=np.int8)
        for token in ids:
            text = texts[token]
            if token in special or not text:
                continue
            first[token], run[token] = _first_and_run(text, classes.__getitem__)
        tree = MergeTree.of(vocab, model["merges"], size)
        ids_of = {text: i for i, text in enumerate(texts) if text is not None and i not in special}
        return cls(
            size, tuple(texts), self_ok, first, run, added, ids_of,
            tuple(b if b is not None else b"" for b in token_bytes), pattern, model,
            (spec.get("normalizer") or {}).get("type") == "NFC", info.tokenizer,
            tree, classes,
        )  # fmt: skip

    def char_class(self, char: str) -> int:
        """The class of one character (probed through the pre-tokenizer once, then kept)."""
        known = self._classes.get(char)
        if known is None:
            pre = self._tokenizer.backend_tokenizer.pre_tokenizer
            known = self._classes[char] = _probe_classes(pre, {char})[char]
        return known

    def first_and_run(self, text: str) -> tuple[int, int]:
        """:attr:`first` and :attr:`run` for a text that is no token's (a character written
        with several tokens, with the head's whole characters before it)."""
        return _first_and_run(text, self.char_class)

    @property
    def tokenizer_backend(self) -> Any:
        """The ``tokenizers.Tokenizer`` itself."""
        return self._tokenizer.backend_tokenizer

    def encode(self, text: str) -> list[int]:
        """The tokenizer's ids for ``text`` (no special tokens added); short texts (a row's
        last chunks, which repeat) are kept."""
        cached = self._encoded.get(text)
        if cached is not None:
            return list(cached)
        backend = self._tokenizer.backend_tokenizer
        ids = list(backend.encode(text, add_special_tokens=False).ids)
        if len(text) <= 64:
            if len(self._encoded) >= 65536:
                self._encoded.clear()
            self._encoded[text] = tuple(ids)
        return ids

    def chunks(self, text: str) -> list[str]:
        """The pre-tokenizer's chunks of ``text``, as text."""
        pre = self._tokenizer.backend_tokenizer.pre_tokenizer
        spans = [span for _, span in pre.pre_tokenize_str(text)]
        return [text[start:end] for start, end in spans]

    def bigram_allowed(self, a: int) -> np.ndarray:
        """bool `(vocab_size,)`: BPE gives ``[a, b]`` back for the bytes of ``a`` then ``b``
        (for every ``b`` BPE gives back alone; the caller checks that): see
        :meth:`~memfree.vocab.merge_tree.MergeTree.bigram_allowed`."""
        return self.tree.bigram_allowed(a)

    def joined(self, a: int) -> np.ndarray:
        """The tokens where :meth:`bigram_allowed` is False, without the row."""
        return self.tree.joined(a)

    def pair_allowed(self, a: int, b: int) -> bool:
        """``bigram_allowed(a)[b]`` without the row."""
        return self.tree.pair_allowed(a, b)

    @property
    def merges_model(self) -> Any:
        """The tokenizer's BPE model without ``ignore_merges`` (the merges alone), built once."""
        return self.tree.merges_model

    def starting_with(self, prefix: str) -> np.ndarray:
        """bool `(vocab_size,)`: the ids whose text starts with ``prefix`` (a search in the
        texts in order, not a pass over the vocabulary)."""
        texts, ids = self._sorted_texts
        return ids_starting_with(texts, ids, prefix, self.vocab_size)

    @functools.cached_property
    def text_lengths(self) -> np.ndarray:
        """int64 `(vocab_size,)`: each id's text's length in characters (0: no text)."""
        return np.array([len(text) if text else 0 for text in self.texts], dtype=np.int64)

    @functools.cached_property
    def whole_last(self) -> np.ndarray:
        """int64 `(vocab_size,)`: 1 where the id's bytes are exactly its text's last character
        (a row that ends in it holds that character in one token), else 0."""
        return np.array(
            [
                int(text is not None and text != "" and len(raw) == len(text[-1].encode()))
                for text, raw in zip(self.texts, self.token_bytes, strict=True)
            ],
            dtype=np.int64,
        )

    @functools.cached_property
    def _sorted_texts(self) -> tuple[list[str], np.ndarray]:
        pairs = sorted((text, token) for token, text in enumerate(self.texts) if text is not None)
        return [text for text, _ in pairs], np.array([t for _, t in pairs], dtype=np.int64)


# Split patterns whose chunks canonical decoding reads through the pre-tokenizer itself
# (memfree.core.canonical_split), as tokenizer.json files write them: one Split step's regex, or
# the regexes of several Split steps in order. A pattern is added only with a tokenizer built as
# that family's is, checked against the definition (tests/memfree/core/test_canonical_split.py).
SPLIT_PATTERNS: dict[str | tuple[str, ...], str] = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "Llama 3",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "Qwen 2",
    # Qwen 3.5: Qwen 2's, with combining marks in words (and never in a punctuation run).
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "Qwen 3.5",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": "Mistral Tekken",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": "OpenAI o200k",
    # DeepSeek V3: three Split steps, one after the other (digits in threes; runs of CJK and
    # kana; then its own pattern: an ASCII mark joins the ASCII word after it). Its
    # tokenizer.json holds carriage returns and newlines themselves in the last one.
    (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
        "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ): "DeepSeek V3",
}


def _check_family(name: str, spec: dict[str, Any]) -> str | None:
    """Raise unless every step of this tokenizer is one that canonical decoding models; the
    name of its split pattern (None: GPT-2's, inside ByteLevel)."""
    model = spec.get("model") or {}
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"a {model.get('type')} model (not BPE)")
    else:
        if model.get("dropout") not in (None, 0, 0.0):
            problems.append("BPE dropout")
        if model.get("byte_fallback"):
            problems.append("byte fallback (a SentencePiece-style BPE)")
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            problems.append("a subword prefix or suffix")
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    pattern = None
    if len(steps) >= 2 and steps[0].get("type") == "Split":
        *splits, level = steps
        regexes = tuple((split.get("pattern") or {}).get("Regex", "") for split in splits)
        pattern = SPLIT_PATTERNS.get(regexes[0] if len(regexes) == 1 else regexes)
        if not (
            pattern
            and all(
                split.get("type") == "Split"
                and split.get("behavior") == "Isolated"
                and not split.get("invert")
                for split in splits
            )
            and level.get("type") == "ByteLevel"
            and not level.get("use_regex", True)
            and not level.get("add_prefix_space", False)
        ):
            problems.append(
                "a split pattern other than GPT-2's, Llama 3's, Qwen 2's, Qwen 3.5's, Tekken's, "
                "o200k's or DeepSeek V3's"
            )
    elif not (
        len(steps) == 1
        and steps[0].get("type") == "ByteLevel"
        and steps[0].get("use_regex", True)
        and not steps[0].get("add_prefix_space", False)
    ):
        kinds = ", ".join(str(step.get("type")) for step in steps)
        problems.append(f"the pre-tokenizer {kinds or None} (not ByteLevel with GPT-2's pattern)")
    normalizer = spec.get("normalizer")
    if normalizer == {"type": "Sequence", "normalizers": []}:
        normalizer = None  # an empty sequence does nothing (DeepSeek V3)
    if normalizer is not None and not (pattern and normalizer.get("type") == "NFC"):
        problems.append(f"a {normalizer.get('type')} normalizer")
    if model.get("ignore_merges") and not pattern:
        problems.append("ignore_merges without Llama 3's split pattern")
    for entry in spec.get("added_tokens", []):
        if entry.get("lstrip") or entry.get("rstrip") or entry.get("single_word"):
            problems.append(f"the added token {entry.get('content')!r} strips spaces")
            break
    if problems:
        raise CanonicalUnsupportedError(
            f"canonical decoding is exact for byte-level BPE tokenizers with GPT-2's, Llama 3's, "
            f"Qwen 2's, Qwen 3.5's, Mistral Tekken's, OpenAI o200k's or DeepSeek V3's split pattern "
            f"(SmolLM2, GPT-2, GPT-NeoX, Llama 3, Qwen 2, Qwen 3.5, Mistral Nemo, gpt-oss, DeepSeek "
            f"V3); {name} has "
            f"{'; '.join(problems)}. " + WORD_GUARD
        )
    return pattern


def tokenizer_spec(info: TokenizerInfo) -> tuple[Any, dict[str, Any]]:
    """The ``tokenizers.Tokenizer`` behind ``info`` and its JSON.

    Raises:
        CanonicalUnsupportedError: a slow (Python) tokenizer.
    """
    backend = getattr(info.tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise CanonicalUnsupportedError(
            f"canonical decoding needs a fast (Rust) tokenizer; {info.name} is a slow one. "
            + WORD_GUARD
        )
    return backend, json.loads(backend.to_str())


def _first_and_run(text: str, class_of: Callable[[str], int]) -> tuple[int, int]:
    """The class of a text's first character, and the run its whole text is (NONE: not one)."""
    kinds = {_RUN_OF[class_of(c)] for c in text}
    return class_of(text[0]), kinds.pop() if len(kinds) == 1 else NONE


def _probe_classes(pre_tokenizer: Any, chars: set[str]) -> dict[str, int]:
    """Each character's class, read from the pre-tokenizer itself: a letter extends the run of
    "a", a number that of "1", punctuation that of "."; anything else is whitespace."""
    classes = {}
    for char in chars:
        if char == "'":
            classes[char] = APOSTROPHE
        elif len(pre_tokenizer.pre_tokenize_str("a" + char)) == 1:
            classes[char] = LETTER
        elif len(pre_tokenizer.pre_tokenize_str("1" + char)) == 1:
            classes[char] = NUMBER
        elif len(pre_tokenizer.pre_tokenize_str("." + char)) == 1:
            classes[char] = PUNCT
        else:
            classes[char] = SP if char == " " else WS
    return classes


def tables_key(info: TokenizerInfo) -> tuple[Any, ...]:
    """What the tables depend on: the vocabulary and special tokens (the fingerprint), and the
    steps around the model, which the fingerprint does not hash (two tokenizers may share a
    vocabulary and split text differently)."""
    backend = getattr(info.tokenizer, "backend_tokenizer", None)
    if backend is None:
        return (info.fingerprint,)
    model = backend.model
    steps = (backend.normalizer, backend.pre_tokenizer)
    return (
        info.fingerprint,
        *(step.__getstate__() if step is not None else None for step in steps),
        type(model).__name__,
        *(getattr(model, name, None) for name in _MODEL_FIELDS),
    )


_MODEL_FIELDS = (
    "dropout",
    "byte_fallback",
    "ignore_merges",
    "continuing_subword_prefix",
    "end_of_word_suffix",
)
__all__ = [
    "WORD_GUARD",
    "ByteLevelBpe",
    "CanonicalUnsupportedError",
    "tables_key",
    "tokenizer_spec",
]
