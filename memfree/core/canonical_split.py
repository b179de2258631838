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

The rule is extendable (the row a prefix of the tokenization of some text that begins with its
text): where the row ends in whitespace, a candidate that is one whitespace character is also
placed before one character of each other class (``\\s+(?!\\S)`` gives a run's last character to
what follows), and a reading where it stands alone is one more group for it (the row is then
pending: its text ended there is tokenized otherwise). Characters written with several tokens
get *pseudo candidates* (:mod:`memfree.core.canonical_chars`), read here like tokens whose
text is their witness's (:meth:`SplitChunks.attach`).
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from memfree.core.split_groups import Groups, SplitReach, splits_only
from memfree.core.split_nfc import may_compose, nfc_context
from memfree.vocab.bpe import ByteLevelBpe
from memfree.vocab.text_search import prefix_range, suffix_ids
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
_CACHE = 1024  # NFC contexts' and continued chunks' answers kept (four times this)
_FEW_ENTRIES = 64  # completions read entry by entry below this many, else as arrays
_STATES = 1 << 15  # rows' last chunks whose state is kept
_SHAPES = 8192  # row shapes whose candidate groups are kept (one byte per candidate shape each)


class SplitChunks:
    """The split-pattern rules for one tokenizer: classes, shapes, models (build once)."""

    def __init__(self, bpe: ByteLevelBpe, usable: np.ndarray) -> None:
        from tokenizers import models

        self.bpe = bpe
        self._class_lock = threading.RLock()
        self._pre = splits_only(bpe.tokenizer_backend.pre_tokenizer)
        self._reach = SplitReach.of(self._pre)  # None: every row shape read whole
        model = bpe.model
        vocab, merges = (
            model["vocab"],
            [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]],
        )
        self.ignore_merges = bool(model.get("ignore_merges"))
        self._model = models.BPE(vocab, merges, ignore_merges=self.ignore_merges)
        self._merges = bpe.merges_model
        self._strings = bpe.tree.strings
        self._byte_char = byte_level_chars()
        self._lengths = [len(raw) for raw in bpe.token_bytes]  # each token's bytes
        self._signatures: dict[tuple[Any, ...], int] = {}
        self._classes: dict[str, int] = {}
        self._reps: list[str] = []
        self._letter = self.char_class("a")
        self._generic: dict[int, int] = {}  # a contraction letter's class -> the letter class
        self._plain: dict[str, int] = {}  # a character -> its class outside contractions
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
        self._shape_ids = shapes
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
                elif may_compose(text[0]):
                    self._nfc_risky[token] = True
        # Both in one byte a token (mask_parts): 1, the model gives it alone; 2, the merges do.
        self._routes = self.alone.astype(np.uint8) | (self.merged.astype(np.uint8) << 1)
        self._groups: OrderedDict[tuple[int, ...], Groups] = OrderedDict()
        self._bpe_cache: dict[tuple[bool, str], list[int]] = {}
        self._row_shapes: dict[str, tuple[tuple[int, ...], list[int]]] = {}
        self._states: dict[tuple[str, tuple[int, ...]], tuple[Any, Any]] = {}
        self._added_in = added_search(bpe.added)
        self._completions: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self._nfc_breaking: OrderedDict[tuple[str, bool], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        empty = np.zeros(0, dtype=bool)
        self.pseudo_shape = np.zeros(0, dtype=np.int64)
        self.pseudo_alone, self.pseudo_merged, self._pseudo_risky = empty, empty, empty
        self._pseudo_texts: list[str] = []
        self._pseudo_of_text: dict[str, list[int]] = {}
        self._goes_on: dict[tuple[int, int], bool] = {}
        self._first_class: np.ndarray | None = None
        self._index_suffixes()

    def attach(self, texts: list[str], heads: np.ndarray) -> None:
        """Reads pseudo candidates (:mod:`memfree.core.canonical_chars`: a head, and a witness
        ``texts[j]``: the head's whole characters and one character it begins, of one class)
        like tokens whose text is the witness's: their shapes, whether the model gives the
        head first for the text (``pseudo_alone``: it starts a chunk) and whether the merges
        alone do (``pseudo_merged``: it continues one). Called before any groups are made."""
        assert not self._groups, "pseudo candidates come before the groups"
        size = len(texts)
        self.pseudo_shape = np.full(size, -1, dtype=np.int64)
        self.pseudo_alone = np.zeros(size, dtype=bool)
        self.pseudo_merged = np.zeros(size, dtype=bool)
        self._pseudo_risky = np.zeros(size, dtype=bool)
        self._pseudo_texts = list(texts)
        self._pseudo_of_text = {}
        for index, text in enumerate(texts):
            if self.bpe.nfc and unicodedata.normalize("NFC", text) != text:
                continue
            shape = self._shape(text, token=True)[0]
            if shape not in self._shape_ids:
                self._shape_ids[shape] = len(self._shape_texts)
                self._shape_texts.append("".join(self._reps[c] for c in shape))
            self.pseudo_shape[index] = self._shape_ids[shape]
            string = "".join(self._byte_char[b] for b in text.encode("utf-8"))
            head = int(heads[index])
            firsts = [model.tokenize(string)[:1] for model in (self._model, self._merges)]
            self.pseudo_alone[index] = [t.id for t in firsts[0]] == [head]
            self.pseudo_merged[index] = [t.id for t in firsts[1]] == [head]
            self._pseudo_risky[index] = self.bpe.nfc and may_compose(text[0])
            self._pseudo_of_text.setdefault(text, []).append(index)
        self._index_suffixes(tokens=False)

    @property
    def nbytes(self) -> int:
        """The bytes the row shapes' kept groups hold (their arrays)."""
        with self._lock:
            kept = list(self._groups.values())
        arrays = {id(a): a for g in kept for a in (g.of_shape, *(t for _, t in g.extra))}
        return sum(a.nbytes for a in arrays.values())  # a shifted row shape shares its arrays

    def _index_suffixes(self, tokens: bool = True) -> None:
        """With ``ignore_merges``, for the sorted token texts: each suffix's token id
        (``tokens``) and the pseudo candidates whose witness it is, what :meth:`_completing`
        reads as arrays. Made again when unpickled, not kept (4-8 MiB for 128k ids, about
        half a second each)."""
        if not self.ignore_merges:
            return
        if tokens:
            self._suffixes = suffix_ids(self._sorted, self.bpe.ids_of)
        if self._pseudo_of_text:
            which = {text: number for number, text in enumerate(self._pseudo_of_text)}
            lists = list(self._pseudo_of_text.values())
            self._pseudo_suffixes = (suffix_ids(self._sorted, which)[1], lists)

    def class_of(self, char: str) -> int:
        """A character's class outside contractions (what a pseudo candidate is kept per)."""
        return self._generic_class(self.char_class(char))

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with empty caches (and their own lock); the two BPE models
        (5 MiB each for 151k ids) are made again from the merge tree, not pickled."""
        state = self.__dict__.copy()
        for name in ("_lock", "_class_lock", "_groups", "_bpe_cache", "_completions"):
            state.pop(name)
        for name in ("_nfc_breaking", "_row_shapes", "_states"):
            state.pop(name, None)
        state.pop("_reach", None)  # made again from the pre-tokenizer
        for name in ("_model", "_merges", "_strings", "_lengths"):
            state.pop(name)
        for name in ("_suffixes", "_pseudo_suffixes"):  # 4-8 MiB for 128k ids: made again
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from tokenizers import models

        self.__dict__.update(state)
        tree = self.bpe.tree
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in tree.merges]
        self._model = models.BPE(tree.vocab, merges, ignore_merges=self.ignore_merges)
        self._merges = self.bpe.merges_model
        self._strings = tree.strings
        self._lengths = [len(raw) for raw in self.bpe.token_bytes]
        self._index_suffixes()
        self._reach = SplitReach.of(self._pre)
        self._groups = OrderedDict()
        self._bpe_cache = {}
        self._row_shapes = {}
        self._states = {}
        self._completions = OrderedDict()
        self._nfc_breaking = OrderedDict()
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
        plain = self._plain
        if not token:
            try:  # every character's plain class known: none is an apostrophe (see below)
                return self._runs([plain[c] for c in text], len(text))
            except KeyError:
                pass
        known = self._classes
        if all(c in known for c in text):  # every character met before: no probe
            classes = [known[c] for c in text]
        else:
            classes = [self.char_class(c) for c in text]
        apostrophe, generic = self._apostrophe, self._generic
        if apostrophe not in classes:  # no contraction: each character's plain class
            start = 2 if token else 0
            for char in text[start:]:
                if char not in plain:  # only characters of texts without an apostrophe
                    plain[char] = self._generic_class(known[char])
            classes[start:] = [plain[c] for c in text[start:]]
        else:
            for index, cls in enumerate(classes):  # after an apostrophe, or a token's first two
                if (index and classes[index - 1] == apostrophe) or (
                    index > 1 and classes[index - 2] == apostrophe
                ):
                    continue
                if not (token and index < 2):
                    found = generic.get(cls)
                    classes[index] = found if found is not None else self._generic_class(cls)
        return self._runs(classes, len(text))

    def row_shape(self, text: str) -> tuple[tuple[int, ...], list[int]]:
        """:meth:`_shape` of a row's last chunks, the last ones read kept: the next step places
        the row by them (:func:`~memfree.core.row_tail.split_moved`). Not to be changed."""
        known = self._row_shapes.get(text)
        if known is None:
            known = self._shape(text, token=False)
            if len(self._row_shapes) >= _SHAPES:
                self._row_shapes.clear()
            self._row_shapes[text] = known
        return known

    def _runs(self, classes: list[int], length: int) -> tuple[tuple[int, ...], list[int]]:
        """:meth:`_shape` from each character's class: runs longer than ``_CAP`` (but of
        digits) cut to their first and last characters."""
        shape: list[int] = []
        where: list[int] = []
        index = 0
        for cls, run in itertools.groupby(classes):
            end = index + len(list(run))
            if end - index > _CAP and cls != self._digit:
                shape.extend([cls] * _CAP)
                where.append(index)
                where.extend(range(end - _CAP + 1, end))
            else:
                shape.extend([cls] * (end - index))
                where.extend(range(index, end))
            index = end
        where.append(length)
        return tuple(shape), where

    # -- groups ---------------------------------------------------------------------------------

    def groups(self, shape: tuple[int, ...]) -> Groups:
        with self._lock:
            known = self._groups.get(shape)
            if known is not None:
                self._groups.move_to_end(shape)
                return known
        row = "".join(self._reps[c] for c in shape)
        starts = [span[0] for _, span in self._pre.pre_tokenize_str(row)]
        end = tuple(start for start in starts if start > 0)  # the row's text alone
        if len(starts) > 1 and self._reach is not None and self._reach.settled(row, starts):
            # No text moves the row's boundaries: its last chunk's groups, shifted (kept too).
            groups = self.groups(shape[starts[-1] :]).shifted(tuple(starts[1:-1]), starts[-1])
            return self._kept(shape, groups)
        found: dict[tuple[int, tuple[int, ...]], int] = {}
        of_shape = np.full(len(self._shape_texts), -1, dtype=np.int64)
        pending: dict[int, set[int]] = {}  # group -> tokens in it only when text follows
        size, spaced, pre = len(row), row[-1:].isspace(), self._pre.pre_tokenize_str
        for index, candidate in enumerate(self._shape_texts):
            # _reading(row, candidate, ""), inlined: a new row shape reads every candidate.
            starts = [span[0] for _, span in pre(row + candidate)]
            at = bisect.bisect_right(starts, size)
            if at == len(starts) or starts[at] >= size + len(candidate):  # crosses none
                own = (starts[at - 1], tuple(starts[1 if starts[0] == 0 else 0 : at - 1]))
                of_shape[index] = found.setdefault(own, len(found))
            if spaced and len(candidate) == 1 and candidate.isspace():
                # A whitespace run may give its last character to what follows: the run as
                # it stands, then this one alone, before a character that is not whitespace.
                for after in self._after_space():
                    reading = self._reading(row, candidate, after)
                    if reading is not None:
                        group = found.setdefault(reading[:2], len(found))
                        if group != of_shape[index]:
                            pending.setdefault(group, set()).update(
                                self._spaces(index, after if reading[2] else "")
                            )
        narrow = np.int8 if len(found) < 128 else np.int16  # a few groups per shape
        extra = tuple(
            (group, np.array(sorted(tokens), dtype=np.int64))
            for group, tokens in pending.items()
            if tokens
        )
        # The last entry: candidates without a shape (shape index -1) are in no group.
        return self._kept(
            shape, Groups(np.append(of_shape, -1).astype(narrow), tuple(found), extra, end)
        )

    def _kept(self, shape: tuple[int, ...], groups: Groups) -> Groups:
        with self._lock:
            self._groups[shape] = groups
            if len(self._groups) > _SHAPES:
                self._groups.popitem(last=False)
        return groups

    def _reading(
        self, row: str, candidate: str, after: str
    ) -> tuple[int, tuple[int, ...], bool] | None:
        """Where the pre-tokenizer puts a candidate after ``row`` and before ``after``: the
        start of its chunk, the chunk boundaries inside the row, and whether its chunk goes on
        into ``after`` (None: it crosses a boundary, or goes on from a chunk before it)."""
        size, end = len(row), len(row) + len(candidate)
        starts = [span[0] for _, span in self._pre.pre_tokenize_str(row + candidate + after)]
        # The starts increase: those up to the row's end, then the first one after it.
        at = bisect.bisect_right(starts, size)
        if at < len(starts) and starts[at] < end:
            return None  # crosses a chunk boundary: one token is never two chunks
        start = starts[at - 1]
        goes_on = bool(after) and end not in starts
        if goes_on and start < size:
            return None
        return start, tuple(starts[1 if starts[0] == 0 else 0 : at - 1]), goes_on

    def _spaces(self, shape: int, after: str) -> list[int]:
        """The whitespace tokens of a candidate shape that may start a chunk on their own
        before a character like ``after`` ("": one that starts a chunk of its own): those for
        which some token that starts with a character of its class goes on with them, no merge
        across (checked with the tokenizer: ``[c, t]`` for their text). Kept per pair."""
        found = []
        for token in np.flatnonzero(self.shape_of == shape).tolist():
            key = (token, self.char_class(after) if after else -1)
            known = self._goes_on.get(key)
            if known is None:
                known = not after or self._witness_after(token, key[1])
                self._goes_on[key] = known
            if known:
                found.append(token)
        return found

    def _witness_after(self, token: int, cls: int) -> bool:
        if self._first_class is None:
            shapes = list(self._shape_ids)
            firsts = np.array([shape[0] if shape else -1 for shape in shapes], dtype=np.int64)
            self._first_class = np.where(self.shape_of >= 0, firsts[self.shape_of], -1)
        goes = (self._first_class == cls) & self.merged & self.bpe.bigram_allowed(token)
        followers = np.flatnonzero(goes)[:64].tolist()
        text = self.bpe.texts[token] or ""
        joined = [text + (self.bpe.texts[t] or "") for t in followers]
        encoded = self.bpe.tokenizer_backend.encode_batch(joined, add_special_tokens=False)
        return any(e.ids == [token, t] for t, e in zip(followers, encoded, strict=True))

    def _after_space(self) -> list[str]:
        """One character of each class that is not whitespace (what may follow a run)."""
        return [rep for rep in self._reps if not rep.isspace()]

    # -- a row ----------------------------------------------------------------------------------

    def state(self, text: str, tokens: list[int]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """The key of a row whose last two chunks are ``text`` with ``tokens``, and what is
        checked per row after the key's mask (``ignore_merges`` and NFC). Kept per text and
        tokens: rows whose chunks before differ meet the same last chunks (a third of a step's
        reads, measured on Qwen 2's vocabulary over code), which the rows' transitions,
        kept per whole read, do not share."""
        memo = (text, tuple(tokens))
        known = self._states.get(memo)
        if known is None:
            known = self._state(text, tokens)
            if len(self._states) >= _STATES:
                self._states.clear()
            self._states[memo] = known
        return known

    def _state(self, text: str, tokens: list[int]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        shape, where = self.row_shape(text)
        groups = self.groups(shape)
        lengths = self._lengths
        ends = list(itertools.accumulate(lengths[t] for t in tokens))
        # Each character's byte offset (and the end's).
        offsets = range(len(text) + 1) if text.isascii() else _offsets(text)
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
            fixes.append((-1, nfc_context(text)))
        # The row's text ending here is its tokens: its chunks, cut where the shape's text
        # alone is (as the facts read theirs), are their tokens' BPE, where the tokenizer
        # answers by its chunks (:meth:`chunk_ids`); else the tokenizer's own answer.
        if self._by_chunks(text):
            cuts = [0, *(where[b] for b in groups.end), len(text)]
            whole = self._chunks_ok(text, tokens, ends, offsets, cuts)
        else:
            whole = self.encode(text) == tokens
        return (shape, tokens[-1], tuple(facts), whole), tuple(fixes)

    def _chunks_ok(
        self, text: str, tokens: list[int], ends: list[int], offsets: Sequence[int], cuts: list[int]
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

    def tokens_before(self, text: str, tokens: tuple[int, ...], cuts: list[int]) -> int:
        """How many of a row's last chunks' ``tokens`` come before the last of ``cuts``
        (character offsets in their ``text``, from 0), where the chunks between ``cuts`` are
        their tokens' BPE; -1 where they are not."""
        ends = list(itertools.accumulate(self._lengths[t] for t in tokens))
        offsets = range(len(text) + 1) if text.isascii() else _offsets(text)
        if not self._chunks_ok(text, list(tokens), ends, offsets, cuts):
            return -1
        return _token_index(ends, offsets[cuts[-1]])

    def encode(self, text: str) -> list[int]:
        """The tokenizer's ids for ``text`` (:meth:`~memfree.vocab.bpe.ByteLevelBpe.encode`),
        from its chunks where :meth:`chunk_ids` reads them, else from the tokenizer."""
        ids = self.chunk_ids(text)
        return ids if ids is not None else self.bpe.encode(text)

    def chunk_ids(self, text: str) -> list[int] | None:
        """The tokenizer's ids for ``text`` from its chunks' BPE, each chunk's kept: a row's
        text is new, its chunks (words, runs) are not. The same ids as the tokenizer's where the
        text holds no added token's content (the tokenizer cuts those out first) and
        normalizing leaves it as it is (NFC already, for Qwen 2's normalizer); None for any
        other text, and where the chunks' spans do not tile it."""
        if not self._by_chunks(text):
            return None
        ids: list[int] = []
        at = 0
        for _, (start, end) in self._pre.pre_tokenize_str(text):
            if start != at:
                return None
            ids += self._encode(text[start:end], merges=False)
            at = end
        return ids if at == len(text) else None

    def _by_chunks(self, text: str) -> bool:
        """Whether the tokenizer's ids for ``text`` are its pre-tokenizer chunks' BPE: it holds
        no added token's content (the tokenizer cuts those out first) and normalizing leaves it
        as it is (NFC already, for Qwen 2's normalizer)."""
        added = self._added_in
        return not (
            (added is not None and added.search(text))
            or (self.bpe.nfc and not unicodedata.is_normalized("NFC", text))
        )

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
        alone, merged = self.mask_parts(key)
        return alone | (merged & bigram)

    def mask_parts(self, key: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`mask` in two parts that do not read the row's last token: the candidates
        allowed whatever it is (they start a chunk), and those allowed where the merge-tree
        test after it passes (they go on with the row's last chunk). The mask is
        ``alone | (merged & bigram)``: a candidate reads the test at its own index only."""
        shape, _, facts, _ = key
        groups = self.groups(shape)
        routes = groups.routes(facts, len(shape))[self.shape_of]
        routes &= self._routes  # the token's own: 1 if the model gives it alone, 2 the merges
        alone = (routes & 1).view(bool)
        merged = (routes >> 1).view(bool)
        for number, tokens in groups.extra:
            if facts[number]:
                if groups.groups[number][0] == len(shape):
                    alone[tokens] |= self.alone[tokens]
                else:
                    merged[tokens] |= self.merged[tokens]
        return alone, merged

    def mask_pseudo(self, key: tuple[Any, ...], bigram: np.ndarray) -> np.ndarray:
        """bool `(K,)`: the pseudo candidates a key allows (before the per-row fixes), as
        :meth:`mask` for tokens; ``bigram``: the merge-tree test after the row's last token,
        at each pseudo candidate's head."""
        alone, merged = self.mask_pseudo_parts(key)
        return alone | (merged & bigram)

    def mask_pseudo_parts(self, key: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`mask_pseudo` in two parts, as :meth:`mask_parts` (the test read at each pseudo
        candidate's head)."""
        shape, _, facts, _ = key
        routes = self.groups(shape).routes(facts, len(shape))[self.pseudo_shape]
        return (routes & 1).view(bool) & self.pseudo_alone, (routes >> 1).view(bool) & (
            self.pseudo_merged
        )

    def start_pseudo(self) -> np.ndarray:
        """bool `(K,)`: the pseudo candidates allowed where a text starts (each its own chunk,
        its head first)."""
        return (self.groups(()).of_shape[self.pseudo_shape] >= 0) & self.pseudo_alone

    def fix_pseudo(
        self, key: tuple[Any, ...], fixes: tuple[Any, ...], allowed: np.ndarray
    ) -> np.ndarray:
        """:meth:`fix` for the pseudo candidates (:meth:`bans_pseudo`)."""
        return _without(allowed, self.bans_pseudo(key, fixes))

    def bans_pseudo(self, key: tuple[Any, ...], fixes: tuple[Any, ...]) -> np.ndarray:
        """int64: the pseudo candidates a row's fixes ban: a witness that would break NFC, or
        whose text the continued chunk's text makes a token (``ignore_merges``); another
        character of its class might not: an over-ban, never an under-ban (a row inside the
        character is checked with the tokenizer itself)."""
        groups = self.groups(key[0])
        banned: list[np.ndarray] = []
        for number, text in fixes:
            if number < 0:
                banned.append(self.breaking_nfc(text, pseudo=True))
                continue
            completing = np.asarray(self._completing(text, True), dtype=np.int64)
            banned.append(completing[groups.of_shape[self.pseudo_shape[completing]] == number])
        return np.concatenate(banned) if banned else np.zeros(0, dtype=np.int64)

    def fix(self, key: tuple[Any, ...], fixes: tuple[Any, ...], mask: np.ndarray) -> np.ndarray:
        """Bans what the key cannot say (:meth:`bans`)."""
        return _without(mask, self.bans(key, fixes))

    def bans(self, key: tuple[Any, ...], fixes: tuple[Any, ...]) -> np.ndarray:
        """int64: the candidates a row's fixes ban (whatever the key's mask allows): a
        continued chunk that is itself a token (``ignore_merges`` gives that token instead), a
        candidate that breaks NFC."""
        groups = self.groups(key[0])
        banned: list[np.ndarray] = []
        alone: np.ndarray | None = None
        for number, text in fixes:
            if number < 0:
                banned.append(self.breaking_nfc(text, pseudo=False))
                continue
            completing = np.asarray(self._completing(text), dtype=np.int64)
            if not completing.size:
                continue
            members = [tokens for group, tokens in groups.extra if group == number]
            mine = groups.of_shape[self.shape_of[completing]] == number
            if members:
                mine |= np.isin(completing, np.concatenate(members))
            if alone is None:
                # Tokens a split reading allows as a chunk of their own: no continued chunk
                # bans them (read once a row, and only where a fix completes a token).
                extra = [
                    tokens
                    for group, tokens in groups.extra
                    if key[2][group] and groups.groups[group][0] == len(key[0])
                ]
                alone = np.concatenate(extra) if extra else np.zeros(0, dtype=np.int64)
                alone = alone[self.alone[alone]]
            if alone.size:
                mine &= ~np.isin(completing, alone)
            banned.append(completing[mine])
        return np.concatenate(banned) if banned else np.zeros(0, dtype=np.int64)

    def breaking_nfc(self, context: str, pseudo: bool) -> np.ndarray:
        """int64: the candidates (``pseudo``: the pseudo candidates) whose text, appended to a
        row whose NFC context (:func:`nfc_context`) is ``context``, leaves the text not NFC.
        Kept per context: rows that end alike share it."""
        with self._lock:
            known = self._nfc_breaking.get((context, pseudo))
        if known is None:
            risky = self._pseudo_risky if pseudo else self._nfc_risky
            texts = self._pseudo_texts if pseudo else self.bpe.texts
            found = []
            for index in np.flatnonzero(risky).tolist():
                joined = context + (texts[index] or "")
                if unicodedata.normalize("NFC", joined) != joined:
                    found.append(index)
            known = np.array(found, dtype=np.int64)
            with self._lock:
                self._nfc_breaking[(context, pseudo)] = known
                if len(self._nfc_breaking) > 4 * _CACHE:
                    self._nfc_breaking.popitem(last=False)
        return known

    def _completing(self, text: str, pseudo: bool = False) -> tuple[int, ...]:
        """The candidates ``c`` such that ``text + text(c)`` is a token; ``pseudo``: the pseudo
        candidates ``j`` such that ``text`` and their witness's text is one (kept per text)."""
        with self._lock:
            known = self._completions.get((text, pseudo))
            if known is not None:  # kept by last use: a short text (" ") walks thousands
                self._completions.move_to_end((text, pseudo))
        if known is None:
            # The tokens whose text starts with ``text``: one range of the sorted texts.
            entries, cut = self._sorted, len(text)
            low, high = prefix_range(entries, text)
            if pseudo and (high - low < _FEW_ENTRIES or not self._pseudo_of_text):
                of_text = self._pseudo_of_text
                found = [j for entry, _ in entries[low:high] for j in of_text.get(entry[cut:], ())]
            elif pseudo:  # the witnesses of each entry's text past the cut, read at once
                (ids, lists), starts = self._pseudo_suffixes, self._suffixes[0]
                rests = ids[starts[low:high] + cut]
                found = [j for number in rests[rests >= 0].tolist() for j in lists[number]]
            elif high - low < _FEW_ENTRIES:
                get = self.bpe.ids_of.get
                rests = (get(entry[cut:], -1) for entry, _ in entries[low:high])
                found = [token for token in rests if token >= 0]
            else:  # each entry's text past the cut, as a token's id (-1: none), read at once
                starts, ids = self._suffixes
                rests = ids[starts[low:high] + cut]
                found = rests[rests >= 0].tolist()
            known = tuple(found)
            with self._lock:
                self._completions[(text, pseudo)] = known
                if len(self._completions) > 4 * _CACHE:
                    self._completions.popitem(last=False)
        return known


def _without(allowed: np.ndarray, banned: np.ndarray) -> np.ndarray:
    """``allowed`` with ``banned`` set False (a copy where anything is banned)."""
    if not banned.size:
        return allowed
    allowed = allowed.copy()
    allowed[banned] = False
    return allowed


def added_search(added: Iterable[str]) -> re.Pattern[str] | None:
    """A search for any of the added tokens' contents ``added`` in a text, longest first
    (None: there are none)."""
    contents = sorted((c for c in added if c), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, contents))) if contents else None


def _offsets(text: str) -> list[int]:
    """Each character's byte offset in ``text`` (and the end's)."""
    return [0, *itertools.accumulate(len(c.encode("utf-8")) for c in text)]


def _token_index(ends: list[int], offset: int) -> int:
    """How many tokens end at or before byte ``offset``."""
    return bisect.bisect_right(ends, offset)


__all__ = ["SplitChunks", "added_search"]
