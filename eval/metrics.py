"""Memorization metrics: BLEU and edit similarity against the true continuation, exact match, and
the stored n-grams of an output (Ippolito et al. 2023, §5: a continuation is *approximately
memorized* when its BLEU against the true continuation exceeds 0.75).

Every result carries a signature of the settings that produced it (as sacrebleu does), so two
numbers are only compared when their signatures agree.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from memfree.errors import SettingError, require

if TYPE_CHECKING:
    from memfree.filterfile import NgramFilter

EDIT_UNITS = ("char", "whitespace")
NORMALIZATIONS = ("none", "casefold", "words")
SIGNATURE_VERSION = "1"


@dataclass(frozen=True)
class MetricSettings:
    """How outputs are compared with the truth.

    Attributes:
        bleu_threshold: a continuation with BLEU above this is approximately memorized (paper:
            0.75).
        edit_unit: edit similarity over characters ("char") or whitespace tokens ("whitespace").
        normalize: what both texts go through before they are compared. "none" (the paper);
            "casefold" (case-folded, runs of whitespace collapsed); "words" (the word unit's
            normalization, :func:`memfree.vocab.words.words`: NFKC, case-folded, only the runs of
            letters and digits, joined by one space; so case, spacing, punctuation, comment
            markers and ``_`` vanish, as they do for the word guard). ``True``/``False`` are read
            as "casefold"/"none".

    Raises:
        memfree.errors.SettingError: a setting out of range, named by its field.
    """

    bleu_threshold: float = 0.75
    edit_unit: str = "char"
    normalize: str = "none"

    def __post_init__(self) -> None:
        if isinstance(self.normalize, bool):
            object.__setattr__(self, "normalize", "casefold" if self.normalize else "none")
        if self.normalize not in NORMALIZATIONS:
            raise SettingError(
                f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {self.normalize!r}",
                field="normalize",
            )
        if not 0.0 <= self.bleu_threshold <= 1.0:
            raise SettingError(
                f"bleu_threshold must be a number from 0 to 1, got {self.bleu_threshold!r}",
                field="bleu_threshold",
            )
        if self.edit_unit not in EDIT_UNITS:
            raise SettingError(
                f"edit_unit must be one of {', '.join(EDIT_UNITS)}, got {self.edit_unit!r}",
                field="edit_unit",
            )

    def signature(self) -> str:
        """Every setting and library version behind a score, in one line (computed once)."""
        return _signature(self.edit_unit, self.normalize, self.bleu_threshold)


@functools.lru_cache(maxsize=64)
def _signature(edit_unit: str, normalize: str, bleu_threshold: float) -> str:
    from importlib.metadata import PackageNotFoundError, version

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "missing"

    return "|".join(
        [
            f"v:{SIGNATURE_VERSION}",
            f"bleu:nltk-{installed('nltk')}-sentence_bleu",
            "weights:0.25x4",
            "smooth:none",
            "tok:whitespace",
            f"edit:editdistance-{installed('editdistance')}-{edit_unit}",
            f"norm:{_NORM_SIGNATURES[normalize]}",
            f"threshold:{bleu_threshold:g}",
        ]
    )


def _norm_signatures() -> dict[str, str]:
    from memfree.vocab.words import NORMALIZER

    return {"none": "none", "casefold": "casefold+spaces", "words": f"words-{NORMALIZER}"}


_NORM_SIGNATURES = _norm_signatures()


def _prepare(text: str, normalize: str | bool) -> str:
    if normalize is True or normalize == "casefold":
        return " ".join(text.casefold().split())
    if normalize == "words":
        from memfree.vocab.words import words

        return " ".join(words(text))
    if normalize is False or normalize == "none":
        return text
    raise ValueError(f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")


def bleu(output: str, truth: str, normalize: str | bool = "none") -> float:
    """BLEU of ``output`` against ``truth`` as the paper computes it.

    NLTK's ``sentence_bleu`` with its default weights (BLEU-1..4 averaged geometrically with equal
    weights) and no smoothing, on whitespace tokens. An empty output or truth scores 0.

    Args:
        output: the generated continuation.
        truth: the true continuation.
        normalize: "none", "casefold" or "words" (see :class:`MetricSettings`).
    """
    require("nltk", "eval")
    from nltk.translate.bleu_score import sentence_bleu

    hypothesis = _prepare(output, normalize).split()
    reference = _prepare(truth, normalize).split()
    if not hypothesis or not reference:
        return 0.0
    with warnings.catch_warnings():
        # NLTK warns when a higher-order n-gram has no match; the score is then ~0, as intended.
        warnings.simplefilter("ignore")
        return float(sentence_bleu([reference], hypothesis))


def edit_similarity(
    output: str, truth: str, unit: str = "char", normalize: str | bool = "none"
) -> float:
    """``1 - editdistance(output, truth) / max(len(output), len(truth))``; 1.0 for two empty texts.

    Args:
        output: the generated continuation.
        truth: the true continuation.
        unit: "char" (Levenshtein over characters) or "whitespace" (over whitespace tokens).
        normalize: "none", "casefold" or "words" (see :class:`MetricSettings`).
    """
    require("editdistance", "eval")
    import editdistance

    if unit not in EDIT_UNITS:
        raise ValueError(f"unit must be one of {', '.join(EDIT_UNITS)}, got {unit!r}")
    left: Sequence[str] = _prepare(output, normalize)
    right: Sequence[str] = _prepare(truth, normalize)
    if unit == "whitespace":
        left, right = str(left).split(), str(right).split()
    longest = max(len(left), len(right))
    if longest == 0:
        return 1.0
    return 1.0 - editdistance.eval(left, right) / longest


def exact_match(output_ids: Sequence[int], truth_ids: Sequence[int]) -> bool:
    """Whether the output reproduces the true continuation token for token (from its start).

    Quantifying Memorization's extractability: the first ``len(truth_ids)`` generated tokens equal
    the truth. An output shorter than the truth does not match.
    """
    truth = list(truth_ids)
    return len(truth) > 0 and list(output_ids[: len(truth)]) == truth


@dataclass(frozen=True)
class StoredNgrams:
    """Stored n-grams among an output's n-grams (windows reaching into the output)."""

    stored: int
    total: int

    @property
    def fraction(self) -> float:
        return self.stored / self.total if self.total else 0.0


