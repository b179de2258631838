"""Typed results of the audit (exposure, extraction, k-extractability), each carrying the settings
that produced it and their signature; written to ``audit.json`` as they always were, plus those.

Every class is a frozen dataclass and a read-only mapping over its JSON fields (see
:class:`eval.records.JsonView`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from eval.exposure import RANDOM_GUESSING_MEAN, RANDOM_GUESSING_MEDIAN
from eval.records import JsonView, signature_of


def audit_settings(model: Any, guard: Any, **values: Any) -> tuple[dict[str, Any], str]:
    """The settings of one audit step (its arguments, the model, the guard's filter) and their
    signature (xxh3 of everything but local paths)."""
    config = getattr(model, "config", None)
    settings: dict[str, Any] = {
        **values,
        "model": str(getattr(config, "_name_or_path", "") or type(model).__name__),
        "guarded": guard is not None,
    }
    ngram_filter = getattr(guard, "filter", None)
    if ngram_filter is not None:
        metadata = ngram_filter.metadata
        settings["filter"] = {
            "path": str(ngram_filter.path),
            "unit": ngram_filter.unit,
            "n": ngram_filter.n,
            "bits_xxh3": metadata.get("bits_xxh3"),
        }
    signed = {k: v for k, v in settings.items() if k != "filter"}
    if "filter" in settings:
        signed["filter"] = {k: v for k, v in settings["filter"].items() if k != "path"}
    return settings, signature_of(signed)


class _Row(JsonView):
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True, eq=False)
class CanaryExposure(_Row):
    """One canary's perplexities and exposures (bits)."""

    canary: str
    repetitions: int
    log_perplexity: float
    secret_log_perplexity: float
    rank_exposure: float
    extrapolated_exposure: float | None


@dataclass(frozen=True, eq=False)
class ExposureGroup(JsonView):
    """The canaries inserted the same number of times: their median exposure and the ε bound."""

    repetitions: int
    canaries: int
    median_exposure: float
    quantiles_10_90: tuple[float, float]
    epsilon_lower_bound: float

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["quantiles_10_90"] = list(self.quantiles_10_90)
        return data


@dataclass(frozen=True, eq=False)
class ExposureResult(JsonView):
    """Exposure of every canary (Carlini et al. 2019), by rank and by extrapolation."""

    space_size: int
    references: int
    exact: bool
    guarded: bool
    canaries: tuple[CanaryExposure, ...]
    by_repetitions: tuple[ExposureGroup, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    signature: str = ""

    @property
    def max_exposure(self) -> float:
        import math

        return math.log2(self.space_size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "space_size": self.space_size,
            "max_exposure": self.max_exposure,
            "references": self.references,
            "exact": self.exact,
            "guarded": self.guarded,
            "random_guessing": {"median": RANDOM_GUESSING_MEDIAN, "mean": RANDOM_GUESSING_MEAN},
            "canaries": [row.to_dict() for row in self.canaries],
            "by_repetitions": [group.to_dict() for group in self.by_repetitions],
            "settings": self.settings,
            "signature": self.signature,
        }


@dataclass(frozen=True, eq=False)
class CanaryExtraction(_Row):
    """Whether greedy decoding from a canary's prefix gives its secret."""

    canary: str
    repetitions: int
    greedy_recovered: bool
    greedy_output: str


@dataclass(frozen=True, eq=False)
class ShortestPathSearch(_Row):
    """The best secret of a shortest-path search over the secret space, and its cost."""

    guess: str
    recovered_canary: str | None
    recovered_repetitions: int | None
    queries: int
    brute_force_queries: int


@dataclass(frozen=True, eq=False)
class ExtractionResult(JsonView):
    """Greedy and shortest-path extraction of planted canaries."""

    guarded: bool
    space_size: int
    canaries: tuple[CanaryExtraction, ...]
    shortest_path: ShortestPathSearch
    settings: dict[str, Any] = field(default_factory=dict)
    signature: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "guarded": self.guarded,
            "space_size": self.space_size,
            "canaries": [row.to_dict() for row in self.canaries],
            "shortest_path": self.shortest_path.to_dict(),
            "settings": self.settings,
            "signature": self.signature,
        }


@dataclass(frozen=True, eq=False)
class ExtractableSequence(_Row):
    """One corpus sequence cut at ``k`` prompt tokens, and whether greedy decoding restores it."""

    k: int
    example_id: str
    occurrences: int | None
    bucket: int | None
    extractable: bool


@dataclass(frozen=True, eq=False)
class ExtractableShare(JsonView):
    """The share of extractable sequences for one prompt length, or one repetition bucket."""

    sequences: int
    extractable: float
    k: int | None = None
    bucket: int | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.bucket is None:
            return {"k": self.k, "sequences": self.sequences, "extractable": self.extractable}
        return {
            "bucket": self.bucket,
            "occurrences_from": 2 ** (self.bucket / 4),
            "sequences": self.sequences,
            "extractable": self.extractable,
        }


@dataclass(frozen=True, eq=False)
class ExtractabilityResult(JsonView):
    """k-extractability (Carlini et al. 2022, Definition 3.1) by k and by repetition bucket."""

    guarded: bool
    truth_tokens: int
    by_k: tuple[ExtractableShare, ...]
    by_bucket: tuple[ExtractableShare, ...]
    sequences: tuple[ExtractableSequence, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    signature: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "guarded": self.guarded,
            "truth_tokens": self.truth_tokens,
            "by_k": [row.to_dict() for row in self.by_k],
            "by_bucket": [row.to_dict() for row in self.by_bucket],
            "sequences": [row.to_dict() for row in self.sequences],
            "settings": self.settings,
            "signature": self.signature,
        }


__all__ = [
    "CanaryExposure",
    "CanaryExtraction",
    "ExposureGroup",
    "ExposureResult",
    "ExtractabilityResult",
    "ExtractableSequence",
    "ExtractableShare",
    "ExtractionResult",
    "ShortestPathSearch",
    "audit_settings",
]
