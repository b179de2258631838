"""Banning scores: the CPU fast path (numpy: banned entries found once and set by index, the
dead-row check from the first choices, the counts and first choices the statistics need) equals
``masked_fill``, the plain rescue rule and torch's argmax, by Hypothesis over scores holding -inf
and NaN."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memfree.engines.setup import ban_scores, ban_scores_cpu


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
) -> None:
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
