"""Typed results of the audit (exposure, extraction, k-extractability), each carrying the settings
that produced it and their signature; written to ``audit.json`` as they always were, plus those.

Every class is a frozen dataclass and a read-only mapping over its JSON fields (see
:class:`eval.records.JsonView`); :func:`audit_result` parses a result given as its JSON, once, so
that the report reads attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
        settings["filter"] = {
            "path": str(ngram_filter.path),
            "unit": ngram_filter.unit,
            "n": ngram_filter.n,
            "bits_xxh3": getattr(ngram_filter.header, "bits_xxh3", None),  # the Bloom layout's
        }
    signed = {k: v for k, v in settings.items() if k != "filter"}
    if "filter" in settings:
        signed["filter"] = {k: v for k, v in settings["filter"].items() if k != "path"}
    return settings, signature_of(signed)


_RowT = TypeVar("_RowT", bound="_Row")


class _Row(JsonView):
    """A flat result: its JSON fields are its dataclass fields."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_RowT], data: Mapping[str, Any]) -> _RowT:
        """The row as ``audit.json`` holds it."""
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        return cls(**{name: data[name] for name in names})


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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExposureGroup:
        low, high = data["quantiles_10_90"]
        return cls(
            data["repetitions"],
            data["canaries"],
            data["median_exposure"],
            (low, high),
            data["epsilon_lower_bound"],
        )

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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExposureResult:
        """The result as ``audit.json`` holds it (see :func:`audit_result`)."""
        return cls(
            space_size=data["space_size"],
            references=data["references"],
            exact=data["exact"],
            guarded=data.get("guarded", False),
            canaries=tuple(CanaryExposure.from_dict(row) for row in data.get("canaries", ())),
            by_repetitions=tuple(ExposureGroup.from_dict(g) for g in data["by_repetitions"]),
            **_signed(data),
        )

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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExtractionResult:
        """The result as ``audit.json`` holds it (see :func:`audit_result`)."""
        return cls(
            guarded=data.get("guarded", False),
            space_size=data.get("space_size", 0),
            canaries=tuple(CanaryExtraction.from_dict(row) for row in data["canaries"]),
            shortest_path=ShortestPathSearch.from_dict(data["shortest_path"]),
            **_signed(data),
        )

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

    @property
    def occurrences_from(self) -> float:
        """A bucket's fewest occurrences, 2^(bucket/4) (0.0 for a prompt length's share)."""
        return 2 ** (self.bucket / 4) if self.bucket is not None else 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExtractableShare:
        return cls(data["sequences"], data["extractable"], data.get("k"), data.get("bucket"))

    def to_dict(self) -> dict[str, Any]:
        if self.bucket is None:
            return {"k": self.k, "sequences": self.sequences, "extractable": self.extractable}
        return {
            "bucket": self.bucket,
            "occurrences_from": self.occurrences_from,
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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExtractabilityResult:
        """The result as ``audit.json`` holds it (see :func:`audit_result`; the command line's
        ``--json`` leaves the sequences out)."""
        return cls(
            guarded=data.get("guarded", False),
            truth_tokens=data["truth_tokens"],
            by_k=tuple(ExtractableShare.from_dict(row) for row in data["by_k"]),
            by_bucket=tuple(ExtractableShare.from_dict(row) for row in data["by_bucket"]),
            sequences=tuple(
                ExtractableSequence.from_dict(row) for row in data.get("sequences") or ()
            ),
            **_signed(data),
        )

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


AuditResult = ExposureResult | ExtractionResult | ExtractabilityResult

#: Each audit step's result, and the section of its JSON that only it holds.
RESULT_SECTIONS: tuple[tuple[type[AuditResult], str], ...] = (
    (ExposureResult, "by_repetitions"),
    (ExtractionResult, "shortest_path"),
    (ExtractabilityResult, "by_k"),
)


def audit_result(part: AuditResult | Mapping[str, Any]) -> AuditResult:
    """A step's result, typed: as it is, or parsed from its JSON (``audit.json``'s, or a
    result's ``to_dict()``), told apart by the section only that step's results hold.

    Fields the report does not read may be absent from the JSON (``guarded``, ``settings``,
    ``signature``, the per-canary or per-sequence rows): they take their defaults.

    Raises:
        ValueError: the JSON holds no step's section.
        KeyError: a field the report reads is missing.
    """
    if isinstance(part, (ExposureResult, ExtractionResult, ExtractabilityResult)):
        return part
    for result_type, section in RESULT_SECTIONS:
        if section in part:
            return result_type.from_dict(part)
    raise ValueError("results of no audit step (exposure, extract, extractable)")


def _signed(data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings and signature of a result's JSON (absent: empty)."""
    return {"settings": data.get("settings", {}), "signature": data.get("signature", "")}


__all__ = [
    "RESULT_SECTIONS",
    "AuditResult",
    "CanaryExposure",
    "CanaryExtraction",
    "ExposureGroup",
    "ExposureResult",
    "ExtractabilityResult",
    "ExtractableSequence",
    "ExtractableShare",
    "ExtractionResult",
    "ShortestPathSearch",
    "audit_result",
    "audit_settings",
]
