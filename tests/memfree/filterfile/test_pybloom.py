"""pybloomfiltermmap3 interchange: our replica hashes, reads and writes exactly as the library."""

from __future__ import annotations

import json
import math
import random
import re
import struct
from pathlib import Path

import numpy as np
import pybloomfilter
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.errors import DamagedFilterError, FilterError, FilterMismatchError
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.filterfile.protocol import NgramSet
from memfree.filterfile.pybloom import arithmetic as pybloom_hash
from memfree.filterfile.pybloom import reader as pybloom

SEEDS = [0, 1, 0xDEADBEEF, 0xFFFFFFFF, 12345]


def _library_positions(key: bytes, seed: int, capacity: int) -> list[int]:
    """Bits the library sets for one key with one seed, read back from its in-memory filter."""
    library = pybloomfilter.BloomFilter(capacity, 0.5, hash_seeds=[seed])
    library.add(key)
    bits = np.unpackbits(np.frombuffer(library.data_array, np.uint8), bitorder="little")
    return [int(library.num_bits), *np.flatnonzero(bits).tolist()]


def _random_ngrams(rng: np.random.Generator, count: int, n: int, vocab: int = 50_000) -> np.ndarray:
    return rng.integers(0, vocab, size=(count, n), dtype=np.int64)


def _library_file(
    path: Path, ngrams: np.ndarray, error_rate: float, seeds: list[int] | None
) -> None:
    random.seed(0)  # the library draws its own seeds with `random` when none are given
    library = pybloomfilter.BloomFilter(200, error_rate, str(path), hash_seeds=seeds)
    for key in pybloom_hash.ngram_key_bytes(ngrams):
        library.add(key.tobytes())
    library.close()


def _written(tmp_path: Path, n: int = 3, count: int = 300) -> tuple[Path, np.ndarray]:
    ngrams = _random_ngrams(np.random.default_rng(5), count, n)
    writer = pybloom.PybloomWriter(capacity=count, error_rate=0.05, hash_seed=11)
    writer.add_ngrams(ngrams)
    path = writer.write(tmp_path / "ours.bloom", {"tokenizer": "toy", "unit": "token"}, count)
    return path, ngrams


# -- hashing -------------------------------------------------------------------------------------


