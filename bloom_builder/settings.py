"""Build settings: one frozen dataclass, validated before any work starts; the CLI reads its
defaults. Its errors name fields and values (``ngram_size must be an integer >= 1, got 0``); the
CLI translates them to its flags (:data:`bloom_builder.cli.FLAGS`)."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from bloom_builder.choices import (
    EXECUTORS,
    FORMATS,
    LAYOUTS,
    UNITS,
    ExecutorName,
    LayoutName,
    OutputFormat,
    UnitName,
)
from memfree.errors import SettingError
from memfree.filterfile.hashing import DEFAULT_HASH_SEED
from memfree.units import get_unit

#: The lowest false-ban rate a prefix index can reach, whatever its corpus: one record a bucket
#: and a 56-bit remainder (with a 1-bit token: its record is 57 bits at most).
INDEX_RATE_FLOOR = 2.0**-56

# A setting's problem: the field at fault, and the message naming it and its value.
Problem = tuple[str, str]


@dataclass(frozen=True)
class BuildSettings:
    """Everything that decides what a build produces (and how fast).

    Attributes:
        ngram_size: units per n-gram (the paper's n; 10 by default).
        unit: "token" (n-grams of the tokenizer's ids) or "word" (n-grams of normalized words,
            no tokenizer: one filter for every model; see :mod:`memfree.vocab.words`).
        min_count: keep n-grams seen at least this many times in the corpus.
        false_positive_rate: target false-positive rate the filter is sized for (None: the
            layout's default, :attr:`target_rate`): for the Bloom layout the rate of one n-gram
            test, for the prefix-keyed index the expected false bans per natural query (a prefix
            and the token, or word, that follows it in text like the corpus).
        tokenizer: a tokenizer directory, ``.gguf`` file or cached name; None = default model's.
        text_field: JSONL field / Parquet column / dataset column holding the text.
        executor: "local" (a process pool on this machine) or "ray" (Ray Core tasks with
            retries; the work directory must be on storage every node sees).
        ray_address: with the Ray executor, a running cluster to join ("auto": the one this
            node belongs to); None starts a local Ray with ``workers`` CPUs.
        ids_field: Parquet / dataset column holding token ids (a pre-tokenized corpus) to read
            instead of text; the ids must be ``tokenizer``'s (token unit only).
        include: fnmatch patterns selecting files inside walked directories.
        exclude: fnmatch patterns excluding files inside walked directories.
        output_format: "memfree" (native) or "pybloomfiltermmap3" (interchange).
        layout: the native format's layout: "prefix-index" (the prefix-keyed index: one lookup
            per guarded row; either unit) or "blocked-512" (a blocked Bloom filter with a prefix
            section); None (the default): the index in the memfree format, the Bloom filter in
            the pybloomfiltermmap3 format (:attr:`resolved_layout`).
        workers: parallel map/reduce processes (1 = in this process).
        memory_limit_bytes: budget across all workers for what the build sizes itself: each
            worker's share goes half to tokenization batches, half to counting buffers (the
            tokenizer, the interpreter and one segment's tokenization come on top).
        num_partitions: key ranges counted independently (a power of two).
        shard_bytes: input bytes per map task (the unit of parallelism and of resume).
        batch_documents: documents tokenized per batch.
        hash_seed: seed of the n-gram hash (recorded in the header).
        prefix_false_positive_rate: target rate of the prefix section, which lets the guard
            skip, exactly, steps whose last n-1 tokens begin no stored n-gram; None = no
            section (a smaller file, a slower guard).
        follow_symlinks: follow symbolic links met walking directories and globs (each file is
            read once, loops cut and reported); False skips and reports them.
    """

    ngram_size: int = 10
    unit: UnitName = "token"
    min_count: int = 1
    false_positive_rate: float | None = None
    tokenizer: str | None = None
    text_field: str = "text"
    ids_field: str | None = None
    executor: ExecutorName = "local"
    ray_address: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    output_format: OutputFormat = "memfree"
    layout: LayoutName | None = None
    workers: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 8)))
    memory_limit_bytes: int = 2 << 30
    num_partitions: int = 16
    shard_bytes: int = 4 << 20
    batch_documents: int = 64
    hash_seed: int = DEFAULT_HASH_SEED
    prefix_false_positive_rate: float | None = 0.01
    follow_symlinks: bool = True

    def __post_init__(self) -> None:
        found = self._problem()
        if found:
            raise SettingError(found[1], field=found[0])

    def problem(self) -> str | None:
        """The first invalid setting, named by its field and value (``ngram_size must be an
        integer >= 1, got 0``), or None."""
        found = self._problem()
        return found[1] if found else None

    def _problem(self) -> Problem | None:
        """The first invalid setting (field, message), in a fixed order, or None."""
        checks = (
            self._counting_problem,
            self._format_problem,
            self._resource_problem,
            self._source_problem,
            self._executor_problem,
            self._hashing_problem,
        )
        for check in checks:
            found = check()
            if found:
                return found
        return None

    def _counting_problem(self) -> Problem | None:
        """What is counted: n, the unit, the minimum count, the target rate."""
        if not isinstance(self.ngram_size, int) or self.ngram_size < 1:
            return "ngram_size", f"ngram_size must be an integer >= 1, got {self.ngram_size!r}"
        if self.ngram_size > 64:
            return "ngram_size", f"ngram_size must be at most 64, got {self.ngram_size}"
        if self.unit not in UNITS:
            return "unit", f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}"
        if not isinstance(self.min_count, int) or self.min_count < 1:
            return "min_count", f"min_count must be an integer >= 1, got {self.min_count!r}"
        rate = self.false_positive_rate
        if rate is None:
            return None
        if not isinstance(rate, (int, float)) or not 0.0 < float(rate) < 1.0:
            return "false_positive_rate", f"false_positive_rate must be in (0, 1), got {rate!r}"
        if self.output_format == "memfree" and not self.uses_index:
            return _unreachable_rate("false_positive_rate", rate)
        if self.uses_index and float(rate) < INDEX_RATE_FLOOR:
            return "false_positive_rate", (
                f"false_positive_rate {rate!r} cannot be reached: no prefix index goes below "
                f"{INDEX_RATE_FLOOR:.1e} (a 56-bit prefix remainder); raise false_positive_rate "
                "(1e-5 to 1e-9 is the usual range)"
            )
        return None

    @property
    def target_rate(self) -> float:
        """The false-positive rate the filter is sized for: the setting, or the layout's default
        (1e-3 for a Bloom filter; 1e-5 false bans per natural query for the prefix-keyed
        index)."""
        if self.false_positive_rate is not None:
            return float(self.false_positive_rate)
        return 1e-5 if self.uses_index else 1e-3

    @property
    def resolved_layout(self) -> LayoutName:
        """The layout written: the setting, or by default the index in the memfree format and
        the Bloom filter in the pybloomfiltermmap3 format."""
        if self.layout is not None:
            return self.layout
        if self.output_format == "memfree":
            return "prefix-index"
        return "blocked-512"

    @property
    def uses_index(self) -> bool:
        """Whether the build writes the prefix-keyed index."""
        return self.output_format == "memfree" and self.resolved_layout == "prefix-index"

    def _format_problem(self) -> Problem | None:
        """The output format, and what the unit can write and take."""
        if self.output_format not in FORMATS:
            return (
                "output_format",
                f"output_format must be one of {', '.join(FORMATS)}, got {self.output_format!r}",
            )
        unit = get_unit(self.unit)
        if self.output_format not in unit.output_formats:
            return (
                "output_format",
                f"unit {self.unit} writes the {' or '.join(unit.output_formats)} format only "
                "(pybloomfiltermmap3 files hash token ids)",
            )
        if self.layout is not None and self.layout not in LAYOUTS:
            return "layout", f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}"
        if self.layout == "prefix-index" and self.output_format != "memfree":
            return (
                "layout",
                "the prefix-index layout is written in the memfree format only (got format "
                f"{self.output_format}); use layout blocked-512",
            )
        problem = unit.tokenizer_problem(self.tokenizer)
        return ("tokenizer", problem) if problem else None

    def _resource_problem(self) -> Problem | None:
        """Workers, memory, partitions, shards and batches."""
        if not isinstance(self.workers, int) or self.workers < 1:
            return "workers", f"workers must be an integer >= 1, got {self.workers!r}"
        memory = self.memory_limit_bytes
        if not isinstance(memory, int) or memory < 16 << 20:
            return (
                "memory_limit_bytes",
                f"memory_limit_bytes must be at least 16M, got {memory!r} bytes",
            )
        partitions = self.num_partitions
        if partitions < 1 or partitions & (partitions - 1) or partitions > 4096:
            return (
                "num_partitions",
                f"num_partitions must be a power of two in [1, 4096], got {partitions}",
            )
        if not isinstance(self.shard_bytes, int) or self.shard_bytes < 1:
            return "shard_bytes", f"shard_bytes must be at least 1 byte, got {self.shard_bytes!r}"
        if self.batch_documents < 1:
            return "batch_documents", f"batch_documents must be >= 1, got {self.batch_documents}"
        return None

    def _source_problem(self) -> Problem | None:
        """The fields read from the corpus."""
        if not self.text_field:
            return "text_field", "text_field must not be empty"
        if self.ids_field is not None and not get_unit(self.unit).reads_token_ids:
            return (
                "ids_field",
                f"ids_field reads token ids: it needs unit token, not unit {self.unit}",
            )
        if self.ids_field == "":
            return "ids_field", "ids_field must not be empty"
        return None

    def _executor_problem(self) -> Problem | None:
        """The executor, and the Ray cluster to join."""
        if self.executor not in EXECUTORS:
            return (
                "executor",
                f"executor must be {' or '.join(EXECUTORS)}, got {self.executor!r}",
            )
        if self.ray_address is not None and self.executor != "ray":
            return "ray_address", "ray_address needs executor ray"
        if self.ray_address is not None:
            from bloom_builder.executors.ray import ray_address_problem  # syntax only: no ray

            problem = ray_address_problem(self.ray_address)
            if problem:
                return "ray_address", problem
        return None

    def _hashing_problem(self) -> Problem | None:
        """The prefix section's rate, and the hash seed."""
        rate = self.prefix_false_positive_rate
        if rate is not None and not 0.0 < float(rate) < 1.0:
            return (
                "prefix_false_positive_rate",
                "prefix_false_positive_rate must be in (0, 1) (or None for no prefix section), "
                f"got {rate!r}",
            )
        if rate is not None and self.output_format == "memfree":
            found = _unreachable_rate("prefix_false_positive_rate", rate)
            if found:
                return found
        if not 0 <= self.hash_seed < 1 << 64:
            return "hash_seed", f"hash_seed must fit in 64 bits, got {self.hash_seed}"
        return None

    def to_dict(self) -> dict[str, Any]:
        """Every setting, JSON-able (the patterns as lists)."""
        data = asdict(self)
        data["include"] = list(self.include)
        data["exclude"] = list(self.exclude)
        return data


@functools.cache
def lowest_reachable_rate() -> float:
    """The lowest false-positive rate any native filter can have: one stored n-gram in the most
    blocks (2**32 - 1) with the best probe count. A target below it cannot be met whatever the
    corpus holds, so it is refused before any work (about 3e-49)."""
    from memfree.filterfile.hashing import MAX_PROBES
    from memfree.filterfile.sizing import expected_false_positive_rate

    most_blocks = (1 << 32) - 1
    return min(
        expected_false_positive_rate(1, most_blocks, probes) for probes in range(1, MAX_PROBES + 1)
    )


def _unreachable_rate(name: str, rate: float) -> Problem | None:
    """The problem of a target rate (the field ``name``) below :func:`lowest_reachable_rate`."""
    floor = lowest_reachable_rate()
    if float(rate) >= floor:
        return None
    return name, (
        f"{name} {rate!r} cannot be reached: no filter of this format goes below {floor:.1e} "
        f"(one n-gram in 2**32 blocks); raise {name} (1e-3 to 1e-6 is the usual range)"
    )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse "512M", "2G", "1.5GiB" or a plain byte count."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 512M or 2G")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit])
