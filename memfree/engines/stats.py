"""What the guard did, per row and step (:class:`GuardStats`), and the per-thread, per-call
bookkeeping that gives one record per ``generate()`` call (the paper's interventions, Figures 9-10).
"""

from __future__ import annotations

import sys
import threading
import weakref
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np
import torch

try:  # the guard stays importable (and testable) without transformers
    from transformers import LogitsProcessorList
except ImportError:  # pragma: no cover - transformers is a hard dependency
    LogitsProcessorList = None  # type: ignore[assignment,misc]

# generate() builds a new LogitsProcessorList in every call and runs each processor from that
# list's __call__: the list found in that frame names one call exactly, where the data cannot (the
# first step of a continuation looks just like the previous call's next step).
_LIST_CALL_CODE = (
    getattr(LogitsProcessorList.__call__, "__code__", None)
    if LogitsProcessorList is not None
    else None
)
_CALLER_FRAMES = 4  # frames searched above the guard's __call__ (subclasses, timing wrappers)


@dataclass
class GuardStats:
    """What the guard did during one ``generate()`` call, per row and step.

    A guard keeps its statistics per thread: ``guard.stats`` are those of the latest
    ``generate()`` call made by the calling thread, so threads that share one guard each read
    their own. A thread that made no call reads the latest call started by any thread (e.g.
    ``generate()`` running in a worker thread behind a ``TextIteratorStreamer``).

    Rows are the rows of ``input_ids`` as the processor sees them: batch x beams (beam search) or
    batch x ``num_return_sequences`` (sampling). Step ``s`` chose the token at sequence position
    ``positions[s]`` of each row.

    Attributes:
        positions: int `(num_steps,)`: index, in the row, of the token each step generated.
        blocked_counts: int `(num_rows, num_steps)`: tokens set to ``-inf`` by the guard.
        first_choice: int `(num_rows, num_steps)`: the token with the highest incoming score.
        first_choice_blocked: bool `(num_rows, num_steps)`: the guard removed that token (an
            *intervention*, the paper's Figures 9 and 10).
        checked: bool `(num_rows, num_steps)`: the row's last n-1 tokens may begin a stored n-gram,
            so the whole vocabulary was checked; False rows were skipped, exactly, by the prefix
            section (or held a special token, or were shorter than n-1 tokens).
    """

    positions: np.ndarray
    blocked_counts: np.ndarray
    first_choice: np.ndarray
    first_choice_blocked: np.ndarray
    checked: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.blocked_counts.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.positions.shape[0])

    def interventions(self) -> np.ndarray:
        """Steps per row where the model's first choice was blocked; int `(num_rows,)`."""
        return self.first_choice_blocked.sum(axis=1)

    def intervention_positions(self, row: int) -> list[int]:
        """Sequence positions in ``row`` where the model's first choice was blocked."""
        return [int(p) for p in self.positions[self.first_choice_blocked[row]]]

    def summary(self) -> dict[str, Any]:
        """Totals for reports: steps, rows, interventions, tokens blocked, rows skipped."""
        cells = max(self.num_rows * self.num_steps, 1)
        return {
            "rows": self.num_rows,
            "steps": self.num_steps,
            "interventions": int(self.first_choice_blocked.sum()),
            "interventions_per_row": self.interventions().tolist(),
            "tokens_blocked": int(self.blocked_counts.sum()),
            "row_steps_checked": int(self.checked.sum()),
            "fraction_skipped": 1.0 - float(self.checked.sum()) / cells,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions.tolist(),
            "blocked_counts": self.blocked_counts.tolist(),
            "first_choice": self.first_choice.tolist(),
            "first_choice_blocked": self.first_choice_blocked.tolist(),
            "checked": self.checked.tolist(),
        }