def test_known_vectors() -> None:
    empty = np.zeros((1, 0), np.uint8)
    assert pybloom_hash.murmur3_x64_128_xor(empty, 0)[0] == 0  # all-zero state stays zero
    keys = pybloom_hash.ngram_key_bytes(np.array([[1, 256], [0xFFFFFFFF, 0]]))
    assert keys.tolist() == [[1, 0, 0, 0, 0, 1, 0, 0], [255, 255, 255, 255, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="2\\*\\*32"):
        pybloom_hash.ngram_key_bytes(np.array([[-1, 2]]))


@pytest.mark.parametrize("seed", SEEDS)
def test_murmur_matches_library_bit_positions(seed: int) -> None:
    rng = np.random.default_rng(seed & 0xFFFF)
    for length in range(41):
        key = rng.integers(0, 256, size=(1, length), dtype=np.uint8)
        hashed = pybloom_hash.murmur3_x64_128_xor(key, seed)[0]
        for capacity in (100_000, 77_777):  # two moduli pin more of the 64 hash bits
            num_bits, *positions = _library_positions(key.tobytes(), seed, capacity)
            assert positions == [int(hashed % np.uint64(num_bits))], (length, capacity)


def test_murmur_is_vectorized_per_row() -> None:
    keys = np.random.default_rng(1).integers(0, 256, size=(50, 23), dtype=np.uint8)
    batch = pybloom_hash.murmur3_x64_128_xor(keys, 99)
    rows = [pybloom_hash.murmur3_x64_128_xor(row[None, :], 99)[0] for row in keys]
    assert batch.dtype == np.uint64 and batch.tolist() == [int(r) for r in rows]
    assert len(set(batch.tolist())) == 50


@pytest.mark.parametrize(
    ("capacity", "error_rate"), [(0, 0.5), (10, 0.1), (1000, 0.001), (12345, 0.013)]
)
def test_writer_sizes_like_the_library(capacity: int, error_rate: float) -> None:
    library = pybloomfilter.BloomFilter(capacity, error_rate)
    writer = pybloom.PybloomWriter(capacity, error_rate, hash_seed=3)
    assert (writer.num_bits, writer.num_hashes) == (library.num_bits, library.num_hashes)
    assert len(set(writer.seeds)) == writer.num_hashes
    assert writer.seeds == pybloom.PybloomWriter(capacity, error_rate, hash_seed=3).seeds
    assert writer.seeds != pybloom.PybloomWriter(capacity, error_rate, hash_seed=4).seeds


# -- interchange with the real library -----------------------------------------------------------


@pytest.mark.parametrize(("error_rate", "seeds"), [(0.2, SEEDS[:3]), (0.01, None)])
def test_reads_library_file_exactly(
    tmp_path: Path, error_rate: float, seeds: list[int] | None
) -> None:
    rng = np.random.default_rng(0)
    stored = _random_ngrams(rng, 400, 4)
    path = tmp_path / "lib.bloom"
    _library_file(path, stored, error_rate, seeds)  # 400 keys in a 200-key filter: many false hits
    filt = pybloom.open_pybloom(path, ngram_size=4)
    library = pybloomfilter.BloomFilter.open(str(path), "r")
    assert path.stat().st_size == pybloom.PREAMBLE_BYTES + library.num_bits // 8
    others = _random_ngrams(rng, 5000, 4)
    queries = np.concatenate([stored, others])
    expected = [key.tobytes() in library for key in pybloom_hash.ngram_key_bytes(queries)]
    assert filt.contains(queries).tolist() == expected
    assert all(expected[:400]) and 0 < sum(expected[400:]) < 5000
    assert (filt.n, filt.num_bits) == (4, library.num_bits)
    assert filt.seeds == list(library.hash_seeds) and filt.num_probes == library.num_hashes
    assert filt.metadata["layout"] == "pybloomfiltermmap3" and filt.metadata["num_ngrams_estimated"]
    assert len(library) == 0  # the library loses its count on reopen; ours is estimated from bits
    assert abs(filt.num_ngrams - 400) < 60
    assert bool(filt.contains(stored[7])) and filt.size_bytes == path.stat().st_size
    with pytest.raises(ValueError, match="shape"):
        filt.contains(stored[:, :3])
    # memfree's fingerprint path does not apply: the reader offers no blocked bits to query
    # (it used to raise from contains_fingerprints/words; now it has neither)
    as_set: NgramSet = filt
    assert as_set.blocked_bits() is None
    assert not hasattr(filt, "contains_fingerprints") and not hasattr(filt, "words")
    library.close()
    filt.close()


def test_library_reads_our_file_exactly(tmp_path: Path) -> None:
    path, stored = _written(tmp_path, n=5, count=300)
    library = pybloomfilter.BloomFilter.open(str(path), "r")
    assert len(library) == 300 and library.num_bits == path.stat().st_size * 8 - 1280 * 8
    filt = pybloom.open_pybloom(path)
    others = _random_ngrams(np.random.default_rng(9), 20_000, 5)
    queries = np.concatenate([stored, others])
    expected = [key.tobytes() in library for key in pybloom_hash.ngram_key_bytes(queries)]
    assert filt.contains(queries).tolist() == expected
    assert all(expected[:300]) and sum(expected[300:]) > 0
    measured = sum(expected[300:]) / 20_000
    assert abs(measured - filt.metadata["expected_false_positive_rate"]) < 0.02
    assert filt.metadata["tokenizer"] == "toy" and filt.num_ngrams == 300 and len(filt) == 300
    assert list(library.hash_seeds) == filt.seeds and library.error_rate == 0.05
    library.close()


def test_writer_is_deterministic(tmp_path: Path) -> None:
    first, _ = _written(tmp_path / "a")
    second, _ = _written(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    assert Path(f"{first}.json").read_bytes() == Path(f"{second}.json").read_bytes()


def test_ngram_filter_open_dispatches(tmp_path: Path) -> None:
    path, stored = _written(tmp_path)
    filt = NgramFilter.open(path)
    assert isinstance(filt, pybloom.PybloomNgramFilter) and filt.contains(stored).all()
    assert isinstance(filt, NgramSet) and isinstance(filt, NgramFilter)  # the face of every layout
    Path(f"{path}.json").unlink()
    assert NgramFilter.open(path, ngram_size=3).contains(stored).all()
    with pytest.raises(FilterError, match=r"pass ngram_size .*\.json"):
        NgramFilter.open(path)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 6),
    rows=st.lists(
        st.lists(st.integers(0, 2**32 - 1), min_size=6, max_size=6), min_size=1, max_size=60
    ),
    error_rate=st.floats(0.001, 0.9),
)
def test_no_false_negatives(
    tmp_path: Path, n: int, rows: list[list[int]], error_rate: float
) -> None:
    ngrams = np.array(rows, dtype=np.int64)[:, :n]
    writer = pybloom.PybloomWriter(len(rows), error_rate, hash_seed=len(rows))
    writer.add_ngrams(ngrams)
    path = writer.write(tmp_path / "h.bloom", {}, num_ngrams=len(rows))
    filt = pybloom.open_pybloom(path)
    assert filt.contains(ngrams).all()
    filt.close()


