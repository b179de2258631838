"""A header edited behind its checksum: validated as a whole, refused as damaged, never a crash and
never a filter that silently blocks nothing; and the file modes a written filter gets."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import NgramFilter
from memfree.errors import DamagedFilterError, FilterError
from memfree.filterfile.bloom.bits import hashing_digest
from memfree.filterfile.header import PAGE_BYTES
from memfree.filterfile.sizing import expected_false_positive_rate

PREAMBLE = struct.Struct("<8sIIQ")
STORED = np.random.default_rng(0).integers(0, 1000, size=(2000, 4))


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    raw = path.read_bytes()
    _, _, length, _ = PREAMBLE.unpack(raw[: PREAMBLE.size])
    metadata = json.loads(raw[PREAMBLE.size : PREAMBLE.size + length])
    data_offset = -(-(PREAMBLE.size + length) // PAGE_BYTES) * PAGE_BYTES
    return metadata, data_offset


def rewrite(path: Path, metadata: dict[str, Any], bits: np.ndarray | None = None) -> None:
    """Write ``metadata`` into ``path``'s header with a recomputed checksum (and ``bits``, with
    its checksum recomputed too), keeping the data where it was."""
    raw = bytearray(path.read_bytes())
    _, data_offset = read_header(path)
    if bits is not None:
        raw[data_offset : data_offset + bits.nbytes] = bits.astype("<u8").tobytes()
        metadata["bits_xxh3"] = xxhash.xxh3_64_hexdigest(bits.astype("<u8").tobytes())
    body = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    assert PREAMBLE.size + len(body) <= data_offset, "the edit must fit in the header's pages"
    preamble = PREAMBLE.pack(b"MEMFREE\x00", 1, len(body), xxhash.xxh3_64_intdigest(body))
    header = preamble + body
    raw[:data_offset] = header + b"\x00" * (data_offset - len(header))
    path.write_bytes(bytes(raw))


@pytest.fixture
def filter_path(tmp_path: Path) -> Path:
    path = tmp_path / "f.memfree"
    NgramFilter.from_ngrams(path, STORED, false_positive_rate=1e-3).close()
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"expected_false_positive_rate": "low"}, "expected_false_positive_rate"),
        ({"expected_false_positive_rate": None}, "expected_false_positive_rate"),
        ({"expected_false_positive_rate": 0.5}, "sizes give"),
        ({"expected_false_positive_rate": float("nan")}, "expected_false_positive_rate"),
        ({"n": 10**30}, "n is"),
        ({"n": 65}, "n is"),
        ({"n": True}, "'n'"),
        ({"num_blocks": "many"}, "num_blocks"),
        ({"target_false_positive_rate": "x"}, "target_false_positive_rate"),
        ({"min_count": 0}, "min_count"),
        ({"tokenizer_fingerprint": 12}, "tokenizer_fingerprint"),
        ({"num_probes": 40}, "num_probes"),
        ({"num_ngrams": 2**62}, "sizes give"),  # once filled memory recomputing the rate
    ],
)
def test_edited_fields_are_refused_as_damaged(
    filter_path: Path, edit: dict[str, Any], message: str
) -> None:
    metadata, _ = read_header(filter_path)
    metadata.update(edit)
    rewrite(filter_path, metadata)
    with pytest.raises(DamagedFilterError, match=message):
        NgramFilter.open(filter_path)


def test_num_blocks_inconsistent_with_the_bits_is_refused(filter_path: Path) -> None:
    metadata, _ = read_header(filter_path)
    metadata["num_blocks"] += 1
    rewrite(filter_path, metadata)
    with pytest.raises(DamagedFilterError, match="num_blocks"):
        NgramFilter.open(filter_path)


def test_an_emptied_bit_array_is_refused(filter_path: Path) -> None:
    """Zeroed bits with their checksum recomputed would block nothing: refused."""
    metadata, _ = read_header(filter_path)
    zeros = np.zeros(metadata["num_bits"] // 64, dtype=np.uint64)
    rewrite(filter_path, metadata, zeros)
    with pytest.raises(DamagedFilterError, match="hashing parameters"):
        NgramFilter.open(filter_path, verify=False)  # the binding holds the old bits' checksum
    metadata["hashing_xxh3"] = hashing_digest(metadata)  # a forger who rebinds it too
    rewrite(filter_path, metadata)
    with pytest.raises(DamagedFilterError, match="block nothing"):
        NgramFilter.open(filter_path)
    assert len(NgramFilter.open(filter_path, verify=False)) == 2000  # opt-out stays


def test_more_probes_than_the_bits_were_set_with_is_refused(filter_path: Path) -> None:
    """A larger probe count, with a consistent rate, would read bits never set: false negatives.
    The share of set bits gives it away."""
    metadata, _ = read_header(filter_path)
    metadata["num_probes"] += 8
    metadata["expected_false_positive_rate"] = expected_false_positive_rate(
        metadata["num_ngrams"], metadata["num_bits"] // 512, metadata["num_probes"]
    )
    rewrite(filter_path, metadata)
    with pytest.raises(DamagedFilterError, match="bits set"):
        NgramFilter.open(filter_path)


@pytest.mark.parametrize("num_ngrams", [0, 1, 3, 50, 5000, 200_000])
@pytest.mark.parametrize("rate", [0.3, 1e-3, 1e-9])
def test_real_filters_pass_the_fill_check(tmp_path: Path, num_ngrams: int, rate: float) -> None:
    ngrams = np.random.default_rng(num_ngrams).integers(0, 2**31, size=(num_ngrams, 3))
    filt = NgramFilter.from_ngrams(tmp_path / "f.memfree", ngrams, false_positive_rate=rate)
    assert filt.contains(ngrams).all()


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=5,
)
FIELDS = [
    "n",
    "num_bits",
    "num_blocks",
    "num_probes",
    "num_ngrams",
    "hash_seed",
    "expected_false_positive_rate",
    "unit",
    "layout",
    "special_token_ids",
    "prefix",
    "bits_xxh3",
    "min_count",
]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(FIELDS), value=JSON_VALUES, prefix_field=st.booleans())
def test_any_edit_is_refused_or_still_finds_every_stored_ngram(
    filter_path: Path, field: str, value: Any, prefix_field: bool
) -> None:
    original = filter_path.read_bytes()
    try:
        metadata, _ = read_header(filter_path)
        if prefix_field and field in ("num_bits", "num_probes", "bits_xxh3"):
            metadata["prefix"][field] = value
        else:
            metadata[field] = value
        try:
            rewrite(filter_path, metadata)
        except AssertionError:
            return  # the edit does not fit in the header's pages
        try:
            filt = NgramFilter.open(filter_path)
        except FilterError:
            return  # refused, with a message; DamagedFilterError is a FilterError
        assert filt.contains(STORED).all()  # accepted: then it is still a working filter
        filt.close()
    finally:
        filter_path.write_bytes(original)


# ------------------------------------------------------------------------------------------------
# File modes


def test_a_new_filter_follows_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        NgramFilter.from_ngrams(tmp_path / "private.memfree", STORED[:10]).close()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "private.memfree").stat().st_mode) == 0o600
    previous = os.umask(0o022)
    try:
        NgramFilter.from_ngrams(tmp_path / "shared.memfree", STORED[:10]).close()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "shared.memfree").stat().st_mode) == 0o644


def test_a_rebuilt_filter_keeps_the_mode_its_owner_chose(tmp_path: Path) -> None:
    path = tmp_path / "f.memfree"
    NgramFilter.from_ngrams(path, STORED[:10]).close()
    path.chmod(0o640)
    NgramFilter.from_ngrams(path, STORED[:20]).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_directories_and_link_loops_are_named_for_what_they_are(tmp_path: Path) -> None:
    with pytest.raises(FilterError, match="is a directory"):
        NgramFilter.open(tmp_path)
    loop = tmp_path / "loop.memfree"
    loop.symlink_to(loop)
    with pytest.raises(FilterError, match="symbolic links"):
        NgramFilter.open(loop)
    dangling = tmp_path / "dangling.memfree"
    dangling.symlink_to(tmp_path / "gone.memfree")
    with pytest.raises(FileNotFoundError, match="symbolic link to"):
        NgramFilter.open(dangling)


@pytest.mark.parametrize(("field", "value"), [("hash_seed", 0), ("n", 5)])
def test_hashing_parameters_edited_behind_the_checksum_are_refused(
    filter_path: Path, field: str, value: int
) -> None:
    """A new seed (or n) would put every stored n-gram's bits elsewhere: the filter would find
    none of them. Found by the Hypothesis test above (hash_seed=0); refused, naming the edit."""
    metadata, _ = read_header(filter_path)
    metadata[field] = value
    rewrite(filter_path, metadata)
    with pytest.raises(DamagedFilterError, match="the header was edited"):
        NgramFilter.open(filter_path)
