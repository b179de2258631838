"""How a guard edits a step's scores: every banned token at ``-inf``, with end of sequence
rescued where nothing else is left (:func:`ban_scores`), or a row closed to everything but end
of sequence (:func:`fail_closed`).

On the CPU at serving widths the edit is a pass over rows × vocabulary scores (155 MiB at 256
rows of 151,646 float32 scores) and costs more than the masks themselves: the ids-only guard's
whole step there was 47 ms, 45 of them the edit, until :func:`ban_scores_cpu` did it in the
fewest passes (8.9 ms; docs/benchmarks.md, the fourteenth session's block).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from memfree.core.row_threads import over_rows

_ROW = 4096  # scores a row holds from which rows are banned one at a time
_PART = 1 << 21  # scores a thread bans at least (8 MiB of float32)
# A row with a ban in more than one score in this many is banned without a branch (the best of
# 2 to 64 on real canonical masks, 49k and 151k ids: a few % of a row banned, scattered).
_SCATTERED = 16
_REUSED = 1 << 22  # bytes from which an output array is kept for the next steps


def ban_scores(
    scores: torch.Tensor,
    banned: torch.Tensor,
    eos_token_ids: tuple[int, ...],
    *,
    inplace: bool,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``scores`` with every banned token at ``-inf``; a row left with nothing allowed (possible
    only when earlier processors removed everything else) gets its end-of-sequence score at 0.

    Args:
        scores: float `(rows, vocab_width)`.
        banned: bool `(rows, vocab_width)` on the same device.
        eos_token_ids: the rescued id is the first (none: no rescue).
        inplace: edit ``scores`` itself (engines that allow it) or return a new tensor.
        rows: bool `(rows,)`, the guarded rows (None: all); only they are rescued.
    """
    fast = ban_scores_cpu(scores, banned, eos_token_ids, inplace=inplace, rows=rows)
    if fast is not None:
        return fast.scores
    guarded = (
        scores.masked_fill_(banned, float("-inf"))
        if inplace
        else scores.masked_fill(banned, float("-inf"))
    )
    if eos_token_ids and eos_token_ids[0] < scores.shape[1]:
        eos = eos_token_ids[0]
        dead = guarded.amax(dim=1) == float("-inf")  # one reduction; NaN is not -inf
        if rows is not None:
            dead &= rows
        guarded[:, eos] = torch.where(dead, torch.zeros_like(guarded[:, eos]), guarded[:, eos])
    return guarded


@dataclass(frozen=True)
class BannedScores:
    """What :func:`ban_scores_cpu` computed: the scores, and what the statistics need."""

    scores: torch.Tensor  # the banned scores (``scores`` itself when edited in place)
    counts: torch.Tensor  # int64 (rows,) tokens banned per row
    first_choice: torch.Tensor  # int64 (rows,) each row's highest score's token before the ban


def ban_scores_cpu(
    scores: torch.Tensor,
    banned: torch.Tensor,
    eos_token_ids: tuple[int, ...],
    *,
    inplace: bool,
    rows: torch.Tensor | None = None,
) -> BannedScores | None:
    """:func:`ban_scores` for float32/float64 scores on the CPU (None otherwise).

    The same result in the fewest passes over the scores, in numpy (torch's CPU kernels wake
    their thread pool, which costs more than these passes right after a model's forward:
    measured, 0.85 ms a step at batch 1 in a generation, against 0.3 ms for the same calls
    alone). A row is alive when its first choice (numpy's argmax, which torch's equals: the
    first of ties, NaN counted highest) is finite and not banned, so only the other rows are
    searched for a finite score. Rows of at least :data:`_ROW` scores go one at a time, each
    in the cache while it is read (:func:`_ban_rows`), split over the step's threads past a few
    MiB, into a reused array (:func:`_output`). Measured at 256 rows of 151,646 float32 scores
    (2 threads): about 16 ms with canonical decoding's bans, against 26 ms for numpy's argmax, the
    counts and torch's ``where``, and about 60 ms for numpy's argmax, counts along the axis and
    ``where`` into a new array, as before.
    """
    if not (
        scores.device.type == "cpu"
        and banned.device.type == "cpu"
        and scores.dtype in (torch.float32, torch.float64)
        and scores.dim() == 2
        and scores.is_contiguous()
        and banned.is_contiguous()
        and banned.shape == scores.shape
        and (rows is None or rows.device.type == "cpu")
    ):
        return None
    original = scores.detach().numpy()
    mask = banned.numpy()
    count, width = original.shape
    guarded = original if inplace else _output(original.shape, original.dtype)
    if width >= _ROW:
        first = np.empty(count, dtype=np.int64)
        counts = np.empty(count, dtype=np.int64)
        over_rows(
            count,
            original.size,
            _PART,
            lambda start, stop: _ban_rows(original, mask, guarded, first, counts, start, stop),
        )
    else:  # narrow rows: whole-array passes cost less than a call per row
        first = original.argmax(axis=1)
        counts = np.count_nonzero(mask, axis=1).astype(np.int64, copy=False)
        if not inplace:
            np.copyto(guarded, original)
        np.copyto(guarded, original.dtype.type(-np.inf), where=mask)
    if eos_token_ids and eos_token_ids[0] < width:
        index = np.arange(count)
        alive = ~mask[index, first] & (original[index, first] > -np.inf)
        dead = np.zeros(count, dtype=bool)
        suspects = np.flatnonzero(~alive)
        if suspects.size:
            dead[suspects] = guarded[suspects].max(axis=1) == -np.inf
        if rows is not None:
            dead &= rows.numpy()
        guarded[dead, eos_token_ids[0]] = 0.0
    result = scores if inplace else torch.from_numpy(guarded)
    return BannedScores(result, torch.from_numpy(counts), torch.from_numpy(first))


