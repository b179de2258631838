"""Banning scores: the CPU fast path (banned entries found with numpy, set by index; the dead-row
check from the first choices) equals ``masked_fill`` and the plain rescue rule, by Hypothesis
over scores holding -inf and NaN."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memfree.engines.setup import ban_scores
from memfree.engines.stats import first_choice


def reference(scores: torch.Tensor, banned: torch.Tensor, eos: int) -> torch.Tensor:
    guarded = scores.masked_fill(banned, float("-inf"))
    dead = torch.isneginf(guarded).all(dim=1)
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
    with_first=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_the_fast_path_equals_masked_fill(
    rows: int,
    width: int,
    seed: int,
    ban_share: float,
    special: float,
    inplace: bool,
    with_first: bool,
    dtype: torch.dtype,
) -> None:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(rows, width))
    odd = rng.random((rows, width)) < special
    values[odd] = rng.choice([-np.inf, np.nan, np.inf], size=int(odd.sum()))
    scores = torch.from_numpy(values).to(dtype)
    banned = torch.from_numpy(rng.random((rows, width)) < ban_share)
    eos = int(rng.integers(0, width))
    expected = reference(scores.clone(), banned, eos)
    first = first_choice(scores) if with_first else None
    if first is not None:
        assert torch.equal(first, scores.argmax(dim=1))  # numpy's argmax: torch's answer
    given_scores = scores.clone()
    got = ban_scores(given_scores, banned, (eos,), inplace=inplace, first_choice=first)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(0.5), expected.nan_to_num(0.5))
    if inplace:
        assert got.data_ptr() == given_scores.data_ptr()
    else:
        assert torch.equal(given_scores.nan_to_num(0.5), scores.nan_to_num(0.5))
