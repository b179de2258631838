"""Build settings: one frozen dataclass, validated before any work starts; the CLI reads its defaults."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from memfree.filterfile.hashing import DEFAULT_HASH_SEED
from memfree.units import UNIT_NAMES, get_unit

FORMATS = ("memfree", "pybloomfiltermmap3")
UNITS = UNIT_NAMES


@dataclass(frozen=True)
class BuildSettings:
    """Everything that decides what a build produces (and how fast).

    Attributes:
        ngram_size: units per n-gram (the paper's n; 10 by default).
        unit: "token" (n-grams of the tokenizer's ids) or "word" (n-grams of normalized words,
            no tokenizer: one filter for every model; see :mod:`memfree.vocab.words`).
        min_count: keep n-grams seen at least this many times in the corpus.
        false_positive_rate: target false-positive rate the filter is sized for.
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
    unit: str = "token"
    min_count: int = 1
    false_positive_rate: float = 1e-3
    tokenizer: str | None = None
    text_field: str = "text"
    ids_field: str | None = None
    executor: str = "local"
    ray_address: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    output_format: str = "memfree"
    workers: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 8)))
    memory_limit_bytes: int = 2 << 30
    num_partitions: int = 16
    shard_bytes: int = 4 << 20
    batch_documents: int = 64
    hash_seed: int = DEFAULT_HASH_SEED
    prefix_false_positive_rate: float | None = 0.01
    follow_symlinks: bool = True

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """The first invalid setting, phrased for the command line, or None."""
        if not isinstance(self.ngram_size, int) or self.ngram_size < 1:
            return f"--n must be an integer >= 1, got {self.ngram_size!r}"
        if self.ngram_size > 64:
            return f"--n must be at most 64, got {self.ngram_size}"
        if self.unit not in UNITS:
            return f"--unit must be one of {', '.join(UNITS)}, got {self.unit!r}"
        if not isinstance(self.min_count, int) or self.min_count < 1:
            return f"--min-count must be an integer >= 1, got {self.min_count!r}"
        if not 0.0 < float(self.false_positive_rate) < 1.0:
            return f"--fpr must be in (0, 1), got {self.false_positive_rate!r}"
        if self.output_format == "memfree":
            problem = _unreachable_rate("--fpr", self.false_positive_rate)
            if problem:
                return problem
        if self.output_format not in FORMATS:
            return f"--format must be one of {', '.join(FORMATS)}, got {self.output_format!r}"
        unit = get_unit(self.unit)
        if self.output_format not in unit.output_formats:
            return (
                f"--unit {self.unit} writes the {' or '.join(unit.output_formats)} format only "
                "(pybloomfiltermmap3 files hash token ids)"
            )
        problem = unit.tokenizer_problem(self.tokenizer)
        if problem:
            return problem
        if not isinstance(self.workers, int) or self.workers < 1:
            return f"--workers must be an integer >= 1, got {self.workers!r}"
        if not isinstance(self.memory_limit_bytes, int) or self.memory_limit_bytes < 16 << 20:
            return f"--memory-limit must be at least 16M, got {self.memory_limit_bytes!r} bytes"
        partitions = self.num_partitions
        if partitions < 1 or partitions & (partitions - 1) or partitions > 4096:
            return f"--partitions must be a power of two in [1, 4096], got {partitions}"
        if not isinstance(self.shard_bytes, int) or self.shard_bytes < 1:
            return f"--shard-size must be at least 1 byte, got {self.shard_bytes!r}"
        if self.batch_documents < 1:
            return f"batch_documents must be >= 1, got {self.batch_documents}"
        if not self.text_field:
            return "--text-field must not be empty"
        if self.ids_field is not None and not get_unit(self.unit).reads_token_ids:
            return f"--ids-field reads token ids: it needs --unit token, not --unit {self.unit}"
        if self.ids_field == "":
            return "--ids-field must not be empty"
        if self.executor not in ("local", "ray"):
            return f"--executor must be local or ray, got {self.executor!r}"
        if self.ray_address is not None and self.executor != "ray":
            return "--ray-address needs --executor ray"
        if self.ray_address is not None:
            from bloom_builder.executors.ray import ray_address_problem  # syntax only: no ray

            problem = ray_address_problem(self.ray_address)
            if problem:
                return problem
        rate = self.prefix_false_positive_rate
        if rate is not None and not 0.0 < float(rate) < 1.0:
            return f"--prefix-fpr must be in (0, 1) (or 0 for no prefix section), got {rate!r}"
        if rate is not None and self.output_format == "memfree":
            problem = _unreachable_rate("--prefix-fpr", rate)
            if problem:
                return problem
        if not 0 <= self.hash_seed < 1 << 64:
            return f"hash_seed must fit in 64 bits, got {self.hash_seed}"
        return None

    def to_dict(self) -> dict[str, Any]:
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


def _unreachable_rate(option: str, rate: float) -> str | None:
    floor = lowest_reachable_rate()
    if float(rate) >= floor:
        return None
    return (
        f"{option} {rate!r} cannot be reached: no filter of this format goes below {floor:.1e} "
        f"(one n-gram in 2**32 blocks); raise {option} (1e-3 to 1e-6 is the usual range)"
    )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse "512M", "2G", "1.5GiB" or a plain byte count."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 512M or 2G")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit])
