"""Exposure: the issue's golden values, extrapolation against ranks, the epsilon bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eval.exposure import (
    RANDOM_GUESSING_MEAN,
    RANDOM_GUESSING_MEDIAN,
    epsilon_lower_bound,
    extrapolated_exposure,
    rank_exposure,
)

REFERENCES = np.arange(1, 17, dtype=float)  # log-perplexities 1..16


def test_rank_exposure_golden_values() -> None:
    assert rank_exposure(3.5, REFERENCES) == 2.0  # 3 references at or below: rank 4 of 16
    assert rank_exposure(0.5, REFERENCES) == 4.0  # below all: rank 1
    assert rank_exposure(16.5, REFERENCES) == pytest.approx(4 - math.log2(17))  # above all
    assert rank_exposure(3.0, REFERENCES) == 2.0  # a tie counts against the canary
    assert rank_exposure([0.5, 3.5], REFERENCES).tolist() == [4.0, 2.0]


def test_sampled_space_scales_the_rank() -> None:
    # 16 sampled references of a space of 1,024: 3 at or below means rank 1 + 3 * 64
    assert rank_exposure(3.5, REFERENCES, space_size=1024) == pytest.approx(
        10 - math.log2(1 + 3 * 64)
    )
    with pytest.raises(ValueError, match="smaller than the number of references"):
        rank_exposure(1.0, REFERENCES, space_size=8)
    with pytest.raises(ValueError, match="empty"):
        rank_exposure(1.0, [])


def test_random_canaries_have_the_guessing_baseline() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=100_000)
    exposures = rank_exposure(scores[:2000], scores[2000:])
    assert np.median(exposures) == pytest.approx(RANDOM_GUESSING_MEDIAN, abs=0.1)
    assert np.mean(exposures) == pytest.approx(RANDOM_GUESSING_MEAN, abs=0.1)


def test_extrapolation_agrees_with_rank_on_a_large_sampled_space() -> None:
    from scipy import stats

    # Log-perplexities of random sequences are close to skew-normal (the paper's premise).
    references = stats.skewnorm.rvs(4.0, loc=30, scale=3, size=400_000, random_state=1)
    canaries = np.quantile(references, [1e-4, 1e-3, 1e-2, 0.1, 0.5])
    ranked = rank_exposure(canaries, references)  # exact ranks in the large sample
    extrapolated = extrapolated_exposure(canaries, references[:5000])  # from 5,000 only
    assert np.abs(extrapolated - ranked).max() < 0.5  # bits, out to exposure 13
    # beyond the sample, extrapolation keeps going where ranks cannot
    far = np.quantile(references, 0.0) - 3
    assert extrapolated_exposure(far, references[:5000]) > rank_exposure(far, references[:5000])


def test_epsilon_lower_bound() -> None:
    assert epsilon_lower_bound(1.0) == 0.0
    assert epsilon_lower_bound(11.0) == pytest.approx(10 * math.log(2))
    assert epsilon_lower_bound(11.0, repetitions=4) == pytest.approx(10 * math.log(2) / 4)
    with pytest.raises(ValueError):
        epsilon_lower_bound(3.0, repetitions=0)
