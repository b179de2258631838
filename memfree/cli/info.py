"""``memfree info``: validate a filter file and show its metadata and false-positive rate."""

from __future__ import annotations

import argparse
import json
from typing import Any

from memfree.cli.common import fail
from memfree.errors import in_flag_terms
from memfree.filterfile.header import MAX_NGRAM_SIZE
from memfree.units import get_unit

#: The readers' argument names and ``memfree info``'s flags (library errors name arguments).
INFO_FLAGS = {"ngram_size": "--ngram-size"}

# Shown on their own lines first; every other metadata key follows, sorted.
_SHOWN_FIRST = frozenset(
    {
        "layout",
        "n",
        "num_ngrams",
        "num_bits",
        "num_probes",
        "size_bytes",
        "tokenizer",
        "tokenizer_fingerprint",
        "expected_false_positive_rate",
        "token_bits",
        "bucket_bits",
        "section_bits",
        "remainder_bits",
        "max_bucket",
        "uniform_false_positive_rate",
        "prefix_collision_rate",
        "concentration_sample",
        "concentration_squares",
    }
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Give ``memfree info``'s parser its description and options."""
    parser.description = (
        "Validate a filter file and print its metadata and expected false-positive rate."
    )
    parser.add_argument("filter", metavar="FILTER")
    parser.add_argument(
        "--ngram-size",
        type=int,
        default=None,
        help="n, for a pybloomfiltermmap3 file without its .json sidecar (1 to "
        f"{MAX_NGRAM_SIZE}); a memfree filter records its own",
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the bit-array checksum")
    parser.add_argument("--json", action="store_true", help="print the metadata as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``memfree info``; returns the exit status (2 for a missing or damaged filter)."""
    from memfree.errors import FilterError
    from memfree.filterfile import NgramFilter

    kwargs: dict[str, Any] = {}
    if args.ngram_size is not None:
        if not 1 <= args.ngram_size <= MAX_NGRAM_SIZE:  # the bound of the native header
            return fail(
                f"--ngram-size must be a positive integer at most {MAX_NGRAM_SIZE} (as in a memfree "
                f"filter's header), got {args.ngram_size}"
            )
        kwargs["ngram_size"] = args.ngram_size
    try:
        if kwargs and not _is_pybloom(args.filter):
            filt = NgramFilter.open(args.filter, verify=not args.no_verify)
            if filt.n != args.ngram_size:
                return fail(
                    f"--ngram-size {args.ngram_size}: {args.filter} is a memfree filter of "
                    f"{filt.n}-grams (it records its n); drop --ngram-size"
                )
        else:
            filt = NgramFilter.open(args.filter, verify=not args.no_verify, **kwargs)
        if not args.no_verify and filt.prefix_index() is not None:
            filt.verify()  # type: ignore[attr-defined]  # an index checks its sections now
    except (FileNotFoundError, FilterError, ValueError) as error:
        return fail(in_flag_terms(str(error), INFO_FLAGS))
    metadata = filt.metadata
    metadata["size_bytes"] = filt.size_bytes
    if args.json:
        print(json.dumps(metadata, indent=2, sort_keys=True))
        return 0
    print(describe(filt, metadata))
    return 0


def _is_pybloom(path: str) -> bool:
    """Whether ``path`` starts as a pybloomfiltermmap3 file (other paths are left to the reader,
    which names what is wrong with them)."""
    from memfree.filterfile import pybloom

    try:
        with open(path, "rb") as handle:
            return handle.read(len(pybloom.MAGIC)) == pybloom.MAGIC
    except OSError:
        return False


def _promise(unit: str) -> str:
    """What a guard over this filter promises, by unit."""
    from memfree.units import get_unit

    return get_unit(unit).promise(None)


def describe(filt: Any, metadata: dict[str, Any]) -> str:
    """The text ``memfree info`` prints: the shape and rate first, then every other key sorted.

    Args:
        filt: an opened filter (:class:`~memfree.NgramFilter` or a pybloomfiltermmap3 reader).
        metadata: its metadata, with ``size_bytes`` added.
    """
    from memfree.filterfile.bloom import describe_rate

    lines = [
        f"{filt.path}",
        f"  layout {filt.header.layout}   n {filt.n}   n-grams {filt.num_ngrams:,}",
    ]
    index = filt.prefix_index()
    if index is not None:
        header = filt.header
        shape = index.shape
        per_ngram = filt.size_bytes / max(filt.num_ngrams, 1)
        word = not get_unit(filt.unit).reads_token_ids  # its index keys next words' hashes
        field = "next-word hash bits" if word else "token"
        lines += [
            f"  records {shape.record_bits} bits ({field} {shape.token_bits}, prefix remainder "
            f"{shape.remainder_bits})   buckets 2**{shape.bucket_bits}   sections "
            f"{shape.num_sections} ({shape.num_blocks} checked blocks)   largest bucket "
            f"{index.max_bucket}",
            f"  size {filt.size_bytes:,} bytes ({per_ngram:.2f} per n-gram)",
        ]
        unit = filt.unit
        lines += [
            f"  expected false bans per natural query {describe_rate(filt.expected_false_positive_rate)}"
            f" (a prefix and the {unit} that follows it in text like the corpus; next "
            f"{unit}s' concentration "
            f"{header.concentration.squares / max(header.concentration.sample, 1) ** 2:.3g})",
            f"  per candidate of a whole-vocabulary row "
            f"{describe_rate(header.uniform_false_positive_rate)}   any query at most "
            f"{describe_rate(header.prefix_collision_rate)} (a prefix collision)",
        ]
    else:
        lines += [
            f"  bits {filt.num_bits:,}   probes {filt.num_probes}   size {filt.size_bytes:,} bytes",
            f"  expected false-positive rate {describe_rate(filt.expected_false_positive_rate)}",
        ]
    if filt.header.tokenizer is not None:
        lines.append(
            f"  tokenizer {filt.header.tokenizer} (fingerprint {filt.header.tokenizer_fingerprint})"
        )
    lines.append(f"  guard promise: {_promise(filt.header.unit)}")
    for key in sorted(metadata):
        if key in _SHOWN_FIRST:
            continue
        value = metadata[key]
        text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
        lines.append(f"  {key}: {text}")
    return "\n".join(lines)
