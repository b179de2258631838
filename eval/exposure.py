"""Canary exposure (Carlini et al., "The Secret Sharer", 2019) and the differential-privacy bound
it implies (Jagielski, "A Note on Interpreting Canary Exposure", 2023).

Scores are log-perplexities: lower means the model finds the sequence more likely. A canary's
rank among the randomness space R is 1 + the number of other candidates scoring at or below it
(ties count against the canary); its exposure is ``log2 |R| - log2 rank``. A canary the model has
not learned has exposure about 1 at the median (mean about 1/ln 2); a fully memorized one has
exposure log2 |R|.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _as_array(scores: Any, name: str) -> np.ndarray:
    array = np.asarray(scores, dtype=np.float64)
    # +inf is a sequence of probability zero (e.g. under the guard): it ranks last.
    if array.size and (np.isnan(array).any() or np.isneginf(array).any()):
        raise ValueError(f"{name} must be log-perplexities (no NaN, no -inf)")
    return array


def rank_exposure(
    canary_scores: Any, reference_scores: Any, space_size: float | None = None
) -> Any:
    """Exposure of each canary by its rank among reference sequences.

    Args:
        canary_scores: log-perplexity of one canary (a scalar) or of several (an array).
        reference_scores: log-perplexities of reference sequences from the same space that were
            never inserted: all of R but the canary (exact), or a uniform sample of it.
        space_size: |R|. Defaults to the number of references (the references are then taken as
            the whole space, as in the exact case with |R| = references). With a sample of n
            references, a canary with c references at or below it has estimated rank
            ``1 + c * |R| / n``.

    Returns:
        exposure(s) in bits, the shape of ``canary_scores``.

    Example:
        >>> rank_exposure(3.5, range(1, 17))  # 3 references at or below: rank 4 of 16
        2.0
    """
    references = np.sort(_as_array(reference_scores, "reference_scores"))
    if references.size == 0:
        raise ValueError("reference_scores is empty: exposure needs reference sequences")
    canaries = _as_array(canary_scores, "canary_scores")
    size = float(references.size if space_size is None else space_size)
    if size < references.size:
        raise ValueError(
            f"space_size ({space_size}) is smaller than the number of references "
            f"({references.size})"
        )
    at_or_below = np.searchsorted(references, canaries, side="right")
    rank = 1.0 + at_or_below * (size / references.size)
    exposure = np.log2(size) - np.log2(rank)
    return float(exposure) if exposure.ndim == 0 else exposure


def extrapolated_exposure(canary_scores: Any, reference_scores: Any) -> Any:
    """Exposure by skew-normal extrapolation, for spaces too large to rank in (Secret Sharer §4).

    A skew-normal distribution is fitted to the reference log-perplexities; a canary's exposure is
    ``-log2 CDF(canary score)``, the estimated fraction of R scoring at or below it.

    Args:
        canary_scores: a scalar or an array of canary log-perplexities.
        reference_scores: log-perplexities of references sampled from R (a few thousand).

    Returns:
        exposure(s) in bits, the shape of ``canary_scores``.
    """
    from memfree.errors import require

    require("scipy", "eval")
    from scipy import stats

    references = _as_array(reference_scores, "reference_scores")
    references = references[np.isfinite(references)]
    if references.size < 10:
        raise ValueError(f"extrapolation needs at least 10 reference scores, got {references.size}")
    canaries = _as_array(canary_scores, "canary_scores")
    shape, location, scale = stats.skewnorm.fit(references)
    log_cdf = stats.skewnorm.logcdf(canaries, shape, location, scale)
    exposure = -np.asarray(log_cdf) / math.log(2)
    return float(exposure) if exposure.ndim == 0 else exposure


RANDOM_GUESSING_MEDIAN = 1.0
RANDOM_GUESSING_MEAN = 1.0 / math.log(2)


def epsilon_lower_bound(exposure: float, repetitions: int = 1) -> float:
    """Lower bound on a differential-privacy epsilon from a canary's exposure (Jagielski 2023).

    ``epsilon >= ln 2 * (exposure - 1)``, divided by the number of times the canary was inserted
    (group privacy). Only meaningful for the median exposure over many canaries, and only as a
    bound: a low exposure does not prove privacy.
    """
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, got {repetitions}")
    return max(0.0, math.log(2) * (exposure - 1.0)) / repetitions
