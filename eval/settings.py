"""The settings of eval's runs, frozen dataclasses validated on creation whose defaults the CLI
shows: the experiments (Ippolito et al. 2023) and the audit (canaries as in "The Secret Sharer";
k-extractability as in "Quantifying Memorization Across Neural Language Models")."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from eval.metrics import MetricSettings
from eval.styles import get_style

DEFENSES = ("none", "censor", "memfree", "word")
GUARDS = ("memfree", "word")  # defenses that generate with a guard
EXPERIMENTS = ("discoverable", "styles")


@dataclass(frozen=True)
class ExperimentSettings:
    """Everything that decides an experiment's records (recorded in its summary).

    Attributes:
        experiment: "discoverable" (defenses on original prompts) or "styles" (style-transferred
            prompts, with and without the guard).
        corpus: where prompts are drawn from (``memfree build`` inputs).
        num_examples: prompts drawn.
        prompt_tokens: k, prompt length in tokens (paper: 50).
        truth_tokens: m, true continuation length and new tokens generated (paper: 50).
        styles: style names (``+`` combines them).
        defenses: among "none", "censor" (reject a generation holding a stored n-gram, as a
            Copilot-style output filter does), "memfree" (the token guard) and "word" (the word
            guard, with a word filter: robust to case, spacing and punctuation).
        seed: sampling seed (prompts and decoding), 0 to 2^32 - 1.
        batch_size: prompts per generate() call.
        count_occurrences: count each example's repetitions in the corpus (frequency buckets).
        per_bucket: instead of ``num_examples`` uniform draws, draw up to this many examples from
            each repetition bucket (2^(i/4) occurrences), as the paper's Figures 7-8 do.
        text_field: JSONL field / Parquet column of the corpus.
        metrics: metric settings.
    """

    experiment: str = "discoverable"
    corpus: tuple[str, ...] = ("stdlib:",)
    num_examples: int = 50
    prompt_tokens: int = 50
    truth_tokens: int = 50
    styles: tuple[str, ...] = ("original",)
    defenses: tuple[str, ...] = ("none", "censor", "memfree")
    seed: int = 0
    batch_size: int = 8
    count_occurrences: bool = False
    per_bucket: int | None = None
    text_field: str = "text"
    metrics: MetricSettings = field(default_factory=MetricSettings)

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """The first invalid setting, phrased for the command line (``memfree eval``), or None.

        The metric settings check themselves (:class:`eval.metrics.MetricSettings`).
        """
        if self.experiment not in EXPERIMENTS:
            return (
                f"the experiment must be one of {', '.join(EXPERIMENTS)}, got {self.experiment!r}"
            )
        unknown = [d for d in self.defenses if d not in DEFENSES]
        if unknown or not self.defenses:
            return f"--defenses must be among {', '.join(DEFENSES)}, got {_shown(tuple(unknown))}"
        for style in self.styles:
            try:
                get_style(style)
            except ValueError as error:  # it names the known styles
                return f"--styles: {error}"
        for option, value in (
            ("--num-examples", self.num_examples),
            ("--prompt-tokens", self.prompt_tokens),
            ("--truth-tokens", self.truth_tokens),
            ("--batch-size", self.batch_size),
        ):
            if not _positive(value):
                return f"{option} must be an integer >= 1, got {value!r}"
        if self.per_bucket is not None and not _positive(self.per_bucket):
            return f"--per-bucket must be an integer >= 1, got {self.per_bucket!r}"
        if not self.text_field:
            return "--text-field must not be empty"
        return _seed_problem(self.seed)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["metrics"]["signature"] = self.metrics.signature()
        return data


def settings_fingerprint(
    settings: ExperimentSettings,
    filter_metadata: dict[str, Any],
    model_name: str,
    word_metadata: dict[str, Any] | None = None,
) -> str:
    """The fingerprint of an experiment run (settings, model, filter checksums): a result
    directory holds the records of one fingerprint only."""
    import xxhash

    data = settings.to_dict()
    # Written as the bool it was before "words" existed, so that older result directories resume.
    if data["metrics"]["normalize"] in ("none", "casefold"):
        data["metrics"]["normalize"] = data["metrics"]["normalize"] == "casefold"
    payload = {
        "settings": data,
        "model": model_name,
        "filter": filter_metadata.get("bits_xxh3"),
        "tokenizer": filter_metadata.get("tokenizer_fingerprint"),
    }
    if word_metadata is not None:  # absent before word filters existed: old runs still resume
        payload["word_filter"] = word_metadata.get("bits_xxh3")
    return xxhash.xxh3_64_hexdigest(json.dumps(payload, sort_keys=True).encode())


#: The Secret Sharer's canary: a social-security-number-like secret of 9 digits (|R| = 10^9).
DEFAULT_CANARY_FORMAT = "my social security number is {ddd}-{dd}-{dddd}"


@dataclass(frozen=True)
class AuditSettings:
    """Everything that decides what an audit step measures.

    ``insert`` reads the canary fields, ``exposure`` ``references`` and ``seed``, ``extract``
    ``max_queries``, and ``extractable`` the length, sampling and ``seed`` fields; a field a step
    does not read keeps its default.

    Attributes:
        canary_format: the canaries' template, with holes ``{d..}`` (digits), ``{a..}``
            (letters), ``{x..}`` (hex digits) or ``{word}`` (``--format``).
        repetitions: how many times each group of canaries is planted (``--repetitions``).
        canaries_per_repetition: canaries planted per repetition count (``--per-repetition``).
        seed: random seed of the planted secrets and places, of the sampled references, and of
            the sequences drawn for k-extractability, 0 to 2^32 - 1 (``--seed``).
        text_field: JSONL field / Parquet column of the corpus, and of the planted corpus
            (``--text-field``).
        prompt_lengths: k, the prompt lengths in tokens whose extractability is measured
            (``--prompt-tokens``, alias ``--k``; paper: 50).
        truth_tokens: m, the continuation that greedy decoding must reproduce, in tokens
            (``--truth-tokens``, alias ``--m``; paper: 50).
        num_examples: corpus sequences drawn per prompt length (``--num-examples``).
        per_bucket: instead of ``num_examples`` uniform draws, up to this many sequences from each
            repetition bucket (2^(i/4) occurrences); None: uniform draws (``--per-bucket``).
        references: random secrets the canaries are ranked against for their exposure
            (``--references``; all of R when R is smaller).
        max_queries: the shortest-path extraction's budget of model queries (``--max-queries``).

    Raises:
        ValueError: a setting out of range, naming its command-line option (see :meth:`problem`).
    """

    canary_format: str = DEFAULT_CANARY_FORMAT
    repetitions: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    canaries_per_repetition: int = 1
    seed: int = 0
    text_field: str = "text"
    prompt_lengths: tuple[int, ...] = (10, 25, 50)
    truth_tokens: int = 50
    num_examples: int = 50
    per_bucket: int | None = None
    references: int = 10_000
    max_queries: int = 100_000

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """The first invalid setting, phrased for the command line, or None.

        The canary template itself is checked by :class:`eval.canary_formats.CanaryFormat`, which
        knows its holes.
        """
        if not _all_positive(self.repetitions):
            return f"--repetitions must be integers >= 1, got {_shown(self.repetitions)}"
        if not _positive(self.canaries_per_repetition):
            return f"--per-repetition must be an integer >= 1, got {self.canaries_per_repetition!r}"
        seed_problem = _seed_problem(self.seed)
        if seed_problem:
            return seed_problem
        if not self.text_field:
            return "--text-field must not be empty"
        if not _all_positive(self.prompt_lengths):
            return f"--prompt-tokens (--k) must be integers >= 1, got {_shown(self.prompt_lengths)}"
        if not _positive(self.truth_tokens):
            return f"--truth-tokens (--m) must be an integer >= 1, got {self.truth_tokens!r}"
        if not _positive(self.num_examples):
            return f"--num-examples must be an integer >= 1, got {self.num_examples!r}"
        if self.per_bucket is not None and not _positive(self.per_bucket):
            return f"--per-bucket must be an integer >= 1, got {self.per_bucket!r}"
        if not _positive(self.references):
            return f"--references must be an integer >= 1, got {self.references!r}"
        if not _positive(self.max_queries):
            return f"--max-queries must be an integer >= 1, got {self.max_queries!r}"
        return None

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values (tuples as lists), to record beside the results."""
        data = asdict(self)
        data["repetitions"] = list(self.repetitions)
        data["prompt_lengths"] = list(self.prompt_lengths)
        return data


#: The largest seed every random generator a run seeds takes (numpy's legacy seed, which
#: transformers' ``set_seed`` sets, is 32 bits; numpy's generators take no negative seed).
MAX_SEED = 2**32 - 1


def _seed_problem(value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"--seed must be an integer, got {value!r}"
    if not 0 <= value <= MAX_SEED:
        return f"--seed must be from 0 to {MAX_SEED}, got {value}"
    return None


def _positive(value: Any) -> bool:
    # bool is an int subclass, but True is no count.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _all_positive(values: Any) -> bool:
    return isinstance(values, tuple) and bool(values) and all(_positive(v) for v in values)


def _shown(values: Any) -> str:
    """Values as they were typed: ``0 4`` for (0, 4)."""
    if isinstance(values, tuple):
        return " ".join(str(value) for value in values) or "nothing"
    return repr(values)