def test_the_read_protocol(tmp_path: Path) -> None:
    path, stored = _written(tmp_path)
    with pybloom.open_pybloom(path) as filt:
        as_set: NgramSet = filt  # mypy checks that the reader implements the Protocol
        assert (as_set.n, as_set.unit, as_set.layout, len(as_set)) == (
            3,
            "token",
            "pybloomfiltermmap3",
            300,
        )
        assert as_set.special_token_ids is None and as_set.blocked_bits() is None
        assert as_set.size_bytes == path.stat().st_size and as_set.path == path
        assert 0 < as_set.expected_false_positive_rate < 0.1
        assert as_set.metadata["tokenizer"] == "toy"
        assert repr(filt).startswith(f"PybloomNgramFilter({str(path)!r}, n=3, num_ngrams=300,")
        assert filt.contains(stored).all()
    assert filt.bits.size == 0  # closed on leaving the block


# -- damage ---------------------------------------------------------------------------------------


def _damaged(path: Path, data: bytes, **kwargs: object) -> None:
    path.write_bytes(data)
    with pytest.raises(DamagedFilterError, match=re.escape(path.name)):
        pybloom.open_pybloom(path, **kwargs)  # type: ignore[arg-type]


def test_truncations_and_extensions(tmp_path: Path) -> None:
    path, _ = _written(tmp_path)
    data = path.read_bytes()
    lengths = [0, 1, 8, 9, 17, 20, 21, 100, 1220, 1221, 1279, 1280, len(data) - 1]
    for length in lengths + list(range(1281, len(data), 7)):
        _damaged(path, data[:length])
        _damaged(path, data[:length], ngram_size=3)
        Path(f"{path}.json").rename(tmp_path / "away.json")
        _damaged(path, data[:length], ngram_size=3)
        (tmp_path / "away.json").rename(f"{path}.json")
    _damaged(path, data + b"\x00")
    path.write_bytes(data[:100])
    with pytest.raises(DamagedFilterError):
        NgramFilter.open(path)


def test_header_flips(tmp_path: Path) -> None:
    path, _ = _written(tmp_path)
    data = path.read_bytes()
    rng = np.random.default_rng(2)
    for offset in list(rng.integers(0, 1280, size=150)) + list(range(21)):
        flipped = bytearray(data)
        flipped[offset] ^= int(rng.integers(1, 256))
        _damaged(path, bytes(flipped))  # the sidecar's header checksum catches every flip
    sidecar = Path(f"{path}.json")
    sidecar.unlink()
    # magic, num_bits, header_len, num_hashes, unused seed slots, pads, version, reserved, pad
    structural = [
        *range(21),
        *range(37, 41),
        *range(57, 1069),
        *range(1077, 1085),
        *range(1093, 1280),
    ]
    for offset in structural:
        flipped = bytearray(data)
        flipped[offset] ^= 0x41
        _damaged(path, bytes(flipped), ngram_size=3)


@pytest.mark.parametrize(
    ("delta", "resized"),
    [(8, True), (-8, True), (1, False), (-1, False), (8, False), (1 << 40, False)],
)
def test_changed_num_bits(tmp_path: Path, delta: int, resized: bool) -> None:
    path, _ = _written(tmp_path)
    data = path.read_bytes()
    num_bits = struct.unpack_from("<Q", data, 9)[0]
    changed = bytearray(data)
    struct.pack_into("<Q", changed, 9, num_bits + delta)
    if resized:  # the file size agrees with the new num_bits
        changed = changed + bytes(1) if delta > 0 else changed[:-1]
    _damaged(path, bytes(changed))  # the sidecar records num_bits and the header's checksum
    Path(f"{path}.json").unlink()
    if not resized:  # a consistent num_bits and size can only be caught by the sidecar
        _damaged(path, bytes(changed), ngram_size=3)


