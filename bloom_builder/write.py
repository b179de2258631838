"""The write step: the filter header's metadata, and the kept fingerprints written as a filter
file (the native format here; pybloomfiltermmap3 in interchange.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bloom_builder.errors import BuildError
from bloom_builder.plan import BUILDER_VERSION, BuildPlan
from bloom_builder.reduce import Reduced, ReduceTask, read_kept
from bloom_builder.settings import BuildSettings
from memfree.errors import SettingError
from memfree.filterfile.bloom import FilterFileWriter, PrefixSection, set_fingerprint_bits
from memfree.filterfile.sizing import FilterSize, choose_size
from memfree.units import EncoderPayload


@dataclass(frozen=True)
class FilterShape:
    """The size a filter was written with."""

    num_bits: int
    num_probes: int
    expected_false_positive_rate: float


def filter_metadata(
    header_fields: dict[str, Any],
    settings: BuildSettings,
    kept: int,
    corpus: dict[str, Any],
) -> dict[str, Any]:
    """The header metadata of a build: the unit's fields, the settings, counts, the corpus."""
    return {
        **header_fields,
        "n": settings.ngram_size,
        "min_count": settings.min_count,
        "hash_seed": settings.hash_seed,
        "num_ngrams": kept,
        "target_false_positive_rate": settings.target_rate,
        "corpus": corpus,
        "builder_version": BUILDER_VERSION,
    }


def write_filter(
    output: Path,
    metadata: dict[str, Any],
    settings: BuildSettings,
    plan: BuildPlan,
    reduced: Reduced,
    payload: EncoderPayload,
    batch_bytes: int,
) -> FilterShape:
    """Write the filter of the kept fingerprints in ``settings.output_format``.

    Args:
        output: the filter path.
        metadata: the header metadata (:func:`filter_metadata`).
        settings: the build's settings.
        plan: the build's plan (the interchange format reads its shards again).
        reduced: the finished reduce tasks and their counts.
        payload: the encoder recipe (the interchange format encodes the corpus again).
        batch_bytes: most characters encoded at once.
    """
    ngram_tasks = reduced.of_kind("ngrams")
    if settings.output_format == "memfree":
        prefixes = (reduced.of_kind("prefixes"), reduced.kept("prefixes"))
        return write_native(output, metadata, settings, ngram_tasks, prefixes)
    from bloom_builder.interchange import write_pybloom_filter

    num_bits, num_hashes, rate = write_pybloom_filter(
        output, plan.shards, ngram_tasks, settings, payload, metadata, plan.options, batch_bytes
    )
    return FilterShape(num_bits, num_hashes, rate)


def write_native(
    output: Path,
    metadata: dict[str, Any],
    settings: BuildSettings,
    ngram_tasks: list[ReduceTask],
    prefixes: tuple[list[ReduceTask], int],
) -> FilterShape:
    """Write the native filter: the n-gram bits, and the prefix section if there are prefix tasks.

    The filter is sized for the kept count (:func:`memfree.filterfile.sizing.choose_size`); the file
    appears at the output path only when complete (the writer writes beside it and renames).

    Args:
        output: the filter path.
        metadata: the header metadata; ``num_probes`` is added.
        settings: the target rates.
        ngram_tasks: finished n-gram reduce tasks, in partition order.
        prefixes: the finished prefix reduce tasks and the prefixes they kept (no tasks: no
            prefix section).
    """
    kept = int(metadata["num_ngrams"])
    size = _size_for(kept, settings.target_rate, "false_positive_rate", "n-grams")
    metadata = {**metadata, "num_probes": size.num_probes}
    prefix_tasks, kept_prefixes = prefixes
    prefix_section = None
    prefix_rate = settings.prefix_false_positive_rate
    if prefix_tasks and prefix_rate is not None:
        prefix_size = _size_for(
            kept_prefixes, prefix_rate, "prefix_false_positive_rate", "prefixes"
        )
        prefix_section = PrefixSection(
            prefix_size.num_blocks, prefix_size.num_probes, kept_prefixes
        )
    writer = FilterFileWriter(output, size.num_blocks, metadata, prefix_section)
    try:
        for task in ngram_tasks:
            set_fingerprint_bits(writer.bit_words, read_kept(task), size.num_probes)
        if writer.prefix_bit_words is not None and prefix_section is not None:
            for task in prefix_tasks:
                set_fingerprint_bits(
                    writer.prefix_bit_words, read_kept(task), prefix_section.num_probes
                )
    except BaseException:
        writer.abort()
        raise
    writer.commit(check=partial(verify_written, output))
    return FilterShape(size.num_bits, size.num_probes, size.expected_false_positive_rate)


class UnreachableRateError(BuildError, SettingError):
    """The target rate cannot be met for the number of n-grams counted; the finished tasks are
    kept, so a rerun with a higher rate reuses them (the rate is not part of the work's key).

    A :class:`BuildError` found late, and a :class:`~memfree.errors.SettingError`: the message
    names the rate's field (``false_positive_rate`` or ``prefix_false_positive_rate``)."""


def _size_for(num_keys: int, rate: float, name: str, what: str) -> FilterSize:
    """The filter size for ``num_keys`` at ``rate`` (the setting ``name``), or the error saying
    that no filter reaches it."""
    try:
        return choose_size(num_keys, rate)
    except ValueError:
        raise UnreachableRateError(
            f"{name} {rate!r} cannot be reached for {num_keys:,} {what}: no filter of at most "
            f"2**32 blocks does; raise {name} (the finished tasks are kept: a rerun with a "
            "higher rate reuses them)",
            field=name,
        ) from None


def verify_written(output: Path, temporary: Path) -> None:
    """Open the written filter as every reader will (header, checksums, set-bit count) before
    it is renamed into place: a damaged work directory must fail the build, never leave a
    filter that readers refuse or that answers wrong.

    Raises:
        BuildError: the check failed; the message names the output and what to do.
    """
    from memfree.errors import DamagedFilterError
    from memfree.filterfile import NgramFilter

    try:
        NgramFilter.open(temporary, verify=True).close()
    except DamagedFilterError as error:
        raise BuildError(
            f"{output}: the filter written from the work directory failed its own check ("
            f"{error}); its intermediate files are damaged. The work directory is deleted: "
            "rerun the same command to build it afresh"
        ) from None
