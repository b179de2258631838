"""One pass from a corpus to a filter file: plan, map, reduce and write, run on an executor.

Resumable: a rerun after an interruption reuses finished tasks and writes the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bloom_builder.counting import RUN_ENTRY_BYTES
from bloom_builder.encode import init_worker
from bloom_builder.errors import BuildError
from bloom_builder.executors import Executor, any_done, make_executor
from bloom_builder.map import MapResult, MapStats, MapTask, map_shard
from bloom_builder.outputs import (
    OutputError,
    check_output,
    locked,
    make_folders,
    missing_folders,
    output_path,
    prepare_work_dir,
    remove_empty_folders,
    remove_stale_temporaries,
    sidecar_of,
)
from bloom_builder.plan import BuildPlan, nothing_usable, plan_build, unit_parts
from bloom_builder.reduce import Reduced, RunKind, reduce_partition, reduce_tasks
from bloom_builder.segments import batch_bytes_for
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import ProblemLog
from bloom_builder.sources.remote import filesystem, is_url
from bloom_builder.sources.remote import url_problem as remote_url_problem
from bloom_builder.store_tasks import StoreSyncedExecutor
from bloom_builder.store_work import StoreWork
from bloom_builder.summary import BuildSummary
from bloom_builder.to_store import build_to_store
from bloom_builder.write import FilterShape, UnreachableRateError, filter_metadata, write_filter
from bloom_builder.write_index import index_token_bits, next_is_hash
from memfree.filterfile.sizing import theoretical_minimum_bits
from memfree.units import BuildParts

__all__ = ["BuildError", "BuildSummary", "build_filter"]

# numpy's sort-based unique needs a few times the input's bytes.
_WORKING_SET_FACTOR = 4


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

    The work directory (``OUTPUT.work`` by default) holds every finished task's output and
    marker. Rerunning the same command after an interruption, even ``kill -9``, reuses finished
    tasks and writes a filter byte-identical to an uninterrupted build; the output path only
    ever receives a complete file, by rename.

    Args:
        paths: files, directories, globs, saved ``datasets`` directories, or ``stdlib:``.
        output: filter path (written atomically), or an object URL (``s3://bucket/f.memfree``:
            built in a staging folder here, verified, then uploaded whole; see
            :mod:`bloom_builder.to_store`).
        settings: build settings (defaults: n=10, min_count=1, fpr=1e-3, default tokenizer).
        work_dir: where resumable intermediate files go (default ``OUTPUT.work``).
        keep_work: keep the work directory after success.
        progress: show progress bars on a terminal.
        tokenizer: an already-loaded tokenizer (else ``settings.tokenizer`` is loaded).
        force: overwrite an existing output that is not a memfree filter, or a read-only one.

    Raises:
        BuildError: no usable document; an output that is an input, is not a filter (without
            ``force``), cannot be written, or is being written by another build; a work
            directory that memfree did not make.
    """
    settings = settings or BuildSettings()
    started = time.perf_counter()
    if not paths:
        raise BuildError("no corpus given: name files, directories, globs or stdlib:")
    pybloom = settings.output_format != "memfree"
    # A work directory on object storage: tasks work in a local mirror, finished ones are kept
    # on the store (checked before any folder is made: never a local folder named "s3:").
    store = StoreWork(os.fspath(work_dir)) if work_dir and is_url(os.fspath(work_dir)) else None
    for path in paths:  # a corpus on object storage: read through fsspec
        if is_url(path):
            problem = remote_url_problem(path)
            if problem is not None:
                raise BuildError(problem)
            filesystem(path)  # its package installed (else MissingDependencyError, naming it)
    if is_url(str(output)):  # built here, verified, then uploaded whole
        return build_to_store(
            build_filter, paths, str(output), settings, work_dir=work_dir, keep_work=keep_work,
            progress=progress, tokenizer=tokenizer, force=force,
        )  # fmt: skip
    try:
        # Absolute from here on: tasks run in processes (Ray workers on other nodes) whose
        # working directory is not the user's.
        output = output_path(output)
        if store is not None:
            work = store.local
        elif work_dir:
            work = Path(os.path.abspath(work_dir))
        else:
            work = output.with_name(output.name + ".work")
        check_output(output, force, pybloom)
        created = list(dict.fromkeys(missing_folders(output) + missing_folders(work)))
        try:
            make_folders(output)
            with locked(output, work), store.locked() if store else contextlib.nullcontext():
                # Under the lock, every temporary named for this output is a build's own: one
                # killed before its rename left it (full size, for the index).
                for stale, size in remove_stale_temporaries(output, pybloom):
                    _log(f"memfree: removed {stale} ({size:,} bytes), left by an interrupted build")
                return _build(
                    paths, output, work, settings, keep_work, progress, tokenizer, started, store
                )
        except BaseException:
            remove_empty_folders(created)  # a failed build leaves no empty folder of its own
            raise
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
    store: StoreWork | None = None,
) -> BuildSummary:
    """Plan, take the work directory, run the steps; keep finished tasks if the build stops."""
    parts = unit_parts(settings, tokenizer)
    pybloom = settings.output_format != "memfree"
    written = [str(output), str(work)] + ([str(sidecar_of(output))] if pybloom else [])
    plan = plan_build(paths, output, written, settings, parts)
    workdir = prepare_work_dir(work, plan.config, plan.config_hash)
    workdir.remove_temporaries()  # of tasks killed mid-write: they run again
    if store is not None:
        store.claim(plan.config, plan.config_hash)

    def remove_work(failed: bool = False) -> None:
        workdir.remove()
        # A failed build never deletes finished tasks from the store: the local mirror's are
        # only copies (a machine whose disk refused them may have none), and a rerun checks
        # each against its marker before reusing it.
        if store is not None and not (failed and store.holds_finished()):
            store.remove()

    try:
        summary = _run(paths, output, work, settings, parts, plan, progress, started, store)
    except UnreachableRateError:
        raise  # counting is done and kept: a rerun with a higher rate reuses it
    except BuildError:
        with contextlib.suppress(OSError):
            remove_work(failed=True)  # nothing usable, or damaged: the work done cannot help
        raise
    except BaseException:
        if any_done(work / "map") or (store is not None and store.holds_finished()):
            where = store.url if store is not None else work
            _log(f"memfree: the build stopped; finished tasks are kept in {where}: rerun the same "
                 "command to resume, or delete that folder")  # fmt: skip
        else:
            with contextlib.suppress(OSError):
                remove_work(failed=True)
        raise
    if not keep_work:
        remove_work()
    return summary


