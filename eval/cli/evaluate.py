"""``memfree eval``: the paper's experiments (discoverable memorization under defenses, style-
transfer prompts, utility impact) on any model, corpus and filter; the embedded defaults (SmolLM2,
the standard library and its filters) when nothing else is given. Defaults: ExperimentSettings."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from memfree.cli.common import disable_download_bars, fail, interrupted, warnings_to_stderr

DEFAULT_FILTER = "out/stdlib.memfree"
DEFAULT_WORD_FILTER = "out/stdlib-words.memfree"
DEFAULT_WORD_N = 6
DEFAULT_STYLES = (
    "original",
    "two_spaces",
    "lower",
    "upper",
    "python_comment",
    "underscore_names",
)
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"  # recorded in results when --model is not given
DEFAULT_UTILITY_TEXTS = 10_000


def experiment_defaults(experiment: str) -> Any:
    """The :class:`~eval.experiments.ExperimentSettings` that ``memfree eval EXPERIMENT`` starts
    from: the dataclass's defaults for "discoverable"; for "styles", every style transfer, the
    word guard among the defenses, and outputs compared as normalized words."""
    from eval.settings import ExperimentSettings

    settings = ExperimentSettings(experiment=experiment)
    if experiment == "styles":
        settings = dataclasses.replace(
            settings,
            styles=DEFAULT_STYLES,
            defenses=("none", "memfree", "word"),
            metrics=dataclasses.replace(settings.metrics, normalize="words"),
        )
    return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Give ``memfree eval``'s parser its description and experiments."""
    parser.description = (
        "Run the MemFree paper's experiments. Without arguments: the default model, prompts from "
        "this Python's standard library, and its filter (built if missing)."
    )
    experiments = parser.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    for name, help_text in (
        ("discoverable", "prompt with k corpus tokens; compare the next m under each defense"),
        ("styles", "the same prompts in other styles (case, spacing, comments, names)"),
    ):
        sub = experiments.add_parser(name, help=help_text, description=help_text)
        _add_memorization_arguments(sub, experiment_defaults(name))
    utility = experiments.add_parser(
        "utility",
        help="how much ordinary text the filter would block (Appendix B.4)",
        description="Share of reference texts holding a stored n-gram, and share of their n-grams "
        "stored.",
    )
    utility.add_argument(
        "texts", nargs="+", metavar="TEXTS", help="reference texts: files, directories, globs"
    )
    utility.add_argument("--filter", default=DEFAULT_FILTER, metavar="FILTER")
    utility.add_argument(
        "--tokenizer",
        default=None,
        help="a token filter's tokenizer (default: the default model's); a word filter needs none",
    )
    utility.add_argument("--text-field", default=experiment_defaults("discoverable").text_field)
    utility.add_argument("--max-texts", type=int, default=DEFAULT_UTILITY_TEXTS)
    utility.add_argument("--json", action="store_true")


def _add_memorization_arguments(sub: argparse.ArgumentParser, defaults: Any) -> None:
    """The options of ``discoverable`` and ``styles``, with ``defaults``' values."""
    from eval.settings import DEFENSES

    _add_inputs(sub, defaults)
    sub.add_argument("--num-examples", type=int, default=defaults.num_examples)
    sub.add_argument(
        "--prompt-tokens",
        type=int,
        default=defaults.prompt_tokens,
        help="k (default %(default)s); where a prompt and m new tokens exceed the model's "
        "context, the prompt is cut from the left, with a warning",
    )
    sub.add_argument(
        "--truth-tokens", type=int, default=defaults.truth_tokens, help="m (default %(default)s)"
    )
    sub.add_argument("--batch-size", type=int, default=defaults.batch_size)
    sub.add_argument("--seed", type=int, default=defaults.seed)
    sub.add_argument("--bleu-threshold", type=float, default=defaults.metrics.bleu_threshold)
    sub.add_argument(
        "--normalize",
        choices=["none", "casefold", "words"],
        default=defaults.metrics.normalize,
        help="what outputs and truths go through before BLEU and edit similarity: none (the "
        "paper), casefold (case and spacing), words (the word unit's normalized words: case, "
        "spacing, punctuation, comment markers and _ vanish); default: %(default)s",
    )
    sub.add_argument(
        "--defenses",
        nargs="+",
        default=list(defaults.defenses),
        choices=list(DEFENSES),
        help="none; censor (reject outputs holding a stored n-gram); memfree (the token "
        "guard); word (the word guard, needs --word-filter)",
    )
    if defaults.experiment == "styles":
        sub.add_argument(
            "--styles",
            nargs="+",
            default=list(defaults.styles),
            help="style names, '+' to combine (see --list-styles)",
        )
        sub.add_argument("--list-styles", action="store_true", help="list styles and exit")
    sub.add_argument(
        "--count-occurrences",
        action="store_true",
        help="count each example's repetitions in the corpus (frequency buckets)",
    )
    sub.add_argument(
        "--per-bucket",
        type=int,
        default=defaults.per_bucket,
        metavar="N",
        help="draw N examples from each repetition bucket (2^(i/4) occurrences) instead "
        "of --num-examples uniform ones",
    )


