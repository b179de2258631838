"""Canonical decoding: a candidate is allowed only if the row's ids with it appended can still be
the tokenizer's own tokenization of their text: a prefix of the tokenization of some text that
begins with their text. End of sequence is allowed only where the ids are the tokenization of
their text as it stands.

An output ended by end of sequence is then its text's tokenization, so the token guard's
promise (no stored n-gram in the ids) holds over the text: tokenizing the output's text again
gives back the ids the guard checked. An output cut elsewhere agrees but for a pending
whitespace run (one whitespace character after a run, split as it is before the next word):
its other reading is returned with the step (:class:`Pending`) and checked against the filter
by :class:`~memfree.core.text_promise.TextPromiseMasker`. Without canonical decoding a model
blocked from the corpus's split spells the same text with another split (``"  "`` where the
corpus has ``" ", " "``), which no tokenizer would produce from that text.

The condition is decided per row from the row's last pre-tokenizer chunks. The split patterns
(Llama 3, Qwen 2, ...) are read through the pre-tokenizer itself
(:mod:`memfree.core.canonical_split`); GPT-2's pattern (runs of letters, numbers, punctuation
or whitespace, contractions, a whitespace run that gives its last space to the next word) is
read by hand-written rules (:mod:`memfree.core.canonical_rules`).

Text is cut at special and added tokens, as the tokenizer cuts it. A special token is allowed
only to end the output (end of sequence): elsewhere it would sit inside the text, invisible once
special tokens are skipped, and split a stored n-gram there. A character the tokenizer writes
with several tokens is read by :mod:`memfree.core.canonical_chars` (its head answered as pseudo
candidates beside the tokens, by GPT-2's rules or the split reading; a row inside it from the
state before its head). Each row's answer
is computed on the CPU from its last chunks and kept by its state (the chunk's kind and last
token), so steps mostly read a cached mask.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from memfree.core.canonical_chars import Characters
from memfree.core.canonical_rules import (
    ENDS_CANONICAL,
    RULE_KINDS,
    Columns,
    contraction_heads,
    cut_mask,
    pseudo_columns,
    rule_mask,
    split_enter,
)
from memfree.core.canonical_split import SplitChunks
from memfree.core.canonical_spm import SentencePieceMasker
from memfree.core.canonical_state import RUN_OF_CLASS, RowStates, Tail
from memfree.core.row_automaton import RowAutomaton
from memfree.core.row_tail import in_space_run
from memfree.core.rule_automaton import RuleAutomaton
from memfree.core.split_rows import SplitRows
from memfree.core.state_table import StateTable, TableMasker, is_banned, row_bounds
from memfree.core.table_cache import cached_tables
from memfree.vocab.bpe import (
    APOSTROPHE,
    LETTER,
    NONE,
    NUMBER,
    PUNCT,
    RUN_LETTERS,
    RUN_NUMBERS,
    RUN_PUNCT,
    SP,
    WS,
    ByteLevelBpe,
    tables_key,
)
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.sentencepiece import is_sentencepiece

_CACHE = 256
_BIGRAMS = 64  # merge tests kept, per last token


class CanonicalMasker(TableMasker):
    """Bans every candidate that would make a row's ids not its text's tokenization.

    Args:
        info: the tokenizer (byte-level BPE with GPT-2's pre-tokenizer; see
            :mod:`memfree.vocab.bpe`).
        end_token_ids: ids that may end the output (allowed where the row is its text's
            tokenization, or where nothing else is).

    Raises:
        CanonicalUnsupportedError: another tokenizer family.
    """

    UNPICKLED = (
        *("_lock", "_masks", "_bigrams", "_readings", "_pseudos", "_entering"),
        *("_columns", "_pseudo_columns", "_pseudo_runs", "_runs", "_split_rows"),
        *("table", "automaton"),
    )

    def __init__(
        self, info: TokenizerInfo, end_token_ids: Iterable[int] = (), *, _split: bool = False
    ) -> None:
        self.info = info
        self.bpe = bpe_tables(info)
        self.end_token_ids = tuple(sorted({int(t) for t in end_token_ids}))
        vocabulary = _vocabulary(info, self.bpe)
        self._cuts = vocabulary.cuts
        self._bytes = list(self.bpe.token_bytes)
        self._new = vocabulary.new
        self._added = vocabulary.added
        self._split_enter = vocabulary.split_enter
        self._vocabulary = vocabulary
        self._chars = None if _split else vocabulary.chars
        self._masks: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()
        self._bigrams: OrderedDict[int, np.ndarray] = OrderedDict()
        self._readings: OrderedDict[tuple[int, ...], dict[int, tuple[int, ...] | None]] = (
            OrderedDict()
        )
        self._prefixes: dict[str, np.ndarray] = {}
        self._pseudos: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()
        self.split = vocabulary.split if (self.bpe.pattern or _split) else None
        if _split and self.split is None:
            special = np.isin(np.arange(self.bpe.vocab_size), list(info.special_token_ids))
            self.split = SplitChunks(self.bpe, _written(self.bpe, special | self._added))
        if _split and vocabulary.split is None:  # GPT-2's pattern read as a split one
            self._split_enter = _lone_spaces(self.bpe, self._new)
        self._entering = np.flatnonzero(self._split_enter).tolist()  # whitespace tokens
        self.states = RowStates(
            self.bpe, self._bytes, self._cuts, self.split, self._pair, self._chars
        )
        self._lock = threading.Lock()
        self.fast_runs = True  # tests: False answers every state by the rules' general path
        self._make_columns()
        self.table = StateTable(self._fill)
        self.automaton = self._automaton()

    def _make_columns(self) -> None:
        """What the rules read of the tokens and of the pseudo candidates (bound to this
        masker's caches: made anew for a copy)."""
        v = self._vocabulary
        self._runs: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # see _run_parts
        self._columns = Columns(
            True, v.new, v.added, v.first_letter, v.first_number, v.first_punct, v.first_space,
            self.bpe.self_ok, self.bpe.run, v.runs, v.word_run, v.split_enter, v.after_apostrophe,
            self._starting_with, self._bigram,
        )  # fmt: skip
        chars = self._chars
        self._split_rows = (
            SplitRows(self.bpe, self.split, chars, v.added, self._starting_with)
            if self.split is not None
            else None
        )
        self._pseudo_columns = (
            pseudo_columns(chars, self._bigram, v.runs)
            if chars is not None and chars.size and chars.classify is None
            else None
        )
        # rule_mask's "run" case over the pseudo candidates, before the merge-tree test: per
        # class of run that goes on, (those that start a chunk, those that go on with it).
        self._pseudo_runs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        c = self._pseudo_columns
        if c is not None:
            for cls, continues in (
                (LETTER, c.first_letter), (NUMBER, c.first_number), (PUNCT, c.first_punct)
            ):  # fmt: skip
                self._pseudo_runs[cls] = (c.new & ~continues, c.runs[RUN_OF_CLASS[cls]])

    def _setup(self) -> None:
        """The caches a copy starts without."""
        self._masks = OrderedDict()
        self._bigrams = OrderedDict()
        self._readings = OrderedDict()
        self._pseudos = OrderedDict()
        self._entering = np.flatnonzero(self._split_enter).tolist()  # whitespace tokens
        self._lock = threading.Lock()
        self._make_columns()
        self.table = StateTable(self._fill)
        self.automaton = self._automaton()

    def _automaton(self) -> RowAutomaton | RuleAutomaton:
        """Rows to states. GPT-2's pattern read by rules: rows kept as integers and advanced as
        arrays (:class:`RuleAutomaton`). Split patterns: a state id is a row's read (its state
        and last chunks; :class:`RowAutomaton`)."""
        states = self.states
        if self.split is None:
            return RuleAutomaton(states)
        return RowAutomaton(
            read=states.read,
            advance=lambda read, token: states.advance(read[0], read[1], token),
            key_of=lambda read: read[0],
            past=(("past",), None),
            vocab_size=self.bpe.vocab_size,
            flag=lambda read: read[1] is not None and in_space_run(read[0], read[1].text),
        )

    # -- the step -------------------------------------------------------------------------------

    def step(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[Pending]]:
        """:meth:`banned_mask`, and each allowed candidate that leaves its row pending (a
        whitespace run whose split waits on the next character) with the other reading of
        its text: what the text, ended there, is tokenized as."""
        device = torch.device(device or contexts.device)
        arrays = contexts.detach().cpu().numpy().astype(np.int64, copy=False)
        count, width = arrays.shape
        # Left padding (negative ids add no text) and ids no text gives, for all rows at once:
        # a row that advances is never turned into a Python list.
        firsts, past = row_bounds(arrays, self.bpe.vocab_size)
        for _ in range(sum(past)):  # an id no text gives: not canonical
            self.states.note(" (it holds an id past the tokenizer's vocabulary)")
        pending: list[Pending] = []
        automaton, states = self.automaton, self.states
        with automaton.lock:
            # Each row's key id; the rows in a whitespace run, with their last chunks.
            if isinstance(automaton, RuleAutomaton):
                fields = automaton.step(arrays, firsts, past)
                kids = fields[:, 0]
                wanted = np.flatnonzero(automaton.spaces(kids)).tolist()
                spaces = [
                    (
                        index,
                        states.tail_of(
                            automaton.spot(fields[index]), arrays[index, firsts[index] :]
                        ),
                    )
                    for index in wanted
                ]
            else:
                ids = automaton.step(arrays, firsts, past)
                kids = automaton.key_ids(ids)
                wanted = np.flatnonzero(automaton.flags(ids)).tolist()
                spaces = [(index, automaton.reads[ids[index]][1]) for index in wanted]
            banned, host = self.table.gather(
                kids, automaton.keys, automaton.generation, vocab_width, device, wanted
            )
        entering = self._entering
        for index, tail in spaces:
            assert tail is not None  # a row in a whitespace run is canonical
            allowed = [t for t in entering if t < vocab_width and not is_banned(host[index], t)]
            replaced, readings = self._other_readings(tail, allowed)
            pending.extend(Pending(index, t, width - replaced, tokens) for t, tokens in readings)
        active = torch.ones(count, dtype=torch.bool, device=device)
        return banned, active, pending

    def _fill(self, row: np.ndarray, key: tuple[Any, ...], width: int) -> None:
        """``row``: the candidates a state bans (ids past the vocabulary always; end of
        sequence where the state may not end)."""
        ends = [token for token in self.end_token_ids if token < width]
        size = min(width, self.bpe.vocab_size)
        row[size:] = True  # ids past the vocabulary
        if key[0] == "run" and not key[-1] and self.fast_runs:
            parts = self._run_parts(key[1])
            if parts is not None:  # the run's row before the merge-tree test, then the test
                banned, tested = parts
                row[:size] = banned[:size]
                joined = self.bpe.joined(key[2])
                joined = joined[tested[joined]]
                row[joined[joined < size]] = True
                row[ends] = False  # a run may end: its text, ended here, is its ids
                return
        if key[0] == "split" and self._split_rows is not None and self.fast_runs:
            whole = row if width >= self.bpe.vocab_size else np.empty(self.bpe.vocab_size, bool)
            allows = self._split_rows.fill(whole, key)  # from parts that states share
            if whole is not row:  # scores narrower than the vocabulary
                row[:] = whole[:width]
            if key[1][3] or not allows:
                row[ends] = False
            return
        if key[0] == "past":
            row[:size] = True
        else:
            allowed = self._allowed(key, keep=False)
            np.logical_not(allowed[:size], out=row[:size])
            if not _may_end(key, allowed):
                return
        row[ends] = False

    def _run_parts(self, cls: int) -> tuple[np.ndarray, np.ndarray] | None:
        """GPT-2's rules after a run of class ``cls`` (letters, digits or punctuation; no
        added-token content begun), split at the merge-tree test after its last token ``a``.
        The rules' answer is, candidate by candidate, an "or" of routes that do not read the
        test (a token that starts a chunk, an added token, a head that starts one) and routes
        that need it to pass *for that candidate* (a token, or a head, that goes on with the
        run). So with ``J`` the tokens the test fails, the banned row is ``banned | (J &
        tested)``: ``banned`` what no route allows (the test passing everywhere), ``tested``
        what only the test's routes allow. Kept per class; None where the rules do not read
        the state (a split pattern)."""
        chars = self._chars
        heads = chars is not None and chars.size
        if (
            cls not in RUN_OF_CLASS
            or self.split is not None
            or (heads and cls not in self._pseudo_runs)
        ):
            return None
        parts = self._runs.get(cls)
        if parts is None:
            size = self.bpe.vocab_size
            key = ("run", cls, 0, ())
            passing = self._columns._replace(bigram=lambda a: np.ones(size, dtype=bool))
            failing = self._columns._replace(bigram=lambda a: np.zeros(size, dtype=bool))
            everywhere = rule_mask(key, passing, self.bpe.ids_of)
            untested = rule_mask(key, failing, self.bpe.ids_of)
            if heads:
                assert chars is not None
                starts, goes_on = self._pseudo_runs[cls]
                everywhere[chars.heads[starts | goes_on]] = True
                untested[chars.heads[starts]] = True
            parts = self._runs[cls] = (~everywhere, everywhere & ~untested)
        return parts

    def allowed(self, ids: list[int], array: np.ndarray | None = None) -> np.ndarray:
        """bool `(vocab_size,)`: the candidates that keep ``ids`` canonical (ends excluded);
        ``array``: the same ids as int64, when the caller has them."""
        return self._allowed(self.states.state(ids, array))

    def may_end(self, ids: list[int]) -> bool:
        """Whether end of sequence is allowed after ``ids``: their text, ended here, is
        tokenized as ``ids`` (or the row is not canonical at all: only a prompt makes one)."""
        key = self.states.state(ids)
        return _may_end(key, self._allowed(key))

    def _allowed(self, key: tuple[Any, ...], keep: bool = True) -> np.ndarray:
        """The candidates a state allows; ``keep``: cache the answer (the step's table keeps
        its own; a split state's mask before its row's fixes is cached either way, rows share
        it)."""
        fixes: tuple[Any, ...] = ()
        if key[0] == "split":
            key, fixes = key[:-1], key[-1]
        elif not keep:
            with self._lock:
                known = self._masks.get(key)
            return known if known is not None else self._compute(key)
        mask = self._cached(key)
        if key[0] == "split" and self.split is not None:
            if fixes:
                mask = self.split.fix(key[1], fixes, mask)
            chars = self._chars
            if chars is not None and chars.size:  # heads: one of their pseudo candidates
                pseudo = self._pseudo(key)
                if fixes:
                    pseudo = self.split.fix_pseudo(key[1], fixes, pseudo)
                if pseudo.any():
                    mask = mask.copy()
                    mask[chars.heads[pseudo]] = True
        return mask

    def _other_readings(
        self, tail: Tail, entering: list[int]
    ) -> tuple[int, list[tuple[int, tuple[int, ...]]]]:
        """A row that ends in a whitespace run (its last chunks ``tail``): of the whitespace
        characters' tokens that enter the split reading, those in ``entering`` (the ones the
        row's banned row allows: the others need no reading), with the tokens the run and the
        character would have if the text ended there (one chunk), where they differ; and how
        many of the row's last tokens those replace (the run's). The chunk before the run
        keeps its tokens (its end is fixed), so this is kept per run and token."""
        # GPT-2's run alone (the chunk before it is fixed); a split row's two chunks.
        chars, count = tail.last if tail.last is not None and self.split is None else (0, 0)
        run, run_tokens = tail.text[chars:], tail.tokens[count:]
        with self._lock:
            known = self._readings.get(run_tokens)
            if known is None:
                known = self._readings[run_tokens] = {}
                if len(self._readings) > _CACHE:
                    self._readings.popitem(last=False)
            else:
                self._readings.move_to_end(run_tokens)
        found = []
        for token in entering:
            if token not in known:
                char = self.bpe.texts[token]
                assert char is not None
                encode = self.bpe.encode if self.split is None else self.split.encode
                tokens = tuple(encode(run + char))
                known[token] = None if tokens == (*run_tokens, token) else tokens
            reading = known[token]
            if reading is not None:
                found.append((token, reading))
        return len(run_tokens), found

    def _cached(self, key: tuple[Any, ...]) -> np.ndarray:
        with self._lock:
            mask = self._masks.get(key)
            if mask is not None:
                self._masks.move_to_end(key)
                return mask
        mask = self._compute(key)
        with self._lock:
            self._masks[key] = mask
            if len(self._masks) > _CACHE:
                self._masks.popitem(last=False)
        return mask

    # -- the row's state ------------------------------------------------------------------------

    # -- the answer for one state ---------------------------------------------------------------

    def _compute(self, key: tuple[Any, ...]) -> np.ndarray:
        """bool `(vocab_size,)`: the candidates a state allows."""
        kind = key[0]
        if kind == "partial":  # inside a character: the state before its head says
            _, before, chain, tail, _ = key
            assert self._chars is not None
            if tail is not None:  # a split pattern: checked with the tokenizer itself
                return self._chars.allowed_after(tail.text, tail.tokens, chain)
            return self._chars.allowed(chain, self._pseudo(before))
        if kind == "dead":
            return np.zeros(self.bpe.vocab_size, dtype=bool)
        if kind == "broken":
            return self._by_definition(list(key[1]), b"".join(self._bytes[t] for t in key[1]))
        if kind == "split" and self.split is not None:
            mask = self.split.mask(key[1], self._bigram(key[1][1]))
        elif kind == "tail":
            mask = self._by_definition(list(key[1]), key[2].encode("utf-8"))
        else:
            mask = rule_mask(key, self._columns, self.bpe.ids_of)
            if self._chars is not None and self._chars.size:
                pseudo = self._pseudo(key)
                mask[self._chars.heads[pseudo]] = True
            return mask
        return cut_mask(key, mask, self._columns)

    def _pseudo(self, key: tuple[Any, ...]) -> np.ndarray:
        """bool `(K,)`: the pseudo candidates (a head and the class of the character it
        begins) a state allows (a split state's before its row's fixes); none but where GPT-2's
        rules or the split reading read the state."""
        columns = self._pseudo_columns
        assert self._chars is not None
        if columns is None:
            return self._split_pseudo(key)
        if key[0] == "run" and not key[-1] and key[1] in self._pseudo_runs:
            # Most states: the rules' "run" case over the pseudo candidates, uncached.
            base, run = self._pseudo_runs[key[1]]
            return base | (run & columns.bigram(key[2]))
        with self._lock:
            known = self._pseudos.get(key)
        if known is None:
            if key[0] in RULE_KINDS:
                known = rule_mask(key, columns, self.bpe.ids_of)
            else:
                known = np.zeros(self._chars.size, dtype=bool)
            with self._lock:
                self._pseudos[key] = known
                if len(self._pseudos) > _CACHE:
                    self._pseudos.popitem(last=False)
        return known

    def _split_pseudo(self, key: tuple[Any, ...]) -> np.ndarray:
        """:meth:`_pseudo` for a split pattern: the split reading over the pseudo candidates
        (``("split", key, pending)``), or where a text starts; kept per state."""
        chars, split = self._chars, self.split
        assert chars is not None and split is not None
        with self._lock:
            known = self._pseudos.get(key)
        if known is not None:
            return known
        if key[0] == "split":
            known = split.mask_pseudo(key[1], self._bigram(key[1][1])[chars.heads])
        elif key[0] == "start":
            known = split.start_pseudo()
        else:
            known = np.zeros(chars.size, dtype=bool)
        for rest in key[-1] if key[0] in ("split", "start") else ():
            known = known & ~chars.starting_with(rest)  # it would finish an added token
        with self._lock:
            self._pseudos[key] = known
            if len(self._pseudos) > _CACHE:
                self._pseudos.popitem(last=False)
        return known

    def _by_definition(self, tokens: list[int], data: bytes) -> np.ndarray:
        """For rows that are not canonical (only a prompt makes them): every candidate checked
        against the definition, by tokenizing ``data`` (the text of ``tokens``, from a fixed
        chunk boundary) with it appended. About a third of a second, once per such state."""
        allowed = np.zeros(self.bpe.vocab_size, dtype=bool)
        ids, texts = [], []
        written = self._new | self._added | (self.bpe.first == NONE)
        for candidate in np.flatnonzero(written):
            try:
                texts.append((data + self._bytes[candidate]).decode("utf-8"))
            except UnicodeDecodeError:
                continue
            ids.append(int(candidate))
        encoded = self.bpe.tokenizer_backend.encode_batch(texts, add_special_tokens=False)
        for token, encoding in zip(ids, encoded, strict=True):
            allowed[token] = encoding.ids == [*tokens, token]
        allowed[list(self.info.special_token_ids)] = False
        return allowed

    def _bigram(self, a: int) -> np.ndarray:
        """bool `(vocab_size,)`: the merge-tree test after ``a`` (read from the tables' runs,
        about 20 µs; the few latest kept, as a state's answer reads it more than once)."""
        with self._lock:
            cached = self._bigrams.get(a)
            if cached is not None:
                self._bigrams.move_to_end(a)
                return cached
        row = self.bpe.bigram_allowed(a)
        row.flags.writeable = False  # shared: a caller that wrote into it would be a bug
        with self._lock:
            self._bigrams[a] = row
            if len(self._bigrams) > _BIGRAMS:
                self._bigrams.popitem(last=False)
        return row

    def _pair(self, a: int, token: int) -> bool:
        """Whether no merge joins ``token`` to ``a`` (one entry of :meth:`_bigram`)."""
        return self.bpe.pair_allowed(a, token)

    def _starting_with(self, prefix: str) -> np.ndarray:
        cached = self._prefixes.get(prefix)
        if cached is None:
            cached = self._prefixes[prefix] = self.bpe.starting_with(prefix)
        return cached


@dataclass(frozen=True, eq=False)
class _Vocabulary:
    """What the rules read of every token, derived once per tokenizer (a masker is then cheap
    to make: one per ``generate()`` call costs no table)."""

    cuts: frozenset[int]  # ids where the tokenizer cuts text (special and added tokens)
    new: np.ndarray  # starts a chunk: the tokenizer gives it back alone (no special token)
    added: np.ndarray  # added tokens that are not special (their own text, always cut)
    first_letter: np.ndarray
    first_number: np.ndarray
    first_punct: np.ndarray
    first_space: np.ndarray
    runs: dict[int, np.ndarray]  # run kind -> tokens that are one such run and come back alone
    word_run: np.ndarray
    split_enter: np.ndarray  # GPT-2's: split_enter(); a split pattern's: _lone_spaces()
    after_apostrophe: np.ndarray  # see contraction_heads
    split: SplitChunks | None  # a split pattern's chunk rules (Llama 3, Qwen 2)
    chars: Characters  # characters written with several tokens


def _vocabulary(info: TokenizerInfo, bpe: ByteLevelBpe) -> _Vocabulary:
    with _TABLES_LOCK:
        known = _VOCABULARIES.get(tables_key(info))
    if known is not None:
        return known
    vocabulary = _build_vocabulary(info, bpe)
    with _TABLES_LOCK:
        _VOCABULARIES[tables_key(info)] = vocabulary
    return vocabulary


def _build_vocabulary(info: TokenizerInfo, bpe: ByteLevelBpe) -> _Vocabulary:
    size = bpe.vocab_size
    special = np.isin(np.arange(size), list(info.special_token_ids))
    added = np.zeros(size, dtype=bool)
    for token in bpe.added.values():
        if token < size and token not in info.special_token_ids:
            added[token] = True
    first, run = bpe.first, bpe.run
    runs = {kind: (run == kind) & bpe.self_ok for kind in range(4)}
    word_run = runs[RUN_LETTERS] | runs[RUN_NUMBERS] | runs[RUN_PUNCT]
    split = SplitChunks(bpe, _written(bpe, special | added)) if bpe.pattern else None
    chars = Characters.of(
        bpe, ~(special | added), classify=split.class_of if split is not None else None
    )
    if split is not None and chars.size:
        split.attach(chars.texts, chars.heads)
    vocabulary = _Vocabulary(
        cuts=frozenset(info.special_token_ids) | frozenset(bpe.added.values()),
        new=bpe.self_ok & ~special,
        added=added,
        first_letter=first == LETTER,
        first_number=first == NUMBER,
        first_punct=(first == PUNCT) | (first == APOSTROPHE),
        first_space=(first == SP) | (first == WS),
        runs=runs,
        word_run=word_run,
        split_enter=(
            split_enter(bpe, bpe.self_ok & ~special & ~added, word_run)
            if split is None
            else _lone_spaces(bpe, bpe.self_ok & ~special & ~added)
        ),
        after_apostrophe=contraction_heads(bpe.texts),
        split=split,
        chars=chars,
    )
    return vocabulary


def _lone_spaces(bpe: ByteLevelBpe, new: np.ndarray) -> np.ndarray:
    """A split pattern's tokens that may enter a whitespace run's split reading (and leave the
    row pending): every token that is one whitespace character and comes back alone."""
    return new & np.array([t is not None and len(t) == 1 and t.isspace() for t in bpe.texts])


def _written(bpe: ByteLevelBpe, cut: np.ndarray) -> np.ndarray:
    """The tokens that write text of their own: whole characters, not special or added."""
    return np.array([text is not None for text in bpe.texts]) & ~cut


def _may_end(key: tuple[Any, ...], allowed: np.ndarray) -> bool:
    """Whether a row in state ``key`` may end here: its text, ended here, is tokenized as its
    ids; or no candidate keeps it extendable (a prompt's fault: end of sequence ends it)."""
    kind = key[0]
    if kind in ENDS_CANONICAL or (kind == "split" and key[1][3]):
        return True
    return not allowed.any()


class Pending(NamedTuple):
    """An allowed candidate that leaves its row's text pending: the ids are a prefix of the
    tokenization of the text with what comes next, but the text ended there is tokenized
    ``row[:at] + tokens`` (``row``: the padded context row ``row``)."""

    row: int
    token: int
    at: int
    tokens: tuple[int, ...]


_TABLES: dict[tuple[Any, ...], ByteLevelBpe] = {}
_VOCABULARIES: dict[tuple[Any, ...], _Vocabulary] = {}
_TABLES_LOCK = threading.Lock()
_BUILD_LOCK = threading.Lock()  # one build at a time (the tables are large)


def bpe_tables(info: TokenizerInfo) -> ByteLevelBpe:
    """The tokenizer's tables, once per process and tokenizer (by its fingerprint and the steps
    around its model): read from memfree's cache directory where an earlier process kept them
    (:mod:`memfree.core.table_cache`), else built and kept there, with the vocabulary's."""
    key = tables_key(info)
    with _TABLES_LOCK:
        tables = _TABLES.get(key)
    if tables is not None:
        return tables
    with _BUILD_LOCK:
        with _TABLES_LOCK:
            tables = _TABLES.get(key)
        if tables is not None:
            return tables

        def build() -> tuple[ByteLevelBpe, _Vocabulary]:
            bpe = ByteLevelBpe.of(info)
            return bpe, _build_vocabulary(info, bpe)

        bpe, vocabulary = cached_tables(
            "byte-level", key, info.fingerprint, build,
            outside={"tokenizer": info.tokenizer},
            left_empty=lambda tables: tables[0].caches(),
        )  # fmt: skip
        with _TABLES_LOCK:
            _TABLES[key] = bpe
            _VOCABULARIES[key] = vocabulary
        return bpe


def canonical_masker(
    info: TokenizerInfo, end_token_ids: Iterable[int] = ()
) -> CanonicalMasker | SentencePieceMasker:
    """The canonical masker of ``info``'s tokenizer family: SentencePiece-style BPE (Llama 2,
    Mistral up to v0.3, Phi-3, Gemma) or byte-level BPE (the rest).

    Raises:
        CanonicalUnsupportedError: a tokenizer neither family reads exactly.
    """
    if is_sentencepiece(info):
        return SentencePieceMasker(info, end_token_ids)
    return CanonicalMasker(info, end_token_ids)


__all__ = ["CanonicalMasker", "Pending", "bpe_tables", "canonical_masker"]
