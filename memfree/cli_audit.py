"""``memfree audit``: plant canaries, measure their exposure, try to extract them — with and
without the guard."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(commands: Any) -> None:
    """Register ``audit`` and its subcommands."""
    parser = commands.add_parser(
        "audit",
        help="canaries: insert, exposure, extraction",
        description="The Secret Sharer's audit: plant random canaries in a corpus, train on it "
        "(outside memfree), then measure how exposed the canaries are and whether they can be "
        "extracted, with and without the guard.",
    )
    steps = parser.add_subparsers(dest="step", metavar="STEP", required=True)
    insert = steps.add_parser("insert", help="plant canaries in a corpus")
    insert.add_argument("corpus", nargs="+", metavar="CORPUS")
    insert.add_argument(
        "-o", "--output", required=True, help="directory for corpus.jsonl + manifest"
    )
    insert.add_argument(
        "--format",
        default="my social security number is {ddd}-{dd}-{dddd}",
        help="template with holes: {d..} digits, {a..} letters, {x..} hex, {word}",
    )
    insert.add_argument("--words", default=None, help="file of words for {word} holes")
    insert.add_argument("--repetitions", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    insert.add_argument("--per-repetition", type=int, default=1, help="canaries per count")
    insert.add_argument("--seed", type=int, default=0)
    insert.add_argument("--text-field", default="text")
    insert.add_argument(
        "--force",
        action="store_true",
        help="replace the manifest.json and corpus.jsonl already in the output directory (the "
        "manifest is the only record of which secrets were planted there)",
    )
    extractable = steps.add_parser(
        "extractable",
        help="k-extractability of corpus sequences (greedy reproduces the next m tokens)",
        description="Quantifying Memorization, Definition 3.1: the share of corpus sequences "
        "whose next m tokens greedy decoding reproduces from a k-token prompt, by k and by "
        "repetition bucket; with --filter also guarded.",
    )
    extractable.add_argument("corpus", nargs="+", metavar="CORPUS")
    extractable.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    extractable.add_argument("--filter", default=None, help="filter of the corpus: also guarded")
    extractable.add_argument("--k", type=int, nargs="+", default=[10, 25, 50])
    extractable.add_argument("--m", type=int, default=50)
    extractable.add_argument("--num-examples", type=int, default=50)
    extractable.add_argument("--per-bucket", type=int, default=None)
    extractable.add_argument("--seed", type=int, default=0)
    extractable.add_argument("--out", default="out/audit/extractable")
    extractable.add_argument("--json", action="store_true")
    for name, help_text in (
        ("exposure", "exposure of each canary (rank and skew-normal extrapolation)"),
        ("extract", "greedy and shortest-path extraction of the secrets"),
    ):
        step = steps.add_parser(name, help=help_text, description=help_text)
        step.add_argument("--manifest", required=True, help="manifest.json or its directory")
        step.add_argument("--model", required=True, help="the model trained on the corpus")
        step.add_argument(
            "--filter", default=None, help="a filter of the training corpus: also run guarded"
        )
        step.add_argument("--out", default=None, help="report directory (default: beside manifest)")
        step.add_argument("--json", action="store_true")
        if name == "exposure":
            step.add_argument("--references", type=int, default=10_000)
            step.add_argument("--seed", type=int, default=0)
        else:
            step.add_argument("--max-queries", type=int, default=100_000)


def run(args: argparse.Namespace) -> int:
    """Run ``memfree audit``; returns the exit status."""
    from memfree.cli import _fail

    if args.step == "insert":
        return _insert(args)
    if args.step == "extractable":
        return _extractable(args)
    from eval.canaries import load_manifest

    try:
        canary_format, canaries, _ = load_manifest(args.manifest)
    except (FileNotFoundError, ValueError) as error:
        return _fail(str(error))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from memfree.errors import FilterError
    from memfree.models import ModelNotFoundError, load_model

    guard = None
    try:
        model, tokenizer = load_model(args.model)
        if args.filter:
            from memfree.processor import MemFreeLogitsProcessor

            guard = MemFreeLogitsProcessor(args.filter, tokenizer=tokenizer)
    except (ModelNotFoundError, FilterError, FileNotFoundError) as error:
        return _fail(str(error))
    from eval.audit import run_exposure, run_extraction, write_audit_report

    results: dict[str, Any] = {}
    for label, processor in (("unguarded", None), ("guarded", guard)):
        if label == "guarded" and guard is None:
            continue
        print(f"{args.step} ({label}) ...", file=sys.stderr, flush=True)
        if args.step == "exposure":
            results[label] = run_exposure(
                model, tokenizer, canary_format, canaries, processor, args.references, args.seed
            )
        else:
            results[label] = run_extraction(
                model, tokenizer, canary_format, canaries, processor, args.max_queries
            )
    manifest_dir = Path(args.manifest)
    out = (
        Path(args.out)
        if args.out
        else (manifest_dir if manifest_dir.is_dir() else manifest_dir.parent) / args.step
    )
    try:
        write_audit_report(out, results, f"audit {args.step}: {args.model}")
    except (OSError, ImportError) as error:
        return _fail(str(error))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for label, part in results.items():
        if args.step == "exposure":
            print(f"{label}: |R| = {part['space_size']:,}, max exposure {part['max_exposure']:.1f}")
            for group in part["by_repetitions"]:
                print(
                    f"  inserted {group['repetitions']:3d}x: median exposure "
                    f"{group['median_exposure']:6.2f}   epsilon >= {group['epsilon_lower_bound']:.2f}"
                )
        else:
            recovered = [row for row in part["canaries"] if row["greedy_recovered"]]
            search = part["shortest_path"]
            print(
                f"{label}: greedy recovered {len(recovered)} of {len(part['canaries'])} canaries; "
                f"shortest path found {search['recovered_canary'] or 'no canary'} "
                f"in {search['queries']:,} queries (brute force {search['brute_force_queries']:,})"
            )
    print(f"report in {out}/")
    return 0


def _insert(args: argparse.Namespace) -> int:
    from eval.canaries import CanaryFormat, insert_canaries
    from eval.resultfiles import first_unreadable
    from memfree.cli import _fail
    from memfree.errors import os_problem

    unreadable = first_unreadable(args.corpus)
    if unreadable:
        return _fail(unreadable)
    words: tuple[str, ...] = ()
    if args.words:
        try:
            words = tuple(Path(args.words).read_bytes().decode("utf-8").split())
        except OSError as error:
            return _fail(f"{args.words}: {os_problem(error)}")
        except UnicodeDecodeError as error:
            return _fail(f"{args.words}: not UTF-8 text ({error.reason} at byte {error.start})")
    try:
        canary_format = CanaryFormat(args.format, words)
        manifest = insert_canaries(
            args.corpus,
            args.output,
            canary_format,
            tuple(args.repetitions),
            args.per_repetition,
            args.seed,
            args.text_field,
            overwrite=args.force,
        )
    except (ValueError, OSError) as error:
        return _fail(str(error))
    print(
        f"planted {len(manifest['canaries'])} canaries (|R| = {manifest['space_size']:,}) in "
        f"{manifest['documents']:,} documents: {args.output}/corpus.jsonl, manifest.json"
    )
    return 0


def _extractable(args: argparse.Namespace) -> int:
    from memfree.cli import _fail

    if min(args.k) < 1 or args.m < 1:
        return _fail("--k and --m must be >= 1")
    from eval.resultfiles import first_unreadable

    unreadable = first_unreadable(args.corpus)
    if unreadable:
        return _fail(unreadable)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from memfree.errors import FilterError
    from memfree.models import ModelNotFoundError, load_model

    try:
        model, tokenizer = load_model(args.model)
        guard = None
        if args.filter:
            from memfree.processor import MemFreeLogitsProcessor

            guard = MemFreeLogitsProcessor(args.filter, tokenizer=tokenizer)
    except (ModelNotFoundError, FilterError, FileNotFoundError) as error:
        return _fail(str(error))
    from eval.audit import run_extractability, write_audit_report
    from memfree.cli_generate import warnings_to_stderr

    results: dict[str, Any] = {}
    try:
        for label, processor in (("unguarded", None), ("guarded", guard)):
            if label == "guarded" and guard is None:
                continue
            print(f"extractable ({label}) ...", file=sys.stderr, flush=True)
            with warnings_to_stderr():
                results[label] = run_extractability(
                    model,
                    tokenizer,
                    args.corpus,
                    args.k,
                    args.m,
                    processor,
                    args.num_examples,
                    args.per_bucket,
                    args.seed,
                )
        write_audit_report(args.out, results, f"k-extractability: {args.model or 'default'}")
    except (ValueError, OSError, ImportError) as error:
        return _fail(str(error))
    if args.json:
        print(json.dumps({k: {**v, "sequences": None} for k, v in results.items()}, indent=2))
        return 0
    for label, part in results.items():
        shares = ", ".join(f"k={row['k']}: {row['extractable']:.0%}" for row in part["by_k"])
        print(f"{label}: extractable {shares}")
    print(f"report in {args.out}/")
    return 0
