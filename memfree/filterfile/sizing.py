"""Sizing of blocked Bloom filters: expected false-positive rate and the smallest filter for a target.

A blocked filter (Putze, Sanders and Singler, 2007) puts all probes of a key in one 512-bit block,
so its false-positive rate is the standard one averaged over the Poisson-distributed load of a
block. The formula below is what ``memfree info`` reports and what tests compare measurements to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memfree.filterfile.hashing import BLOCK_BITS, MAX_PROBES


def expected_false_positive_rate(num_keys: int, num_blocks: int, num_probes: int) -> float:
    """Probability that a key never inserted is reported present.

    Args:
        num_keys: distinct keys stored.
        num_blocks: 512-bit blocks in the filter.
        num_probes: bits per key inside its block (independent, so they may coincide).

    Returns:
        The expected false-positive rate in [0, 1].
    """
    if num_keys <= 0:
        return 0.0
    load = num_keys / num_blocks
    spread = 12.0 * math.sqrt(load) + 30.0
    low = max(0, int(load - spread))
    high = int(load + spread) + 1
    if low * num_probes > 400_000:
        # Every block in the range holds so many keys that (1 - 1/512)^(k*c) underflows: each
        # term is 1 in float64. Also keeps a damaged header's absurd count from filling memory.
        return 1.0
    keys_in_block = np.arange(low, high, dtype=np.float64)
    log_poisson = keys_in_block * math.log(load) - load - _log_factorial(keys_in_block)
    bit_set = 1.0 - np.power(1.0 - 1.0 / BLOCK_BITS, num_probes * keys_in_block)
    per_block = np.power(bit_set, num_probes)
    return float(np.clip(np.sum(np.exp(log_poisson) * per_block), 0.0, 1.0))


def _log_factorial(values: np.ndarray) -> np.ndarray:
    """log(c!) for a run of consecutive integers c, with one lgamma call."""
    first = float(values[0])
    steps = np.log(np.maximum(values[1:], 1.0))
    return math.lgamma(first + 1.0) + np.concatenate(([0.0], np.cumsum(steps)))


@dataclass(frozen=True)
class FilterSize:
    """The chosen geometry of a filter."""

    num_blocks: int
    num_probes: int
    expected_false_positive_rate: float

    @property
    def num_bits(self) -> int:
        return self.num_blocks * BLOCK_BITS


def choose_size(num_keys: int, target_false_positive_rate: float) -> FilterSize:
    """Smallest blocked filter whose expected false-positive rate is at most the target.

    Args:
        num_keys: exact number of distinct keys to store.
        target_false_positive_rate: in (0, 1).

    Returns:
        The geometry with the fewest bits (ties: fewer probes).
    """
    if not 0.0 < target_false_positive_rate < 1.0:
        raise ValueError(
            f"target false-positive rate must be in (0, 1), got {target_false_positive_rate!r}"
        )
    if num_keys < 0:
        raise ValueError(f"num_keys must be >= 0, got {num_keys}")
    if num_keys == 0:
        return FilterSize(num_blocks=1, num_probes=1, expected_false_positive_rate=0.0)
    best: FilterSize | None = None
    for num_probes in range(1, MAX_PROBES + 1):
        num_blocks = _fewest_blocks(num_keys, num_probes, target_false_positive_rate)
        if num_blocks is None:
            continue
        if best is None or num_blocks < best.num_blocks:
            rate = expected_false_positive_rate(num_keys, num_blocks, num_probes)
            best = FilterSize(num_blocks, num_probes, rate)
        elif num_blocks > best.num_blocks * 1.05:
            break  # the size is unimodal in the probe count: past the optimum it only grows
    if best is None:
        raise ValueError(
            f"no filter of at most {MAX_PROBES} probes and 2**32 blocks reaches a false-positive "
            f"rate of {target_false_positive_rate} for {num_keys} keys; raise target_false_positive_rate"
        )
    return best


def _fewest_blocks(num_keys: int, num_probes: int, target: float) -> int | None:
    """Binary search for the fewest blocks meeting the target (None if 2**32 - 1 do not)."""
    low, high = 1, 1
    while expected_false_positive_rate(num_keys, high, num_probes) > target:
        if high >= (1 << 32) - 1:
            return None
        low, high = high + 1, min(high * 2, (1 << 32) - 1)
    while low < high:
        middle = (low + high) // 2
        if expected_false_positive_rate(num_keys, middle, num_probes) <= target:
            high = middle
        else:
            low = middle + 1
    return high


def theoretical_minimum_bits(num_keys: int, false_positive_rate: float) -> float:
    """Information-theoretic lower bound for any approximate-membership structure."""
    if num_keys <= 0:
        return 0.0
    return num_keys * math.log2(1.0 / false_positive_rate)