def _ban_rows(
    original: np.ndarray,
    mask: np.ndarray,
    guarded: np.ndarray,
    first: np.ndarray,
    counts: np.ndarray,
    start: int,
    stop: int,
) -> None:
    """Rows ``start..stop`` of :func:`ban_scores_cpu`: each row's first choice and count, and
    its scores banned into ``guarded`` (``original`` itself, or a new array). A row with no ban
    is copied; one with few bans is copied and then banned by a pass over its mask that seldom
    branches; one with bans scattered over it (canonical decoding's: a few to ten in a hundred,
    apart) is banned without a branch, over the scores' bits: ``bits ^ ((bits ^ -inf) &
    lanes)``, where ``lanes`` is -1 at a ban and 0 elsewhere (numpy's and torch's ``where``
    mispredict a branch at nearly every ban there: twice the time of a row with none)."""
    ints = np.int32 if original.dtype == np.float32 else np.int64
    minus = original.dtype.type(-np.inf)
    minus_bits = minus.view(ints)
    width = original.shape[1]
    bits, out_bits = original.view(ints), guarded.view(ints)
    lanes = np.empty(width, dtype=ints)
    spare = np.empty(width, dtype=ints) if guarded is original else None
    for row in range(start, stop):
        first[row] = original[row].argmax()
        many = counts[row] = np.count_nonzero(mask[row])
        if many * _SCATTERED < width:
            if guarded is not original:
                np.copyto(guarded[row], original[row])
            if many:
                np.copyto(guarded[row], minus, where=mask[row])
            continue
        np.negative(mask[row].view(np.int8), out=lanes, dtype=ints)
        # A new array's row holds the step between (the scores' row is still read); edited in
        # place, a spare row does.
        between = out_bits[row] if spare is None else spare
        np.bitwise_xor(bits[row], minus_bits, out=between)
        np.bitwise_and(between, lanes, out=between)
        np.bitwise_xor(bits[row], between, out=out_bits[row])


_KEPT: list[np.ndarray] = []  # the arrays :func:`_output` handed out lately, in this process
_KEPT_LOCK = threading.Lock()


def _output(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An uninitialized array of ``shape`` and ``dtype`` that nothing else holds: one of the
    last two handed out (by any thread) whose tensors (views and copies into numpy included)
    were all let go, or a new one. A new array of 155 MiB (256 rows of 151,646 float32 scores)
    costs a page fault every 4 KiB written: 15 ms, more than the pass that fills it. A caller
    that keeps every step's scores (``output_scores=True``) keeps them all: each step then gets
    a new one. Only arrays of at least :data:`_REUSED` bytes are kept (smaller ones come from
    the allocator's free lists), only of the last shape asked for, and two at most in the
    process: what stays after the last large step is 2 × its scores, whatever the threads."""
    with _KEPT_LOCK:
        if _KEPT and (_KEPT[0].shape != shape or _KEPT[0].dtype != dtype):
            _KEPT.clear()
        for index in range(len(_KEPT)):
            # Held by the list and by getrefcount's argument only: a tensor made by
            # torch.from_numpy, and every view of it, holds its array. The array handed out
            # is held by the caller before the lock is let go.
            if sys.getrefcount(_KEPT[index]) == 2:
                return _KEPT[index]
        array = np.empty(shape, dtype=dtype)
        if array.nbytes >= _REUSED:
            _KEPT.append(array)
            del _KEPT[:-2]
        return array


def fail_closed(
    scores: torch.Tensor, rows: torch.Tensor, eos_token_ids: tuple[int, ...]
) -> torch.Tensor:
    """Edits ``scores`` in place so that the given rows may take nothing but end of sequence.

    For rows whose context the guard cannot know (an engine's placeholder, an error inside a
    callback that must not raise): a token the guard did not check is never emitted.

    Args:
        scores: float `(rows, vocab_width)`.
        rows: bool `(rows,)`, the rows to close.
        eos_token_ids: their first id keeps its score (0 where it was ``-inf``); none: every
            score of the rows goes to ``-inf``.
    """
    if not bool(rows.any()):
        return scores
    eos = eos_token_ids[0] if eos_token_ids and eos_token_ids[0] < scores.shape[1] else None
    kept = scores[rows, eos] if eos is not None else None
    scores[rows] = float("-inf")
    if eos is not None and kept is not None:
        scores[rows, eos] = torch.where(torch.isneginf(kept), torch.zeros_like(kept), kept)
    return scores


__all__ = ["BannedScores", "ban_scores", "ban_scores_cpu", "fail_closed"]
