"""``memfree eval``: the paper's experiments (discoverable memorization under defenses, style-
transfer prompts, utility impact) on any model, corpus and filter; the embedded defaults (SmolLM2,
the standard library and its filter) when nothing else is given."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
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


def add_parser(commands: Any) -> None:
    """Register ``eval`` and its subcommands."""
    parser = commands.add_parser(
        "eval",
        help="measure memorization the guard does and does not stop",
        description="Run the MemFree paper's experiments. Without arguments: the default model, "
        "prompts from this Python's standard library, and its filter (built if missing).",
    )
    experiments = parser.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    for name, help_text in (
        ("discoverable", "prompt with k corpus tokens; compare the next m under each defense"),
        ("styles", "the same prompts in other styles (case, spacing, comments, names)"),
    ):
        sub = experiments.add_parser(name, help=help_text, description=help_text)
        _common(sub)
        sub.add_argument("--num-examples", type=int, default=50)
        sub.add_argument(
            "--prompt-tokens",
            type=int,
            default=50,
            help="k (default 50); where a prompt and m new tokens exceed the model's context, "
            "the prompt is cut from the left, with a warning",
        )
        sub.add_argument("--truth-tokens", type=int, default=50, help="m (default 50)")
        sub.add_argument("--batch-size", type=int, default=8)
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--bleu-threshold", type=float, default=0.75)
        sub.add_argument(
            "--normalize",
            choices=["none", "casefold", "words"],
            default="none" if name == "discoverable" else "words",
            help="what outputs and truths go through before BLEU and edit similarity: none (the "
            "paper), casefold (case and spacing), words (the word unit's normalized words: case, "
            "spacing, punctuation, comment markers and _ vanish); default: "
            + ("none" if name == "discoverable" else "words"),
        )
        sub.add_argument(
            "--defenses",
            nargs="+",
            default=["none", "censor", "memfree"]
            if name == "discoverable"
            else ["none", "memfree", "word"],
            choices=["none", "censor", "memfree", "word"],
            help="none; censor (reject outputs holding a stored n-gram); memfree (the token "
            "guard); word (the word guard, needs --word-filter)",
        )
        if name == "styles":
            sub.add_argument(
                "--styles",
                nargs="+",
                default=list(DEFAULT_STYLES),
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
            default=None,
            metavar="N",
            help="draw N examples from each repetition bucket (2^(i/4) occurrences) instead "
            "of --num-examples uniform ones",
        )
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
    utility.add_argument("--text-field", default="text")
    utility.add_argument("--max-texts", type=int, default=10_000)
    utility.add_argument("--json", action="store_true")


def _common(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--corpus", nargs="+", default=["stdlib:"], help="where prompts come from")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--out", default=None, help="results directory (default out/eval/NAME)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``memfree eval``; returns the exit status."""
    from memfree.cli import _fail

    if args.experiment == "utility":
        return _run_utility(args)
    if getattr(args, "list_styles", False):
        from eval.styles import available_styles

        for name, description in available_styles().items():
            print(f"{name:20s} {description}")
        return 0
    from eval.experiments import ExperimentSettings
    from eval.metrics import MetricSettings
    from eval.resultfiles import first_unreadable

    unreadable = first_unreadable(args.corpus)
    if unreadable:
        return _fail(unreadable)
    try:
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
        if settings.per_bucket is not None and settings.per_bucket < 1:
            raise ValueError(f"--per-bucket must be >= 1, got {settings.per_bucket}")
    except ValueError as error:
        return _fail(str(error))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from memfree.errors import FilterError
    from memfree.models import ModelNotFoundError, load_model

    if args.corpus != ["stdlib:"]:  # the default filters are the standard library's
        if args.filter is None:
            return _fail("give --filter, the filter of your corpus (build it first)")
        if args.word_filter is None and "word" in settings.defenses:
            return _fail(
                "the word defense needs --word-filter, the word filter of your corpus (memfree "
                "build CORPUS --unit word), or leave 'word' out of --defenses"
            )
    from memfree.filter import NgramFilter

    try:  # the filters named on the command line are checked before the model loads
        given = {
            unit: NgramFilter.open(path)
            for unit, path in (("token", args.filter), ("word", args.word_filter))
            if path is not None
        }
        for unit, opened in given.items():
            if opened.unit != unit:
                option = "--filter" if unit == "token" else "--word-filter"
                raise ValueError(
                    f"{opened.path}: a {opened.unit} filter given as {option}, which takes a "
                    f"{unit} filter"
                    + (" (memfree build CORPUS --unit word)" if unit == "word" else "")
                )
    except (FilterError, OSError, ValueError) as error:
        return _fail(str(error))
    try:
        model, tokenizer = load_model(args.model)
        # Past the checks above, a filter not given is the standard library's.
        ngram_filter = given.get("token") or _default_filter("token", tokenizer)
        word_filter = given.get("word")
        if word_filter is None and "word" in settings.defenses:
            word_filter = _default_filter("word", tokenizer)
    except (ModelNotFoundError, FilterError, OSError, ValueError, ImportError) as error:
        return _fail(str(error))

    from tqdm import tqdm

    from eval.experiments import run_memorization
    from eval.report import write_report
    from memfree.cli_generate import warnings_to_stderr

    out = Path(args.out or f"out/eval/{args.experiment}")
    total = settings.num_examples * len(settings.styles) * len(settings.defenses)
    if settings.per_bucket is not None:
        total = 0  # unknown until the corpus is counted
    try:
        with (
            tqdm(total=total or None, desc=args.experiment, unit="gen", file=sys.stderr) as bar,
            warnings_to_stderr(),
        ):
            records = run_memorization(
                settings,
                out,
                model,
                tokenizer,
                ngram_filter,
                model_name=args.model or "smollm2-135m-instruct",
                progress=bar.update,
                word_filter=word_filter,
            )
    except (ValueError, OSError, ImportError, FilterError) as error:
        return _fail(str(error))
    except KeyboardInterrupt:
        print("memfree: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    title = f"{args.experiment}: {args.model or 'SmolLM2-135M-Instruct'} on {' '.join(args.corpus)}"
    try:
        summary = write_report(out, records, settings.to_dict(), title)
    except (OSError, ImportError) as error:
        return _fail(f"the records are in {out}/records.jsonl, but the report failed: {error}")
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    words = word_filter is not None
    print(
        f"{'style':22s} {'defense':8s} {'verbatim':>9s} "
        + (f"{'words':>6s} " if words else "")
        + f"{'approx.':>8s} {'BLEU':>6s} {'edit':>6s}"
    )
    for row in summary["rows"]:
        print(
            f"{row['style']:22s} {row['defense']:8s} {row['verbatim_rate']:9.0%} "
            + (f"{row.get('word_verbatim_rate', 0.0):6.0%} " if words else "")
            + f"{row['approximate_rate']:8.0%} {row['mean_bleu']:6.3f} "
            f"{row['mean_edit_similarity']:6.3f}"
        )
    if words:
        print(
            "verbatim: holds a stored token n-gram; words: holds a stored word n-gram; approx.: "
            f"BLEU > {settings.metrics.bleu_threshold:g} ({settings.metrics.normalize} "
            "normalization)"
        )
    print(f"records, summary, report and plots in {out}/")
    return 0


def _default_filter(unit: str, tokenizer: Any) -> Any:
    """The standard library's token or word filter, built the first time it is needed."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.filter import NgramFilter

    path = DEFAULT_FILTER if unit == "token" else DEFAULT_WORD_FILTER
    if not Path(path).exists():
        print(f"building {path} from stdlib: ...", file=sys.stderr)
        if unit == "token":
            build_filter(["stdlib:"], path, tokenizer=tokenizer)
        else:
            build_filter(["stdlib:"], path, BuildSettings(unit="word", ngram_size=DEFAULT_WORD_N))
    return NgramFilter.open(path)


def _run_utility(args: argparse.Namespace) -> int:
    from memfree.cli import _fail
    from memfree.errors import FilterError
    from memfree.filter import NgramFilter
    from memfree.tokenizer import TokenizerNotFoundError, load_tokenizer

    if args.max_texts < 1:
        return _fail(f"--max-texts must be >= 1, got {args.max_texts}")
    from eval.resultfiles import first_unreadable

    unreadable = first_unreadable(args.texts)
    if unreadable:
        return _fail(unreadable)
    try:
        ngram_filter = NgramFilter.open(args.filter)
        # A word filter's n-grams are those of the text's normalized words: no tokenizer.
        tokenizer = load_tokenizer(args.tokenizer) if ngram_filter.unit == "token" else None
    except (FileNotFoundError, FilterError, TokenizerNotFoundError) as error:
        return _fail(str(error))
    from memfree.tokenizer import tokenizer_fingerprint

    expected = ngram_filter.metadata.get("tokenizer_fingerprint")
    if (
        tokenizer is not None
        and expected is not None
        and tokenizer_fingerprint(tokenizer) != expected
    ):
        return _fail(
            f"{args.filter}: built with tokenizer {ngram_filter.metadata.get('tokenizer')!r}, "
            "not this one; pass that tokenizer with --tokenizer"
        )
    from bloom_builder.sources import ProblemLog, SourceOptions, discover, read_unit
    from eval.experiments import run_utility
    from eval.sampling import skipped

    options = SourceOptions(text_field=args.text_field)
    problems = ProblemLog()
    texts: list[str] = []
    for unit in discover(args.texts, options, problems):
        for document in read_unit(unit, options, problems):
            texts.append(document.text)
            if len(texts) >= args.max_texts:
                break
        if len(texts) >= args.max_texts:
            break
    if not texts:
        return _fail(f"no readable text in {', '.join(args.texts)}{skipped(problems)}")
    result = run_utility(texts, tokenizer, ngram_filter)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    print(
        f"{result['texts_with_stored_ngram']:,} of {result['texts']:,} texts "
        f"({result['share_of_texts']:.1%}) hold a stored {ngram_filter.n}-gram; "
        f"{result['stored_ngrams']:,} of {result['ngrams']:,} n-grams stored "
        f"({result['share_of_ngrams']:.2%})"
    )
    for example in result["examples"]:
        print(f"  {example['first_stored_ngram']!r} in {example['text'][:80]!r}")
    return 0
