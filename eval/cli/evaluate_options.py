"""The options of ``memfree eval`` (defaults from :class:`~eval.settings.ExperimentSettings`,
as :func:`experiment_defaults` adjusts them per experiment), and the ExperimentSettings its
parsed options make."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

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
    from eval.defenses import DEFENSE_NAMES

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
        choices=list(DEFENSE_NAMES),
        help=_defenses_help(),
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


def _defenses_help() -> str:
    """What each defense is, for ``--defenses``: "none; censor (reject ...); ..."."""
    from eval.defenses import DEFENSE_NAMES, get_defense

    parts = []
    for name in DEFENSE_NAMES:
        defense = get_defense(name)
        about = [defense.summary] if defense.summary else []
        if defense.needs_word_filter:
            about.append("needs --word-filter")
        parts.append(f"{name} ({', '.join(about)})" if about else name)
    return "; ".join(parts)


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


def settings_from_args(args: argparse.Namespace) -> Any:
    """The experiment's settings from the command line (ExperimentSettings checks them).

    Raises:
        memfree.errors.SettingError: a setting out of range, named by its field
            (:func:`eval.cli.flags.in_flags` says it in the options' names).
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


__all__ = [
    "DEFAULT_FILTER",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_STYLES",
    "DEFAULT_UTILITY_TEXTS",
    "DEFAULT_WORD_FILTER",
    "DEFAULT_WORD_N",
    "add_arguments",
    "experiment_defaults",
    "settings_from_args",
]
