"""The settings of eval's runs, frozen dataclasses validated on creation whose defaults the CLI
shows: the experiments (Ippolito et al. 2023) and the audit (canaries as in "The Secret Sharer";
k-extractability as in "Quantifying Memorization Across Neural Language Models").

A setting out of range raises :class:`memfree.errors.SettingError` naming the field and the value
(``num_examples must be an integer >= 1, got 0``); eval's command line says it in its flags'
names (:data:`eval.cli.flags.FLAGS`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from eval.defenses import DEFENSE_NAMES, is_guarded
from eval.metrics import MetricSettings
from eval.styles import get_style
from memfree.errors import SettingError

# The defenses' names (the registry is eval.defenses), kept under the names they had here.
DEFENSES = DEFENSE_NAMES
GUARDS = tuple(name for name in DEFENSE_NAMES if is_guarded(name))
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
        defenses: names of :mod:`eval.defenses` (:data:`~eval.defenses.DEFENSE_NAMES`).
        seed: sampling seed (prompts and decoding), 0 to 2^32 - 1.
        batch_size: prompts per generate() call.
        count_occurrences: count each example's repetitions in the corpus (frequency buckets).
        per_bucket: instead of ``num_examples`` uniform draws, draw up to this many examples from
            each repetition bucket (2^(i/4) occurrences), as the paper's Figures 7-8 do.
        text_field: JSONL field / Parquet column of the corpus.
        metrics: metric settings.

    Raises:
        memfree.errors.SettingError: a setting out of range (see :meth:`problem`).
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
        _raise(self._problem())

    def problem(self) -> str | None:
        """The first invalid setting, named by its field (``batch_size must be an integer >= 1,
        got 0``), or None. The metric settings check themselves
        (:class:`eval.metrics.MetricSettings`)."""
        return _message(self._problem())

    def _problem(self) -> tuple[str, str] | None:
        """(field, message) of the first invalid setting, or None."""
        if self.experiment not in EXPERIMENTS:
            return "experiment", (
                f"experiment must be one of {', '.join(EXPERIMENTS)}, got {self.experiment!r}"
            )
        unknown = [d for d in self.defenses if d not in DEFENSE_NAMES]
        if unknown or not self.defenses:
            return "defenses", (
                f"defenses must be among {', '.join(DEFENSE_NAMES)}, got {_shown(tuple(unknown))}"
            )
        for style in self.styles:
            try:
                get_style(style)
            except ValueError as error:  # it names the known styles
                return "styles", f"styles: {error}"
        return _first_problem(
            _count_problem("num_examples", self.num_examples),
            _count_problem("prompt_tokens", self.prompt_tokens),
            _count_problem("truth_tokens", self.truth_tokens),
            _count_problem("batch_size", self.batch_size),
            _count_problem("per_bucket", self.per_bucket, optional=True),
            _text_field_problem(self.text_field),
            _seed_problem(self.seed),
        )

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
        memfree.errors.SettingError: a setting out of range (see :meth:`problem`).
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
        _raise(self._problem())

    def problem(self) -> str | None:
        """The first invalid setting, named by its field (``references must be an integer >= 1,
        got 0``), or None. The canary template itself is checked by
        :class:`eval.canary_formats.CanaryFormat`, which knows its holes."""
        return _message(self._problem())

    def _problem(self) -> tuple[str, str] | None:
        """(field, message) of the first invalid setting, or None."""
        return _first_problem(
            _counts_problem("repetitions", self.repetitions),
            _count_problem("canaries_per_repetition", self.canaries_per_repetition),
            _seed_problem(self.seed),
            _text_field_problem(self.text_field),
            _counts_problem("prompt_lengths", self.prompt_lengths),
            _count_problem("truth_tokens", self.truth_tokens),
            _count_problem("num_examples", self.num_examples),
            _count_problem("per_bucket", self.per_bucket, optional=True),
            _count_problem("references", self.references),
            _count_problem("max_queries", self.max_queries),
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values (tuples as lists), to record beside the results."""
        data = asdict(self)
        data["repetitions"] = list(self.repetitions)
        data["prompt_lengths"] = list(self.prompt_lengths)
        return data


#: The largest seed every random generator a run seeds takes (numpy's legacy seed, which
#: transformers' ``set_seed`` sets, is 32 bits; numpy's generators take no negative seed).
MAX_SEED = 2**32 - 1


# Each check gives (field, message) for a bad value, else None.
Problem = tuple[str, str] | None


def _seed_problem(value: Any) -> Problem:
    if not isinstance(value, int) or isinstance(value, bool):
        return "seed", f"seed must be an integer, got {value!r}"
    if not 0 <= value <= MAX_SEED:
        return "seed", f"seed must be from 0 to {MAX_SEED}, got {value}"
    return None


def _count_problem(name: str, value: Any, *, optional: bool = False) -> Problem:
    """A count of at least 1 (None too, when ``optional``)."""
    if (optional and value is None) or _positive(value):
        return None
    return name, f"{name} must be an integer >= 1, got {value!r}"


def _counts_problem(name: str, values: Any) -> Problem:
    """A non-empty tuple of counts of at least 1."""
    if _all_positive(values):
        return None
    return name, f"{name} must be integers >= 1, got {_shown(values)}"


def _text_field_problem(value: str) -> Problem:
    return None if value else ("text_field", "text_field must not be empty")


def _first_problem(*problems: Problem) -> Problem:
    return next((problem for problem in problems if problem is not None), None)


def _message(problem: Problem) -> str | None:
    return problem[1] if problem is not None else None


def _raise(problem: Problem) -> None:
    if problem is not None:
        raise SettingError(problem[1], field=problem[0])


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
