"""Canonical decoding for a split pattern read through the pre-tokenizer itself (Llama 3, Qwen 2).

GPT-2's pattern has hand-written rules (:mod:`memfree.core.canonical`). Llama 3's, Qwen 2's and
Mistral Tekken's chunk text in more ways (a punctuation mark joins the word after it, digits go
in groups of three or one, a punctuation run takes the newlines after it, contractions in any
case; Tekken splits letter runs by case and keeps combining marks in words and in punctuation
runs), so here the chunks come from the tokenizer's own pre-tokenizer, over *shapes*:

- every character gets a class: characters that the pattern cannot tell apart (it sees letters,
  upper and lower case, marks, numbers, whitespace, ``\\r``, ``\\n``, ``/``, the space, the
  apostrophe and the letters of contractions) share one, found by running the pre-tokenizer
  over probe strings (checked: a text with each character replaced by its class's
  representative is cut at the same places);
- a text's shape is its classes (a letter of a contraction counts as any letter unless an
  apostrophe comes right before it; runs of a class the pattern does not count are cut at three);
- for the shape of a row's last two chunks and the shape of every candidate, the
  pre-tokenizer's chunks of the two together give each candidate its *group*: the chunk it
  lands in starts at the candidate (a new chunk), inside the row's text (it continues that
  chunk), or it crosses a chunk boundary (never canonical); and where the row's own chunks now
  end. One ``pre_tokenize_str`` per candidate shape, kept per row shape.

Then, exactly, per group: the row's chunks before the candidate's must be their tokens' BPE (the
model's, so ``ignore_merges`` counts); a new chunk needs the model to give ``[c]`` for the
candidate's text; a continued chunk ``x`` with tokens ``X`` needs the merges to give ``X + [c]``
for ``x + text(c)``: ``X`` right, ``c`` right alone and no merge across the junction (the
merge-tree test, :meth:`~memfree.vocab.bpe.ByteLevelBpe.bigram_allowed`); with ``ignore_merges``
also ``x + text(c)`` not a token itself. With an NFC normalizer (Qwen 2) the text must stay NFC:
a candidate that would compose with or reorder against the row's end is checked by
normalizing.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import threading
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from memfree.vocab.bpe import ByteLevelBpe
from memfree.vocab.token_bytes import byte_level_chars

# Probes: strings around a character whose chunks tell the pattern's classes apart.
_PROBES = (
    "{}", "a{}", "{}a", "1{}", "{}1", "12{}", "{}12", " {}", "{} ", "{}{}", "{}{}a", ".{}",
    "{}.", "{}.a", " {}a", "'{}", "'{}a", "'{}ea", "'{}la", "'r{}a", "'v{}a", "'l{}a", "'{}1",
    "\n{}", "{}\n", "\r{}", "{}\r", "\t{}", "{}\t", "{} a", "a {}", "{}  a", ". {}", "{}\n\n",
    " {}\n", "{}{}{}", "x{}{}y", "{}s", "{}sa", "{}rea", "{}vea", "{}lla", "{}ma", "a{}sa",
    " {}sa", ".\n{}", ".\n{}a", "..{}", " .{}", "{}Aa", "A{}", "{}A",
    "a'{}", "a'{}e", "a'{}l", "a'r{}", "a'v{}", "a'l{}",
)  # fmt: skip
_CAP = 3  # runs of a class the pattern does not count are cut to this length
_CACHE = 1024  # row shapes whose candidate groups are kept (one int8 per token each)


@dataclass(frozen=True, eq=False)
class _Groups:
    """One row shape's candidate groups: ``of_token[c]`` (-1: crosses a boundary or no text)
    and per group ``(start, bounds)`` in the shape's characters: where the candidate's chunk
    starts (the shape's length: at the candidate) and the chunk boundaries inside the row's
    last chunks."""

    of_token: np.ndarray
    groups: tuple[tuple[int, tuple[int, ...]], ...]


class SplitChunks:
    """The split-pattern rules for one tokenizer: classes, shapes, models (build once)."""

    def __init__(self, bpe: ByteLevelBpe, usable: np.ndarray) -> None:
        from tokenizers import models

        self.bpe = bpe
        self._class_lock = threading.RLock()
        self._pre = bpe.tokenizer_backend.pre_tokenizer
        model = bpe.model
        vocab, merges = (
            model["vocab"],
            [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]],
        )
        self.ignore_merges = bool(model.get("ignore_merges"))
        self._model = models.BPE(vocab, merges, ignore_merges=self.ignore_merges)
        self._merges = bpe.merges_model
        self._strings = {token: string for string, token in vocab.items()}
        self._byte_char = byte_level_chars()
        self._signatures: dict[tuple[Any, ...], int] = {}
        self._classes: dict[str, int] = {}
        self._reps: list[str] = []
        self._letter = self.char_class("a")
        self._generic: dict[int, int] = {}  # a contraction letter's class -> the letter class
        self._digit = self.char_class("1")
        self._apostrophe = self.char_class("'")
        size = bpe.vocab_size
        shapes: dict[tuple[int, ...], int] = {}
        self.shape_of = np.full(size, -1, dtype=np.int64)
        for token in np.flatnonzero(usable):
            text = bpe.texts[token]
            if text:
                shape = self._shape(text, token=True)[0]
                self.shape_of[token] = shapes.setdefault(shape, len(shapes))
        self._shape_texts = ["".join(self._reps[c] for c in shape) for shape in shapes]
        alone = np.zeros(size, dtype=bool)
        merged = np.zeros(size, dtype=bool)
        for token in np.flatnonzero(self.shape_of >= 0):
            string = self._strings.get(int(token))
            if string is None:
                continue
            alone[token] = [t.id for t in self._model.tokenize(string)] == [token]
            merged[token] = [t.id for t in self._merges.tokenize(string)] == [token]
        self.alone, self.merged = alone, merged
        if self.ignore_merges:
            self._sorted = sorted((t, i) for i, t in enumerate(bpe.texts) if t and usable[i])
        self._nfc_risky = np.zeros(size, dtype=bool)
        if bpe.nfc:
            for token in np.flatnonzero(self.shape_of >= 0):
                text = bpe.texts[token] or ""
                if unicodedata.normalize("NFC", text) != text:
                    self.alone[token] = self.merged[token] = False
                elif _may_compose(text[0]):
                    self._nfc_risky[token] = True
        self._groups: OrderedDict[tuple[int, ...], _Groups] = OrderedDict()
        self._bpe_cache: dict[tuple[bool, str], list[int]] = {}
        self._completions: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with empty caches (and their own lock)."""
        state = self.__dict__.copy()
        for name in ("_lock", "_class_lock", "_groups", "_bpe_cache", "_completions"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._groups = OrderedDict()
        self._bpe_cache = {}
        self._completions = OrderedDict()
        self._lock = threading.Lock()
        self._class_lock = threading.RLock()

    # -- classes and shapes ---------------------------------------------------------------------

    def char_class(self, char: str) -> int:
        known = self._classes.get(char)
        if known is None:
            signature = tuple(self._probe(char))
            with self._class_lock:
                known = self._signatures.get(signature)
                if known is None:
                    known = self._signatures[signature] = len(self._reps)
                    self._reps.append(char)
                self._classes[char] = known
        return known

    def _generic_class(self, cls: int) -> int:
        """A letter's class outside contractions: the letter class when the character differs
        from "a" only after an apostrophe (so "sister" has the shape of "aaaaaa")."""
        generic = self._generic.get(cls)
        if generic is None:
            rep = self._reps[cls]
            plain = [i for i, probe in enumerate(_PROBES) if "'" not in probe]
            a = self._probe(self._reps[self._letter])
            mine = self._probe(rep)
            same = all(a[i] == mine[i] for i in plain)
            generic = self._generic[cls] = self._letter if same else cls
        return generic

    def _probe(self, char: str) -> list[Any]:
        return [
            tuple(span for _, span in self._pre.pre_tokenize_str(probe.replace("{}", char)))
            for probe in _PROBES
        ]

    def _shape(self, text: str, token: bool) -> tuple[tuple[int, ...], list[int]]:
        """The text's shape and, for each of its characters and its end, the index in the
        text it stands for (runs cut short stand for their first and last characters)."""
        classes = [self.char_class(c) for c in text]
        for index, cls in enumerate(classes):
            after_apostrophe = self._apostrophe in classes[max(0, index - 2) : index]
            if not after_apostrophe and not (token and index < 2):
                classes[index] = self._generic_class(cls)
        shape: list[int] = []
        where: list[int] = []
        index = 0
        while index < len(classes):
            end = index
            while end < len(classes) and classes[end] == classes[index]:
                end += 1
            length = end - index
            if length > _CAP and classes[index] != self._digit:
                shape.extend([classes[index]] * _CAP)
                where.extend([index, *range(end - _CAP + 1, end)])
            else:
                shape.extend(classes[index:end])
                where.extend(range(index, end))
            index = end
        where.append(len(text))
        return tuple(shape), where

    # -- groups ---------------------------------------------------------------------------------

    def groups(self, shape: tuple[int, ...]) -> _Groups:
        with self._lock:
            known = self._groups.get(shape)
            if known is not None:
                self._groups.move_to_end(shape)
                return known
        row = "".join(self._reps[c] for c in shape)
        size = len(row)
        found: dict[tuple[int, tuple[int, ...]], int] = {}
        of_shape = np.full(len(self._shape_texts), -1, dtype=np.int64)
        for index, candidate in enumerate(self._shape_texts):
            starts = [span[0] for _, span in self._pre.pre_tokenize_str(row + candidate)]
            if any(size < s < size + len(candidate) for s in starts):
                continue  # crosses a chunk boundary: one token is never two chunks
            start = max(s for s in starts if s <= size)
            bounds = tuple(s for s in starts if 0 < s < start)
            of_shape[index] = found.setdefault((start, bounds), len(found))
        narrow = np.int8 if len(found) < 128 else np.int16  # a few groups per shape
        of_token = np.where(self.shape_of >= 0, of_shape[self.shape_of], -1).astype(narrow)
        groups = _Groups(of_token, tuple(found))
        with self._lock:
            self._groups[shape] = groups
            if len(self._groups) > _CACHE:
                self._groups.popitem(last=False)
        return groups

    # -- a row ----------------------------------------------------------------------------------

    def state(self, text: str, tokens: list[int]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """The key of a row whose last two chunks are ``text`` with ``tokens``, and what is
        checked per row after the key's mask (``ignore_merges`` and NFC)."""
        shape, where = self._shape(text, token=False)
        groups = self.groups(shape)
        ends = np.cumsum([len(self.bpe.token_bytes[t]) for t in tokens]).tolist()
        offsets = [len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]
        facts = []
        fixes = []
        for number, (start, bounds) in enumerate(groups.groups):
            cut = [where[b] for b in bounds]
            at = where[start] if start < len(shape) else len(text)
            fact = self._chunks_ok(text, tokens, ends, offsets, [0, *cut, at])
            if fact and at < len(text):
                rest = tokens[_token_index(ends, offsets[at]) :]
                fact = self._encode(text[at:], merges=True) == rest
                if fact and self.ignore_merges:
                    fixes.append((number, text[at:]))
            facts.append(fact)
        if self.bpe.nfc:
            fixes.append((-1, text))
        ends = self.bpe.encode(text) == tokens  # the row's text ending here is its tokens
        return (shape, tokens[-1], tuple(facts), ends), tuple(fixes)

    def _chunks_ok(
        self, text: str, tokens: list[int], ends: list[int], offsets: list[int], cuts: list[int]
    ) -> bool:
        """Whether the row's chunks between ``cuts`` (character offsets) are their tokens."""
        first = 0
        for left, right in itertools.pairwise(cuts):
            if left == right:
                continue
            if offsets[right] not in ends and offsets[right] != 0:
                return False
            last = _token_index(ends, offsets[right])
            if self._encode(text[left:right], merges=False) != tokens[first:last]:
                return False
            first = last
        return True

    def _encode(self, text: str, merges: bool) -> list[int]:
        """The model's tokens for one chunk (``merges``: by the merges alone)."""
        key = (merges, text)
        known = self._bpe_cache.get(key)
        if known is None:
            string = "".join(self._byte_char[b] for b in text.encode("utf-8"))
            model = self._merges if merges else self._model
            known = [t.id for t in model.tokenize(string)]
            if len(self._bpe_cache) > 65536:
                self._bpe_cache.clear()
            self._bpe_cache[key] = known
        return known

    def mask(self, key: tuple[Any, ...], bigram: np.ndarray) -> np.ndarray:
        """The candidates a key allows (before the per-row fixes)."""
        shape, _, facts, _ = key
        groups = self.groups(shape)
        allowed = np.zeros(self.bpe.vocab_size, dtype=bool)
        for number, ((start, _), fact) in enumerate(zip(groups.groups, facts, strict=True)):
            if not fact:
                continue
            members = groups.of_token == number
            if start == len(shape):
                allowed |= members & self.alone
            else:
                allowed |= members & self.merged & bigram
        return allowed

    def fix(self, key: tuple[Any, ...], fixes: tuple[Any, ...], mask: np.ndarray) -> np.ndarray:
        """Bans what the key cannot say: a continued chunk that is itself a token
        (``ignore_merges`` gives that token instead), a candidate that breaks NFC."""
        groups = self.groups(key[0])
        banned: list[int] = []
        for number, text in fixes:
            if number < 0:
                for token in np.flatnonzero(self._nfc_risky & mask):
                    joined = text + (self.bpe.texts[token] or "")
                    if unicodedata.normalize("NFC", joined) != joined:
                        banned.append(int(token))
                continue
            banned.extend(t for t in self._completing(text) if groups.of_token[t] == number)
        if not banned:
            return mask
        mask = mask.copy()
        mask[banned] = False
        return mask

    def _completing(self, text: str) -> tuple[int, ...]:
        """The candidates ``c`` such that ``text + text(c)`` is a token (kept per text)."""
        with self._lock:
            known = self._completions.get(text)
        if known is None:
            found = []
            index = bisect.bisect_left(self._sorted, (text, -1))
            while index < len(self._sorted) and self._sorted[index][0].startswith(text):
                token = self.bpe.ids_of.get(self._sorted[index][0][len(text) :])
                if token is not None:
                    found.append(token)
                index += 1
            known = tuple(found)
            with self._lock:
                self._completions[text] = known
                if len(self._completions) > 4 * _CACHE:
                    self._completions.popitem(last=False)
        return known


def _token_index(ends: list[int], offset: int) -> int:
    """How many tokens end at or before byte ``offset``."""
    return bisect.bisect_right(ends, offset)


def _may_compose(char: str) -> bool:
    """Whether ``char`` can change NFC text it is appended to: a combining mark (it reorders
    or composes), or a character that composes with one before it (Hangul vowels and finals,
    the second half of a canonical pair)."""
    return bool(unicodedata.combining(char)) or char in _second_halves()


@functools.cache
def _second_halves() -> frozenset[str]:
    halves = {chr(c) for c in range(0x1161, 0x1176)} | {chr(c) for c in range(0x11A8, 0x11C3)}
    for code in range(0x110000):
        parts = unicodedata.decomposition(chr(code)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            halves.add(chr(int(parts[1], 16)))
    return frozenset(halves)


__all__ = ["SplitChunks"]