_Record = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class _Call:
    """The steps one thread recorded for one ``generate()`` call (or run of direct calls)."""

    __slots__ = ("caller", "next_length", "records", "rows")

    def __init__(self, caller: Any = None, rows: int | None = None) -> None:
        # The calling LogitsProcessorList, weakly: a strong one would keep the previous call's
        # processors alive, and a dead one can never match a new list at the same address.
        self.caller: weakref.ref[Any] | None = None if caller is None else weakref.ref(caller)
        self.rows = rows
        self.next_length: int | None = None
        # (position, tokens blocked, first choice, first choice blocked, checked): one append per
        # step, so another thread reading the statistics meanwhile sees whole steps only.
        self.records: list[_Record] = []

    def continues(self, caller: Any, rows: int, length: int) -> bool:
        """Whether a step with this caller and shape belongs to this call."""
        if rows != self.rows or length != self.next_length:
            return False
        if caller is None:
            return self.caller is None
        return self.caller is not None and self.caller() is caller


def calling_list() -> Any:
    """The LogitsProcessorList whose ``__call__`` runs the guard's step, or None (a direct call).

    Call it from the guard's own ``__call__`` (it looks from that frame's caller up); looks a few
    frames up, by code object (no frame's locals are read unless it is that method's).
    """
    if _LIST_CALL_CODE is None:  # pragma: no cover - without transformers
        return None
    try:
        frame: FrameType | None = sys._getframe(2)
    except (AttributeError, ValueError):  # pragma: no cover - no frames, or a short stack
        return None
    for _ in range(_CALLER_FRAMES):
        if frame is None:
            return None
        if frame.f_code is _LIST_CALL_CODE:
            owner = frame.f_locals.get("self")
            return owner if isinstance(owner, LogitsProcessorList) else None
        frame = frame.f_back
    return None


class StatsRecorder:
    """One guard's statistics: a record per ``generate()`` call and thread.

    A step starts a new record when its caller (the ``LogitsProcessorList`` of a ``generate()``
    call, or None for a direct call) differs from the previous step's, or when its rows are not
    the previous step's rows one token longer. Copies and pickles start empty (thread-local state
    cannot be copied).
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._latest = _Call()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._local = threading.local()
        self._latest = _Call()

    def record(
        self,
        caller: Any,
        input_ids: torch.Tensor,
        scores: torch.Tensor,
        mask: torch.Tensor,
        checked: torch.Tensor,
    ) -> None:
        """Append one step (tensors stay on their device: no host synchronisation).

        Args:
            caller: what :func:`calling_list` found for this step.
            input_ids: `(rows, seq_len)` the step's rows.
            scores: `(rows, vocab)` the scores before the guard.
            mask: bool `(rows, vocab)` tokens the guard blocked.
            checked: bool `(rows,)` rows whose candidates were checked.
        """
        rows, length = int(input_ids.shape[0]), int(input_ids.shape[1])
        call = getattr(self._local, "call", None)
        if call is None or not call.continues(caller, rows, length):
            call = self._local.call = self._latest = _Call(caller, rows)
        call.next_length = length + 1
        first = scores.argmax(dim=1)
        first_blocked = mask.gather(1, first[:, None])[:, 0]
        call.records.append((length, mask.sum(dim=1), first, first_blocked, checked))

    def reset(self) -> None:
        """Forget the calling thread's statistics; its next step starts a new record."""
        mine = getattr(self._local, "call", None)
        empty = _Call()
        if mine is not None:
            self._local.call = empty
        if mine is None or self._latest is mine:
            self._latest = empty

    def stats(self) -> GuardStats:
        """The calling thread's latest record (else the latest of any thread), on the host."""
        call = getattr(self._local, "call", None)
        if call is None:
            call = self._latest
        records = list(call.records)  # a snapshot: the owning thread may still be appending
        rows = call.rows or 0
        if not records:
            empty = np.zeros((rows, 0), dtype=np.int64)
            return GuardStats(
                np.zeros(0, np.int64), empty, empty.copy(), empty.astype(bool), empty.astype(bool)
            )
        positions, *parts = zip(*records, strict=True)
        counts, first, first_blocked, checked = (
            torch.stack(column, dim=1).cpu().numpy() for column in parts
        )
        return GuardStats(
            positions=np.asarray(positions, dtype=np.int64),
            blocked_counts=counts.astype(np.int64),
            first_choice=first.astype(np.int64),
            first_choice_blocked=first_blocked.astype(bool),
            checked=checked.astype(bool),
        )


__all__ = ["GuardStats", "StatsRecorder", "calling_list"]
