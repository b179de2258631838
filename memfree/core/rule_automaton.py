"""Rows of token ids to states for GPT-2's pattern read by rules, advanced as arrays: the
canonical masker's automaton for SmolLM2, GPT-2 and their kin.

:class:`~memfree.core.row_automaton.RowAutomaton` advances a row in Python, a few microseconds
a row. Most rows of a step are a run of letters, digits or punctuation followed by a token that
goes on with the run or starts a chunk of its own, or a whitespace run followed by a token that
starts a chunk after it (:meth:`RowStates.move <memfree.core.canonical_state.RowStates.move>`):
the next state then follows from the row's :class:`~memfree.core.canonical_state.Spot` and the
token alone, by per-token columns and the merge-tree test. :class:`RuleAutomaton` keeps each
row's spot as integers (its state's key id, where its last chunks lie) from one step to the next
and takes those moves for all rows at once with numpy; the other rows (a contraction, an
apostrophe, a whitespace token after a run, a token that begins an added token's content, a
merge-tree test with a late node, a row seen for the first time) go through
:class:`~memfree.core.canonical_state.RowStates` one by one, as before. The arrays compute
:meth:`RowStates.move`'s answer term for term; ``tests/memfree/core/test_rule_automaton.py``
checks every step's states against the rows read in full.

A row is matched to the calling thread's previous step by position where the batch kept its
order and grew by one column (``generate()``), else by its ids (an engine that reorders rows).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

import numpy as np

from memfree.core.canonical_state import RUN_OF_CLASS, RowStates, Spot
from memfree.vocab.bpe import APOSTROPHE, NONE, PUNCT, SP, WS, ByteLevelBpe

_LIMIT = 1 << 16  # keys past which the automaton starts afresh (at a step's start)
# A row's spot as integers, one column each: its state's key id, its last chunks' tokens and
# characters, where the last chunk starts in them (-1: not known), Spot.end.
KID, TOKENS, CHARS, LAST_CHARS, LAST_TOKENS, END = range(6)
_FIELDS = 6
# Below this many rows a step advances them one by one: the arrays' fixed cost (0.1-0.4 ms a
# step, measured on the bench's rows: equal at 8-16 rows) is more than a few rows' Python.
_ARRAYS_FROM = 16
# What the arrays move a key by (0: nothing, one by one): a run, a whitespace run (with the
# flag that it splits before its last character: Spot.key[3]), a whitespace run split so.
_RUN, _SPACE, _SPACE_FLAGGED, _SPACE_SPLIT = 1, 2, 3, 4
_CLASSES = 8  # run classes kept per key (character classes: memfree.vocab.bpe)


class RuleAutomaton:
    """Each row's state key id, for rows of token ids (negative ids on the left are padding).

    Args:
        states: the rows' reader (GPT-2's pattern: no split pattern).

    Attributes:
        keys: key id -> the state table's key.
        generation: counts fresh starts (a key id means nothing across them).
        lock: held by the caller over a step and its use of the key ids.
    """

    def __init__(self, states: RowStates) -> None:
        assert states.split is None  # GPT-2's pattern, read by rules
        self.states = states
        bpe: ByteLevelBpe = states.bpe
        size = bpe.vocab_size
        self._size = size
        # Per token: whether a move may take it (whole characters, comes back alone, no cut).
        written = np.array([text is not None for text in bpe.texts], dtype=bool)
        self._movable = written & bpe.self_ok & ~states._is_cut[:size]
        self._begins = np.full(size, -1, dtype=np.int8)  # its text begins an added token's
        self._space_word = np.full(size, -1, dtype=np.int8)  # a space, then no whitespace
        self._run = bpe.run.astype(np.int64)
        self._first = bpe.first.astype(np.int64)
        self._length = bpe.text_lengths
        self._end = bpe.whole_last
        self._run_of_class = np.full(_CLASSES, -2, dtype=np.int64)  # -2: no run goes on
        for cls, run in RUN_OF_CLASS.items():
            self._run_of_class[cls] = run
        tree = bpe.tree
        self._ranges = tree.ranges
        self._late = tree.late
        self.arrays_from = _ARRAYS_FROM  # rows a step needs to advance them as arrays
        self.lock = threading.Lock()
        self._seen = threading.local()  # per thread: its last step's rows and their spots
        self.generation = 0
        self._start()

    def _start(self) -> None:
        """Forget every key id (at a step's start)."""
        self.generation += 1
        self.keys: list[Hashable] = []
        self._key_ids: dict[Hashable, int] = {}
        self._kind = np.zeros(64, dtype=np.int64)  # per key id: what moves arrays take (_RUN...)
        self._class = np.zeros(64, dtype=np.int64)  # a run's class
        self._last = np.zeros(64, dtype=np.int64)  # a run's last token
        self._space = np.zeros(64, dtype=bool)  # a whitespace run (Spot.space)
        self._space_last = np.zeros(64, dtype=bool)  # a whitespace run whose last character is " "
        self._lone = np.full(self._size, -1, dtype=np.int64)  # a token's chunk alone: key id
        self._runs = np.full((_CLASSES, self._size), -1, dtype=np.int64)  # ("run", cls, t, ())
        self._past = self._fields(self.states.spot((("past",), None)))  # an id past the vocabulary

    def intern(self, key: Hashable) -> int:
        """The id of a state's key (a new one for a key not seen since the last fresh start)."""
        kid = self._key_ids.get(key)
        if kid is None:
            kid = self._key_ids[key] = len(self.keys)
            self.keys.append(key)
            if kid >= len(self._kind):
                grown = 2 * len(self._kind)
                self._kind = np.resize(self._kind, grown)
                self._class = np.resize(self._class, grown)
                self._last = np.resize(self._last, grown)
                self._space = np.resize(self._space, grown)
                self._space_last = np.resize(self._space_last, grown)
            assert isinstance(key, tuple)
            kind = 0
            if key[-1]:  # an added token's content begun: read one by one
                pass
            elif key[0] == "run" and key[1] in RUN_OF_CLASS:
                kind = _RUN
            elif key[0] == "space":
                kind = _SPACE_FLAGGED if key[3] else _SPACE
            elif key[0] == "space_split":
                kind = _SPACE_SPLIT
            self._kind[kid] = kind
            self._class[kid] = key[1] if kind == _RUN else 0
            self._last[kid] = key[2] if kind == _RUN else 0
            self._space[kid] = key[0] == "space"
            # a whitespace run's last character is a space
            self._space_last[kid] = kind in (_SPACE, _SPACE_FLAGGED) and key[2] == " "
            self._space_last[kid] |= kind == _SPACE_SPLIT and key[1] == " "
        return kid

    def spaces(self, kids: np.ndarray) -> np.ndarray:
        """bool: whether each row (given by its key id) ends in a whitespace run whose split
        waits on the next character."""
        return self._space[kids]

    def spot(self, fields: np.ndarray) -> Spot:
        """A row's :class:`Spot` from its integers."""
        kid, tokens, chars, last_chars, last_tokens, end = fields.tolist()
        key = self.keys[kid]
        last = (last_chars, last_tokens) if last_chars >= 0 else None
        assert isinstance(key, tuple)
        return Spot(key, tokens, chars, last, end, bool(self._space[kid]))

    def _fields(self, spot: Spot) -> list[int]:
        last = spot.last if spot.last is not None else (-1, -1)
        return [self.intern(spot.key), spot.tokens, spot.chars, *last, spot.end]

    # -- the step ---------------------------------------------------------------------------

    def step(self, arrays: np.ndarray, firsts: list[int], past: list[bool]) -> np.ndarray:
        """int64 `(rows, 6)`: each row's spot as integers (its key id first; ``arrays``: the
        rows as int64, ``firsts``: each row's first written position, ``past``: whether it
        holds an id past the vocabulary). Called under :attr:`lock`."""
        count, width = arrays.shape
        if len(self.keys) > _LIMIT:
            self._start()
        before = getattr(self._seen, "rows", None)
        if before is not None and before[0] != self.generation:
            before = None
        written = np.asarray(firsts, dtype=np.int64) < width
        outside = np.asarray(past, dtype=bool)
        previous = self._previous(arrays, firsts, written & ~outside, before)
        fields = np.full((count, _FIELDS), -1, dtype=np.int64)
        done = np.zeros(count, dtype=bool)
        fields[outside] = self._past
        done |= outside
        if before is not None and count >= self.arrays_from:
            done |= self._move(arrays, previous, before[3], fields)
        for index in np.flatnonzero(~done).tolist():
            array = arrays[index, firsts[index] :]
            spot = None
            if before is not None and previous[index] >= 0:
                spot = self._advance(self.spot(before[3][previous[index]]), array)
            if spot is None:
                spot = self.states.spot(self.states.read(array.tolist(), array))
            fields[index] = self._fields(spot)
        self._seen.rows = (self.generation, arrays.copy(), list(firsts), fields)
        return fields

    def _previous(
        self, arrays: np.ndarray, firsts: list[int], written: np.ndarray, before: Any
    ) -> np.ndarray:
        """int64 `(rows,)`: each row's place in the previous step (-1: none), where that row
        was this one less its last id. By position where the batch kept its order and grew by
        a column; the others by their ids."""
        count, width = arrays.shape
        found = np.full(count, -1, dtype=np.int64)
        if before is None:
            return found
        _, old, old_firsts, _ = before
        if old.shape == (count, width - 1):
            same = written & (arrays[:, :-1] == old).all(axis=1)
            found[same] = np.flatnonzero(same)
        else:
            same = np.zeros(count, dtype=bool)
        rest = np.flatnonzero(written & ~same)
        if rest.size:  # reordered or regrown rows: found by their ids
            known = {old[row, old_firsts[row] :].tobytes(): row for row in range(len(old))}
            for index in rest.tolist():
                row = arrays[index, firsts[index] : width - 1].tobytes()
                found[index] = known.get(row, -1)
        return found

    def _advance(self, spot: Spot, array: np.ndarray) -> Spot | None:
        """A row one token longer than a row in ``spot``, one by one (None: read it)."""
        states, token = self.states, int(array[-1])
        moved = states.move(spot, token)
        if moved is not None:
            return moved
        tail = states.tail_of(spot, array[:-1])
        read = None if tail is None else states.advance_text(spot.key, tail, token)
        return None if read is None else states.spot(read)

    def _move(
        self, arrays: np.ndarray, previous: np.ndarray, spots: np.ndarray, fields: np.ndarray
    ) -> np.ndarray:
        """The rows :meth:`RowStates.move <memfree.core.canonical_state.RowStates.move>` takes
        without text, all at once: after a run, a token that goes on with it or starts a chunk
        of its own (``_run_move``); after a whitespace run, a token that starts a chunk of its
        own after it (``_space_move``). Their fields written; bool `(rows,)`, which."""
        done = np.zeros(len(arrays), dtype=bool)
        rows = np.flatnonzero(previous >= 0)
        old = spots[previous[rows]]
        kinds = self._kind[old[:, KID]]
        keep = (kinds > 0) & (old[:, TOKENS] >= 0)
        rows, old, kinds = rows[keep], old[keep], kinds[keep]
        if not rows.size:
            return done
        tokens = arrays[rows, -1]
        unknown = tokens[self._begins[tokens] < 0]
        for token in np.unique(unknown).tolist():
            self._begins[token] = self.states.begins_added(token)
        movable = self._movable[tokens] & (self._begins[tokens] == 0)
        runs = kinds == _RUN
        self._run_moves(rows[runs], old[runs], tokens[runs], movable[runs], fields, done)
        self._space_moves(
            rows[~runs], old[~runs], kinds[~runs], tokens[~runs], movable[~runs], fields, done
        )
        return done

    def _run_moves(
        self,
        rows: np.ndarray,
        old: np.ndarray,
        tokens: np.ndarray,
        movable: np.ndarray,
        fields: np.ndarray,
        done: np.ndarray,
    ) -> None:
        """``RowStates._run_move`` for rows after a run (their old fields ``old``)."""
        cls, a = self._class[old[:, KID]], self._last[old[:, KID]]
        movable = movable & (old[:, LAST_CHARS] >= 0)
        goes = movable & (self._run[tokens] == self._run_of_class[cls])
        if self._ranges is None:
            goes[:] = False  # the merge-tree test read per token: one by one
        else:
            exact = goes & ~self._late[0][a] & ~self._late[1][tokens]
            goes = exact.copy()
            goes[exact] = ~self._ranges.joins_many(a[exact], tokens[exact])
        first = self._first[tokens]
        starts = (
            movable
            & (self._run[tokens] != self._run_of_class[cls])
            & (first != cls)
            & ~((cls == PUNCT) & (first == APOSTROPHE))
        )
        if goes.any():  # the chunk goes on: ("run", cls, token, ())
            at, t, c = rows[goes], tokens[goes], cls[goes]
            kids = self._runs[c, t]
            for index in np.flatnonzero(kids < 0).tolist():
                kid = self.intern(("run", int(c[index]), int(t[index]), ()))
                self._runs[c[index], t[index]] = kids[index] = kid
            o = old[goes]
            self._write(
                fields,
                done,
                at,
                kids,
                t,
                o[:, TOKENS],
                o[:, CHARS],
                o[:, LAST_CHARS],
                o[:, LAST_TOKENS],
            )
        if starts.any():  # a chunk of the token alone after the run's
            o = old[starts]
            kept = o[:, CHARS] - o[:, LAST_CHARS]  # the run's chunk
            count = o[:, TOKENS] - o[:, LAST_TOKENS]
            self._chunk_after(fields, done, rows[starts], tokens[starts], kept, count)

    def _space_moves(
        self,
        rows: np.ndarray,
        old: np.ndarray,
        kinds: np.ndarray,
        tokens: np.ndarray,
        movable: np.ndarray,
        fields: np.ndarray,
        done: np.ndarray,
    ) -> None:
        """``RowStates._space_move`` for rows after a whitespace run: a space then a character
        that is not whitespace, after a run read as one chunk (the run and the token); or a
        token that starts with a character that is not whitespace, after a run whose last
        character is not a space and splits before it (that character and the token)."""
        if not rows.size:
            return
        unknown = tokens[self._space_word[tokens] < 0]
        for token in np.unique(unknown).tolist():
            text = self.states.bpe.texts[token] or ""
            self._space_word[token] = len(text) >= 2 and self.states.bpe.char_class(
                text[1]
            ) not in (SP, WS)
        first = self._first[tokens]
        kid = old[:, KID]
        word = (
            movable
            & (first == SP)
            & (kinds != _SPACE_SPLIT)
            & (self._space_word[tokens] == 1)
            & (old[:, LAST_CHARS] >= 0)
        )
        split = (kinds == _SPACE_SPLIT) | (kinds == _SPACE_FLAGGED)
        after = (
            movable
            & (first != SP)
            & (first != WS)
            & (first != NONE)
            & split
            & ~self._space_last[kid]
            & (old[:, END] > 0)
        )
        if word.any():  # the run, the token
            o = old[word]
            kept, count = o[:, CHARS] - o[:, LAST_CHARS], o[:, TOKENS] - o[:, LAST_TOKENS]
            self._chunk_after(fields, done, rows[word], tokens[word], kept, count)
        if after.any():  # the run's last character, the token
            count = old[after, END]
            self._chunk_after(fields, done, rows[after], tokens[after], np.ones_like(count), count)

    def _chunk_after(
        self,
        fields: np.ndarray,
        done: np.ndarray,
        at: np.ndarray,
        tokens: np.ndarray,
        kept: np.ndarray,
        count: np.ndarray,
    ) -> None:
        """Rows whose last two chunks are now a chunk of ``kept`` characters in ``count``
        tokens and the token alone (its kind alone: ``RowStates.lone_kind``)."""
        kids = self._lone[tokens]
        texts = self.states.bpe.texts
        for index in np.flatnonzero(kids < 0).tolist():
            token = int(tokens[index])
            text = texts[token]
            assert text is not None
            kid = self.intern((*self.states.lone_kind(token, text), ()))
            self._lone[token] = kids[index] = kid
        self._write(fields, done, at, kids, tokens, count, kept, kept, count)

    def _write(
        self,
        fields: np.ndarray,
        done: np.ndarray,
        at: np.ndarray,
        kids: np.ndarray,
        tokens: np.ndarray,
        before_tokens: np.ndarray,
        before_chars: np.ndarray,
        last_chars: np.ndarray,
        last_tokens: np.ndarray,
    ) -> None:
        """Rows ``at`` now in state ``kids``, their last chunks those before (``before_tokens``
        tokens, ``before_chars`` characters) and ``tokens``; the last chunk starting at
        ``last_chars``, ``last_tokens``."""
        fields[at, KID] = kids
        fields[at, TOKENS] = before_tokens + 1
        fields[at, CHARS] = before_chars + self._length[tokens]
        fields[at, LAST_CHARS] = last_chars
        fields[at, LAST_TOKENS] = last_tokens
        fields[at, END] = self._end[tokens]
        done[at] = True


__all__ = ["RuleAutomaton"]
