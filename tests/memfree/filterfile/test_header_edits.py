"""A filter header edited behind a recomputed checksum: the hashing binding is required (a header
without it is refused with the fix), several fields edited at once are refused with or without
it, an unedited rewrite still opens; a pybloomfiltermmap3 sidecar with an impossible n is damaged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import NgramFilter
from memfree.errors import DamagedFilterError
from memfree.filterfile.header import MAX_NGRAM_SIZE
from memfree.filterfile.sizing import expected_false_positive_rate
from memfree.vocab.words import NORMALIZER
from tests.memfree.filterfile.test_header import STORED, read_header, rewrite

SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

# ------------------------------------------------------------------------------------------------
# 5. The hashing binding is required: edits behind a recomputed header checksum, several at once.


@pytest.fixture
def filter_path(tmp_path: Path) -> Path:
    path = tmp_path / "f.memfree"
    NgramFilter.from_ngrams(path, STORED, false_positive_rate=1e-3).close()
    return path


def test_a_filter_without_its_hashing_binding_is_refused_with_the_fix(filter_path: Path) -> None:
    metadata, _ = read_header(filter_path)
    del metadata["hashing_xxh3"]
    rewrite(filter_path, metadata)
    for verify in (True, False):
        with pytest.raises(DamagedFilterError, match="hashing_xxh3") as error:
            NgramFilter.open(filter_path, verify=verify)
        assert "rebuild it with `memfree build`" in str(error.value)


def test_an_unedited_rewrite_still_opens(filter_path: Path) -> None:
    """The editing helper itself changes nothing but what a test edits."""
    metadata, _ = read_header(filter_path)
    rewrite(filter_path, metadata)
    assert NgramFilter.open(filter_path).contains(STORED).all()


def _other(value: int, low: int, high: int, draw: int) -> int:
    """A value in [low, high] other than ``value``."""
    choice = low + draw % (high - low)
    return choice if choice < value else choice + 1


# Each edit keeps the header self-consistent (the stated rates recomputed), so only the binding
# of the bits to their hashing parameters (and the share of set bits) can refuse it.
EDITS = ("hash_seed", "n", "num_probes", "prefix_num_probes", "unit")


def _edit(metadata: dict[str, Any], field: str, draw: int) -> None:
    if field == "hash_seed":
        # Any other seed: 1 + draw stays below 2**64, so the edit is never a no-op (a draw of
        # 2**64 - 1 once gave the same seed back, and an intact file opened).
        metadata["hash_seed"] = (metadata["hash_seed"] + 1 + draw % ((1 << 64) - 1)) % (1 << 64)
    elif field == "n":
        metadata["n"] = _other(metadata["n"], 2, MAX_NGRAM_SIZE, draw)
    elif field == "num_probes":
        metadata["num_probes"] = _other(metadata["num_probes"], 1, 32, draw)
        metadata["expected_false_positive_rate"] = expected_false_positive_rate(
            metadata["num_ngrams"], metadata["num_bits"] // 512, metadata["num_probes"]
        )
    elif field == "prefix_num_probes":
        prefix = metadata["prefix"]
        prefix["num_probes"] = _other(prefix["num_probes"], 1, 32, draw)
        prefix["expected_false_positive_rate"] = expected_false_positive_rate(
            prefix["num_prefixes"], prefix["num_bits"] // 512, prefix["num_probes"]
        )
    else:  # a token filter read as a word filter
        metadata["unit"], metadata["normalizer"] = "word", NORMALIZER


@settings(max_examples=150, deadline=None, suppress_health_check=SLOW)
@given(
    fields=st.sets(st.sampled_from(EDITS), min_size=1),
    draws=st.lists(st.integers(0, 2**64), min_size=len(EDITS), max_size=len(EDITS)),
    binding=st.sampled_from(["kept", "deleted"]),
)
def test_multi_field_edits_are_refused_with_or_without_the_binding(
    filter_path: Path, fields: set[str], draws: list[int], binding: str
) -> None:
    """Several hashing fields changed together, the header checksum recomputed, the binding left
    stale or deleted: refused, never a filter that opens and finds none of its n-grams."""
    original = filter_path.read_bytes()
    try:
        metadata, _ = read_header(filter_path)
        for index, field in enumerate(sorted(fields)):
            _edit(metadata, field, draws[index])
        if binding == "deleted":
            del metadata["hashing_xxh3"]
        rewrite(filter_path, metadata)
        with pytest.raises(DamagedFilterError):
            NgramFilter.open(filter_path)
        # Refused from the header alone, even unverified: the binding reads no bits.
        with pytest.raises(DamagedFilterError):
            NgramFilter.open(filter_path, verify=False)
    finally:
        filter_path.write_bytes(original)


def test_a_pybloom_sidecar_with_an_impossible_n_is_damaged(tmp_path: Path) -> None:
    from memfree.filterfile import pybloom

    writer = pybloom.PybloomWriter(100, 0.01, hash_seed=1)
    writer.add_ngrams(np.array([[1, 2, 3]]))
    path = writer.write(tmp_path / "f.bloom", {}, num_ngrams=1)
    sidecar = json.loads(pybloom.sidecar_path(path).read_text())
    sidecar["n"], sidecar["key_bytes"] = 100_000, 400_000
    pybloom.sidecar_path(path).write_text(json.dumps(sidecar))
    with pytest.raises(DamagedFilterError, match="'n' is 100000"):
        NgramFilter.open(path)
