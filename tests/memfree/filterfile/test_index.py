"""The prefix-keyed index layout: exact against a reference set (every stored n-gram found, every
other answer explained by a fingerprint collision), its widths, and damaged or edited files
refused."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from memfree.errors import DamagedFilterError
from memfree.filterfile import open_filter
from memfree.filterfile.hashing import fingerprints_np
from memfree.filterfile.header import PREAMBLE
from memfree.filterfile.index.header import index_digest
from memfree.filterfile.index.layout import (
    IndexShape,
    encode_sections,
    index_keys,
    pack_fields,
    token_bits_for,
)
from memfree.filterfile.index.query import read_fields
from memfree.filterfile.index.reader import IndexFilter, verify_written
from memfree.filterfile.index.sizing import Concentration, choose_shape, natural_rate
from memfree.filterfile.index.writer import IndexFileWriter


def collides(index: IndexFilter, prefix: np.ndarray, other: np.ndarray) -> bool:
    """Whether two prefixes share the top b + R fingerprint bits (the index cannot tell them
    apart)."""
    shape = index.prefix_index().shape
    bits = shape.bucket_bits + shape.remainder_bits
    if bits == 0:
        return True
    seed = index.hash_seed
    first, second = fingerprints_np(np.stack([prefix, other]), seed) >> np.uint64(64 - bits)
    return bool(first == second)


@st.composite
def stored_sets(draw: st.DrawFn) -> tuple[int, int, np.ndarray, float]:
    vocab = draw(st.integers(2, 3000))
    n = draw(st.integers(1, 5))
    alphabet = draw(st.integers(1, min(vocab, 12)))
    count = draw(st.integers(0, 400))
    seed = draw(st.integers(0, 2**32))
    rng = np.random.default_rng(seed)
    ngrams = rng.integers(0, alphabet, size=(count, n))
    if count and draw(st.booleans()):  # next tokens from the whole vocabulary
        ngrams[:, -1] = rng.integers(0, vocab, size=count)
    rate = draw(st.sampled_from([1e-2, 1e-5, 1e-9]))
    return vocab, n, ngrams, rate


@settings(max_examples=120, deadline=None)
@given(case=stored_sets(), probe_seed=st.integers(0, 2**32))
def test_exact_against_a_reference_set(
    case: tuple[int, int, np.ndarray, float], probe_seed: int
) -> None:
    vocab, n, ngrams, rate = case
    reference = {tuple(row) for row in ngrams.tolist()}
    with tempfile.TemporaryDirectory() as directory:
        filt = IndexFilter.from_ngrams(
            Path(directory) / "f.memfree",
            ngrams,
            vocab_size=vocab,
            false_positive_rate=rate,
        )
        assert len(filt) <= len(reference)  # two prefixes whose fingerprints collide merge
        if ngrams.size:
            assert filt.contains(ngrams).all()  # no false negatives
        rng = np.random.default_rng(probe_seed)
        probes = rng.integers(0, max(2, min(vocab, 14)), size=(300, n))
        prefixes = np.unique(probes[:, : n - 1], axis=0)
        rows, tokens = filt.next_tokens(prefixes)
        for row, token in zip(rows.tolist(), tokens.tolist(), strict=True):
            ngram = (*prefixes[row].tolist(), token)
            if ngram in reference:
                continue
            # A token reported for a prefix that does not store it: a stored n-gram with this
            # token whose prefix collides with this one.
            assert any(
                stored[-1] == token and collides(filt, prefixes[row], np.array(stored[:-1]))
                for stored in reference
            ), ngram
        # Every stored next token of a probed prefix is reported for it.
        reported = set(zip(rows.tolist(), tokens.tolist(), strict=True))
        for row, prefix in enumerate(prefixes.tolist()):
            for stored in reference:
                if list(stored[:-1]) == prefix:
                    assert (row, stored[-1]) in reported
        stored = np.array([tuple(p) in reference for p in probes.tolist()], dtype=bool)
        assert filt.contains(probes)[stored].all()
        filt.close()


def test_a_prefix_with_thousands_of_next_tokens(tmp_path: Path) -> None:
    vocab = 70_000
    heavy = np.stack([np.full(5000, 7), np.full(5000, 9), np.arange(5000) * 13], axis=1)
    rng = np.random.default_rng(1)
    others = rng.integers(0, vocab, size=(3000, 3))
    filt = IndexFilter.from_ngrams(
        tmp_path / "f.memfree", np.concatenate([heavy, others]), vocab_size=vocab
    )
    _, tokens = filt.next_tokens(np.array([[7, 9]]))
    assert set(tokens.tolist()) >= set((np.arange(5000) * 13).tolist())
    assert filt.prefix_index().max_bucket >= 5000
    assert filt.prefix_index().shape.token_bits == 17


def test_empty_and_unigram_filters(tmp_path: Path) -> None:
    empty = IndexFilter.from_ngrams(tmp_path / "e.memfree", np.zeros((0, 4), int), vocab_size=9)
    assert len(empty) == 0 and not empty.contains([[1, 2, 3, 4]])
    assert empty.next_tokens(np.array([[1, 2, 3]]))[0].size == 0
    unigrams = IndexFilter.from_ngrams(tmp_path / "u.memfree", [[5], [7]], vocab_size=9)
    assert unigrams.contains([[5], [6], [7]]).tolist() == [True, False, True]
    assert type(open_filter(tmp_path / "u.memfree")) is IndexFilter


def size_bits(shape: IndexShape, records: int = 4_000_000) -> int:
    return shape.record_bits * records + 32 * shape.directory_entries


def test_widths_follow_the_target_rate() -> None:
    uniform = 1 / 49_152
    loose = choose_shape(4_000_000, 16, 1e-5, uniform)
    tight = choose_shape(4_000_000, 16, 1e-9, uniform)
    assert 17 <= loose.bucket_bits <= 19  # 8 to 32 records a bucket
    assert loose.section_bits == 12 and choose_shape(100, 16, 1e-5, uniform).section_bits in (2, 3)
    assert tight.remainder_bits > loose.remainder_bits
    # Tokens drawn uniformly: 6 or 7 remainder bits (~3 bytes per n-gram) meet 1e-5.
    assert (
        natural_rate(4_000_000, loose, uniform)
        <= 1e-5
        < natural_rate(
            4_000_000, dataclasses.replace(loose, remainder_bits=loose.remainder_bits - 1), uniform
        )
    )
    assert loose.record_bits in (22, 23)  # 6 or 7 remainder bits: ~3 bytes per n-gram
    # Natural text's next tokens (the stdlib's 10-grams under SmolLM2: 8.8e-3) need
    # log2(8.8e-3 * 49,152) = 8.8 more bits for the same rate per natural query.
    natural = choose_shape(4_000_000, 16, 1e-5, 8.8e-3)
    assert natural.remainder_bits - loose.remainder_bits in (8, 9)
    assert natural_rate(4_000_000, natural, 8.8e-3) <= 1e-5
    # Of the bucket widths near 16 records, the one whose records and directory take fewest bits.
    for bucket_bits in range(natural.bucket_bits - 1, natural.bucket_bits + 2):
        per_bucket = 4_000_000 / 2**bucket_bits + 1
        remainder = math.ceil(math.log2(per_bucket * 8.8e-3 / 1e-5))
        other = IndexShape(16, bucket_bits, 12, remainder, min(bucket_bits - 12, 10))
        assert natural_rate(4_000_000, other, 8.8e-3) <= 1e-5
        assert size_bits(natural) <= size_bits(other)
    assert token_bits_for(49_152) == 16 and token_bits_for(2) == 1 and token_bits_for(1) == 1


@settings(max_examples=60, deadline=None)
@given(
    width=st.integers(1, 57),
    values=st.lists(st.integers(0, 2**57 - 1), max_size=50),
)
def test_packed_fields_read_back(width: int, values: list[int]) -> None:
    array = np.array([value & ((1 << width) - 1) for value in values], dtype=np.uint64)
    words = np.concatenate([pack_fields(array, width), np.zeros(1, np.uint64)])
    offsets = np.arange(array.size, dtype=np.uint64) * np.uint64(width)
    assert np.array_equal(read_fields(words, offsets, width), array)


def test_encoding_refuses_unsorted_or_foreign_keys() -> None:
    shape = IndexShape(8, 2, 2, 8, 0)  # 4 buckets, 4 sections
    keys = np.sort(index_keys(np.array([1, 2, 3], np.uint64) << np.uint64(60), [1, 2, 3], 8))
    with pytest.raises(ValueError, match="outside"):
        encode_sections(keys | np.uint64(1 << 63), 0, 2, shape)
    with pytest.raises(ValueError, match="not sorted"):
        encode_sections(keys[::-1], 0, 4, shape)
    encoded = encode_sections(keys, 0, 1, shape)
    assert encoded.records.tolist() == [3]


# ------------------------------------------------------------------------------------------------
# Damaged and edited files


@pytest.fixture
def index_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    path = tmp_path / "f.memfree"
    IndexFilter.from_ngrams(path, rng.integers(0, 500, size=(2000, 4)), vocab_size=500).close()
    return path


def rewrite_metadata(path: Path, edit: dict[str, object], rebind: bool) -> None:
    data = bytearray(path.read_bytes())
    _, version, length, _ = PREAMBLE.unpack_from(data)
    metadata = json.loads(data[PREAMBLE.size : PREAMBLE.size + length])
    metadata.update(edit)
    if rebind:
        metadata["hashing_xxh3"] = index_digest(metadata)
    raw = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    assert len(raw) <= length + 40
    header = struct.pack("<8sIIQ", b"MEMFREE\x00", version, len(raw), xxhash.xxh3_64_intdigest(raw))
    data[: PREAMBLE.size + len(raw)] = header + raw
    path.write_bytes(bytes(data))


def flip(path: Path, where: str) -> None:
    data = bytearray(path.read_bytes())
    metadata = open_filter(path).metadata
    sections = metadata["sections"]
    blocks = sections << (
        metadata["bucket_bits"] - metadata["section_bits"] - metadata["block_bits"]
    )
    offset = {
        "table": 4096 + 17,
        "blocks": 4096 + sections * 16 + 9,
        "directory": 4096 + sections * 16 + blocks * 8 + 9,
        "records": len(data) - 100,
        "last word": len(data) - 3,
    }[where]
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["table", "last word"])
def test_a_flipped_byte_in_the_table_or_the_end_is_refused_at_open(
    index_file: Path, where: str
) -> None:
    flip(index_file, where)
    with pytest.raises(DamagedFilterError, match=r"section table checksum|zero word"):
        open_filter(index_file)


@pytest.mark.parametrize("where", ["blocks", "directory", "records"])
def test_a_damaged_section_is_refused_when_first_read(index_file: Path, where: str) -> None:
    flip(index_file, where)
    filt = open_filter(index_file)  # opening reads the header and the section table only
    assert isinstance(filt, IndexFilter)
    with pytest.raises(DamagedFilterError, match=r"section \d+(, block \d+)?: (checksum|its dir)"):
        filt.verify()
    # A lookup that reads the damaged block is refused too; one that reads others is not.
    fresh = open_filter(index_file)
    assert isinstance(fresh, IndexFilter)
    rng = np.random.default_rng(0)
    prefixes = rng.integers(0, 500, size=(4000, 3))
    blocks = _blocks(fresh, prefixes)
    checks = fresh.prefix_index().ensure
    assert checks is not None
    shape = fresh.prefix_index().shape
    bad = next(b for b in range(shape.num_blocks) if _refused(checks, b << shape.block_bits))
    assert (blocks != bad).any() and (blocks == bad).any()
    fresh.next_tokens(prefixes[blocks != bad])
    with pytest.raises(DamagedFilterError, match=f"section {bad // shape.blocks_per_section}"):
        fresh.next_tokens(prefixes[blocks == bad][:1])
    # Unverified, the caller asked for no checks: the bytes are read as they are.
    open_filter(index_file, verify=False).next_tokens(prefixes)


def _blocks(filt: IndexFilter, prefixes: np.ndarray) -> np.ndarray:
    """The block each prefix's bucket lies in."""
    shape = filt.prefix_index().shape
    fingerprints = fingerprints_np(prefixes, filt.hash_seed)
    buckets = (fingerprints >> np.uint64(64 - shape.bucket_bits)).astype(np.int64)
    return buckets >> shape.block_bits


