"""``memfree eval``: the paper's experiments (discoverable memorization under defenses, style-
transfer prompts, utility impact) on any model, corpus and filter; the embedded defaults (SmolLM2,
the standard library and its filters) when nothing else is given. Options and their defaults:
:mod:`eval.cli.evaluate_options`."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from eval.cli.evaluate_options import (
    DEFAULT_FILTER,
    DEFAULT_MODEL_NAME,
    DEFAULT_STYLES,
    DEFAULT_UTILITY_TEXTS,
    DEFAULT_WORD_FILTER,
    DEFAULT_WORD_N,
    add_arguments,
    experiment_defaults,
    settings_from_args,
)
from eval.cli.flags import in_flags
from memfree.cli.common import (
    disable_download_bars,
    fail,
    interrupted,
    no_room,
    warnings_to_stderr,
)


def _needing_word_filter(settings: Any) -> str | None:
    """The first of the run's defenses that needs a word filter, or None."""
    from eval.defenses import get_defense

    return next((d for d in settings.defenses if get_defense(d).needs_word_filter), None)


def run(args: argparse.Namespace) -> int:
    """Run ``memfree eval``; returns the exit status (2 for bad settings or inputs, 130 when
    interrupted: rerunning the same command resumes)."""
    if args.experiment == "utility":
        from eval.cli.utility import run_utility_command

        return run_utility_command(args)
    if getattr(args, "list_styles", False):
        from eval.styles import available_styles

        for name, description in available_styles().items():
            print(f"{name:20s} {description}")
        return 0
    from eval.resultfiles import first_unreadable

    unreadable = first_unreadable(args.corpus)
    if unreadable:
        return fail(unreadable)
    try:
        settings = settings_from_args(args)
    except ValueError as error:
        return fail(in_flags(error))
    if args.corpus != list(experiment_defaults(args.experiment).corpus):
        # The default filters are the standard library's: another corpus needs its own.
        if args.filter is None:
            return fail("give --filter, the filter of your corpus (build it first)")
        needing = _needing_word_filter(settings)
        if args.word_filter is None and needing is not None:
            return fail(
                f"the {needing} defense needs --word-filter, the word filter of your corpus "
                f"(memfree build CORPUS --unit word), or leave '{needing}' out of --defenses"
            )
    out = Path(args.out or f"out/eval/{args.experiment}")
    from eval.resultdirs import claim_results_dir

    with contextlib.ExitStack() as held:
        try:
            # Checked and locked before the model loads: a second run into the same --out is
            # refused at once, naming the first; the lock is held until the report is written.
            held.enter_context(claim_results_dir(out, "eval", args.force))
        except ValueError as error:
            return fail(str(error))
        return _run_in(args, settings, out)


def _run_in(args: argparse.Namespace, settings: Any, out: Path) -> int:
    """Run ``memfree eval discoverable|styles`` into ``out``, whose lock is held."""
    disable_download_bars()
    from memfree.errors import FilterError
    from memfree.models import ModelNotFoundError

    try:
        model, tokenizer, ngram_filter, word_filter = _model_and_filters(args, settings)
    except (ModelNotFoundError, FilterError, OSError, ValueError, ImportError) as error:
        return fail(str(error))
    try:
        records = _run_memorization(
            args, settings, out, model, tokenizer, ngram_filter, word_filter
        )
    except (ValueError, OSError, ImportError, FilterError) as error:
        # Among them the library's refusals: a filter of the wrong unit or tokenizer, results
        # of other settings in --out, a damaged, duplicate or another run's record; a setting
        # out of range is named by its flag.
        room = no_room(
            error, str(out), "free space there, or pass --out on a disk with room; the same "
            "command with the same --out resumes from the records kept"
        )  # fmt: skip
        return fail(room or in_flags(error))
    except KeyboardInterrupt:
        return interrupted()
    from eval.report import write_summary

    title = f"{args.experiment}: {args.model or 'SmolLM2-135M-Instruct'} on {' '.join(args.corpus)}"
    try:
        summary = write_summary(out, records, settings.to_dict(), title)
    except (OSError, ImportError) as error:
        room = no_room(error, str(out), "free space there and rerun the same command")
        return fail(
            f"the records are in {out}/records.jsonl, but the report failed: {room or error}"
        )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    _print_summary(summary, settings, words=word_filter is not None)
    print(f"records, summary, report and plots in {out}/")
    return 0


