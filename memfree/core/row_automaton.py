"""Rows of token ids to state ids, advanced one token a step: the canonical maskers' automaton.

An engine's rows grow by one token a step. A canonical masker reads a row once (its *read*: its
state, and what advancing it needs), and afterwards advances it from the previous step's read by
the token appended. :class:`RowAutomaton` interns each read as an integer (a *state id*), keeps
each transition it has taken, ``(state id, token) -> state id``, and interns the key the state
table answers a read by (several reads share a key: their banned rows are the same). A row that
repeats a transition costs two dictionary lookups, and a step hands the table an array of key
ids, not tuples to hash.

Advancing is a function of the read and the token alone (the maskers' ``advance``), so a
transition kept is the transition taken again: interning changes no answer. Ids grow with the
text a process has seen; past a bound the automaton starts afresh at a step's start (every row
is then read once again, and the table's rows are found again by key).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

_LIMIT = 1 << 16  # reads (and keys) past which the automaton starts afresh
_TRANSITIONS = 1 << 18  # transitions past which it starts afresh


class RowAutomaton:
    """State ids for rows of token ids (negative ids on the left are padding).

    Args:
        read: ``read(ids, array)``: a row read from its ids (a list, and the same as int64).
        advance: ``advance(read, token)``: the read of a row one token longer than one read as
            ``read``; None where only a full read can say.
        key_of: the state table's key of a read.
        flag: ``flag(read)``: a fact kept per read (the canonical masker's: its row ends in a
            whitespace run, whose other reading the guard checks).
        past: the read of a row that holds an id past the vocabulary.
        vocab_size: ids at or past it are past the vocabulary.

    Attributes:
        generation: counts fresh starts (a key id means nothing across them).
    """

    def __init__(
        self,
        read: Callable[[list[int], np.ndarray], Hashable],
        advance: Callable[[Any, int], Hashable | None],
        key_of: Callable[[Any], Hashable],
        past: Hashable,
        vocab_size: int,
        flag: Callable[[Any], bool] | None = None,
    ) -> None:
        self._read = read
        self._advance = advance
        self._key_of = key_of
        self._flag = flag
        self._past = past
        self._stride = vocab_size + 1
        self.lock = threading.Lock()  # held by the caller over a step and its use of the ids
        self._seen = threading.local()  # per thread: its last step's rows (bytes) -> state ids
        self.generation = 0
        self._start()

    def _start(self) -> None:
        """Forget every id (at a step's start)."""
        self.generation += 1
        self.reads: list[Any] = []  # state id -> read
        self.keys: list[Hashable] = []  # key id -> key
        self._ids: dict[Any, int] = {}
        self._key_ids: dict[Hashable, int] = {}
        self._next: dict[int, int] = {}  # state id * stride + token -> state id
        self._kid: list[int] = []  # state id -> key id
        self._flags: list[bool] = []  # state id -> flag
        self.past = self._intern(self._past)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("lock", "_seen"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()
        self._seen = threading.local()
        self._start()

    def __len__(self) -> int:
        return len(self.reads)

    def step(self, arrays: np.ndarray, firsts: list[int], past: list[bool]) -> np.ndarray:
        """int64 `(rows,)`: each row's state id (``arrays``: the rows as int64; ``firsts``:
        each row's first written position; ``past``: whether it holds an id past the
        vocabulary). A row one token longer than a row of the calling thread's last step is
        advanced from it; others are read. Called under :attr:`lock`, held while the ids are
        used (:attr:`reads`, :attr:`keys`, :meth:`key_ids`, :meth:`flags`): another step may
        start afresh."""
        count, width = arrays.shape
        ids = np.empty(count, dtype=np.int64)
        if len(self.reads) > _LIMIT or len(self.keys) > _LIMIT or len(self._next) > _TRANSITIONS:
            self._start()
        generation, before = getattr(self._seen, "rows", (0, None))
        if generation != self.generation or not before:
            before = None
        seen: dict[bytes, int] = {}
        lasts: list[int] = arrays[:, -1].tolist() if width else []
        stride, following, reads = self._stride, self._next, self.reads
        for index in range(count):
            if past[index]:
                ids[index] = self.past
                continue
            array = arrays[index, firsts[index] :]
            row = array.tobytes()
            sid = -1
            if before is not None and array.size:
                last = before.get(row[:-8])  # the row one id shorter (int64 ids)
                if last is not None:
                    token = lasts[index]
                    code = last * stride + token
                    sid = following.get(code, -1)
                    if sid < 0:
                        advanced = self._advance(reads[last], token)
                        if advanced is not None:
                            sid = following[code] = self._intern(advanced)
            if sid < 0:
                sid = self._intern(self._read(array.tolist(), array))
            seen[row] = sid
            ids[index] = sid
        self._seen.rows = (self.generation, seen)
        return ids

    def key_ids(self, ids: np.ndarray) -> np.ndarray:
        """The state table's key id of each state id."""
        kid = self._kid
        return np.array([kid[sid] for sid in ids.tolist()], dtype=np.int64)

    def flags(self, ids: np.ndarray) -> np.ndarray:
        """``flag`` of each state id's read."""
        flags = self._flags
        return np.array([flags[sid] for sid in ids.tolist()], dtype=bool)

    def _intern(self, read: Any) -> int:
        sid = self._ids.get(read)
        if sid is None:
            sid = self._ids[read] = len(self.reads)
            self.reads.append(read)
            key = self._key_of(read)
            kid = self._key_ids.get(key)
            if kid is None:
                kid = self._key_ids[key] = len(self.keys)
                self.keys.append(key)
            self._kid.append(kid)
            self._flags.append(self._flag is not None and self._flag(read))
        return sid


__all__ = ["RowAutomaton"]
