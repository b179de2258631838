"""``memfree audit``'s steps: plant canaries, measure their exposure, try to extract them, and
measure k-extractability — with and without the guard. Options: :mod:`eval.cli.audit_options`."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eval.cli.audit_options import (
    DEFAULT_EXTRACTABLE_OUT,
    OPTION_FIELDS,
    add_arguments,
    settings_from_args,
)
from eval.cli.flags import in_flags
from memfree.cli.common import disable_download_bars, fail, no_room, warnings_to_stderr

# The name it had here before the options moved to eval.cli.audit_options (tests import it).
_OPTION_FIELDS = OPTION_FIELDS


def run(args: argparse.Namespace) -> int:
    """Run ``memfree audit``; returns the exit status (2 for bad settings or inputs)."""
    if args.step == "insert":
        return _insert(args)
    if args.step == "extractable":
        return _extractable(args)
    return _canary_step(args)


def as_json(result: Any) -> Any:
    """A result as JSON values: typed results (``to_dict()``) and mappings become dicts."""
    if hasattr(result, "to_dict"):
        return result.to_dict()
    if isinstance(result, Mapping):
        return {key: as_json(value) for key, value in result.items()}
    return result


def _model_and_guard(model_name: str | None, filter_path: str | None) -> tuple[Any, Any, Any]:
    """The model, its tokenizer and, with a filter, its guard.

    Raises:
        memfree.models.ModelNotFoundError, memfree.errors.FilterError (a damaged filter, or one
        of another tokenizer: the guard checks), FileNotFoundError.
    """
    from memfree.models import load_model

    disable_download_bars()
    model, tokenizer = load_model(model_name)
    guard = None
    if filter_path:
        from memfree.engines.transformers import MemFreeLogitsProcessor

        guard = MemFreeLogitsProcessor(filter_path, tokenizer=tokenizer)
    return model, tokenizer, guard


def _loaded(args: argparse.Namespace) -> tuple[Any, Any, Any] | str:
    """The model, its tokenizer and (``--filter``) its guard; or why they cannot be loaded."""
    from memfree.errors import FilterError
    from memfree.models import ModelNotFoundError

    try:
        return _model_and_guard(args.model, args.filter)
    except (ModelNotFoundError, FilterError, FileNotFoundError) as error:
        return str(error)


def _with_and_without(step: str, guard: Any, measure: Callable[[Any], Any]) -> dict[str, Any]:
    """``measure(None)`` as "unguarded" and, with a guard, ``measure(guard)`` as "guarded";
    each announced on stderr."""
    results: dict[str, Any] = {}
    for label, processor in (("unguarded", None), ("guarded", guard)):
        if label == "guarded" and guard is None:
            continue
        print(f"{step} ({label}) ...", file=sys.stderr, flush=True)
        results[label] = measure(processor)
    return results


def _canary_step(args: argparse.Namespace) -> int:
    """``exposure`` or ``extract``: the canaries of a manifest, unguarded and (--filter) guarded."""
    from eval.canaries import load_manifest

    try:
        settings = settings_from_args(args)
        canary_format, canaries, _ = load_manifest(args.manifest)
    except (FileNotFoundError, ValueError) as error:
        return fail(in_flags(error, old_names=True))
    manifest_dir = Path(args.manifest)
    out = (
        Path(args.out)
        if args.out
        else (manifest_dir if manifest_dir.is_dir() else manifest_dir.parent) / args.step
    )
    with contextlib.ExitStack() as held:
        problem = _claim(held, out, args)
        if problem:
            return problem
        loaded = _loaded(args)
        if isinstance(loaded, str):
            return fail(loaded)
        model, tokenizer, guard = loaded
        from eval.audit import run_exposure, run_extraction
        from eval.audit_report import write_audit_report

        def measure(processor: Any) -> Any:
            if args.step == "exposure":
                return run_exposure(
                    model,
                    tokenizer,
                    canary_format,
                    canaries,
                    processor,
                    settings.references,
                    settings.seed,
                )
            return run_extraction(
                model, tokenizer, canary_format, canaries, processor, settings.max_queries
            )

        try:
            results = _with_and_without(args.step, guard, measure)
            title = f"audit {args.step}: {args.model}"
            write_audit_report(out, results, title, overwrite=args.force)
        except (ValueError, OSError, ImportError) as error:
            return fail(_said(error))
    if args.json:
        print(json.dumps(as_json(results), indent=2))
        return 0
    _print_canary_results(args.step, results)
    print(f"report in {out}/")
    return 0


def _print_canary_results(step: str, results: dict[str, Any]) -> None:
    """Each label's exposure or extraction result (typed), a few lines each."""
    for label, part in results.items():
        if step == "exposure":
            print(f"{label}: |R| = {part.space_size:,}, max exposure {part.max_exposure:.1f}")
            for group in part.by_repetitions:
                print(
                    f"  inserted {group.repetitions:3d}x: median exposure "
                    f"{group.median_exposure:6.2f}   epsilon >= {group.epsilon_lower_bound:.2f}"
                )
        else:
            recovered = [row for row in part.canaries if row.greedy_recovered]
            search = part.shortest_path
            print(
                f"{label}: greedy recovered {len(recovered)} of {len(part.canaries)} canaries; "
                f"shortest path found {search.recovered_canary or 'no canary'} "
                f"in {search.queries:,} queries (brute force {search.brute_force_queries:,})"
            )