def _add_inputs(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """Model, filters, corpus and output options of the memorization experiments."""
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument(
        "--filter",
        default=None,
        metavar="FILTER",
        help=f"the corpus's filter (default {DEFAULT_FILTER}, built from stdlib: if missing)",
    )
    parser.add_argument(
        "--word-filter",
        default=None,
        metavar="FILTER",
        help="the corpus's word filter (memfree build --unit word), for the word defense; also "
        "counts each output's stored word n-grams (default with the word defense: "
        f"{DEFAULT_WORD_FILTER}, {DEFAULT_WORD_N}-grams built from stdlib: if missing)",
    )
    parser.add_argument(
        "--corpus", nargs="+", default=list(defaults.corpus), help="where prompts come from"
    )
    parser.add_argument("--text-field", default=defaults.text_field)
    parser.add_argument(
        "--out",
        default=None,
        help="results directory (default out/eval/NAME): a new or empty one, or one of the same "
        "run to resume it",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out that holds no eval results, replacing files of the "
        "names eval writes (report.md, summary.json, plots, ...)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


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
        return fail(str(error))
    if args.corpus != list(experiment_defaults(args.experiment).corpus):
        # The default filters are the standard library's: another corpus needs its own.
        if args.filter is None:
            return fail("give --filter, the filter of your corpus (build it first)")
        if args.word_filter is None and "word" in settings.defenses:
            return fail(
                "the word defense needs --word-filter, the word filter of your corpus (memfree "
                "build CORPUS --unit word), or leave 'word' out of --defenses"
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
        # of other settings in --out, a damaged, duplicate or another run's record.
        return fail(str(error))
    except KeyboardInterrupt:
        return interrupted()
    from eval.report import write_report

    title = f"{args.experiment}: {args.model or 'SmolLM2-135M-Instruct'} on {' '.join(args.corpus)}"
    try:
        summary = write_report(out, records, settings.to_dict(), title)
    except (OSError, ImportError) as error:
        return fail(f"the records are in {out}/records.jsonl, but the report failed: {error}")
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    _print_summary(summary, settings, words=word_filter is not None)
    print(f"records, summary, report and plots in {out}/")
    return 0


def settings_from_args(args: argparse.Namespace) -> Any:
    """The experiment's settings from the command line (ExperimentSettings checks them).

    Raises:
        ValueError: a setting out of range, naming its option.
    """
    from eval.metrics import MetricSettings
    from eval.settings import ExperimentSettings

    settings = ExperimentSettings(
        experiment=args.experiment,
        corpus=tuple(args.corpus),
        num_examples=args.num_examples,
        prompt_tokens=args.prompt_tokens,
        truth_tokens=args.truth_tokens,
        styles=tuple(getattr(args, "styles", ("original",))),
        defenses=tuple(args.defenses),
        seed=args.seed,
        batch_size=args.batch_size,
        count_occurrences=getattr(args, "count_occurrences", False),
        per_bucket=getattr(args, "per_bucket", None),
        text_field=args.text_field,
        metrics=MetricSettings(bleu_threshold=args.bleu_threshold, normalize=args.normalize),
    )
    return settings


def _model_and_filters(args: argparse.Namespace, settings: Any) -> tuple[Any, Any, Any, Any]:
    """The model, its tokenizer, the token filter and the word filter (None when unused).

    The filters named on the command line open, and their units are checked, before the model
    loads; a filter not named is the standard library's, built the first time it is needed.
    Whether the token filter fits the tokenizer, the guard checks.

    Raises:
        ValueError: a filter of the other unit given as --filter or --word-filter.
    """
    from eval.experiments import check_filters
    from memfree.filterfile.native import NgramFilter
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
    """The standard library's token or word filter, built the first time it is needed."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.filterfile.native import NgramFilter
    from memfree.units import get_unit

    path, settings = {
        "token": (DEFAULT_FILTER, BuildSettings()),
        "word": (DEFAULT_WORD_FILTER, BuildSettings(unit="word", ngram_size=DEFAULT_WORD_N)),
    }[unit]
    if not Path(path).exists():
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


def _print_summary(summary: dict[str, Any], settings: Any, words: bool) -> None:
    """The summary's rows as a table (a words column when a word filter counted)."""
    print(
        f"{'style':22s} {'defense':8s} {'verbatim':>9s} {'text':>5s} "
        + (f"{'words':>6s} " if words else "")
        + f"{'approx.':>8s} {'BLEU':>6s} {'edit':>6s}"
    )
    for row in summary["rows"]:
        print(
            f"{row['style']:22s} {row['defense']:8s} {row['verbatim_rate']:9.0%} "
            + _cell(row, "text_verbatim_rate", 5)
            + (_cell(row, "word_verbatim_rate", 6) if words else "")
            + f"{row['approximate_rate']:8.0%} {row['mean_bleu']:6.3f} "
            f"{row['mean_edit_similarity']:6.3f}"
        )
    print(
        "verbatim: holds a stored token n-gram in the ids generated; text: in its text tokenized "
        "again (the token guard promises nothing there)"
        + ("; words: holds a stored word n-gram" if words else "")
        + f"; approx.: BLEU > {settings.metrics.bleu_threshold:g} "
        f"({settings.metrics.normalize} normalization)"
    )


def _cell(row: dict[str, Any], rate: str, width: int) -> str:
    """A rate, or "-" where the run's records do not count it (an older run)."""
    return f"{row[rate]:{width}.0%} " if rate in row else f"{'-':>{width}s} "
