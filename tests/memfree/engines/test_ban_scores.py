"""Banning scores: the CPU fast path (banned entries set in one pass, numpy's or, past a width,
torch's on its threads into a reused array; the dead-row check from the first choices; the
counts and first choices the statistics need) equals ``masked_fill``, the plain rescue rule and
torch's argmax, by Hypothesis over scores holding -inf and NaN; an array handed out is never
reused while a tensor, a view of one or a numpy view still holds it."""

from __future__ import annotations

from unittest import mock

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memfree.engines import scores as scores_module
from memfree.engines.scores import ban_scores, ban_scores_cpu


def reference(
    scores: torch.Tensor, banned: torch.Tensor, eos: int, rows: torch.Tensor | None
) -> torch.Tensor:
    guarded = scores.masked_fill(banned, float("-inf"))
    dead = torch.isneginf(guarded).all(dim=1)
    if rows is not None:
        dead &= rows
    guarded[:, eos] = torch.where(dead, torch.zeros_like(guarded[:, eos]), guarded[:, eos])
    return guarded


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5),
    width=st.integers(1, 40),
    seed=st.integers(0, 2**32),
    ban_share=st.sampled_from([0.0, 0.1, 0.9, 1.0]),
    special=st.sampled_from([0.0, 0.3, 1.0]),
    inplace=st.booleans(),
    guarded_rows=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    path=st.sampled_from(["whole", "few", "scattered"]),
)
def test_the_fast_path_equals_masked_fill(
    rows: int,
    width: int,
    seed: int,
    ban_share: float,
    special: float,
    inplace: bool,
    guarded_rows: bool,
    dtype: torch.dtype,
    path: str,
) -> None:
    # Each path at every width here: whole-array passes (narrow rows); row by row, split over
    # threads, into a kept array, with a row's bans set by a pass over its mask ("few") or
    # over the scores' bits ("scattered": every row with a ban).
    thresholds = {
        "whole": {"_ROW": 1 << 62},
        "few": {"_ROW": 1, "_PART": 1, "_SCATTERED": 0},
        "scattered": {"_ROW": 1, "_PART": 1, "_SCATTERED": 1 << 40},
    }[path]
    with mock.patch.multiple(scores_module, _REUSED=1, **thresholds):
        rng = np.random.default_rng(seed)
        values = rng.normal(size=(rows, width))
        odd = rng.random((rows, width)) < special
        values[odd] = rng.choice([-np.inf, np.nan, np.inf], size=int(odd.sum()))
        scores = torch.from_numpy(values).to(dtype)
        banned = torch.from_numpy(rng.random((rows, width)) < ban_share)
        eos = int(rng.integers(0, width))
        rows_mask = torch.from_numpy(rng.random(rows) < 0.5) if guarded_rows else None
        expected = reference(scores.clone(), banned, eos, rows_mask)
        given_scores = scores.clone()
        got = ban_scores(given_scores, banned, (eos,), inplace=inplace, rows=rows_mask)
        assert torch.equal(got.isnan(), expected.isnan())
        assert torch.equal(got.nan_to_num(0.5), expected.nan_to_num(0.5))
        if inplace:
            assert got.data_ptr() == given_scores.data_ptr()
        else:
            assert torch.equal(given_scores.nan_to_num(0.5), scores.nan_to_num(0.5))
        fast = ban_scores_cpu(scores.clone(), banned, (eos,), inplace=False, rows=rows_mask)
        if dtype == torch.bfloat16:
            assert fast is None  # numpy has no bfloat16: the torch path answers
            return
        assert fast is not None
        assert torch.equal(fast.first_choice, scores.argmax(dim=1))  # torch's own answer
        assert torch.equal(fast.counts, banned.sum(dim=1))


def test_at_a_serving_width_the_ban_equals_masked_fill() -> None:
    """256 rows of 16,384 scores (past every threshold, as they are): the scattered bans of
    canonical decoding and the sparse ones of the ids-only guard, a row with nothing left."""
    rng = np.random.default_rng(7)
    scores = torch.from_numpy(rng.normal(size=(256, 16384)).astype(np.float32))
    scores[3, 100] = float("nan")
    scores[4, :] = float("-inf")
    for share in (0.1, 0.0005):
        banned = torch.from_numpy(rng.random(scores.shape) < share)
        banned[5, :] = True
        rows_mask = torch.from_numpy(rng.random(256) < 0.9)
        expected = reference(scores.clone(), banned, 2, rows_mask)
        for inplace in (False, True):
            given_scores = scores.clone()
            fast = ban_scores_cpu(given_scores, banned, (2,), inplace=inplace, rows=rows_mask)
            assert fast is not None
            assert torch.equal(fast.scores.nan_to_num(0.5), expected.nan_to_num(0.5))
            assert torch.equal(fast.scores.isnan(), expected.isnan())
            assert torch.equal(fast.counts, banned.sum(dim=1))
            assert torch.equal(fast.first_choice, scores.argmax(dim=1))
            if not inplace:
                assert torch.equal(given_scores.nan_to_num(0.5), scores.nan_to_num(0.5))


def test_an_array_still_held_is_never_handed_out_again() -> None:
    """Each step's scores come in an array kept for later steps (a new one of that size costs
    a page fault every 4 KiB). One is handed out again only when nothing holds it: not the
    tensor, a view of it, nor a numpy view of either."""
    rng = np.random.default_rng(11)

    def step(seed: int) -> torch.Tensor:
        scores = torch.from_numpy(np.random.default_rng(seed).normal(size=(64, 32768)))
        banned = torch.from_numpy(rng.random(scores.shape) < 0.1)
        fast = ban_scores_cpu(scores.float(), banned, (0,), inplace=False)
        assert fast is not None
        return fast.scores

    first = step(1)
    kept = first.clone()
    view = step(2)[:, :7]  # the tensor goes, its view stays
    kept_view = view.clone()
    as_numpy = step(3).numpy()  # the tensor goes, a numpy view of it stays
    kept_numpy = as_numpy.copy()
    for seed in range(4, 8):
        step(seed)
    assert torch.equal(first, kept)
    assert torch.equal(view, kept_view)
    assert np.array_equal(as_numpy, kept_numpy)
    # Let go, an array is handed out again: a step's scores land where the last ones were.
    address = step(8).data_ptr()
    assert step(9).data_ptr() == address


def test_threads_that_ban_at_once_never_share_an_array_still_held() -> None:
    """The kept arrays are the process's: threads banning at once each get their own, and
    every result keeps its answer while its thread holds it."""
    import threading

    results: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {0: [], 1: [], 2: []}

    def work(number: int) -> None:
        rng = np.random.default_rng(number)
        for _ in range(6):
            scores = torch.from_numpy(rng.normal(size=(32, 40000)).astype(np.float32))
            banned = torch.from_numpy(rng.random(scores.shape) < 0.1)
            fast = ban_scores_cpu(scores, banned, (0,), inplace=False)
            assert fast is not None
            results[number].append((fast.scores, reference(scores, banned, 0, None)))

    threads = [threading.Thread(target=work, args=(number,)) for number in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    held = [got for pairs in results.values() for got, _ in pairs]
    assert len({got.data_ptr() for got in held}) == len(held)
    for pairs in results.values():
        for got, expected in pairs:
            assert torch.equal(got, expected)
