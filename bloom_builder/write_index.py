"""The write step of the prefix-keyed index: each reduce partition's kept keys become a run of
sections of the file, written in place by its own task on the executor; the driver sizes the file
and writes only its header and section table. There is no serial pass over the n-grams.

Partitions are equal ranges of the key space's top bits, and so are sections (their number is
fixed by the number of n-grams, :mod:`memfree.filterfile.index.layout`): a partition covers a
run of sections, or a section a run of partitions, and the reduce step's histograms of the kept
keys' top bits size every section before any is written. Any executor, any number of workers or
partitions: the same bytes (each section's bytes depend only on its keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from bloom_builder.errors import BuildError
from bloom_builder.executors import Executor
from bloom_builder.reduce import HISTOGRAM_BITS, Reduced, ReduceTask
from bloom_builder.settings import BuildSettings
from bloom_builder.write import UnreachableRateError
from memfree.errors import DamagedFilterError
from memfree.filterfile.index import (
    CONCENTRATION_SAMPLE,
    MAX_SECTION_RECORDS,
    Concentration,
    IndexFileWriter,
    IndexShape,
    SectionTarget,
    WrittenSections,
    choose_shape,
    encode_sections,
    natural_rate,
    open_index,
    stated_rates,
    token_bits_for,
    word_rate,
    word_shape,
    word_token_bits,
)
from memfree.units import get_unit


@dataclass(frozen=True)
class SectionResult:
    """A section task's result: what its sections hold (:class:`WrittenSections`)."""

    first: int
    records: tuple[int, ...]
    digests: tuple[int, ...]
    max_bucket: int
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "records": list(self.records),
            "digests": [f"{digest:016x}" for digest in self.digests],
            "max_bucket": self.max_bucket,
            "reused": self.reused,
        }

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> SectionResult:
        return cls(
            int(payload["first"]),
            tuple(int(count) for count in payload["records"]),
            tuple(int(digest, 16) for digest in payload["digests"]),
            int(payload["max_bucket"]),
            True,
        )


@dataclass(frozen=True)
class SectionTask:
    """Encode the kept keys of some partitions as a run of sections, written in place.

    Attributes:
        target: where the sections go in the file being written.
        kept_paths: the kept keys of the partitions those sections cover (sorted uint64 files,
            in key order).
        marker_dir: where its marker goes (it always runs again: the file is new each build).
    """

    result_type: ClassVar[type[SectionResult]] = SectionResult

    target: SectionTarget
    kept_paths: tuple[str, ...]
    marker_dir: str

    @property
    def marker(self) -> Path:
        return Path(self.marker_dir) / f"sections-{self.target.first:05d}.json"

    def outputs_intact(self, result: SectionResult) -> bool:
        return False  # its output is a slice of a temporary file that the next build replaces


def write_section(task: SectionTask) -> SectionResult:
    """Run one section task: encode its keys, write them in place, read them back."""
    parts = []
    for path in task.kept_paths:
        size = Path(path).stat().st_size // 8
        if size:
            parts.append(np.memmap(path, dtype="<u8", mode="r", shape=(size,)))
    keys = (
        parts[0]
        if len(parts) == 1
        else (np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64))
    )
    target = task.target
    written = target.write(encode_sections(keys, target.first, target.count, target.shape))
    return SectionResult(written.first, written.records, written.digests, written.max_bucket)


@dataclass(frozen=True)
class IndexShapeSummary:
    """What the index was written with, for the build's summary: its widths, and the rates its
    header states (:func:`~memfree.filterfile.index.layout.stated_rates`: per natural query,
    the target; per candidate of a whole-vocabulary row; any query's prefix-collision bound)."""

    shape: IndexShape
    rates: dict[str, float]

    @property
    def expected_false_positive_rate(self) -> float:
        """False bans per natural query (a word index's: both halves)."""
        return self.rates["expected_false_positive_rate"]


def section_records(reduced: Reduced, tasks: list[ReduceTask], num_sections: int) -> np.ndarray:
    """Records of each section, from the partitions' histograms of their kept keys' top bits."""
    bins = np.concatenate(
        [np.asarray(reduced.results["ngrams", task.index].histogram, np.int64) for task in tasks]
    )
    if bins.size != 1 << HISTOGRAM_BITS:
        raise BuildError("the reduce step's histograms do not cover the key space: rerun")
    return bins.reshape(num_sections, -1).sum(axis=1)


