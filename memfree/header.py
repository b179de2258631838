"""The filter file's header: its fixed layout, how it is read, and its validation as a whole
(types, ranges, agreement between fields and with the bit array itself).

Layout (all integers little-endian)::

    offset 0   8 bytes   magic b"MEMFREE\\0"
    offset 8   uint32    format version
    offset 12  uint32    length L of the JSON metadata
    offset 16  uint64    xxh3-64 of the JSON metadata bytes
    offset 24  L bytes   UTF-8 JSON metadata (sorted keys), zero padding up to a multiple of 4096
    then       uint64    bit words, ``num_blocks * 8`` of them (page-aligned, so numpy.memmap and
                         torch.from_numpy map them without copying)
    then       uint64    optional prefix section: ``prefix.num_blocks * 8`` bit words of a second
                         blocked Bloom filter holding the (n-1)-token prefixes of stored n-grams

The metadata records everything that produced the file and an xxh3-64 checksum of each bit array.
The same inputs give the same bytes: there is no wall-clock field.

The metadata checksum only proves that the header is the one that was written last, not that it
is sane: an edited header with its checksum recomputed must still never crash a reader, never
make the guard miss a stored n-gram and never yield a filter that silently blocks nothing. So every
field the readers rely on is checked here, the false-positive rate the header states is
recomputed from its sizes, and (when the bits are verified) the share of set bits is compared with
what the header's n-gram count and probe count must produce. An edited seed or n shows in no bit,
so the header must also carry ``hashing_xxh3``, binding the bits' checksums to the parameters that
placed them: a header without it is refused (rebuild the file), as is one it does not match.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import numpy as np
import xxhash

from memfree.errors import DamagedFilterError, FilterError
from memfree.hashing import BLOCK_BITS, HASH_SCHEME, MAX_PROBES
from memfree.sizing import expected_false_positive_rate

MAGIC = b"MEMFREE\x00"
FORMAT_VERSION = 1
PAGE_BYTES = 4096
# magic, format version, metadata length, xxh3-64 of the metadata bytes (little-endian)
PREAMBLE = struct.Struct("<8sIIQ")
MAX_METADATA_BYTES = 16 << 20
LAYOUT = "blocked-512"
MAX_NGRAM_SIZE = 64
MAX_BLOCKS = 1 << 32
_REQUIRED_INTS = ("n", "num_bits", "num_probes", "hash_seed", "num_ngrams")
# Set bits may stray from their expectation by block-load variance; 10% and 8 standard
# deviations never trip on a real filter (tests check filters from 1 to millions of n-grams) and
# still catch a bit array emptied, or a probe or n-gram count changed, behind the checksum.
_FILL_TOLERANCE = 0.10
_FILL_SIGMAS = 8.0


def page_round(size_bytes: int) -> int:
    """``size_bytes`` rounded up to whole pages: where the bit words start after the header."""
    return (size_bytes + PAGE_BYTES - 1) // PAGE_BYTES * PAGE_BYTES


def damaged_error(path: Path, problem: str) -> DamagedFilterError:
    """The error for a native filter file that cannot be trusted, naming the file and the fix."""
    return DamagedFilterError(
        f"{path}: {problem}; the file is damaged or not a memfree filter, rebuild it with "
        "`memfree build`"
    )


def read_preamble(path: Path) -> bytes:
    """The first bytes of a would-be filter file (any format), with an error naming the fix."""
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise FilterError(f"{path}: is a directory, not a filter file")
        if not stat.S_ISREG(mode):
            raise FilterError(f"{path}: not a regular file (a device, socket or pipe)")
        with open(path, "rb") as handle:
            return handle.read(PREAMBLE.size)
    except FileNotFoundError:
        if path.is_symlink():
            raise FileNotFoundError(
                f"{path}: a symbolic link to {os.readlink(path)!r}, which does not exist"
            ) from None
        raise FileNotFoundError(
            f"{path}: no such filter file; build one with `memfree build`"
        ) from None
    except OSError as error:  # a symbolic link loop, no permission, ...
        raise FilterError(
            f"{path}: cannot read the filter file ({error.strerror or error})"
        ) from None


def read_header(
    path: Path, head: bytes, file_size: int, handle: BinaryIO | None = None
) -> tuple[dict[str, Any], int]:
    """Parse and validate a native filter file's header.

    Args:
        path: the file (read again for the metadata unless ``handle`` is given; named in errors).
        head: its first ``PREAMBLE.size`` bytes (fewer when the file is shorter).
        file_size: its size in bytes; must be exactly what the header implies.
        handle: the open file to read the metadata from (so that header and bits come from one
            file even if the path is renamed over meanwhile).

    Returns:
        (the validated JSON metadata, the byte offset of the first bit word).

    Raises:
        DamagedFilterError: any problem, named.
    """
    if len(head) < PREAMBLE.size:
        raise damaged_error(
            path, f"only {len(head)} bytes, shorter than the {PREAMBLE.size}-byte preamble"
        )
    magic, version, metadata_bytes, metadata_hash = PREAMBLE.unpack(head)
    if magic != MAGIC:
        raise damaged_error(path, f"bad magic bytes {magic!r}")
    if version != FORMAT_VERSION:
        raise DamagedFilterError(
            f"{path}: format version {version}, this memfree reads version {FORMAT_VERSION}; "
            "rebuild the filter or upgrade memfree"
        )
    if metadata_bytes > MAX_METADATA_BYTES or PREAMBLE.size + metadata_bytes > file_size:
        raise damaged_error(
            path, f"metadata length {metadata_bytes} does not fit in {file_size} bytes"
        )
    if handle is not None:
        raw = os.pread(handle.fileno(), metadata_bytes, PREAMBLE.size)
    else:
        with open(path, "rb") as reader:
            reader.seek(PREAMBLE.size)
            raw = reader.read(metadata_bytes)
    if xxhash.xxh3_64_intdigest(raw) != metadata_hash:
        raise damaged_error(path, "metadata checksum mismatch")
    try:
        metadata = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise damaged_error(path, f"unreadable metadata ({error})") from None
    problem = check_metadata(metadata)
    if problem:
        raise damaged_error(path, problem)
    data_offset = page_round(PREAMBLE.size + metadata_bytes)
    prefix = metadata.get("prefix")
    num_words = int(metadata["num_bits"]) // 64 + (int(prefix["num_bits"]) // 64 if prefix else 0)
    expected_size = data_offset + num_words * 8
    if file_size != expected_size:
        raise damaged_error(
            path, f"size {file_size} bytes, expected {expected_size} from its header"
        )
    return metadata, data_offset


# What decides where an n-gram's bits are: a header edit of any of these (with the header's
# checksum recomputed) would make the filter answer "absent" for stored n-grams.
_HASHING_FIELDS = ("hash_scheme", "hash_seed", "layout", "n", "num_probes", "num_bits", "unit")


def hashing_digest(metadata: dict[str, Any]) -> str:
    """xxh3-64 binding the bit arrays' checksums to the parameters that placed their bits.

    The header's own checksum is recomputed by anyone who edits it; this one also has to be, and
    an edit of the seed or the probe count that misses it is refused rather than silently
    finding nothing.
    """
    prefix = metadata.get("prefix") or {}
    bound = {
        "bits_xxh3": metadata.get("bits_xxh3"),
        "prefix": [prefix.get("bits_xxh3"), prefix.get("num_probes"), prefix.get("num_bits")],
        "normalizer": metadata.get("normalizer"),
        **{field: metadata.get(field) for field in _HASHING_FIELDS},
    }
    return xxhash.xxh3_64_hexdigest(json.dumps(bound, sort_keys=True).encode("utf-8"))


def verify_bits(
    path: Path, metadata: dict[str, Any], words: np.ndarray, prefix_words: np.ndarray | None
) -> None:
    """Check the bit arrays against the header: their checksums, then their share of set bits.

    Args:
        path: the file (named in errors).
        metadata: its validated header metadata.
        words: uint64 `(num_bits / 64,)`, the n-gram bit array.
        prefix_words: uint64 `(prefix num_bits / 64,)`, or None without a prefix section.

    Raises:
        DamagedFilterError: the first mismatch, named.
    """
    if bits_checksum(words) != metadata["bits_xxh3"]:
        raise damaged_error(path, "bit array checksum mismatch")
    prefix: dict[str, Any] = metadata.get("prefix") or {}
    if prefix_words is not None and bits_checksum(prefix_words) != prefix["bits_xxh3"]:
        raise damaged_error(path, "prefix bit array checksum mismatch")
    problem = fill_problem(
        "the bit array",
        count_set_bits(words),
        metadata["num_ngrams"],
        metadata["num_bits"],
        metadata["num_probes"],
    )
    if not problem and prefix_words is not None:
        problem = fill_problem(
            "the prefix section",
            count_set_bits(prefix_words),
            prefix["num_prefixes"],
            prefix["num_bits"],
            prefix["num_probes"],
        )
    if problem:
        raise damaged_error(path, problem)
    # Last, so that the checks above name what they find first (an emptied array, more probes).
    check_hashing_binding(path, metadata)


def check_hashing_binding(path: Path, metadata: dict[str, Any]) -> None:
    """Refuse a header whose hashing parameters are not those its bits were written with (part of
    :func:`verify_bits`: the digest binds the bits' checksums, which ``verify=False`` skips).

    Raises:
        DamagedFilterError: ``hashing_xxh3`` is missing or does not match the header.
    """
    recorded = metadata.get("hashing_xxh3")
    if not isinstance(recorded, str):
        raise damaged_error(path, "metadata has no 'hashing_xxh3'")
    if recorded != hashing_digest(metadata):
        raise damaged_error(
            path,
            "its hashing parameters (hash_seed, n, num_probes, scheme, unit) are not those the "
            "bit array was written with: the header was edited",
        )


def bits_checksum(words: np.ndarray) -> str:
    """The xxh3-64 hex digest of a bit array's bytes, as the header records it."""
    return xxhash.xxh3_64_hexdigest(words.data.cast("B"))


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bits_problem(name: str, num_bits: int) -> str | None:
    if num_bits == 0 or num_bits % BLOCK_BITS or num_bits // BLOCK_BITS >= MAX_BLOCKS:
        return f"{name} is {num_bits}, must be a positive multiple of {BLOCK_BITS} below 2**41"
    return None


def _rate_problem(
    name: str, stated: Any, num_keys: int, num_bits: int, num_probes: int
) -> str | None:
    """The stated expected false-positive rate must be a number equal to the formula's."""
    if not _is_number(stated) or not 0.0 <= stated <= 1.0:
        return f"{name} is {stated!r}, expected a number in [0, 1]"
    recomputed = expected_false_positive_rate(num_keys, num_bits // BLOCK_BITS, num_probes)
    if not math.isclose(stated, recomputed, rel_tol=1e-6, abs_tol=1e-12):
        return f"{name} is {stated!r}, but the header's sizes give {recomputed:.6g}"
    return None


def check_metadata(metadata: Any) -> str | None:
    """The first problem with a filter header's metadata, or None.

    Args:
        metadata: the decoded JSON metadata of a memfree filter file.

    Returns:
        A sentence naming the field and the problem, or None when the header is consistent.
    """
    if not isinstance(metadata, dict):
        return "metadata is not a JSON object"
    for key in _REQUIRED_INTS:
        value = metadata.get(key)
        if not _is_int(value) or value < 0:
            return f"metadata field {key!r} is {value!r}, expected a non-negative integer"
    if metadata.get("layout") != LAYOUT:
        return f"unknown layout {metadata.get('layout')!r}, expected {LAYOUT!r}"
    if metadata.get("hash_scheme") != HASH_SCHEME:
        return f"unknown hash scheme {metadata.get('hash_scheme')!r}, expected {HASH_SCHEME!r}"
    if not 1 <= metadata["n"] <= MAX_NGRAM_SIZE:
        return f"n is {metadata['n']}, must be in [1, {MAX_NGRAM_SIZE}]"
    unit = metadata.get("unit", "token")
    if unit not in ("token", "word"):
        return f"unit is {unit!r}, expected 'token' or 'word'"
    if unit == "word" and not isinstance(metadata.get("normalizer"), str):
        return "a word filter's metadata names no normalizer"
    if not 1 <= metadata["num_probes"] <= MAX_PROBES:
        return f"num_probes is {metadata['num_probes']}, must be in [1, {MAX_PROBES}]"
    num_bits = metadata["num_bits"]
    problem = _bits_problem("num_bits", num_bits)
    if problem:
        return problem
    blocks = metadata.get("num_blocks", num_bits // BLOCK_BITS)
    if not _is_int(blocks) or blocks * BLOCK_BITS != num_bits:
        return f"num_blocks is {blocks!r}, but num_bits {num_bits} makes {num_bits // BLOCK_BITS}"
    if metadata["hash_seed"] >= 1 << 64:
        return "hash_seed does not fit in 64 bits"
    if not isinstance(metadata.get("bits_xxh3"), str):
        return "metadata has no bit array checksum"
    if not isinstance(metadata.get("hashing_xxh3"), str):
        # Without it an edit of the seed, n or probe count (header checksum recomputed) would
        # open cleanly and find none of the stored n-grams; memfree has written it since the
        # hashing parameters were bound, so a file without it is refused, never trusted.
        return (
            "metadata has no 'hashing_xxh3' (the checksum binding the bit array to its hash_seed, "
            "n and num_probes): the file predates it or its header was edited"
        )
    problem = _rate_problem(
        "expected_false_positive_rate",
        metadata.get("expected_false_positive_rate"),
        metadata["num_ngrams"],
        num_bits,
        metadata["num_probes"],
    )
    if problem:
        return problem
    target = metadata.get("target_false_positive_rate")
    if target is not None and (not _is_number(target) or not 0.0 < target < 1.0):
        return f"target_false_positive_rate is {target!r}, expected a number in (0, 1)"
    min_count = metadata.get("min_count")
    if min_count is not None and (not _is_int(min_count) or min_count < 1):
        return f"min_count is {min_count!r}, expected an integer >= 1"
    for key in ("tokenizer", "tokenizer_fingerprint", "normalizer"):
        value = metadata.get(key)
        if value is not None and not isinstance(value, str):
            return f"metadata field {key!r} is {value!r}, expected a string"
    special = metadata.get("special_token_ids")
    if special is not None and (
        not isinstance(special, list) or not all(_is_int(i) and i >= 0 for i in special)
    ):
        return "metadata field 'special_token_ids' is not a list of token ids"
    return _prefix_problem(metadata.get("prefix"), metadata["n"])


def _prefix_problem(prefix: Any, ngram_size: int) -> str | None:
    if prefix is None:
        return None
    if not isinstance(prefix, dict):
        return "metadata field 'prefix' is not a JSON object"
    if ngram_size < 2:
        return "a filter of 1-grams cannot have a prefix section"
    for key in ("num_bits", "num_probes", "num_prefixes"):
        value = prefix.get(key)
        if not _is_int(value) or value < 0:
            return f"prefix field {key!r} is {value!r}, expected a non-negative integer"
    if not 1 <= prefix["num_probes"] <= MAX_PROBES:
        return f"prefix num_probes is {prefix['num_probes']}, must be in [1, {MAX_PROBES}]"
    problem = _bits_problem("prefix num_bits", prefix["num_bits"])
    if problem:
        return problem
    if not isinstance(prefix.get("bits_xxh3"), str):
        return "prefix section has no checksum"
    return _rate_problem(
        "prefix expected_false_positive_rate",
        prefix.get("expected_false_positive_rate"),
        prefix["num_prefixes"],
        prefix["num_bits"],
        prefix["num_probes"],
    )


def count_set_bits(words: np.ndarray, chunk_words: int = 1 << 20) -> int:
    """Number of set bits in a uint64 array (in bounded-memory chunks)."""
    total = 0
    for begin in range(0, words.shape[0], chunk_words):
        part = np.asarray(words[begin : begin + chunk_words]).view(np.uint64)
        if hasattr(np, "bitwise_count"):
            total += int(np.bitwise_count(part).sum(dtype=np.int64))
        else:  # numpy < 2.0
            total += int(np.unpackbits(part.view(np.uint8)).sum(dtype=np.int64))
    return total


def fill_problem(name: str, set_bits: int, num_keys: int, num_bits: int, num_probes: int) -> str:
    """Why ``set_bits`` cannot come from ``num_keys`` keys of ``num_probes`` probes, or "".

    Each key sets at most ``num_probes`` bits, in a block of 512 chosen by its hash, so at most
    ``num_keys * num_probes`` bits are set, and in expectation
    ``num_bits * (1 - exp(-(num_keys / blocks) * (1 - (1 - 1/512) ** num_probes)))``.
    """
    upper = num_keys * num_probes
    if num_keys and not set_bits:
        return f"{name} has no bit set although it holds {num_keys:,} keys: it would block nothing"
    blocks = num_bits // BLOCK_BITS
    missing_per_key = 1.0 - (1.0 - 1.0 / BLOCK_BITS) ** num_probes
    expected = num_bits * -math.expm1(-(num_keys / blocks) * missing_per_key)
    slack = _FILL_TOLERANCE * expected + _FILL_SIGMAS * math.sqrt(expected) + 8
    if set_bits > upper:
        return (
            f"{name} has {set_bits:,} bits set, more than its {num_keys:,} keys x {num_probes} "
            "probes can set"
        )
    if set_bits < expected - slack:
        return (
            f"{name} has {set_bits:,} bits set where its {num_keys:,} keys x {num_probes} probes "
            f"set about {expected:,.0f}: bits are missing, so stored n-grams would go unblocked"
        )
    if set_bits > expected + slack:
        return (
            f"{name} has {set_bits:,} bits set where its {num_keys:,} keys x {num_probes} probes "
            f"set about {expected:,.0f}"
        )
    return ""
