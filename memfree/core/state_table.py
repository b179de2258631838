"""The banned rows of the states seen lately, one table per vocabulary width, mirrored on the
scores' device.

A canonical masker answers each row of a step by its *state* (what the tokenizer's split needs
of the row's end); rows in the same state ban the same candidates. :class:`StateTable` keeps
each recent state's banned row in a table, packed 8 candidates a byte (so that it holds the
states of several steps of a serving batch: a state met again costs nothing), and gathers a
step's rows from it: on the CPU one packed row is unpacked per row; on another device the table
has a copy there, brought up to date row by row (only states new since it was last used go
over), and the step's rows are gathered and unpacked there, so what crosses is the rows' table
indexes and the new states' packed rows (:attr:`StateTable.sent` counts the bytes).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from memfree.core.row_threads import over_rows
from memfree.vocab.merge_tree import distinct

_SLOTS = 4096  # states whose banned rows a table keeps (more while one step needs more)
_PART = 1 << 22  # dense entries (bytes) a thread unpacks at least
_WIDE_ROW = 1 << 16  # candidates a row holds from which a step's rows may be split over threads
_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)  # np.packbits' order


class StateTable:
    """Banned rows by state.

    Args:
        fill: ``fill(row, key, width)`` writes the banned candidates of state ``key`` into the
            bool array ``row`` (``width`` long); called once per state while it stays.
        capacity: rows past which the least recently used state gives its row up.

    Attributes:
        sent: the bytes the latest step sent to the scores' device (0 on the CPU).
        mirror_always: tests: gather from the device copy on the CPU too.
    """

    def __init__(
        self, fill: Callable[[np.ndarray, Any, int], None], capacity: int = _SLOTS
    ) -> None:
        self._fill = fill
        # The banned candidates of the states seen lately, packed (np.packbits), and the width
        # they were packed from; a scratch row for ``fill``.
        self._table = np.zeros((0, 0), dtype=np.uint8)
        self._width = -1
        self._scratch = np.ones(0, dtype=bool)
        self._filled = 0  # table rows in use
        self._used = np.zeros(0, dtype=np.int64)  # the step that last used each table row
        self._versions = np.zeros(0, dtype=np.int64)  # the step that last filled each table row
        self._key_of_slot = np.zeros(0, dtype=np.int64)  # each table row's key id (-1: none)
        self._slot_of = np.zeros(0, dtype=np.int64)  # each key id's table row (-1: none)
        self._generation = -1  # of the key ids (RowAutomaton.generation)
        # Per device: the table's copy there, and the version of each row it holds.
        self._mirrors: dict[str, tuple[torch.Tensor | None, np.ndarray]] = {}
        self._bits: dict[str, torch.Tensor] = {}  # per device: the bit of each packed column
        self.mirror_always = False  # tests: use the copy on the CPU too
        self.sent = 0  # bytes the latest step sent to the scores' device (0 on the CPU)
        self._steps = 0
        self._eviction: tuple[int, Iterator[int]] | None = None  # see _least_recent
        self._dense: np.ndarray | None = None  # the CPU's last dense rows (see _unpacked)
        self.capacity = capacity  # rows past which the least recently used state is dropped
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """The table's bytes on the host (its rows filled: the others are pages never
        written), with the last step's dense rows where it keeps them."""
        dense = 0 if self._dense is None else self._dense.nbytes
        table = self._filled * self._table.shape[1]
        return int(table + self._scratch.nbytes + dense)

    def gather(
        self,
        key_ids: np.ndarray,
        keys: Sequence[Hashable],
        generation: int,
        width: int,
        device: torch.device,
        wanted: list[int],
    ) -> tuple[torch.Tensor, dict[int, np.ndarray]]:
        """bool `(len(key_ids), width)` on ``device``: the banned row of each state, given as
        its key id (``keys[id]``: the key ``fill`` reads; ids of one ``generation`` of a
        :class:`~memfree.core.row_automaton.RowAutomaton`), from a table of the states seen
        lately; and the host's copy of the rows ``wanted``, packed (:func:`is_banned` reads
        one candidate). On the CPU a step copies one table row per row. On another device the
        table has a copy there, brought up to date row by row (only states new since it was
        last used go over), and the rows are gathered there: what crosses is the rows' table
        indexes and the new states' rows."""
        with self._lock:
            if self._width != width:  # another width: a table of its own
                self._width = width
                self._table = np.zeros((0, (width + 7) // 8), dtype=np.uint8)
                self._scratch = np.ones(width, dtype=bool)
                self._filled = 0
                self._used = np.zeros(0, dtype=np.int64)
                self._versions = np.zeros(0, dtype=np.int64)
                self._key_of_slot = np.zeros(0, dtype=np.int64)
                self._slot_of[:] = -1
                self._mirrors.clear()
            if self._generation != generation:  # the rows stay, found by no key id
                self._generation = generation
                self._slot_of[:] = -1
                self._key_of_slot[:] = -1
            if len(self._slot_of) < len(keys):
                grown = np.full(max(2 * len(self._slot_of), len(keys), 64), -1, dtype=np.int64)
                grown[: len(self._slot_of)] = self._slot_of
                self._slot_of = grown
            self._steps += 1
            slots = self._slot_of[key_ids]
            missing = slots < 0
            self._used[slots[~missing]] = self._steps  # rows this step uses stay
            if missing.any():
                for key_id in distinct(key_ids[missing]).tolist():
                    self._add(key_id, keys[key_id])
                slots = self._slot_of[key_ids]
            host = {index: self._table[slots[index]].copy() for index in wanted}
            if device.type == "cpu" and not self.mirror_always:
                self.sent = 0
                return torch.from_numpy(self._unpacked(slots, width)), host
            return self._mirrored(slots, device), host

    def _unpacked(self, slots: np.ndarray, width: int) -> np.ndarray:
        """bool `(len(slots), width)`: the table rows ``slots``, unpacked on the host. Into the
        last step's array where nothing outside the table holds it any more (no tensor, view or
        name: the caller applied it and let it go), as an engine's steps do: a new array of
        that size costs a page fault every 4 KiB written (37 MiB at 256 rows of 151k ids), more
        than unpacking into it. One row at a time: a row unpacked stays in the cache while it
        is copied (``np.unpackbits`` over all rows at once is slower)."""
        shape = (len(slots), width)
        # Held by the attribute and by getrefcount's argument only: no one else can see it.
        if self._dense is None or self._dense.shape != shape or sys.getrefcount(self._dense) > 2:
            self._dense = np.empty(shape, dtype=bool)
        dense, table, rows = self._dense, self._table, slots.tolist()

        def unpack(start: int, stop: int) -> None:
            for index in range(start, stop):
                dense[index] = np.unpackbits(table[rows[index]], count=width).view(bool)

        # numpy lets the interpreter go while it unpacks and copies: past a few MiB, parts of
        # the rows go to other threads (the step's wall time; the CPU time is the same). Not
        # rows narrower than _WIDE_ROW: each one's unpack is too short to gain from threads
        # (256 rows of 49,152 ids: 0.87 ms in one thread, 1.2 in two; of 151,646 ids: 2.2 ms in
        # one, 1.5 in two; medians of 12 alternated runs).
        over_rows(len(rows), dense.size if width >= _WIDE_ROW else 0, _PART, unpack)
        return dense

    def _add(self, key_id: int, key: Hashable) -> None:
        """Fill a table row with a state's banned candidates. Past the table's capacity the
        least recently used state gives its row up, unless this step uses it too (then the
        table grows). Called under the table's lock."""
        if self._filled < min(len(self._table), self.capacity):
            slot = self._filled
            self._filled += 1
        else:
            oldest = self._least_recent() if self._filled >= self.capacity else -1
            if oldest < 0:
                slot = self._filled
                if slot >= len(self._table):
                    # At once to the capacity (past it, twice the rows): np.zeros maps pages
                    # the first write faults in (where the system maps zero pages lazily, as
                    # Linux does), so rows not yet filled cost no memory, and the rows filled
                    # are copied once, not at each doubling (a copy of 40 MiB for 151k ids).
                    size = max(self.capacity, 1) if slot < self.capacity else 2 * slot
                    grown = np.zeros((size, self._table.shape[1]), dtype=np.uint8)
                    grown[:slot] = self._table[:slot]
                    self._table = grown
                    self._used = _grown(self._used, size, 0)
                    self._versions = _grown(self._versions, size, 0)
                    self._key_of_slot = _grown(self._key_of_slot, size, -1)
                self._filled += 1
            else:
                slot = oldest
                if self._key_of_slot[slot] >= 0:
                    self._slot_of[self._key_of_slot[slot]] = -1
        self._fill(self._scratch, key, self._width)
        self._table[slot] = np.packbits(self._scratch)
        self._versions[slot] = self._steps  # copies on other devices: this row is new
        self._used[slot] = self._steps
        self._slot_of[key_id] = slot
        self._key_of_slot[slot] = key_id

    def _least_recent(self) -> int:
        """The table row used least recently, not by this step (-1: none). The rows by last
        use are sorted once a step (then taken in turn, skipping those this step has used
        since), not searched once per new state."""
        if self._eviction is None or self._eviction[0] != self._steps:  # the rows filled only
            order = np.argsort(self._used[: self._filled], kind="stable").tolist()
            self._eviction = (self._steps, iter(order))
        for slot in self._eviction[1]:
            if self._used[slot] != self._steps:
                return int(slot)
        return -1

    def _mirrored(self, slots: np.ndarray, device: torch.device) -> torch.Tensor:
        """The rows ``slots`` gathered from the table's copy on ``device`` (under the lock). The
        copy is an ordinary tensor, whether the step runs inside ``torch.inference_mode`` (as
        ``generate()`` does) or not: an inference tensor could not be updated outside it."""
        with torch.inference_mode(False):
            return self._gather_mirrored(slots, device)

    def _gather_mirrored(self, slots: np.ndarray, device: torch.device) -> torch.Tensor:
        key = str(device)
        tensor, seen = self._mirrors.get(key, (None, np.zeros(0, dtype=np.int64)))
        filled, packed = self._filled, self._table.shape[1]
        if tensor is None or tensor.shape[0] < filled:  # rows filled past the copy's
            # Doubled (a device's zeros are written, not mapped): rows that hold states.
            size = max(filled, 64, 2 * (0 if tensor is None else tensor.shape[0]))
            grown = torch.zeros((size, packed), dtype=torch.uint8, device=device)
            if tensor is not None:
                grown[: tensor.shape[0]] = tensor
            tensor = grown
            seen = np.concatenate([seen, np.full(size - len(seen), -1, dtype=np.int64)])
        used = distinct(slots)
        stale = used[seen[used] != self._versions[used]]
        if stale.size:
            rows = torch.from_numpy(self._table[stale]).to(device)
            tensor[torch.from_numpy(stale).to(device)] = rows
            seen[stale] = self._versions[stale]
        self._mirrors[key] = (tensor, seen)
        self.sent = int(stale.size * packed + slots.size * 8)
        rows = tensor[torch.from_numpy(slots).to(device)]
        bits = self._bits.get(key)
        if bits is None:
            bits = self._bits[key] = _BITS.to(device)
        unpacked = rows.unsqueeze(-1).bitwise_and(bits).ne(0)
        return unpacked.reshape(len(slots), packed * 8)[:, : self._width]


class TableMasker:
    """What the canonical maskers share: a step's rows read from a :class:`StateTable`, copies
    and pickles that start with empty caches, and the masker's face (:meth:`banned_mask`).

    A subclass names the attributes a copy drops (``UNPICKLED``), makes them again in
    :meth:`_setup`, and answers :meth:`step`.
    """

    UNPICKLED: tuple[str, ...] = ()
    table: StateTable

    def describe(self) -> dict[str, Any]:
        return {}

    @property
    def sent(self) -> int:
        """The bytes the latest step sent to the scores' device (0 on the CPU)."""
        return self.table.sent

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with empty caches (and their own lock)."""
        state = self.__dict__.copy()
        for name in self.UNPICKLED:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def _setup(self) -> None:
        raise NotImplementedError

    def banned_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """bool `(rows, vocab_width)`: candidates that make the row not canonical; every row is
        checked. Negative ids on the left are padding (they add no text). Ids past the
        tokenizer's vocabulary are banned (no text gives them)."""
        banned, active, _ = self.step(contexts, vocab_width, device)
        return banned, active

    def step(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
        raise NotImplementedError


def _grown(array: np.ndarray, size: int, fill: int) -> np.ndarray:
    grown = np.full(size, fill, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


def is_banned(packed: np.ndarray, token: int) -> bool:
    """One candidate of a packed banned row (:meth:`StateTable.gather`'s host copies)."""
    return bool(packed[token >> 3] & (0x80 >> (token & 7)))


def row_bounds(arrays: np.ndarray, vocab_size: int) -> tuple[list[int], list[bool]]:
    """For padded rows of ids (negative ids on the left are padding): each row's first written
    position, and whether it holds an id past the vocabulary (no text gives one)."""
    count, width = arrays.shape
    written = arrays >= 0
    starts = written.argmax(axis=1) if width else np.zeros(count, dtype=np.int64)
    firsts: list[int] = np.where(written.any(axis=1), starts, width).tolist()
    past: list[bool] = np.any(arrays >= vocab_size, axis=1).tolist()
    return firsts, past


__all__ = ["StateTable", "TableMasker", "is_banned", "row_bounds"]
