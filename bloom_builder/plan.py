"""Planning a build: the corpus's work units, their shards, and the configuration that decides
whether a work directory's finished tasks can be reused (no document is read here).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xxhash

from bloom_builder.errors import BuildError
from bloom_builder.outputs import check_not_an_input, owned_paths
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import ProblemLog, SourceOptions, WorkUnit, discover
from bloom_builder.sources.megatron import bin_path
from bloom_builder.sources.remote import is_url
from bloom_builder.sources.remote import stamp as remote_stamp
from memfree.units import BuildParts, get_unit

BUILDER_VERSION = "bloom_builder 0.2.0"  # 0.2: runs store only their repeated keys' counts


@dataclass
class BuildPlan:
    """What the build found and decided before its work directory was taken.

    Attributes:
        units: the corpus's work units, sorted by path.
        shards: the units grouped, in order, into map tasks' shards.
        problems: what discovery skipped (the map step adds what reading skips).
        options: how the sources are selected and read.
        use_prefixes: whether the filter gets a prefix section.
        config: everything that decides the tasks' outputs (hashed to reuse a work directory).
    """

    units: list[WorkUnit]
    shards: list[tuple[WorkUnit, ...]]
    problems: ProblemLog
    options: SourceOptions
    use_prefixes: bool
    config: dict[str, Any]

    @property
    def config_hash(self) -> str:
        """xxh3 of the configuration: equal hashes, reusable work."""
        encoded = json.dumps(self.config, sort_keys=True).encode("utf-8")
        return xxhash.xxh3_64_hexdigest(encoded)


def unit_parts(settings: BuildSettings, tokenizer: Any = None) -> BuildParts:
    """What the build's unit gives it (:meth:`memfree.units.base.Unit.build_parts`): the encoder
    payload, the header and work-directory fields and the progress label.

    Raises:
        BuildError: the unit cannot take the tokenizer given (a word build takes none).
    """
    unit = get_unit(settings.unit)
    problem = unit.tokenizer_problem(settings.tokenizer, tokenizer)
    if problem:
        raise BuildError(problem)
    return unit.build_parts(settings.tokenizer, tokenizer)


def plan_build(
    paths: list[str],
    output: Path,
    written: list[str],
    settings: BuildSettings,
    parts: BuildParts,
) -> BuildPlan:
    """Discover ``paths``, refuse an output that is one of them, and plan the shards.

    Args:
        paths: files, directories, globs, saved ``datasets`` directories, or ``stdlib:``.
        output: the filter path.
        written: every path the build writes (output, sidecar, work directory): never read;
            one that holds a file the build did not write is refused if the corpus holds it.
        settings: the build's settings.
        parts: the unit's choices (its configuration fields enter the work-directory hash).

    Raises:
        BuildError: no readable input.
        OutputError: the output (or its sidecar) is one of the inputs.
    """
    pybloom = settings.output_format != "memfree"
    options = SourceOptions(
        text_field=settings.text_field,
        ids_field=settings.ids_field,
        include=settings.include,
        exclude=settings.exclude,
        follow_symlinks=settings.follow_symlinks,
    )
    problems = ProblemLog()
    # Named files first, then every file discovery found. Discovery passes over only what is
    # the build's own (a previous filter, its sidecar, the work directory, the locks): any other
    # file at the output path, or behind a link there, is found and refused here.
    check_not_an_input(output, _named_files(paths), pybloom)
    units = discover(list(paths), options, problems, reserved=owned_paths(written))
    check_not_an_input(output, [unit.path for unit in units], pybloom)
    if not units:
        raise BuildError(nothing_usable(problems, "no readable input found"))
    use_prefixes = (
        settings.prefix_false_positive_rate is not None
        and settings.ngram_size > 1
        and settings.output_format == "memfree"
        and not settings.uses_index
    )
    stamps: dict[str, list[Any]] = {}
    config = {
        "builder": BUILDER_VERSION,
        "units": [
            [u.path, u.kind, u.compression, u.start, u.stop, u.size_bytes, _unit_stamp(u, stamps)]
            for u in units
        ],
        **parts.config_fields,
        "unit": settings.unit,
        "ngram_size": settings.ngram_size,
        "hash_seed": settings.hash_seed,
        "shard_bytes": settings.shard_bytes,
        "num_partitions": settings.num_partitions,
        "options": asdict(options),
        "prefixes": use_prefixes,
        # The index's runs hold (prefix, next token) keys, not n-gram fingerprints.
        **({"layout": "prefix-index"} if settings.uses_index else {}),
    }
    shards = plan_shards(units, settings.shard_bytes)
    return BuildPlan(units, shards, problems, options, use_prefixes, config)


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


def nothing_usable(problems: ProblemLog, headline: str) -> str:
    """The error of a build with nothing to read: the headline, then each kind of problem."""
    lines = [f"{headline}; nothing to build a filter from."]
    data = problems.to_dict()
    for kind, count in sorted(data["counts"].items()):
        examples = "; ".join(data["examples"].get(kind, []))
        lines.append(f"  {kind}: {count} ({examples})")
    lines.append("Check the paths, --text-field and --include/--exclude.")
    return "\n".join(lines)


def _unit_stamp(unit: WorkUnit, stamps: dict[str, list[Any]]) -> list[Any]:
    """The stamps of every file a unit reads: a Megatron dataset's ``.bin`` beside its ``.idx``
    (the unit's path), every file of a saved dataset's split folder; ``stamps`` caches them by
    path (a file cut into many units is looked at once)."""
    if unit.path not in stamps and is_url(unit.path):  # objects: what the store says of them
        files = [unit.path, bin_path(unit.path)] if unit.kind == "megatron" else [unit.path]
        stamps[unit.path] = [[f.rsplit("/", 1)[-1], *remote_stamp(f)] for f in files]
    if unit.path not in stamps:
        if unit.kind == "megatron":
            files = [unit.path, bin_path(unit.path)]
        elif os.path.isdir(unit.path):
            files = sorted(
                os.path.join(folder, name)
                for folder, _, names in os.walk(unit.path)
                for name in names
            )
        else:
            files = [unit.path]
        stamps[unit.path] = [[os.path.relpath(f, unit.path), *_stamp(f)] for f in files]
    return stamps[unit.path]


def _stamp(path: str) -> tuple[int, int, int]:
    """What tells a changed file from the one whose tasks are kept: its modification time and
    its status-change time. Tools that copy a file's times (``cp -p``, ``rsync -t``, ``touch -r``)
    restore the first but cannot set the second: the kernel sets it on every write, so a
    same-size edit with its mtime restored still starts the work afresh. (Reading the whole
    corpus again to hash it would double a resumed build's reading.)"""
    try:
        info = Path(path).stat()
    except OSError:
        return 0, 0, 0
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _named_files(paths: list[str]) -> list[str]:
    """The paths given by name that exist as files (a glob or a directory is checked later)."""
    local = (os.path.expanduser(p) for p in paths if not is_url(p))
    return [path for path in local if os.path.isfile(path)]
