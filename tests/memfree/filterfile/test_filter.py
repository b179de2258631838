"""The filter file: round trips, no false negatives, false-positive rate, and damaged files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import DamagedFilterError, FilterError, NgramFilter
from memfree.filterfile.bloom.writer import bits_from_fingerprints, write_filter
from memfree.filterfile.hashing import fingerprints_np, query_bits_np, query_bits_torch
from memfree.filterfile.header import PAGE_BYTES
from memfree.filterfile.protocol import NgramSet
from memfree.filterfile.sizing import choose_size, expected_false_positive_rate


def make_filter(path: Path, ngrams: np.ndarray, fpr: float = 1e-3, seed: int = 7) -> NgramFilter:
    fingerprints = np.unique(fingerprints_np(ngrams, seed))
    size = choose_size(len(fingerprints), fpr)
    words = bits_from_fingerprints(fingerprints, size.num_blocks, size.num_probes)
    metadata = {
        "n": ngrams.shape[1],
        "num_probes": size.num_probes,
        "hash_seed": seed,
        "num_ngrams": len(fingerprints),
        "unit": "token",
    }
    return NgramFilter.create(path, words, metadata)


def test_exact_small_case(tmp_path: Path) -> None:
    stored = np.array([[1, 2, 3], [3, 2, 1], [0, 0, 0]])
    filt = make_filter(tmp_path / "f.memfree", stored, fpr=1e-9)
    assert filt.contains(stored).tolist() == [True, True, True]
    # With a 1e-9 target these are absent for certain in practice (and pinned by the hash).
    assert filt.contains(np.array([[1, 2, 4], [2, 3, 1], [0, 0, 1]])).tolist() == [
        False,
        False,
        False,
    ]
    assert bool(filt.contains([1, 2, 3])) is True
    assert filt.n == 3 and len(filt) == 3


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    ngram_size=st.integers(1, 6),
    vocab=st.integers(2, 50),
)
def test_no_false_negatives_against_exact_set(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, ngram_size: int, vocab: int
) -> None:
    rows = data.draw(
        st.lists(
            st.lists(st.integers(0, vocab - 1), min_size=ngram_size, max_size=ngram_size),
            min_size=1,
            max_size=200,
        )
    )
    stored = np.array(rows, dtype=np.int64)
    fpr = data.draw(st.sampled_from([0.3, 1e-2, 1e-4]))
    filt = make_filter(tmp_path_factory.mktemp("f") / "f.memfree", stored, fpr=fpr)
    assert filt.contains(stored).all()
    # Reopen: same answers from the file alone, for members and for every other probe.
    reopened = NgramFilter.open(filt.path)
    probes = np.array(
        data.draw(
            st.lists(
                st.lists(st.integers(0, vocab - 1), min_size=ngram_size, max_size=ngram_size),
                min_size=1,
                max_size=100,
            )
        )
    )
    assert reopened.contains(probes).tolist() == filt.contains(probes).tolist()
    exact = {tuple(row) for row in rows}
    for row, answer in zip(probes.tolist(), reopened.contains(probes).tolist(), strict=True):
        if tuple(row) in exact:
            assert answer


@pytest.mark.parametrize(("num_keys", "fpr"), [(20_000, 1e-2), (50_000, 1e-3), (3_000, 0.2)])
def test_measured_false_positive_rate_near_formula(
    tmp_path: Path, num_keys: int, fpr: float
) -> None:
    rng = np.random.default_rng(num_keys)
    stored = rng.integers(0, 50_000, size=(num_keys, 4))
    filt = make_filter(tmp_path / "f.memfree", stored, fpr=fpr)
    formula = filt.expected_false_positive_rate
    assert formula <= fpr * 1.0001
    # Random 4-grams over a vocabulary of 2**30 are absent from the stored set.
    queries = rng.integers(50_000, 2**30, size=(max(200_000, int(3000 / formula)), 4))
    measured = filt.contains(queries).mean()
    assert abs(measured - formula) / formula < 0.2, (measured, formula)


def test_formula_matches_standard_bloom_in_the_limit() -> None:
    # One key per block on average and one probe: FPR = E[1 - (1-1/512)^C] with C ~ Poisson(1),
    # which is 1 - exp(-(1 - (1 - 1/512))) in closed form.
    rate = expected_false_positive_rate(1000, 1000, 1)
    direct = 1 - np.exp(-1 * (1 - (1 - 1 / 512)))
    assert rate == pytest.approx(direct, rel=1e-9)


def test_torch_view_without_copy_answers_like_numpy(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    stored = rng.integers(0, 1000, size=(500, 5))
    filt = make_filter(tmp_path / "f.memfree", stored, fpr=0.05)
    words = torch.from_numpy(filt.bit_words.view(np.int64))
    assert words.data_ptr() == filt.bit_words.ctypes.data  # mapped, not copied
    queries = rng.integers(0, 1000, size=(2000, 5))
    fps = torch.from_numpy(fingerprints_np(queries, filt.hash_seed).view(np.int64))
    assert query_bits_torch(words, fps, filt.num_probes).tolist() == filt.contains(queries).tolist()


def test_same_inputs_same_bytes(tmp_path: Path) -> None:
    stored = np.arange(300).reshape(100, 3)
    make_filter(tmp_path / "a.memfree", stored)
    make_filter(tmp_path / "b.memfree", stored)
    assert (tmp_path / "a.memfree").read_bytes() == (tmp_path / "b.memfree").read_bytes()
    filt = NgramFilter.open(tmp_path / "a.memfree")
    header_bytes = filt.size_bytes - filt.metadata["num_bits"] // 8
    assert header_bytes > 0 and header_bytes % PAGE_BYTES == 0  # bits start on a page boundary


def test_metadata_and_layout(tmp_path: Path) -> None:
    filt = make_filter(tmp_path / "f.memfree", np.arange(30).reshape(10, 3))
    metadata = filt.metadata
    assert metadata["layout"] == "blocked-512"
    assert metadata["num_bits"] == filt.num_bits and filt.num_bits % 512 == 0
    assert len(metadata["bits_xxh3"]) == 16
    metadata["n"] = 99  # a copy: the filter is unchanged
    assert filt.metadata["n"] == 3


def test_the_read_protocol_and_blocked_bits(tmp_path: Path) -> None:
    stored = np.arange(30).reshape(10, 3)
    with NgramFilter.from_ngrams(tmp_path / "f.memfree", stored, hash_seed=5) as filt:
        as_set: NgramSet = filt  # mypy checks that the native filter implements the Protocol
        assert isinstance(as_set, NgramSet) and len(as_set) == 10 and as_set.layout == "blocked-512"
        bits = filt.blocked_bits()
        assert bits.bit_words is filt.bit_words and bits.prefix_bit_words is filt.prefix_bit_words
        assert (
            bits.prefix_bit_words is not None and bits.prefix_num_probes == filt.prefix_num_probes
        )
        assert (bits.num_probes, bits.hash_seed) == (filt.num_probes, 5)
        assert query_bits_np(bits.bit_words, fingerprints_np(stored, 5), bits.num_probes).all()


def test_write_is_atomic_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f.memfree"
    with pytest.raises(ValueError, match="whole 512-bit blocks"):
        write_filter(
            target,
            np.zeros(7, dtype=np.uint64),
            {"n": 3, "num_probes": 2, "hash_seed": 1, "num_ngrams": 0},
        )
    assert list(tmp_path.iterdir()) == []


def test_contains_rejects_bad_shapes(tmp_path: Path) -> None:
    filt = make_filter(tmp_path / "f.memfree", np.arange(30).reshape(10, 3))
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        filt.contains(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="non-negative"):
        filt.contains(np.array([[-1, 2, 3]]))


# ------------------------------------------------------------------------------------------------
# Damaged files


@pytest.fixture()
def good_file(tmp_path: Path) -> tuple[Path, bytes]:
    rng = np.random.default_rng(1)
    filt = make_filter(tmp_path / "good.memfree", rng.integers(0, 500, size=(2000, 3)), fpr=0.01)
    return filt.path, filt.path.read_bytes()


def test_missing_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="memfree build"):
        NgramFilter.open(tmp_path / "absent.memfree")
    with pytest.raises(FilterError, match="directory"):
        NgramFilter.open(tmp_path)


@pytest.mark.parametrize("cut", [0, 1, 8, 23, 24, 100, 4095, 4096, 4097, -8, -1])
def test_truncated_files_are_refused(
    tmp_path: Path, good_file: tuple[Path, bytes], cut: int
) -> None:
    _, data = good_file
    damaged = tmp_path / "cut.memfree"
    damaged.write_bytes(data[:cut])
    with pytest.raises(DamagedFilterError, match=str(damaged.name)):
        NgramFilter.open(damaged)


def test_extra_bytes_are_refused(tmp_path: Path, good_file: tuple[Path, bytes]) -> None:
    _, data = good_file
    damaged = tmp_path / "long.memfree"
    damaged.write_bytes(data + b"\x00")
    with pytest.raises(DamagedFilterError, match="size"):
        NgramFilter.open(damaged)


def test_wrong_version_is_refused(tmp_path: Path, good_file: tuple[Path, bytes]) -> None:
    _, data = good_file
    damaged = tmp_path / "v9.memfree"
    damaged.write_bytes(data[:8] + struct.pack("<I", 9) + data[12:])
    with pytest.raises(DamagedFilterError, match="version 9"):
        NgramFilter.open(damaged)
    # Version 2 is the prefix-keyed index: a Bloom header under it is refused as damaged.
    damaged.write_bytes(data[:8] + struct.pack("<I", 2) + data[12:])
    with pytest.raises(DamagedFilterError, match="unknown layout 'blocked-512'"):
        NgramFilter.open(damaged)


def test_bit_flip_in_bits_is_caught_by_checksum(
    tmp_path: Path, good_file: tuple[Path, bytes]
) -> None:
    _, data = good_file
    flipped = bytearray(data)
    flipped[-5] ^= 0x10
    damaged = tmp_path / "flip.memfree"
    damaged.write_bytes(bytes(flipped))
    with pytest.raises(DamagedFilterError, match="checksum"):
        NgramFilter.open(damaged)
    assert NgramFilter.open(damaged, verify=False).n == 3  # explicitly unverified still opens


def test_consistent_but_forged_metadata_is_caught(
    tmp_path: Path, good_file: tuple[Path, bytes]
) -> None:
    # Change n from 3 to 4 inside valid JSON of the same length, keeping the old metadata hash.
    _, data = good_file
    length = struct.unpack_from("<I", data, 12)[0]
    metadata = json.loads(data[24 : 24 + length])
    metadata["n"] = 4
    raw = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    assert len(raw) == length
    damaged = tmp_path / "forged.memfree"
    damaged.write_bytes(data[:24] + raw + data[24 + length :])
    with pytest.raises(DamagedFilterError, match="metadata checksum"):
        NgramFilter.open(damaged)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.integers(0, 4095), value=st.integers(0, 255))
def test_header_fuzz_never_crashes_or_answers_wrongly(
    tmp_path_factory: pytest.TempPathFactory,
    good_file: tuple[Path, bytes],
    position: int,
    value: int,
) -> None:
    path, data = good_file
    reference = NgramFilter.open(path)
    queries = np.random.default_rng(2).integers(0, 500, size=(500, 3))
    expected = reference.contains(queries).tolist()
    fuzzed = bytearray(data)
    fuzzed[position] = value
    target = tmp_path_factory.mktemp("fuzz") / "fuzzed.memfree"
    target.write_bytes(bytes(fuzzed))
    try:
        filt = NgramFilter.open(target)
    except DamagedFilterError as error:
        assert str(target) in str(error)
        return
    # Opening succeeded: only bytes that do not matter changed (padding), so answers are equal.
    assert filt.contains(queries).tolist() == expected


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(size=st.integers(0, 20_000))
def test_size_fuzz(
    tmp_path_factory: pytest.TempPathFactory, good_file: tuple[Path, bytes], size: int
) -> None:
    _, data = good_file
    target = tmp_path_factory.mktemp("size") / "sized.memfree"
    target.write_bytes((data + b"\x00" * size)[:size])
    if size == len(data):
        assert NgramFilter.open(target).n == 3
    else:
        with pytest.raises(DamagedFilterError):
            NgramFilter.open(target)


def test_every_layout_reads_its_header_once_as_a_typed_value(tmp_path: Path) -> None:
    """Each layout's reader has a frozen :class:`FilterHeader` of its own kind, parsed at open,
    whose fields are the header's (the raw JSON stays as the read-only ``raw`` view)."""
    import dataclasses
    import pickle
    import types

    from memfree.filterfile import NgramFilter
    from memfree.filterfile.bloom import BloomHeader
    from memfree.filterfile.header import FilterHeader
    from memfree.filterfile.index import IndexFilter, IndexHeader
    from memfree.filterfile.pybloom import PybloomHeader

    rows = [[1, 2, 3], [4, 5, 6], [1, 2, 7]]
    bloom = NgramFilter.from_ngrams(
        tmp_path / "b.memfree", rows, metadata={"special_token_ids": [0]}
    )
    index = IndexFilter.from_ngrams(tmp_path / "i.memfree", rows, vocab_size=100)
    from tests.memfree.filterfile.test_pybloom import _written

    path, _ = _written(tmp_path)
    interchange = NgramFilter.open(path)
    for filt, kind in ((bloom, BloomHeader), (index, IndexHeader), (interchange, PybloomHeader)):
        header = filt.header
        assert type(header) is kind and isinstance(header, FilterHeader)
        metadata = filt.metadata
        assert (header.layout, header.n, header.num_ngrams, header.unit) == (
            metadata["layout"], metadata["n"], metadata["num_ngrams"], metadata.get("unit", "token")
        )  # fmt: skip
        assert header.expected_false_positive_rate == metadata["expected_false_positive_rate"]
        assert header.raw == metadata and isinstance(header.raw, types.MappingProxyType)
        with pytest.raises(dataclasses.FrozenInstanceError):
            header.n = 5  # type: ignore[misc]
        copied = pickle.loads(pickle.dumps(header))  # guards' copies and workers hold it
        assert copied == header and copied.raw == header.raw
        assert isinstance(copied.raw, types.MappingProxyType)
    assert bloom.header.special_token_ids == (0,) and index.header.special_token_ids is None
    assert (bloom.header.num_bits, bloom.header.num_probes) == (bloom.num_bits, bloom.num_probes)
    assert index.header.shape == index.prefix_index().shape
    assert interchange.header.seeds == tuple(interchange.seeds)
