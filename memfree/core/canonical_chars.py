"""Canonical decoding of characters the tokenizer writes with several tokens.

A byte-level vocabulary holds tokens that are not whole UTF-8 characters: a *head* (``" \\xe6"``:
whole characters ``P``, then the first bytes ``h`` of one more) and *continuation* tokens, which
start with continuation bytes (``"\\x97"``; in most vocabularies some go on past the character,
``"\\xad\\xe6"``). A CJK character or an emoji that has no token of its own is written as a head
and continuations: the row's ids pass through states that are not text.

The rule stays the one of :mod:`memfree.core.canonical`: a candidate is allowed iff some text
keeps the row a prefix of its tokenization. The head and the tokens after it up to the first
token that ends at a character boundary are one stretch, the *chain*, inside one chunk, and:

- the chain is a prefix of a chunk's BPE iff it is ``BPE`` of its own text (a token prefix of a
  chunk's BPE is the BPE of its own bytes; BPE is pairwise local) and the junction before the
  head passes the merge-tree test;
- so after a row at a character boundary the chain acts as one candidate whose text is ``P``
  and characters of one class ``k`` (they share the head's chunk): the rules read of it only its
  first character's class, the class of its whole run, its head (the merge-tree test) and, for a
  contraction or an added token's content, its first ASCII characters: all fixed by the head and
  ``k``.

Each head therefore gets one *pseudo candidate* per class ``k`` (letter, number, punctuation,
whitespace, as the pre-tokenizer sees them) for which some character ``X`` of that class has
``BPE(P + X)`` beginning with the head: a *witness*, found by search and checked with the
tokenizer itself. The rules answer pseudo candidates beside the tokens; a head is allowed iff
one of its pseudo candidates is. A row inside a character (its state: the state before the head,
and the chain so far) allows a continuation iff the chain with it is the BPE of its text, where
it ends at a character boundary, or else some completion of its last character witnesses it; its
characters are of a class the state before the head allows. Every allowed candidate has a
witness that ends at a character boundary, so an allowed head always has a way on.

A split pattern (:mod:`memfree.core.canonical_split`) tells more classes apart (letters by case,
marks, CJK): there a head's witnesses are searched per Unicode category and kept per class of
the pattern, the split reading answers each like a token whose text is the witness's, and a row
inside a character is checked with the tokenizer itself over the row's last two chunks, the
chain and the continuation (:meth:`Characters.allowed_after`).

Witnesses are one character long: a head (or a continuation) that only a longer completion
would keep canonical is banned, an over-ban; so is a whitespace character of several tokens as a
whitespace run's split reading (the run as it stands, then that character, before a word). Both
are stated in docs/canonical.md.
"""

from __future__ import annotations

import functools
import itertools
import threading
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfree.vocab.bpe import LETTER, NUMBER, PUNCT, WS, ByteLevelBpe

_CLASSES = (LETTER, NUMBER, PUNCT, WS)  # the classes a character of several tokens may have
_BATCHES = (8, 56, 448, 3584)  # completions tried per batch, then all the rest at once
_SEARCHES = 1 << 14  # searches kept


def utf8_length(lead: int) -> int:
    """Bytes in the character a lead byte starts (0: not a lead byte)."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead < 0xE0:
        return 2
    if 0xE0 <= lead < 0xF0:
        return 3
    if 0xF0 <= lead < 0xF5:
        return 4
    return 0


def _leading_continuations(data: bytes) -> int:
    count = 0
    while count < len(data) and 0x80 <= data[count] < 0xC0:
        count += 1
    return count


def _split_head(data: bytes) -> tuple[str, bytes] | None:
    """A head's whole characters and the first bytes of the next one (None: not a head)."""
    for at in range(len(data) - 1, max(-1, len(data) - 4), -1):
        need = utf8_length(data[at])
        if need > 1:
            if len(data) - at >= need:
                return None
            try:
                return data[:at].decode("utf-8"), data[at:]
            except UnicodeDecodeError:
                return None
    return None


def _completions(begun: bytes, kinds: frozenset[int]) -> Iterator[str]:
    """The characters whose UTF-8 bytes begin with ``begun`` and that Unicode's tables put in
    ``kinds`` (:func:`_guess`), in order. They are one range of code points: UTF-8 keeps the
    order of code points."""
    low, high = code_points(begun)
    if WS in kinds:
        yield from (c for c in _WHITESPACE if low <= ord(c) <= high)
    if not kinds - {WS}:
        return
    for block in range(low >> _BLOCK, (high >> _BLOCK) + 1):
        if not kinds & _block_classes(block):
            continue  # most of the planes a 4-byte head begins hold no letter, no digit
        for point in range(max(low, block << _BLOCK), min(high, ((block + 1) << _BLOCK) - 1) + 1):
            char = chr(point)
            if 0xD800 <= point < 0xE000 or char.encode("utf-8")[: len(begun)] != begun:
                continue  # a surrogate; an overlong prefix (no character begins with it)
            kind = _guess(char)
            if kind != WS and kind in kinds:
                yield char


