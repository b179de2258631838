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

import bisect
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfree.vocab.info import TokenizerInfo
from memfree.vocab.token_bytes import UnsupportedTokenizerError

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
_INF = np.iinfo(np.int64).max
_WORD_GUARD = (
    "Pass canonical=False (--no-canonical) to guard the token ids only, or build a word filter "
    "(`memfree build --unit word`): the word guard's promise is over the text for every tokenizer."
)


class CanonicalUnsupportedError(UnsupportedTokenizerError):
    """Canonical decoding is not exact for this tokenizer, so it is refused."""


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
    _left: np.ndarray  # (V,) left child of each merged token (-1: none)
    _right: np.ndarray
    _made_at: np.ndarray  # (V,) rank of the merge that makes the token (_INF: not merged)
    _partners: tuple[np.ndarray, np.ndarray, np.ndarray]  # CSR by left: offsets, right, rank
    _members: tuple[np.ndarray, np.ndarray, np.ndarray]  # CSR by symbol: offsets, token, rho
    _classes: dict[str, int]
    _late: tuple[np.ndarray, np.ndarray]  # (V,) bool: a late node on the right / left spine
    _encoded: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _merges_only: list[Any] = field(default_factory=list)  # the model without ignore_merges

    @classmethod
    def of(cls, info: TokenizerInfo) -> ByteLevelBpe:
        """The tables of ``info``'s tokenizer (about a second for a 49k vocabulary).

        Raises:
            CanonicalUnsupportedError: the tokenizer is not of the family read here.
        """
        backend = getattr(info.tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise CanonicalUnsupportedError(
                f"canonical decoding needs a fast (Rust) tokenizer; {info.name} is a slow one. "
                + _WORD_GUARD
            )
        spec = json.loads(backend.to_str())
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
        left, right, made_at, partners = _merge_tree(model["merges"], vocab, size)
        members = _left_spines(left, made_at, size)
        late = _late_spines(left, right, made_at)
        ids_of = {text: i for i, text in enumerate(texts) if text is not None and i not in special}
        return cls(
            size, tuple(texts), self_ok, first, run, added, ids_of,
            tuple(b if b is not None else b"" for b in token_bytes), pattern, model,
            (spec.get("normalizer") or {}).get("type") == "NFC", info.tokenizer,
            left, right, made_at, partners, members, classes, late,
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
        (for every ``b`` BPE gives back alone; the caller checks that).

        A merge across the junction fires iff some x on ``a``'s right spine and y on ``b``'s
        left spine form a merge of rank r while both stand there: r < cons(x) and r <= cons(y)
        (cons: the rank of the merge that consumes the symbol in its tree), and their lives
        meet: form(y) < cons(x) and form(x) <= cons(y) (form: the rank that makes it; a byte
        is there from the start). Merges are applied in increasing rank, leftmost first among
        equals. In a vocabulary trained by BPE every merge comes after the merges that make
        its parts, and the second pair of conditions always holds; a vocabulary converted from
        tiktoken's ranks (Llama 3) has merges whose parts are made later. There the rule is
        exact wherever each node on the two spines is made no earlier than the nodes under it
        (a symbol's life is then the span between those ranks; the proof is in
        docs/canonical.md); the few tokens with a later-made node on a spine are read from the
        merges themselves.
        """
        if self._late[0][a]:  # read from the merges: only where some merge meets the junction
            allowed = np.ones(self.vocab_size, dtype=bool)
            near = self._meeting(a)
            allowed[near] = self._bigram_by_merges(a, near)
            return allowed
        conflict = np.zeros(self.vocab_size, dtype=bool)
        offsets, partner, rank = self._partners
        member_offsets, member, rho = self._members
        formed = self._formed
        for x, consumed_at in self._right_spine(a):
            start, end = offsets[x], offsets[x + 1]
            if start == end:
                continue
            ys, ranks = partner[start:end], rank[start:end]
            keep = (ranks < consumed_at) & (formed[ys] < consumed_at)
            ys, ranks = ys[keep], ranks[keep]
            if not ys.size:
                continue
            starts, ends = member_offsets[ys], member_offsets[ys + 1]
            lengths = ends - starts
            total = int(lengths.sum())
            if not total:
                continue
            # The concatenated ranges [starts[i], ends[i]) as one index array.
            shifts = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
            index = np.arange(total) + shifts
            hit = rho[index] >= np.repeat(np.maximum(ranks, formed[x]), lengths)
            conflict[member[index[hit]]] = True
        allowed = ~conflict
        owners, symbols = self._late_left_spines
        if owners.size:  # read from the merges, where some merge meets the junction at all
            partners = np.concatenate(
                [partner[offsets[x] : offsets[x + 1]] for x, _ in self._right_spine(a)]
            )
            late = np.unique(owners[np.isin(symbols, partners)])
            allowed[late] = self._bigram_by_merges(a, late)
        return allowed

    def starting_with(self, prefix: str) -> np.ndarray:
        """bool `(vocab_size,)`: the ids whose text starts with ``prefix`` (a search in the
        texts in order, not a pass over the vocabulary)."""
        texts, ids = self._sorted_texts
        found = np.zeros(self.vocab_size, dtype=bool)
        start = bisect.bisect_left(texts, prefix)
        end = start
        while end < len(texts) and texts[end].startswith(prefix):
            end += 1
        found[ids[start:end]] = True
        return found

    @functools.cached_property
    def _sorted_texts(self) -> tuple[list[str], np.ndarray]:
        pairs = sorted((text, token) for token, text in enumerate(self.texts) if text is not None)
        return [text for text, _ in pairs], np.array([t for _, t in pairs], dtype=np.int64)

    @functools.cached_property
    def _late_left_spines(self) -> tuple[np.ndarray, np.ndarray]:
        """The tokens with a late node on their left spine, once per symbol on that spine:
        (token, symbol) as two arrays."""
        owners, symbols = [], []
        for token in np.flatnonzero(self._late[1]).tolist():
            node = token
            while node >= 0:
                owners.append(token)
                symbols.append(node)
                node = int(self._left[node])
        return np.array(owners, dtype=np.int64), np.array(symbols, dtype=np.int64)

    def _meeting(self, a: int) -> np.ndarray:
        """The tokens with a symbol on their left spine that some merge joins to a symbol on
        ``a``'s right spine (whatever the ranks): the only ones a merge across the junction
        can reach."""
        offsets, partner, _ = self._partners
        member_offsets, member, _ = self._members
        found = [
            member[member_offsets[y] : member_offsets[y + 1]]
            for x, _ in self._right_spine(a)
            for y in np.unique(partner[offsets[x] : offsets[x + 1]])
        ]
        return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)

    @functools.cached_property
    def _formed(self) -> np.ndarray:
        """int64 `(V,)`: the rank of the merge that makes each token (-1: a byte, never made)."""
        return np.where(self._made_at == _INF, -1, self._made_at)

    @functools.cached_property
    def _strings(self) -> dict[int, str]:
        """Each id's string in the model's vocabulary (bytes as ByteLevel writes them)."""
        return {token: string for string, token in self.model["vocab"].items()}

    @property
    def merges_model(self) -> Any:
        """The tokenizer's BPE model without ``ignore_merges`` (the merges alone), built once."""
        if not self._merges_only:
            from tokenizers import models

            merges = [
                tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                for m in self.model["merges"]
            ]
            self._merges_only.append(models.BPE(self.model["vocab"], merges, ignore_merges=False))
        return self._merges_only[0]

    def _bigram_by_merges(self, a: int, others: np.ndarray) -> np.ndarray:
        """bool `(len(others),)`: whether the merges alone give ``[a, b]`` for the bytes of
        ``a`` then ``b``, read from the model itself (for the few tokens the rule cannot say)."""
        model = self.merges_model
        strings = self._strings
        head = strings.get(a)
        result = np.zeros(len(others), dtype=bool)
        if head is None:
            return result
        for index, b in enumerate(others.tolist()):
            tail = strings.get(b)
            if tail is not None:
                result[index] = [t.id for t in model.tokenize(head + tail)] == [a, b]
        return result

    def _right_spine(self, a: int) -> list[tuple[int, int]]:
        """(symbol, rank of the merge that consumes it) down the right edge of ``a``'s tree."""
        spine = [(a, _INF)]
        node = a
        while self._right[node] >= 0:
            spine.append((int(self._right[node]), int(self._made_at[node])))
            node = int(self._right[node])
        return spine


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
            f"{'; '.join(problems)}. " + _WORD_GUARD
        )
    return pattern


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


def _merge_tree(
    merges: list[Any], vocab: dict[str, int], size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each merged token's children and the rank that makes it, and the merges by left symbol.

    A token that several merges make (Llama 3's vocabulary, converted from tiktoken's ranks,
    holds a merge for every split of a token into two tokens) has one tree all the same: the one
    BPE builds from the token's own bytes. Where the token ends up whole, no merge ever crossed
    its edges, and the merges inside it ran as they run on its bytes alone (lowest rank first,
    leftmost among equals). Its children are the two parts that tree joins last; a token that
    its own bytes never make (only ``ignore_merges`` gives it, as a whole chunk) has none.
    """
    left = np.full(size, -1, dtype=np.int64)
    right = np.full(size, -1, dtype=np.int64)
    made_at = np.full(size, _INF, dtype=np.int64)
    rows = []
    pairs: dict[tuple[int, int], tuple[int, int]] = {}  # (x, y) -> (rank, token), as BPE reads
    several: set[int] = set()
    for rank, merge in enumerate(merges):
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        x, y, z = vocab.get(a), vocab.get(b), vocab.get(a + b)
        if x is None or y is None or z is None or z >= size:
            continue
        pairs.setdefault((x, y), (rank, z))
        if made_at[z] != _INF:
            several.add(z)
        else:
            left[z], right[z], made_at[z] = x, y, rank
        rows.append((x, y, rank))
    if several:
        strings = {token: string for string, token in vocab.items() if token < size}
        for z in several:
            last = _last_merge([vocab.get(char, -1) for char in strings[z]], pairs)
            if last is not None and last[3] == z:
                left[z], right[z], made_at[z] = last[:3]
            else:  # never made by merges: a leaf (it cannot stand inside a merged chunk)
                left[z], right[z], made_at[z] = -1, -1, _INF
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    order = np.argsort(table[:, 0], kind="stable")
    table = table[order]
    offsets = np.searchsorted(table[:, 0], np.arange(size + 1))
    return left, right, made_at, (offsets, table[:, 1].copy(), table[:, 2].copy())


def _late_spines(
    left: np.ndarray, right: np.ndarray, made_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """bool `(V,)` twice: tokens with a *late* node on their right spine, and on their left
    spine (themselves included). A node is late when a node under it is made by a merge of a
    later rank than its own: BPE then makes it after its own rank (Llama 3's converted merges
    have a few; a vocabulary trained by BPE has none)."""
    merged = left >= 0
    formed = np.where(made_at == _INF, -1, made_at)
    latest = formed.copy()  # the latest rank in each token's tree
    while True:
        grown = latest.copy()
        grown[merged] = np.maximum(
            formed[merged], np.maximum(latest[left[merged]], latest[right[merged]])
        )
        if np.array_equal(grown, latest):
            break
        latest = grown
    late = merged & (latest > formed)
    spines = []
    for child in (right, left):
        on = late.copy()
        while True:
            grown = on.copy()
            grown[merged] |= on[child[merged]]
            if np.array_equal(grown, on):
                break
            on = grown
        spines.append(on)
    return spines[0], spines[1]


def _last_merge(
    symbols: list[int], pairs: dict[tuple[int, int], tuple[int, int]]
) -> tuple[int, int, int, int] | None:
    """BPE over ``symbols`` (lowest rank first, leftmost among equals): the last merge it
    applies, ``(x, y, rank, token)``, when it ends with one symbol; else None."""
    last = None
    while len(symbols) > 1:
        best: tuple[int, int, int] | None = None
        for index in range(len(symbols) - 1):
            found = pairs.get((symbols[index], symbols[index + 1]))
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], index, found[1])
        if best is None:
            return None
        rank, index, token = best
        last = (symbols[index], symbols[index + 1], rank, token)
        symbols[index : index + 2] = [token]
    return last


def _left_spines(
    left: np.ndarray, made_at: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each symbol y, the tokens whose left spine holds y, with the rank of the merge that
    consumes y there (_INF for the token itself)."""
    symbols, tokens, ranks = [], [], []
    for token in range(size):
        node, consumed_at = token, _INF
        while True:
            symbols.append(node)
            tokens.append(token)
            ranks.append(consumed_at)
            child = int(left[node])
            if child < 0:
                break
            node, consumed_at = child, int(made_at[node])
    table = np.array([symbols, tokens, ranks], dtype=np.int64)
    order = np.argsort(table[0], kind="stable")
    table = table[:, order]
    offsets = np.searchsorted(table[0], np.arange(size + 1))
    return offsets, table[1].copy(), table[2].copy()


__all__ = ["ByteLevelBpe", "CanonicalUnsupportedError"]
