"""One pass from a corpus to a filter file: plan, map, reduce, size, write; resumable.

The work directory (``OUTPUT.work`` by default) holds every finished task's output and marker.
Rerunning the same command after an interruption, even ``kill -9``, reuses finished tasks and
writes a filter byte-identical to an uninterrupted build; the output path only ever receives a
complete file, by rename.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from bloom_builder.counting import RUN_ENTRY_BYTES, partition_bounds
from bloom_builder.outputs import (
    OutputError,
    WorkDir,
    check_not_an_input,
    check_output,
    locked,
    prepare_work_dir,
    sidecar_of,
)
from bloom_builder.segments import batch_bytes_for
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit, discover
from bloom_builder.stages import (
    LocalExecutor,
    MapStats,
    MapTask,
    ReduceTask,
    TokenizerPayload,
    WordPayload,
    map_shard,
    read_kept,
    reduce_partition,
)
from memfree.filter import FilterFileWriter, PrefixSection, set_fingerprint_bits
from memfree.sizing import choose_size, theoretical_minimum_bits
from memfree.tokenizer import (
    special_token_ids,
    tokenizer_fingerprint,
    tokenizer_name,
    tokenizer_vocab_size,
)
from memfree.words import NORMALIZER, word_metadata

BUILDER_VERSION = "bloom_builder 0.1.0"
# numpy's sort-based unique needs a few times the input's bytes.
_WORKING_SET_FACTOR = 4


class BuildError(ValueError):
    """The build cannot produce a filter (nothing usable, bad output path, ...)."""


@dataclass
class BuildSummary:
    """What a build did; printed at the end and available as JSON (``--json``)."""

    output: str
    unit: str
    output_format: str
    documents: int
    tokens: int
    ngrams: int
    distinct_ngrams: int
    kept_ngrams: int
    kept_prefixes: int
    num_bits: int
    num_probes: int
    expected_false_positive_rate: float
    size_bytes: int
    theoretical_minimum_bytes: float
    seconds: float
    tokens_per_second: float
    seconds_tokenizing: float
    seconds_hashing_counting: float
    map_tasks: int
    reused_tasks: int
    workers: int
    skipped: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        counts = self.skipped.get("counts", {})
        lines = [
            f"wrote {self.output} ({self.output_format}, {self.size_bytes:,} bytes; n-gram bits "
            f"{self.num_bits / 8 / max(self.theoretical_minimum_bytes, 1):.2f}x the theoretical "
            "minimum)",
            f"  documents {self.documents:,}   {self.unit}s {self.tokens:,}   "
            f"n-grams {self.ngrams:,}",
            f"  distinct {self.distinct_ngrams:,}   kept {self.kept_ngrams:,}   "
            f"prefixes {self.kept_prefixes:,}",
            f"  bits {self.num_bits:,}   probes {self.num_probes}   "
            f"expected false-positive rate {self.expected_false_positive_rate:.3g}",
            f"  time {self.seconds:.1f} s   {self.tokens_per_second:,.0f} {self.unit}s/s   "
            f"workers {self.workers}   tasks {self.map_tasks} ({self.reused_tasks} reused)",
        ]
        if counts:
            lines.append(
                "  skipped: "
                + ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items()))
            )
            for kind, examples in sorted(self.skipped.get("examples", {}).items()):
                for example in examples:
                    lines.append(f"    {kind}: {example}")
        return "\n".join(lines)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _progress(total: float, description: str, unit: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=description,
        unit=unit,
        unit_scale=True,
        disable=None if enabled else True,
        file=sys.stderr,
        leave=False,
    )


def plan_shards(units: list[WorkUnit], shard_bytes: int) -> list[tuple[WorkUnit, ...]]:
    """Group work units, in order, into shards of about ``shard_bytes`` input bytes."""
    shards: list[tuple[WorkUnit, ...]] = []
    current: list[WorkUnit] = []
    current_bytes = 0
    for unit in units:
        current.append(unit)
        current_bytes += max(unit.size_bytes, 1)
        if current_bytes >= shard_bytes:
            shards.append(tuple(current))
            current, current_bytes = [], 0
    if current:
        shards.append(tuple(current))
    return shards


def build_filter(
    paths: list[str],
    output: str | Path,
    settings: BuildSettings | None = None,
    *,
    work_dir: str | Path | None = None,
    keep_work: bool = False,
    progress: bool = True,
    tokenizer: Any = None,
    force: bool = False,
) -> BuildSummary:
    """Build a filter of the corpus's n-grams seen at least ``min_count`` times.

    Args:
        paths: files, directories, globs, saved ``datasets`` directories, or ``stdlib:``.
        output: filter path (written atomically).
        settings: build settings (defaults: n=10, min_count=1, fpr=1e-3, default tokenizer).
        work_dir: where resumable intermediate files go (default ``OUTPUT.work``).
        keep_work: keep the work directory after success.
        progress: show progress bars on a terminal.
        tokenizer: an already-loaded tokenizer (else ``settings.tokenizer`` is loaded).
        force: overwrite an existing output that is not a memfree filter.

    Raises:
        BuildError: no usable document; an output that is an input, is not a filter (without
            ``force``), cannot be written, or is being written by another build; a work
            directory that memfree did not make.
    """
    settings = settings or BuildSettings()
    started = time.perf_counter()
    output = Path(output)
    if not paths:
        raise BuildError("no corpus given: name files, directories, globs or stdlib:")
    pybloom = settings.output_format != "memfree"
    work = Path(work_dir) if work_dir else output.with_name(output.name + ".work")
    try:
        check_output(output, force, pybloom)
        with locked(output, work):
            return _build(paths, output, work, settings, keep_work, progress, tokenizer, started)
    except OutputError as error:
        raise BuildError(str(error)) from None


def _build(
    paths: list[str],
    output: Path,
    work: Path,
    settings: BuildSettings,
    keep_work: bool,
    progress: bool,
    tokenizer: Any,
    started: float,
) -> BuildSummary:
    pybloom = settings.output_format != "memfree"

    words = settings.unit == "word"
    if words and tokenizer is not None:
        raise BuildError("--unit word needs no tokenizer (one filter serves every model)")
    if tokenizer is None and not words:
        from memfree.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(settings.tokenizer)
    fingerprint = None if words else tokenizer_fingerprint(tokenizer)
    special_ids = [] if words else list(special_token_ids(tokenizer))
    options = SourceOptions(
        text_field=settings.text_field,
        include=settings.include,
        exclude=settings.exclude,
        follow_symlinks=settings.follow_symlinks,
    )
    problems = ProblemLog()
    written = [str(output), str(work)] + ([str(sidecar_of(output))] if pybloom else [])
    # Named files first: discovery leaves out the build's own paths, so an output named as an
    # input would not be among the units; then every file discovery found.
    check_not_an_input(output, _named_files(paths), pybloom)
    units = discover(list(paths), options, problems, reserved=written)
    check_not_an_input(output, [unit.path for unit in units], pybloom)
    if not units:
        raise BuildError(_nothing_usable(problems, "no readable input found"))
    shards = plan_shards(units, settings.shard_bytes)
    use_prefixes = (
        settings.prefix_false_positive_rate is not None
        and settings.ngram_size > 1
        and settings.output_format == "memfree"
    )

    config = {
        "builder": BUILDER_VERSION,
        "units": [
            [u.path, u.kind, u.compression, u.start, u.stop, u.size_bytes, _mtime(u.path)]
            for u in units
        ],
        "tokenizer_fingerprint": fingerprint,
        "unit": settings.unit,
        "normalizer": NORMALIZER if words else None,
        "ngram_size": settings.ngram_size,
        "hash_seed": settings.hash_seed,
        "shard_bytes": settings.shard_bytes,
        "num_partitions": settings.num_partitions,
        "options": asdict(options),
        "prefixes": use_prefixes,
        "special_ids": special_ids,
    }
    config_hash = xxhash.xxh3_64_hexdigest(json.dumps(config, sort_keys=True).encode("utf-8"))
    workdir = prepare_work_dir(work, config, config_hash)
    try:
        plan = _Plan(
            paths, output, settings, tokenizer, units, shards, problems, options, use_prefixes,
            fingerprint, special_ids,
        )  # fmt: skip
        summary = _run(plan, workdir, progress, started)
    except BuildError:
        workdir.remove()  # nothing usable: the work done cannot help a rerun
        raise
    except BaseException:
        if any((work / "map").glob("shard-*.json")):
            _log(f"memfree: the build stopped; finished tasks are kept in {work}: rerun the same "
                 "command to resume, or delete that folder")  # fmt: skip
        else:
            workdir.remove()
        raise
    if not keep_work:
        workdir.remove()
    return summary


@dataclass
class _Plan:
    """What the build found and decided before its work directory was taken."""

    paths: list[str]
    output: Path
    settings: BuildSettings
    tokenizer: Any
    units: list[WorkUnit]
    shards: list[tuple[WorkUnit, ...]]
    problems: ProblemLog
    options: SourceOptions
    use_prefixes: bool
    fingerprint: str | None
    special_ids: list[int]


def _run(plan: _Plan, workdir: WorkDir, progress: bool, started: float) -> BuildSummary:
    """Map, reduce, size and write: the part of a build that its work directory makes resumable."""
    paths, output, settings, tokenizer = plan.paths, plan.output, plan.settings, plan.tokenizer
    units, shards, problems, options = plan.units, plan.shards, plan.problems, plan.options
    use_prefixes, fingerprint, special_ids = plan.use_prefixes, plan.fingerprint, plan.special_ids
    work = workdir.path
    words = settings.unit == "word"
    # Each worker's share of the memory limit: half for tokenization batches, half for counting.
    per_worker = settings.memory_limit_bytes // settings.workers
    batch_bytes = batch_bytes_for(per_worker // 2)
    buffer_entries = max(1 << 16, per_worker // 2 // (8 * _WORKING_SET_FACTOR))
    map_tasks = [
        MapTask(
            index,
            shard,
            str(work),
            settings.ngram_size,
            settings.hash_seed,
            settings.batch_documents,
            buffer_entries,
            options,
            use_prefixes,
            batch_bytes,
        )
        for index, shard in enumerate(shards)
    ]
    payload: TokenizerPayload | WordPayload = (
        WordPayload(NORMALIZER) if words else TokenizerPayload.from_tokenizer(tokenizer)
    )
    results: dict[int, dict[str, Any]] = {}
    with LocalExecutor(settings.workers, payload) as executor:
        total_bytes = sum(max(u.size_bytes, 1) for u in units)
        stage = "normalize+hash" if words else "tokenize+hash"
        with _progress(total_bytes, stage, "B", progress) as bar:
            for task, result in executor.run(map_shard, map_tasks):
                results[task.index] = result
                bar.update(sum(max(u.size_bytes, 1) for u in task.units))
        stats = MapStats()
        for index in sorted(results):
            task_stats = dict(results[index]["stats"])
            problems.merge(ProblemLog.from_dict(task_stats.pop("problems")))
            stats.add(MapStats(**task_stats))
        if stats.documents == 0:
            raise BuildError(_nothing_usable(problems, "no usable document in the corpus"))

        reduce_dir = work / f"reduce-min{settings.min_count}"
        reduce_dir.mkdir(parents=True, exist_ok=True)
        max_entries = max(1 << 16, per_worker // (RUN_ENTRY_BYTES * _WORKING_SET_FACTOR))
        all_tasks: list[ReduceTask] = []
        for kind, key in (("ngrams", "runs"), ("prefixes", "prefix_runs")):
            runs = tuple(stem for index in sorted(results) for stem in results[index][key])
            if kind == "prefixes" and not use_prefixes:
                continue
            all_tasks += [
                ReduceTask(
                    index, low, high, runs, settings.min_count, max_entries, str(reduce_dir), kind
                )
                for index, (low, high) in enumerate(partition_bounds(settings.num_partitions))
            ]
        reduced: dict[tuple[str, int], dict[str, Any]] = {}
        with _progress(len(all_tasks), "count", "part", progress) as bar:
            for reduce_task, result in executor.run(reduce_partition, all_tasks):
                reduced[reduce_task.kind, reduce_task.index] = result
                bar.update(1)
    reduce_tasks = [task for task in all_tasks if task.kind == "ngrams"]
    prefix_tasks = [task for task in all_tasks if task.kind == "prefixes"]

    distinct = sum(result["distinct"] for (kind, _), result in reduced.items() if kind == "ngrams")
    kept = sum(result["kept"] for (kind, _), result in reduced.items() if kind == "ngrams")
    kept_prefixes = sum(
        result["kept"] for (kind, _), result in reduced.items() if kind == "prefixes"
    )
    corpus = {
        "documents": stats.documents,
        "tokens": stats.tokens,
        "ngrams": stats.ngrams,
        "distinct_ngrams": distinct,
        "sources": [str(path) for path in paths],
        "input_units": len(units),
        "skipped": problems.to_dict()["counts"],
    }
    unit_fields: dict[str, Any] = (
        word_metadata()
        if words
        else {
            "unit": "token",
            "tokenizer": tokenizer_name(tokenizer, settings.tokenizer),
            "tokenizer_fingerprint": fingerprint,
            "vocab_size": tokenizer_vocab_size(tokenizer),
            "special_token_ids": special_ids,
        }
    )
    metadata = {
        **unit_fields,
        "n": settings.ngram_size,
        "min_count": settings.min_count,
        "hash_seed": settings.hash_seed,
        "num_ngrams": kept,
        "target_false_positive_rate": settings.false_positive_rate,
        "corpus": corpus,
        "builder_version": BUILDER_VERSION,
    }
    if settings.output_format == "memfree":
        size = choose_size(kept, settings.false_positive_rate)
        metadata["num_probes"] = size.num_probes
        prefix_section = None
        if use_prefixes:
            assert settings.prefix_false_positive_rate is not None
            prefix_size = choose_size(kept_prefixes, settings.prefix_false_positive_rate)
            prefix_section = PrefixSection(
                prefix_size.num_blocks, prefix_size.num_probes, kept_prefixes
            )
        with FilterFileWriter(output, size.num_blocks, metadata, prefix_section) as writer:
            for reduce_task in reduce_tasks:
                set_fingerprint_bits(writer.words, read_kept(reduce_task), size.num_probes)
            if writer.prefix_words is not None and prefix_section is not None:
                for reduce_task in prefix_tasks:
                    set_fingerprint_bits(
                        writer.prefix_words, read_kept(reduce_task), prefix_section.num_probes
                    )
        num_bits, num_probes, rate = (
            size.num_bits,
            size.num_probes,
            size.expected_false_positive_rate,
        )
    else:
        from bloom_builder.interchange import write_pybloom_filter

        assert isinstance(payload, TokenizerPayload)  # settings refuse --unit word here
        num_bits, num_probes, rate = write_pybloom_filter(
            output, shards, reduce_tasks, settings, payload, metadata, options, batch_bytes
        )

    seconds = time.perf_counter() - started
    return BuildSummary(
        output=str(output),
        unit=settings.unit,
        output_format=settings.output_format,
        documents=stats.documents,
        tokens=stats.tokens,
        ngrams=stats.ngrams,
        distinct_ngrams=distinct,
        kept_ngrams=kept,
        kept_prefixes=kept_prefixes,
        num_bits=num_bits,
        num_probes=num_probes,
        expected_false_positive_rate=rate,
        size_bytes=output.stat().st_size,
        theoretical_minimum_bytes=theoretical_minimum_bits(kept, settings.false_positive_rate) / 8,
        seconds=seconds,
        tokens_per_second=stats.tokens / seconds if seconds > 0 else 0.0,
        seconds_tokenizing=stats.seconds_tokenizing,
        seconds_hashing_counting=stats.seconds_hashing
        + sum(r.get("seconds", 0.0) for r in reduced.values()),
        map_tasks=len(map_tasks),
        reused_tasks=sum(bool(r.get("reused")) for r in results.values()),
        workers=settings.workers,
        skipped=problems.to_dict(),
    )


def _mtime(path: str) -> int:
    try:
        return Path(path).stat().st_mtime_ns
    except OSError:
        return 0


def _named_files(paths: list[str]) -> list[str]:
    """The paths given by name that exist as files (a glob or a directory is checked later)."""
    return [path for path in (os.path.expanduser(p) for p in paths) if os.path.isfile(path)]


def _nothing_usable(problems: ProblemLog, headline: str) -> str:
    lines = [f"{headline}; nothing to build a filter from."]
    data = problems.to_dict()
    for kind, count in sorted(data["counts"].items()):
        examples = "; ".join(data["examples"].get(kind, []))
        lines.append(f"  {kind}: {count} ({examples})")
    lines.append("Check the paths, --text-field and --include/--exclude.")
    return "\n".join(lines)