_BLOCK = 12  # code points per block of _block_classes: 4,096


@functools.cache
def _block_classes(block: int) -> frozenset[int]:
    """The classes Unicode's tables give the characters of one block of code points (kept for
    the process: every tokenizer's search skips the blocks without the class it wants)."""
    start = block << _BLOCK
    return frozenset(
        _guess(chr(point))
        for point in range(start, min(start + (1 << _BLOCK), 0x110000))
        if not 0xD800 <= point < 0xE000
    )


def code_points(begun: bytes) -> tuple[int, int]:
    """The first and last code point whose UTF-8 bytes may begin with ``begun`` (one range:
    UTF-8 keeps the order of code points)."""
    rest = utf8_length(begun[0]) - len(begun)
    low = _code_point(begun + b"\x80" * rest)
    return low, min(_code_point(begun + b"\xbf" * rest), 0x10FFFF)


def _code_point(data: bytes) -> int:
    """The code point UTF-8's bit layout gives ``data`` (one lead byte and continuations),
    whether or not the encoding is valid."""
    point = data[0] & (0x7F >> len(data))
    for byte in data[1:]:
        point = (point << 6) | (byte & 0x3F)
    return point


# Every character Python's str.isspace() accepts (the class the search tries first; the
# pre-tokenizer's own class decides).
_WHITESPACE = tuple(
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _split_guess(char: str) -> str:
    """A split pattern's search key for a character: Unicode's general category, with CJK
    ideographs and kana apart (DeepSeek V3 cuts their runs from other letters). The patterns
    tell characters apart by category (letters by case, marks, numbers, whitespace), so a
    character of each class is found by trying each key; every witness's class is then read
    from the pre-tokenizer."""
    point = ord(char)
    if 0x4E00 <= point <= 0x9FA5 or 0x3040 <= point <= 0x30FF:
        return "cjk"
    return unicodedata.category(char)


@functools.lru_cache(maxsize=4096)
def _range_by_key(begun: bytes) -> dict[str, np.ndarray]:
    """The code points of the characters whose UTF-8 bytes begin with ``begun``, by
    :func:`_split_guess` (kept per process: heads share their first bytes)."""
    low, high = code_points(begun)
    found: dict[str, list[int]] = {}
    for point in range(low, high + 1):
        if 0xD800 <= point < 0xE000:
            continue  # surrogates: no character
        char = chr(point)
        if char.encode("utf-8")[: len(begun)] == begun:  # else an overlong prefix
            found.setdefault(_split_guess(char), []).append(point)
    return {key: np.array(points, dtype=np.int32) for key, points in found.items()}


def _split_kinds(begun: bytes) -> list[str]:
    """The search keys of the characters ``begun`` may begin, the most common first."""
    keys = _range_by_key(begun)
    return sorted(keys, key=lambda key: (-len(keys[key]), key))


def _guess(char: str) -> int:
    """The class a character likely has (Unicode's tables): only orders the search; every
    witness's class is read from the pre-tokenizer."""
    if char.isspace():
        return WS
    category = unicodedata.category(char)
    return LETTER if category[0] == "L" else NUMBER if category[0] == "N" else PUNCT


@dataclass(eq=False)
class Characters:
    """A vocabulary's heads and continuations, and their pseudo candidates.

    Attributes:
        heads: int64 `(K,)`: the head of each pseudo candidate.
        classes: int8 `(K,)`: the class of the character it completes.
        texts: each pseudo candidate's text (the head's whole characters and one witness).
        firsts, runs: int8 `(K,)`: as :class:`~memfree.vocab.bpe.ByteLevelBpe`'s, for the text.
        columns: head -> class -> its pseudo candidate's index.
        is_cont, is_head: bool `(vocab_size,)`.
    """

    bpe: ByteLevelBpe
    heads: np.ndarray
    classes: np.ndarray
    texts: list[str]
    firsts: np.ndarray
    runs: np.ndarray
    columns: dict[int, dict[int, int]]
    is_cont: np.ndarray
    is_head: np.ndarray
    parts: dict[int, tuple[str, bytes]]  # head -> (whole characters, begun bytes)
    conts: list[tuple[int, bytes, int]]  # continuation tokens: bytes, leading continuation bytes
    classify: Callable[[str], int] | None = None  # a split pattern's classes (None: GPT-2's)
    _searches: dict[tuple[Any, ...], str | None] = field(default_factory=dict)
    _starting: dict[str, np.ndarray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(
        cls, bpe: ByteLevelBpe, written: np.ndarray, classify: Callable[[str], int] | None = None
    ) -> Characters:
        """The tables. ``written``: the tokens that may be written (no special or added
        token). ``classify``: a split pattern's character classes
        (:meth:`~memfree.core.canonical_split.SplitChunks.generic_class`; None: GPT-2's
        pattern, whose four classes the rules read)."""
        size = bpe.vocab_size
        is_cont = np.zeros(size, dtype=bool)
        parts: dict[int, tuple[str, bytes]] = {}
        conts = []
        for token, data in enumerate(bpe.token_bytes):
            if not data or bpe.texts[token] is not None or not written[token]:
                continue
            lead = _leading_continuations(data)
            if lead:
                is_cont[token] = True
                conts.append((token, data, lead))
            else:
                split = _split_head(data)
                if split is not None:
                    parts[token] = split
        is_head = np.zeros(size, dtype=bool)
        is_head[list(parts)] = True
        conts.sort(key=lambda entry: (entry[2], len(entry[1])))
        chars = cls(
            bpe, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8), [],
            np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int8), {}, is_cont, is_head,
            parts, conts, classify,
        )  # fmt: skip
        heads: list[int] = []
        classes: list[int] = []
        texts: list[str] = []
        for head, (whole, begun) in parts.items():
            kinds: list[Any] = list(_CLASSES) if classify is None else _split_kinds(begun)
            for kind in kinds:
                witness = chars.witness(whole, begun, (head,), frozenset({kind}))
                if witness is None:
                    continue
                found: int = kind if classify is None else classify(witness)
                if found not in chars.columns.get(head, {}):
                    chars.columns.setdefault(head, {})[found] = len(heads)
                    heads.append(head)
                    classes.append(found)
                    texts.append(whole + witness)
        chars.heads = np.array(heads, dtype=np.int64)
        chars.classes = np.array(classes, dtype=np.int16)
        chars.texts = texts
        firsts_runs = [bpe.first_and_run(text) for text in texts]
        chars.firsts = np.array([f for f, _ in firsts_runs], dtype=np.int8)
        chars.runs = np.array([r for _, r in firsts_runs], dtype=np.int8)
        return chars

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_searches"] = {}
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return len(self.heads)

    def starting_with(self, prefix: str) -> np.ndarray:
        """bool `(K,)`: pseudo candidates whose text may start with ``prefix``: the head's whole
        characters do, or ``prefix`` goes on past them with a character that is not ASCII (what
        follows them is not known here, and is never ASCII). Kept per prefix."""
        known = self._starting.get(prefix)
        if known is None:
            known = self._starting[prefix] = self._starting_with(prefix)
        return known

    def _starting_with(self, prefix: str) -> np.ndarray:
        found = np.zeros(self.size, dtype=bool)
        for index, head in enumerate(self.heads.tolist()):
            whole = self.parts[head][0]
            if whole.startswith(prefix) or (
                prefix.startswith(whole) and not prefix[len(whole)].isascii()
            ):
                found[index] = True
        return found

    def chain(self, segment: list[int]) -> int | None:
        """Where the chain a row ends in starts (the head's index in ``segment``), or None if
        the row's end is not a head and continuations that leave a character unfinished."""
        at = len(segment) - 1
        while at >= 0 and self.is_cont[segment[at]]:
            at -= 1
        if at < 0 or not self.is_head[segment[at]]:
            return None
        data = b"".join(self.bpe.token_bytes[t] for t in segment[at:])
        split = _split_head(data)
        return at if split is not None else None

    def allowed(self, chain: tuple[int, ...], pseudo: np.ndarray) -> np.ndarray:
        """bool `(vocab_size,)`: the continuations allowed after ``chain`` (a head and
        continuations, the last character unfinished), where the state before the head allows
        the pseudo candidates ``pseudo``."""
        head = chain[0]
        split = _split_head(b"".join(self.bpe.token_bytes[t] for t in chain))
        kinds = frozenset(k for k, column in self.columns.get(head, {}).items() if pseudo[column])
        if (
            split is None
            or not kinds
            or not self._of_kinds(split[0][len(self.parts[head][0]) :], kinds)
        ):
            return np.zeros(self.bpe.vocab_size, dtype=bool)
        return self._continuations(chain, "", (), kinds)

    def allowed_after(
        self, text: str, tokens: tuple[int, ...], chain: tuple[int, ...]
    ) -> np.ndarray:
        """A split pattern: bool `(vocab_size,)`, the continuations allowed after ``chain`` (a
        head and continuations, the last character unfinished) where the row before the head
        ends in the chunks ``text`` with ``tokens`` (its last two: where they start no appended
        text moves). Checked with the tokenizer itself, so its normalizer, ``ignore_merges``
        and pattern all count."""
        return self._continuations(chain, text, tokens, None)

    def _continuations(
        self,
        chain: tuple[int, ...],
        text: str,
        tokens: tuple[int, ...],
        kinds: frozenset[int] | None,
    ) -> np.ndarray:
        """The continuations after ``chain`` that ``text`` (tokenized as ``tokens``), the
        chain's text and their own keep canonical: one that finishes the character iff that
        text is tokenized as ``tokens``, the chain and it; one that goes on into the next
        character iff some completion of that character witnesses it. ``kinds``: the classes
        the characters after the head's whole ones may have (None: any)."""
        allowed = np.zeros(self.bpe.vocab_size, dtype=bool)
        split = _split_head(b"".join(self.bpe.token_bytes[t] for t in chain))
        if split is None:
            return allowed
        whole, begun = split
        rest = utf8_length(begun[0]) - len(begun)
        ended: list[tuple[int, str]] = []  # candidates that end at a character boundary
        for token, data, lead in self.conts:
            if lead > rest:
                break
            if lead < rest and len(data) > lead:
                continue  # a character begins before this one ends: not UTF-8
            try:
                piece = (begun + data).decode("utf-8")
            except UnicodeDecodeError:
                more = _split_head(begun + data)
                if more is not None and (kinds is None or self._of_kinds(more[0], kinds)):
                    found = self.witness(
                        text + whole + more[0],
                        more[1],
                        (*tokens, *chain, token),
                        kinds or frozenset(),
                    )
                    allowed[token] = found is not None
                continue
            if kinds is None or self._of_kinds(piece, kinds):
                ended.append((token, text + whole + piece))
        if ended:
            encoded = self.bpe.tokenizer_backend.encode_batch(
                [joined for _, joined in ended], add_special_tokens=False
            )
            for (token, _), encoding in zip(ended, encoded, strict=True):
                allowed[token] = tuple(encoding.ids) == (*tokens, *chain, token)
        return allowed

    def _of_kinds(self, text: str, kinds: frozenset[int]) -> bool:
        """Whether every character of ``text`` is of a class in ``kinds`` (the characters after
        a head's whole ones share its chunk)."""
        return all(self.bpe.char_class(char) in kinds for char in text)

    def witness(
        self, whole: str, begun: bytes, chain: tuple[int, ...], kinds: frozenset[int]
    ) -> str | None:
        """A character ``X`` that begins with ``begun``, of a class in ``kinds``, with ``BPE(whole
        + X)`` beginning with ``chain`` (None: there is none). Completions Unicode's tables put
        in ``kinds`` are tried in growing batches, each checked with the tokenizer; the class of
        the one found is read from the pre-tokenizer."""
        key = (whole, begun, chain, kinds)
        with self._lock:
            if key in self._searches:
                return self._searches[key]
        found = None
        if len(begun) <= utf8_length(begun[0]):
            found = self._search(whole, begun, chain, kinds)
        with self._lock:
            self._searches[key] = found
            if len(self._searches) > _SEARCHES:
                self._searches.pop(next(iter(self._searches)))
        return found

    def _search(
        self, whole: str, begun: bytes, chain: tuple[int, ...], kinds: frozenset[Any]
    ) -> str | None:
        classes = self.classify is None  # GPT-2's: the pre-tokenizer's class must be in kinds
        if classes:
            candidates: Iterator[str] = _completions(begun, kinds)
        else:  # a split pattern: ``kinds`` are search keys (empty: any character)
            keys = _range_by_key(begun)
            candidates = (
                chr(point)
                for key in sorted(kinds or keys)
                for point in keys.get(key, np.zeros(0, dtype=np.int32)).tolist()
            )

        backend = self.bpe.tokenizer_backend
        for size in itertools.chain(_BATCHES, itertools.repeat(_BATCHES[-1])):
            batch = list(itertools.islice(candidates, size))
            if not batch:
                break
            encoded = backend.encode_batch([whole + x for x in batch], add_special_tokens=False)
            for char, encoding in zip(batch, encoded, strict=True):
                if tuple(encoding.ids[: len(chain)]) == chain and (
                    not classes or self.bpe.char_class(char) in kinds
                ):
                    return char
        return None


__all__ = ["Characters", "code_points", "utf8_length"]