def write_index(
    output: Path,
    metadata: dict[str, Any],
    settings: BuildSettings,
    reduced: Reduced,
    executor: Executor,
    work: Path,
) -> IndexShapeSummary:
    """Write the prefix-keyed index of the kept keys: one task per partition (or per section,
    when there are fewer sections than partitions), each writing its sections in place.

    Args:
        output: the filter path (the file appears there only when complete).
        metadata: the header metadata (:func:`~bloom_builder.write.filter_metadata`); must hold
            ``vocab_size``.
        settings: the build's settings (the target rate).
        reduced: the finished reduce tasks (one per partition, in order).
        executor: runs the section tasks.
        work: the work directory (their markers go there).
    """
    tasks: list[ReduceTask] = reduced.of_kind("ngrams")
    total = sum(reduced.results["ngrams", task.index].kept for task in tasks)
    token_bits = index_token_bits(settings, int(metadata.get("vocab_size", 0)))
    concentration = first_keys_concentration([Path(task.kept_path) for task in tasks], token_bits)
    shape, reached = index_shape(
        total, settings, int(metadata.get("vocab_size", 0)), concentration.value
    )
    vocab_size = 1 << shape.token_bits if next_is_hash(settings) else int(metadata["vocab_size"])
    metadata = {**metadata, "vocab_size": vocab_size}  # a word index's: its next-word field's
    if total and reached > settings.target_rate:
        raise UnreachableRateError(
            f"false_positive_rate {settings.target_rate!r} cannot be reached for {total:,} "
            f"n-grams: the widest prefix remainder gives {reached:.2g}; raise false_positive_rate "
            "(the finished tasks are kept: a rerun with a higher rate reuses them)",
            field="false_positive_rate",
        )
    records = section_records(reduced, tasks, shape.num_sections)
    if int(records.max()) > MAX_SECTION_RECORDS:
        raise BuildError(
            f"a section of the index would hold {int(records.max()):,} n-grams, more than "
            "2**32 - 1: the corpus is beyond this layout's reach"
        )
    writer = IndexFileWriter(output, metadata, shape, records, concentration)
    marker_dir = work / "sections"
    marker_dir.mkdir(parents=True, exist_ok=True)
    sections, partitions = shape.num_sections, len(tasks)
    groups = max(1, min(sections, partitions))
    section_tasks = [
        SectionTask(
            writer.target(group * sections // groups, sections // groups),
            tuple(
                str(task.kept_path)
                for task in tasks[group * partitions // groups : (group + 1) * partitions // groups]
            ),
            str(marker_dir),
        )
        for group in range(groups)
    ]
    try:
        written = [
            WrittenSections(result.first, result.records, result.digests, result.max_bucket)
            for _, result in executor.run(write_section, section_tasks)
        ]
        writer.commit(written, check=lambda temporary: _check_header(output, temporary))
    except (ValueError, OSError) as error:  # DamagedFilterError is a ValueError
        writer.abort()
        if isinstance(error, BuildError):
            raise
        raise BuildError(
            f"{output}: the index written from the work directory failed its own check "
            f"({error}); its intermediate files are damaged. The work directory is deleted: "
            "rerun the same command to build it afresh"
        ) from None
    except BaseException:
        writer.abort()
        raise
    return IndexShapeSummary(
        shape, stated_rates(total, shape, vocab_size, concentration.value, settings.unit)
    )


def first_keys_concentration(kept_paths: list[Path], token_bits: int) -> Concentration:
    """The :class:`Concentration` of the first kept keys in key order (the partitions' kept files
    in order are one sorted run): the same sample for any number of partitions or workers."""
    parts: list[np.ndarray] = []
    wanted = CONCENTRATION_SAMPLE
    for path in kept_paths:
        if wanted <= 0:
            break
        size = min(path.stat().st_size // 8, wanted)
        if size:
            parts.append(np.fromfile(path, dtype="<u8", count=size))
            wanted -= size
    keys = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    return Concentration.of_keys(keys, token_bits)


def index_shape(
    total: int, settings: BuildSettings, vocab_size: int, concentration: float
) -> tuple[IndexShape, float]:
    """The widths of the index of ``total`` kept keys, and the false bans per natural query they
    give (to compare with the target rate)."""
    if next_is_hash(settings):
        shape = word_shape(total, settings.target_rate, concentration)
        return shape, word_rate(total, shape, concentration)
    shape = choose_shape(total, token_bits_for(vocab_size), settings.target_rate, concentration)
    return shape, natural_rate(total, shape, concentration)


def next_is_hash(settings: BuildSettings) -> bool:
    """Whether an index key's last field holds the next unit's hash bits (truncated to the
    field) rather than an id that must fit it: the unit says (a unit whose n-grams are not token
    ids stores hashes)."""
    return not get_unit(settings.unit).reads_token_ids


def index_token_bits(settings: BuildSettings, vocab_size: int) -> int:
    """The width of the index keys' last field: a token id, or a next word's hash bits."""
    if next_is_hash(settings):
        return word_token_bits(settings.target_rate)
    return token_bits_for(vocab_size)


def _check_header(output: Path, temporary: Path) -> None:
    """Open the written file's header and sizes as readers will (each section task read its own
    bytes back already: the file is not read again serially here)."""
    try:
        open_index(temporary, verify=False).close()
    except DamagedFilterError as error:
        raise BuildError(
            f"{output}: the index written from the work directory failed its own check ({error}); "
            "rerun the same command"
        ) from None


__all__ = ["SectionResult", "SectionTask", "write_index", "write_section"]