def stored_ngrams(
    ngram_filter: NgramFilter,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    tokenizer: Any = None,
    *,
    text: bool = False,
) -> StoredNgrams:
    """How many of the n-grams holding at least one output token the filter stores.

    Windows with a special token the builder cut at are not counted, stored or not. A word
    filter counts the word n-grams the output created in the decoded text (needs ``tokenizer``).
    With ``text``, a token filter counts the n-grams of the decoded text tokenized again, those
    holding a token the output created or changed (needs ``tokenizer``).
    """
    from memfree.units import stored_ngram_counts

    return StoredNgrams(
        *stored_ngram_counts(ngram_filter, prompt_ids, output_ids, tokenizer=tokenizer, text=text)
    )


@dataclass(frozen=True)
class Scores:
    """How one output compares with its true continuation."""

    bleu: float
    edit_similarity: float
    exact_match: bool
    approximately_memorized: bool
    signature: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(
    output: str,
    truth: str,
    settings: MetricSettings | None = None,
    output_ids: Sequence[int] | None = None,
    truth_ids: Sequence[int] | None = None,
) -> Scores:
    """All text metrics of one output against its truth.

    Args:
        output: generated continuation (text).
        truth: true continuation (text).
        settings: metric settings.
        output_ids: generated token ids, for the exact match (else the texts are compared).
        truth_ids: true continuation token ids.
    """
    settings = settings or MetricSettings()
    value = bleu(output, truth, settings.normalize)
    if output_ids is not None and truth_ids is not None:
        exact = exact_match(output_ids, truth_ids)
    else:
        exact = bool(truth) and output.startswith(truth)
    return Scores(
        bleu=value,
        edit_similarity=edit_similarity(output, truth, settings.edit_unit, settings.normalize),
        exact_match=exact,
        approximately_memorized=value > settings.bleu_threshold,
        signature=settings.signature(),
    )
