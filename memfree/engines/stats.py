"""What the guard did, per row and step (:class:`GuardStats`), and the per-thread bookkeeping
that gives one record per generation (the paper's interventions, Figures 9-10).

A step starts a new record when its rows are not the previous step's rows one token longer, or
after :meth:`StatsRecorder.reset`. That is read from the step's own data, through no private
interface of any engine. A ``generate()`` call whose prompt is exactly the previous call's
output, with as many rows, looks like that call's next step: call ``reset()`` between such
calls (as transformers' stateful processors and xgrammar ask), or use one guard per call;
:func:`memfree.generation.complete` resets before each call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class GuardStats:
    """What the guard did during one ``generate()`` call, per row and step.

    A guard keeps its statistics per thread: ``guard.stats`` are those of the latest
    generation run by the calling thread (see this module's docstring for where one starts), so threads that share one guard each read
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
    """The steps one thread recorded for one generation."""

    __slots__ = ("next_length", "records", "rows")

    def __init__(self, rows: int | None = None) -> None:
        self.rows = rows
        self.next_length: int | None = None
        # (position, tokens blocked, first choice, first choice blocked, checked): one append per
        # step, so another thread reading the statistics meanwhile sees whole steps only.
        self.records: list[_Record] = []

    def continues(self, rows: int, length: int) -> bool:
        """Whether a step with this shape is this generation's next step."""
        return rows == self.rows and length == self.next_length


def first_choice(scores: torch.Tensor) -> torch.Tensor:
    """Each row's highest-scoring token (the first of ties; a NaN counts as highest), as
    ``scores.argmax(dim=1)``; on the CPU through numpy, whose argmax is vectorized (measured:
    29 µs against 615 µs for 8 rows of 49,152)."""
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(scores.detach().numpy().argmax(axis=1))
    return scores.argmax(dim=1)


class StatsRecorder:
    """One guard's statistics: a record per generation and thread.

    A step starts a new record when its rows are not the previous step's rows one token longer,
    or after :meth:`reset`. Copies and pickles start empty (thread-local state cannot be copied).
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
        input_ids: torch.Tensor,
        scores: torch.Tensor,
        mask: torch.Tensor,
        checked: torch.Tensor,
        first: torch.Tensor | None = None,
        counts: torch.Tensor | None = None,
    ) -> None:
        """Append one step (tensors stay on their device: no host synchronisation).

        Args:
            input_ids: `(rows, seq_len)` the step's rows.
            scores: `(rows, vocab)` the scores before the guard.
            mask: bool `(rows, vocab)` tokens the guard blocked.
            checked: bool `(rows,)` rows whose candidates were checked.
            first: int64 `(rows,)` each row's highest-scoring token (:func:`first_choice` of
                ``scores``), when the caller has it.
            counts: int `(rows,)` tokens blocked per row, when the caller has them.
        """
        rows, length = int(input_ids.shape[0]), int(input_ids.shape[1])
        call = getattr(self._local, "call", None)
        if call is None or not call.continues(rows, length):
            call = self._local.call = self._latest = _Call(rows)
        call.next_length = length + 1
        if first is None:
            first = first_choice(scores)
        first_blocked = mask.gather(1, first[:, None])[:, 0]
        if counts is None:
            counts = mask.view(torch.uint8).sum(dim=1, dtype=torch.int32)
        call.records.append((length, counts, first, first_blocked, checked))

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


__all__ = ["GuardStats", "StatsRecorder", "first_choice"]