@pytest.mark.parametrize(
    "field", ["num_hashes", "error_rate_nan", "error_rate_one", "num_hashes_big", "version", "bits"]
)
def test_bad_header_fields_without_sidecar(tmp_path: Path, field: str) -> None:
    path, _ = _written(tmp_path)
    Path(f"{path}.json").unlink()
    data = bytearray(path.read_bytes())
    offset = 21
    if field == "num_hashes":
        struct.pack_into("<I", data, offset + 16, 0)
    elif field == "num_hashes_big":
        struct.pack_into("<I", data, offset + 16, 257)
    elif field == "error_rate_nan":
        struct.pack_into("<d", data, offset + 8, math.nan)
    elif field == "error_rate_one":
        struct.pack_into("<d", data, offset + 8, 1.0)
    elif field == "version":
        data[offset + 1056] = 2
    else:
        struct.pack_into("<Q", data, 9, 0)
    _damaged(path, bytes(data), ngram_size=3)


def test_bit_flip_caught_by_checksum(tmp_path: Path) -> None:
    path, _ = _written(tmp_path)
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(4)
    for _ in range(20):
        flipped = bytearray(data)
        flipped[int(rng.integers(1280, len(data)))] ^= 1 << int(rng.integers(0, 8))
        _damaged(path, bytes(flipped))
    path.write_bytes(bytes(flipped))
    assert pybloom.open_pybloom(path, verify=False).num_bits > 0  # verify=False skips the read


@pytest.mark.parametrize(
    "sidecar",
    [
        "{not json",
        "[1, 2]",
        "\xff",
        '{"key_encoding": "uint32le", "num_ngrams": 1}',
        '{"n": "3", "key_encoding": "uint32le", "num_ngrams": 1}',
        '{"n": 0, "key_encoding": "uint32le", "num_ngrams": 1}',
        '{"n": 3, "key_encoding": "utf8", "num_ngrams": 1}',
        '{"n": 3, "key_encoding": "uint32le", "num_ngrams": -1}',
        '{"n": 3, "key_encoding": "uint32le", "num_ngrams": 1, "key_bytes": 4}',
        '{"n": 3, "key_encoding": "uint32le", "num_ngrams": 1, "num_bits": 8}',
        '{"n": 3, "key_encoding": "uint32le", "num_ngrams": 1, "seeds": [1]}',
        '{"n": 3, "key_encoding": "uint32le", "num_ngrams": 1, "bits_xxh3": "0"}',
    ],
)
def test_garbled_sidecar(tmp_path: Path, sidecar: str) -> None:
    path, _ = _written(tmp_path)
    Path(f"{path}.json").write_bytes(sidecar.encode("latin-1"))
    for kwargs in ({}, {"ngram_size": 3}):
        with pytest.raises(DamagedFilterError, match=r"sidecar|checksum"):
            pybloom.open_pybloom(path, **kwargs)  # type: ignore[arg-type]


def test_sidecar_n_mismatch_and_writer_arguments(tmp_path: Path) -> None:
    path, _ = _written(tmp_path)
    with pytest.raises(FilterMismatchError, match="n=3"):
        pybloom.open_pybloom(path, ngram_size=4)
    sidecar = json.loads(Path(f"{path}.json").read_text())
    assert sidecar["bits_xxh3"] and sidecar["key_bytes"] == 12 and sidecar["num_ngrams"] == 300
    with pytest.raises(ValueError, match="capacity"):
        pybloom.PybloomWriter(-1, 0.1, hash_seed=0)
    with pytest.raises(ValueError, match="error_rate"):
        pybloom.PybloomWriter(5, 1.0, hash_seed=0)
    writer = pybloom.PybloomWriter(10, 0.1, hash_seed=0)
    writer.add_ngrams(np.array([[1, 2]]))
    with pytest.raises(ValueError, match="shape"):
        writer.add_ngrams(np.array([[1, 2, 3]]))
    with pytest.raises(ValueError, match="inconsistent"):
        writer.write(tmp_path / "x.bloom", {"n": 3}, 1)
    assert not (tmp_path / "x.bloom").exists()