def _refused(checks: Any, bucket: int) -> bool:
    try:
        checks(np.array([bucket]))
    except DamagedFilterError:
        return True
    return False


def test_a_reader_checks_only_the_blocks_it_reads(tmp_path: Path) -> None:
    """Sections of several blocks: a damaged block is refused when read, its section's other
    blocks are read, and a damaged block checksum list refuses its section."""
    rng = np.random.default_rng(5)
    ngrams = rng.integers(0, 500, size=(150_000, 4))
    keys = np.unique(index_keys(fingerprints_np(ngrams[:, :-1], 1), ngrams[:, -1], 9))
    shape = dataclasses.replace(choose_shape(keys.size, 9, 1e-5, 1 / 500), block_bits=0)
    assert shape.blocks_per_section == 2 and shape.num_sections == 4096
    encoded = encode_sections(keys, 0, shape.num_sections, shape)
    path = tmp_path / "blocks.memfree"
    writer = IndexFileWriter(
        path,
        {"n": 4, "hash_seed": 1, "vocab_size": 500},
        shape,
        encoded.records,
        Concentration.of_keys(keys, 9),
    )
    writer.commit([writer.target(0, shape.num_sections).write(encoded)], check=verify_written)
    filt = open_filter(path)
    assert isinstance(filt, IndexFilter) and filt.contains(ngrams).all()
    # Damage the records of the block holding the first n-gram's bucket.
    blocks = _blocks(filt, ngrams[:, :-1])
    target = int(blocks[0])
    section, local = divmod(target, 2)
    directory = filt.prefix_index().directory
    entry = section * (shape.buckets_per_section + 1) + local
    # A record inside the block (its first and last words may be shared with its neighbours).
    record = (int(directory[entry]) + int(directory[entry + 1])) // 2
    start = int(filt.prefix_index().section_words[section]) + record * shape.record_bits // 64
    words_offset = len(path.read_bytes()) - filt.prefix_index().words.shape[0] * 8
    filt.close()
    data = bytearray(path.read_bytes())
    data[words_offset + start * 8] ^= 0x01
    path.write_bytes(bytes(data))
    damaged = open_filter(path)
    assert isinstance(damaged, IndexFilter)
    sibling = blocks == (section * 2 + 1 - local)
    assert sibling.any()
    assert damaged.contains(ngrams[sibling]).all()  # the section's other block reads fine
    with pytest.raises(DamagedFilterError, match=f"section {section}, block {local}: checksum"):
        damaged.contains(ngrams[:1])
    # A damaged block checksum refuses its section's blocks.
    data = bytearray(path.read_bytes())
    data[words_offset + start * 8] ^= 0x01  # mended
    block_table = 4096 + shape.num_sections * 16  # after the header page and section table
    data[block_table + target * 8] ^= 0x01
    path.write_bytes(bytes(data))
    listed = open_filter(path)
    with pytest.raises(DamagedFilterError, match=f"section {section}: checksum mismatch"):
        listed.contains(ngrams[sibling][:1])