@dataclass(frozen=True)
class _Budget:
    """Each worker's share of the memory limit: half for encoding batches, half for counting."""

    batch_bytes: int  # characters encoded at once
    buffer_entries: int  # fingerprints a map task buffers before spilling a run
    max_entries: int  # run entries a reduce task loads at once

    @classmethod
    def of(cls, settings: BuildSettings) -> _Budget:
        per_worker = settings.memory_limit_bytes // settings.workers
        return cls(
            batch_bytes=batch_bytes_for(per_worker // 2),
            buffer_entries=max(1 << 16, per_worker // 2 // (8 * _WORKING_SET_FACTOR)),
            max_entries=max(1 << 16, per_worker // (RUN_ENTRY_BYTES * _WORKING_SET_FACTOR)),
        )


def _run(
    paths: list[str],
    output: Path,
    work: Path,
    settings: BuildSettings,
    parts: BuildParts,
    plan: BuildPlan,
    progress: bool,
    started: float,
    store: StoreWork | None = None,
) -> BuildSummary:
    """Map, reduce and write: the part of a build that its work directory makes resumable."""
    budget = _Budget.of(settings)
    setup = partial(init_worker, parts.payload)
    executor_kind, address = settings.executor, settings.ray_address
    inner = make_executor(settings.workers, setup, executor_kind, address)
    if store is not None:  # Ray's tasks may share nothing but the bucket: they reach it
        reach = executor_kind == "ray"
        inner = StoreSyncedExecutor(inner, store, settings.num_partitions, reach)
    with inner as executor:
        map_results = _map_step(executor, plan, settings, work, budget, parts, progress)
        stats = _merge_stats(map_results, plan.problems)
        if stats.documents == 0:
            raise BuildError(nothing_usable(plan.problems, "no usable document in the corpus"))
        reduced = _reduce_step(executor, map_results, settings, work, plan, budget, progress)
        if store is not None:  # the kept keys, for the write step here (checked by xxh3)
            store.fetch_outputs(
                reduced.tasks, [reduced.results[task.kind, task.index] for task in reduced.tasks]
            )
        metadata = filter_metadata(
            parts.header_fields,
            settings,
            reduced.kept("ngrams"),
            _corpus(paths, plan, stats, reduced),
        )
        writing = time.perf_counter()
        if settings.uses_index:
            from bloom_builder.write_index import write_index

            index = write_index(output, metadata, settings, reduced, executor, work)
            size = output.stat().st_size
            shape = FilterShape(size * 8, 0, index.expected_false_positive_rate)
            summary = _summary(output, settings, plan, stats, map_results, reduced, shape, started)
            summary.uniform_false_positive_rate = index.rates["uniform_false_positive_rate"]
            summary.prefix_collision_rate = index.rates["prefix_collision_rate"]
            summary.seconds_writing = time.perf_counter() - writing
            return summary
    shape = write_filter(
        output, metadata, settings, plan, reduced, parts.payload, budget.batch_bytes
    )
    summary = _summary(output, settings, plan, stats, map_results, reduced, shape, started)
    summary.seconds_writing = time.perf_counter() - writing
    return summary


def _corpus(paths: list[str], plan: BuildPlan, stats: MapStats, reduced: Reduced) -> dict[str, Any]:
    """The header's corpus summary."""
    return {
        "documents": stats.documents,
        "tokens": stats.tokens,
        "ngrams": stats.ngrams,
        "distinct_ngrams": reduced.distinct("ngrams"),
        "sources": [str(path) for path in paths],
        "input_units": len(plan.units),
        "skipped": plan.problems.to_dict()["counts"],
    }


def _map_step(
    executor: Executor,
    plan: BuildPlan,
    settings: BuildSettings,
    work: Path,
    budget: _Budget,
    parts: BuildParts,
    progress: bool,
) -> dict[int, MapResult]:
    """Run one map task per shard; returns each task's result by shard index."""
    vocab_size = parts.header_fields.get("vocab_size", 0)
    tasks = [
        MapTask(
            index=index,
            units=shard,
            work_dir=str(work),
            ngram_size=settings.ngram_size,
            hash_seed=settings.hash_seed,
            batch_documents=settings.batch_documents,
            buffer_entries=budget.buffer_entries,
            options=plan.options,
            prefixes=plan.use_prefixes,
            batch_bytes=budget.batch_bytes,
            index_token_bits=index_token_bits(settings, int(vocab_size))
            if settings.uses_index
            else 0,
            index_next_words=next_is_hash(settings),
        )
        for index, shard in enumerate(plan.shards)
    ]
    results: dict[int, MapResult] = {}
    total_bytes = sum(max(unit.size_bytes, 1) for unit in plan.units)
    with _progress(total_bytes, parts.progress_label, "B", progress) as bar:
        for task, result in executor.run(map_shard, tasks):
            results[task.index] = result
            bar.update(sum(max(unit.size_bytes, 1) for unit in task.units))
    return results


def _merge_stats(results: dict[int, MapResult], problems: ProblemLog) -> MapStats:
    """The map tasks' statistics summed in shard order; their problems go into ``problems``."""
    stats = sum((results[index].stats for index in sorted(results)), MapStats())
    problems.merge(stats.problems)
    return stats


def _reduce_step(
    executor: Executor,
    map_results: dict[int, MapResult],
    settings: BuildSettings,
    work: Path,
    plan: BuildPlan,
    budget: _Budget,
    progress: bool,
) -> Reduced:
    """Count every partition of the n-gram runs (and of the prefix runs, for a prefix section)."""
    in_order = [map_results[index] for index in sorted(map_results)]
    runs: dict[RunKind, list[str]] = {"ngrams": [stem for done in in_order for stem in done.runs]}
    if plan.use_prefixes:
        runs["prefixes"] = [stem for done in in_order for stem in done.prefix_runs]
    reduce_dir = work / f"reduce-min{settings.min_count}"
    tasks = reduce_tasks(
        runs,
        settings.num_partitions,
        settings.min_count,
        budget.max_entries,
        reduce_dir,
        histogram=settings.uses_index,
    )
    reduced = Reduced(tasks)
    with _progress(len(tasks), "count", "part", progress) as bar:
        for task, result in executor.run(reduce_partition, tasks):
            reduced.results[task.kind, task.index] = result
            bar.update(1)
    return reduced


def _summary(
    output: Path,
    settings: BuildSettings,
    plan: BuildPlan,
    stats: MapStats,
    map_results: dict[int, MapResult],
    reduced: Reduced,
    shape: FilterShape,
    started: float,
) -> BuildSummary:
    """What the build did, for the user (printed, or as JSON)."""
    kept = reduced.kept("ngrams")
    seconds = time.perf_counter() - started
    empty = _empty_filter(output, settings, stats, reduced)
    return BuildSummary(
        output=str(output),
        unit=settings.unit,
        output_format=settings.output_format,
        documents=stats.documents,
        tokens=stats.tokens,
        ngrams=stats.ngrams,
        distinct_ngrams=reduced.distinct("ngrams"),
        kept_ngrams=kept,
        kept_prefixes=reduced.kept("prefixes"),
        num_bits=shape.num_bits,
        num_probes=shape.num_probes,
        expected_false_positive_rate=shape.expected_false_positive_rate,
        size_bytes=output.stat().st_size,
        theoretical_minimum_bytes=theoretical_minimum_bits(kept, settings.target_rate) / 8,
        seconds=seconds,
        tokens_per_second=stats.tokens / seconds if seconds > 0 else 0.0,
        seconds_tokenizing=stats.seconds_tokenizing,
        seconds_hashing_counting=stats.seconds_hashing + reduced.seconds(),
        cpu_seconds_hashing_counting=stats.cpu_seconds_hashing + reduced.cpu_seconds(),
        map_tasks=len(plan.shards),
        reused_tasks=sum(result.reused for result in map_results.values()),
        workers=settings.workers,
        skipped=plan.problems.to_dict(),
        layout=settings.resolved_layout,
        empty=empty is not None,
        warnings=[empty] if empty else [],
    )


def _empty_filter(
    output: Path, settings: BuildSettings, stats: MapStats, reduced: Reduced
) -> str | None:
    """The warning for a filter of no n-gram (it blocks nothing), naming why and the setting
    to change by its field; None when it holds some."""
    if reduced.kept("ngrams"):
        return None
    n, unit = settings.ngram_size, settings.unit
    if stats.ngrams == 0:
        why = (
            f"no document has {n} {unit}s (ngram_size {n} is above every document's length: "
            f"{stats.documents:,} documents, {stats.tokens:,} {unit}s in all); lower ngram_size"
        )
    else:
        why = (
            f"none of the corpus's {reduced.distinct('ngrams'):,} distinct n-grams was seen "
            f"{settings.min_count} times (min_count {settings.min_count} is above every n-gram's "
            "count); lower min_count"
        )
    return f"{output} holds no n-gram, so a guard using it blocks nothing: {why}"


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