def _model_and_filters(args: argparse.Namespace, settings: Any) -> tuple[Any, Any, Any, Any]:
    """The model, its tokenizer, the token filter and the word filter (None when unused).

    The filters named on the command line open, and their units are checked, before the model
    loads; a filter not named is the standard library's, built the first time it is needed.
    Whether the token filter fits the tokenizer, the guard checks.

    Raises:
        ValueError: a filter of the other unit given as --filter or --word-filter.
    """
    from eval.experiments import check_filters
    from memfree.filterfile import NgramFilter
    from memfree.models import load_model

    ngram_filter = NgramFilter.open(args.filter) if args.filter is not None else None
    word_filter = NgramFilter.open(args.word_filter) if args.word_filter is not None else None
    # Said before the model loads (and a default filter is built), in the options' names.
    check_filters(ngram_filter, word_filter)
    model, tokenizer = load_model(args.model)
    if ngram_filter is None:
        ngram_filter = _default_filter("token", tokenizer)
    if word_filter is None and "word" in settings.defenses:
        word_filter = _default_filter("word", tokenizer)
    return model, tokenizer, ngram_filter, word_filter


def _default_filter(unit: str, tokenizer: Any) -> Any:
    """The standard library's token or word filter, built the first time it is needed (and again
    when the one there cannot be reused: written by an earlier memfree, or damaged)."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.errors import DamagedFilterError
    from memfree.filterfile import NgramFilter
    from memfree.units import get_unit

    path, settings = {
        "token": (DEFAULT_FILTER, BuildSettings()),
        "word": (DEFAULT_WORD_FILTER, BuildSettings(unit="word", ngram_size=DEFAULT_WORD_N)),
    }[unit]
    if Path(path).exists():
        try:
            return NgramFilter.open(path)
        except DamagedFilterError as error:  # e.g. an earlier memfree's: this one builds it anew
            print(f"cannot reuse {path} ({error}); building it again", file=sys.stderr)
    print(f"building {path} from stdlib: ...", file=sys.stderr)
    # The token filter is the model's tokenizer's; a word filter reads no tokenizer.
    reads_ids = get_unit(unit).reads_token_ids
    build_filter(["stdlib:"], path, settings, tokenizer=tokenizer if reads_ids else None)
    return NgramFilter.open(path)


def _run_memorization(
    args: argparse.Namespace,
    settings: Any,
    out: Path,
    model: Any,
    tokenizer: Any,
    ngram_filter: Any,
    word_filter: Any,
) -> Any:
    """The experiment's records, under a progress bar (generations: examples x styles x
    defenses; unknown in advance with --per-bucket)."""
    from tqdm import tqdm

    from eval.experiments import run_memorization

    total = settings.num_examples * len(settings.styles) * len(settings.defenses)
    if settings.per_bucket is not None:
        total = 0  # unknown until the corpus is counted
    with (
        tqdm(total=total or None, desc=args.experiment, unit="gen", file=sys.stderr) as bar,
        warnings_to_stderr(),
    ):
        return run_memorization(
            settings,
            out,
            model,
            tokenizer,
            ngram_filter,
            model_name=args.model or DEFAULT_MODEL_NAME,
            progress=bar.update,
            word_filter=word_filter,
            overwrite=args.force,
        )


def _print_summary(summary: Any, settings: Any, words: bool) -> None:
    """The summary's rows (:class:`eval.summary.Summary`) as a table (a words column when a word
    filter counted)."""
    print(
        f"{'style':22s} {'defense':11s} {'verbatim':>9s} {'text':>5s} "
        + (f"{'words':>6s} " if words else "")
        + f"{'approx.':>8s} {'BLEU':>6s} {'edit':>6s}"
    )
    for row in summary.rows:
        print(
            f"{row.style:22s} {row.defense:11s} {row.verbatim_rate:9.0%} "
            + _cell(row.text_verbatim_rate, 5)
            + (_cell(row.word_verbatim_rate, 6) if words else "")
            + f"{row.approximate_rate:8.0%} {row.mean_bleu:6.3f} "
            f"{row.mean_edit_similarity:6.3f}"
        )
    print(
        "verbatim: holds a stored token n-gram in the ids generated; text: in its text tokenized "
        "again (memfree keeps it at 0 too, memfree-ids promises nothing there)"
        + ("; words: holds a stored word n-gram" if words else "")
        + f"; approx.: BLEU > {settings.metrics.bleu_threshold:g} "
        f"({settings.metrics.normalize} normalization)"
    )


def _cell(rate: float | None, width: int) -> str:
    """A rate, or "-" where the run's records do not count it (an older run)."""
    return f"{rate:{width}.0%} " if rate is not None else f"{'-':>{width}s} "


__all__ = [
    "DEFAULT_FILTER",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_STYLES",
    "DEFAULT_UTILITY_TEXTS",
    "DEFAULT_WORD_FILTER",
    "DEFAULT_WORD_N",
    "add_arguments",
    "experiment_defaults",
    "run",
    "settings_from_args",
]