def test_truncated_and_extended_files_are_refused(index_file: Path) -> None:
    data = index_file.read_bytes()
    for damaged in (data[:-8], data + b"\x00" * 8, data[:20], data[:5000]):
        index_file.write_bytes(damaged)
        with pytest.raises(DamagedFilterError):
            open_filter(index_file, verify=False)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"hash_seed": 7}, "edited"),
        ({"remainder_bits": 0}, "expected_false_positive_rate|edited"),
        ({"n": 3}, "edited"),
        ({"token_bits": 30}, "vocab_size"),
        ({"max_bucket": 1}, "max_bucket|edited"),
        ({"unit": "word"}, "word index's vocab_size|edited"),
        ({"unit": "sentence"}, "token or word n-grams"),
        ({"sections": 2}, "sections"),
        ({"section_table_xxh3": "0" * 16}, "edited"),
    ],
)
def test_edited_headers_are_refused(
    index_file: Path, edit: dict[str, object], message: str
) -> None:
    rewrite_metadata(index_file, edit, rebind=False)
    with pytest.raises(DamagedFilterError, match=message):
        open_filter(index_file, verify=False)


def test_an_edit_rebound_is_still_caught_when_verified(index_file: Path) -> None:
    # Lowering max_bucket with the binding recomputed: the fixed-shape step would read too few
    # slots; verification compares every bucket with it.
    metadata = open_filter(index_file).metadata
    rewrite_metadata(index_file, {"max_bucket": metadata["max_bucket"] - 1}, rebind=True)
    filt = open_filter(index_file)
    assert isinstance(filt, IndexFilter)
    with pytest.raises(DamagedFilterError, match="max_bucket"):
        filt.verify()


def test_a_newer_version_names_the_fix(index_file: Path) -> None:
    data = bytearray(index_file.read_bytes())
    data[8:12] = struct.pack("<I", 3)
    index_file.write_bytes(bytes(data))
    with pytest.raises(DamagedFilterError, match=r"version 3.*upgrade memfree"):
        open_filter(index_file)


def test_info_checks_every_section(index_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memfree.cli import main as cli_main

    assert cli_main(["info", str(index_file)]) == 0
    shown = capsys.readouterr().out
    assert "prefix-index-v1" in shown and "per n-gram)" in shown
    assert "false bans per natural query" in shown
    flip(index_file, "records")
    assert cli_main(["info", str(index_file)]) == 2
    assert "checksum mismatch" in capsys.readouterr().err
    assert cli_main(["info", str(index_file), "--no-verify"]) == 0