def _claim(held: contextlib.ExitStack, out: Path, args: argparse.Namespace) -> int | None:
    """Check ``out`` for this step's report and hold its lock until ``held`` closes (before the
    model loads: a second run into the same folder is refused at once, naming the first); the
    exit status of a refusal, else None."""
    from eval.resultdirs import claim_results_dir

    try:
        held.enter_context(claim_results_dir(out, f"audit {args.step}", args.force))
    except ValueError as error:
        return fail(str(error))
    return None


def _said(error: BaseException) -> str:
    """An error in words: an OSError as ``PATH: problem`` rather than ``[Errno N] ...``, a
    setting out of range named by its flag (:func:`eval.cli.flags.in_flags`)."""
    from memfree.errors import os_problem

    room = no_room(error, "the folder written", "free space there, or write to a disk with room")
    if room is not None:
        return room
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.filename}: {os_problem(error)}"
    return in_flags(error, old_names=True)


def _insert(args: argparse.Namespace) -> int:
    """``insert``: plant the canaries and write the corpus and its manifest."""
    from eval.canaries import CanaryFormat, insert_canaries
    from eval.resultfiles import first_unreadable
    from memfree.errors import os_problem

    unreadable = first_unreadable(args.corpus)
    if unreadable:
        return fail(unreadable)
    words: tuple[str, ...] = ()
    if args.words:
        try:
            words = tuple(Path(args.words).read_bytes().decode("utf-8").split())
        except OSError as error:
            return fail(f"{args.words}: {os_problem(error)}")
        except UnicodeDecodeError as error:
            return fail(f"{args.words}: not UTF-8 text ({error.reason} at byte {error.start})")
    try:
        settings = settings_from_args(args)
    except ValueError as error:
        return fail(in_flags(error, old_names=True))
    try:
        canary_format = CanaryFormat(settings.canary_format, words)
    except ValueError as error:
        hint = " (give them with --words FILE)" if "{word}" in str(error) else ""
        return fail(f"--format: {error}{hint}")
    try:
        manifest = insert_canaries(
            args.corpus,
            args.output,
            canary_format,
            settings.repetitions,
            settings.canaries_per_repetition,
            settings.seed,
            settings.text_field,
            overwrite=args.force,
        )
    except (ValueError, OSError) as error:
        room = no_room(error, str(args.output), "free space there, or pass -o on a disk with room")
        return fail(room or _said(error))
    print(
        f"planted {len(manifest['canaries'])} canaries (|R| = {manifest['space_size']:,}) in "
        f"{manifest['documents']:,} documents: {args.output}/corpus.jsonl, manifest.json"
    )
    return 0


def _extractable(args: argparse.Namespace) -> int:
    """``extractable``: k-extractability of corpus sequences, unguarded and (--filter) guarded."""
    from eval.resultfiles import first_unreadable

    try:
        settings = settings_from_args(args)
    except ValueError as error:
        return fail(in_flags(error, old_names=True))
    unreadable = first_unreadable(args.corpus)
    if unreadable:
        return fail(unreadable)
    with contextlib.ExitStack() as held:
        problem = _claim(held, Path(args.out), args)
        if problem:
            return problem
        loaded = _loaded(args)
        if isinstance(loaded, str):
            return fail(loaded)
        model, tokenizer, guard = loaded
        from eval.audit import run_extractability
        from eval.audit_report import write_audit_report

        def measure(processor: Any) -> Any:
            with warnings_to_stderr():
                return run_extractability(
                    model,
                    tokenizer,
                    args.corpus,
                    list(settings.prompt_lengths),
                    settings.truth_tokens,
                    processor,
                    settings.num_examples,
                    settings.per_bucket,
                    settings.seed,
                )

        try:
            results = _with_and_without("extractable", guard, measure)
            title = f"k-extractability: {args.model or 'default'}"
            write_audit_report(args.out, results, title, overwrite=args.force)
        except (ValueError, OSError, ImportError) as error:
            return fail(_said(error))
    if args.json:
        print(
            json.dumps({k: {**as_json(v), "sequences": None} for k, v in results.items()}, indent=2)
        )
        return 0
    for label, part in results.items():
        shares = ", ".join(f"k={row.k}: {row.extractable:.0%}" for row in part.by_k)
        print(f"{label}: extractable {shares}")
    print(f"report in {args.out}/")
    return 0


__all__ = [
    "DEFAULT_EXTRACTABLE_OUT",
    "add_arguments",
    "as_json",
    "run",
    "settings_from_args",
]
