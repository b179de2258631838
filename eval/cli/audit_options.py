"""The options of ``memfree audit``'s steps (defaults from :class:`~eval.settings.AuditSettings`),
and the AuditSettings a step's parsed options make."""

from __future__ import annotations

import argparse
from typing import Any

from eval.cli.flags import FLAGS, OLD_NAMES

DEFAULT_EXTRACTABLE_OUT = "out/audit/extractable"

_AUDIT_FIELDS = (
    "canary_format",
    "repetitions",
    "canaries_per_repetition",
    "seed",
    "text_field",
    "prompt_lengths",
    "truth_tokens",
    "num_examples",
    "per_bucket",
    "references",
    "max_queries",
)
#: Each option of a step (its argparse dest, from its flag in :data:`eval.cli.flags.FLAGS`) and
#: the AuditSettings field it sets.
OPTION_FIELDS = {FLAGS[name].removeprefix("--").replace("-", "_"): name for name in _AUDIT_FIELDS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Give ``memfree audit``'s parser its description and steps, defaults from AuditSettings."""
    from eval.settings import AuditSettings

    defaults = AuditSettings()
    parser.description = (
        "The Secret Sharer's audit: plant random canaries in a corpus, train on it (outside "
        "memfree), then measure how exposed the canaries are and whether they can be extracted, "
        "with and without the guard."
    )
    steps = parser.add_subparsers(dest="step", metavar="STEP", required=True)
    insert = steps.add_parser("insert", help="plant canaries in a corpus")
    insert.add_argument("corpus", nargs="+", metavar="CORPUS")
    insert.add_argument(
        "-o", "--output", required=True, help="directory for corpus.jsonl + manifest"
    )
    insert.add_argument(
        "--format",
        default=defaults.canary_format,
        help="template with holes: {d..} digits, {a..} letters, {x..} hex, {word}",
    )
    insert.add_argument("--words", default=None, help="file of words for {word} holes")
    insert.add_argument("--repetitions", type=int, nargs="+", default=list(defaults.repetitions))
    insert.add_argument(
        "--per-repetition",
        type=int,
        default=defaults.canaries_per_repetition,
        help="canaries per count",
    )
    insert.add_argument("--seed", type=int, default=defaults.seed)
    insert.add_argument("--text-field", default=defaults.text_field)
    insert.add_argument(
        "--force",
        action="store_true",
        help="replace the manifest.json and corpus.jsonl already in the output directory (the "
        "manifest is the only record of which secrets were planted there)",
    )
    _add_extractable(steps, defaults)
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
        step.add_argument(
            "--out",
            default=None,
            help=f"report directory (default: {name}/ beside the manifest): a new or empty one, "
            f"or an earlier audit {name} report's, which is replaced",
        )
        _add_force(step)
        step.add_argument("--json", action="store_true")
        if name == "exposure":
            step.add_argument("--references", type=int, default=defaults.references)
            step.add_argument("--seed", type=int, default=defaults.seed)
        else:
            step.add_argument("--max-queries", type=int, default=defaults.max_queries)


def _add_extractable(steps: Any, defaults: Any) -> None:
    """The ``extractable`` step; its lengths are named as in ``memfree eval`` (--k/--m too)."""
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
    extractable.add_argument(
        "--prompt-tokens",
        OLD_NAMES["--prompt-tokens"],
        dest="prompt_tokens",
        type=int,
        nargs="+",
        default=list(defaults.prompt_lengths),
        metavar="K",
        help="k, prompt lengths in tokens, one result each (default: "
        + " ".join(str(k) for k in defaults.prompt_lengths)
        + ")",
    )
    extractable.add_argument(
        "--truth-tokens",
        OLD_NAMES["--truth-tokens"],
        dest="truth_tokens",
        type=int,
        default=defaults.truth_tokens,
        metavar="M",
        help="m, tokens after the prompt that greedy decoding must reproduce (default %(default)s)",
    )
    extractable.add_argument("--num-examples", type=int, default=defaults.num_examples)
    extractable.add_argument("--per-bucket", type=int, default=defaults.per_bucket)
    extractable.add_argument("--seed", type=int, default=defaults.seed)
    extractable.add_argument(
        "--out",
        default=DEFAULT_EXTRACTABLE_OUT,
        help="report directory (default %(default)s): a new or empty one, or an earlier audit "
        "extractable report's, which is replaced",
    )
    _add_force(extractable)
    extractable.add_argument("--json", action="store_true")


def _add_force(step: argparse.ArgumentParser) -> None:
    step.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out that holds no report of this step, replacing its "
        "audit.json, audit.md (and exposure.png)",
    )


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~eval.settings.AuditSettings` of a step's parsed options (the fields of other
    steps keep their defaults).

    Raises:
        memfree.errors.SettingError: a setting out of range, named by its field
            (:func:`eval.cli.flags.in_flags` says it in the options' names).
    """
    from eval.settings import AuditSettings

    values = {
        name: getattr(args, option)
        for option, name in OPTION_FIELDS.items()
        if hasattr(args, option)
    }
    for name in ("repetitions", "prompt_lengths"):  # nargs="+" gives lists
        if name in values:
            values[name] = tuple(values[name])
    return AuditSettings(**values)


__all__ = ["DEFAULT_EXTRACTABLE_OUT", "OPTION_FIELDS", "add_arguments", "settings_from_args"]
