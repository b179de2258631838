"""What a memorization run's records add up to (Ippolito et al. 2023, Table 2 and Figures 7-8):
one row per (style, defense) and one per (repetition bucket, defense), typed, with the settings
and metric signatures behind them (as sacrebleu's scores carry their signature). Written to
``summary.json`` as they always were."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from eval.defenses import defense_order
from eval.records import MemorizationRecord


@dataclass(frozen=True)
class ScoredRecord:
    """What the summaries read of one record, parsed from a record given as JSON (a line of
    ``records.jsonl``); a field that not every summary reads may be absent (None).

    Attributes: as in :class:`eval.records.MemorizationRecord`.
    """

    style: str
    defense: str
    stored_ngrams: int
    approximately_memorized: bool
    bleu: float
    exact_match: bool | None = None
    edit_similarity: float | None = None
    interventions: int | None = None
    censored: bool | None = None
    bucket: int | None = None
    stored_text_ngrams: int | None = None
    stored_word_ngrams: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoredRecord:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: data[name] for name in names if name in data})


#: A record as the summaries read it: typed, or parsed from its JSON.
Scored: TypeAlias = MemorizationRecord | ScoredRecord


@dataclass(frozen=True)
class SummaryRow:
    """The generations of one style under one defense.

    Attributes:
        style: the style transfer ("original": none).
        defense: the defense (:mod:`eval.defenses`).
        generations: records in the row.
        verbatim_rate: share holding a stored token n-gram in the ids generated.
        exact_match_rate: share reproducing the truth.
        approximate_rate: share approximately memorized (BLEU above the threshold).
        mean_bleu: mean BLEU against the truth.
        mean_edit_similarity: mean edit similarity against the truth.
        mean_interventions: mean decoding steps where the guard removed a token.
        censored_rate: share the censor withheld.
        text_verbatim_rate: share holding a stored token n-gram in the text tokenized again,
            over the records that count it (None: none does, a run before the count existed).
        word_verbatim_rate: share holding a stored word n-gram, over the records that count it
            (None: none does, a run without a word filter).
    """

    style: str
    defense: str
    generations: int
    verbatim_rate: float
    exact_match_rate: float
    approximate_rate: float
    mean_bleu: float
    mean_edit_similarity: float
    mean_interventions: float
    censored_rate: float
    text_verbatim_rate: float | None = None
    word_verbatim_rate: float | None = None

    @classmethod
    def of(cls, style: str, defense: str, members: Sequence[Scored]) -> SummaryRow:
        """The row of ``members``, the records of one style and defense."""
        count = len(members)
        return cls(
            style=style,
            defense=defense,
            generations=count,
            verbatim_rate=sum(r.stored_ngrams > 0 for r in members) / count,
            exact_match_rate=sum(bool(r.exact_match) for r in members) / count,
            approximate_rate=sum(bool(r.approximately_memorized) for r in members) / count,
            mean_bleu=float(np.mean([r.bleu for r in members])),
            mean_edit_similarity=float(np.mean([r.edit_similarity for r in members])),
            mean_interventions=float(np.mean([r.interventions for r in members])),
            censored_rate=sum(bool(r.censored) for r in members) / count,
            **_optional_rates(members),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SummaryRow:
        """A row as ``summary.json`` holds it."""
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields, in the order they are written (an uncounted rate left out)."""
        return _without_none(self.__dict__)


@dataclass(frozen=True)
class BucketRow:
    """The original-style generations of one repetition bucket under one defense.

    Attributes:
        bucket: i, for examples occurring 2^(i/4) to 2^((i+1)/4) times in the corpus.
        defense: the defense (:mod:`eval.defenses`).
        generations: records in the row.
        verbatim_rate, approximate_rate, mean_bleu, text_verbatim_rate, word_verbatim_rate: as
            in :class:`SummaryRow`.
    """

    bucket: int
    defense: str
    generations: int
    verbatim_rate: float
    approximate_rate: float
    mean_bleu: float
    text_verbatim_rate: float | None = None
    word_verbatim_rate: float | None = None

    @property
    def occurrences_from(self) -> float:
        """The fewest occurrences in the bucket, 2^(bucket/4)."""
        return float(2 ** (self.bucket / 4))

    @classmethod
    def of(cls, bucket: int, defense: str, members: Sequence[Scored]) -> BucketRow:
        """The row of ``members``, the records of one bucket and defense."""
        count = len(members)
        return cls(
            bucket=bucket,
            defense=defense,
            generations=count,
            verbatim_rate=sum(r.stored_ngrams > 0 for r in members) / count,
            approximate_rate=sum(bool(r.approximately_memorized) for r in members) / count,
            mean_bleu=float(np.mean([r.bleu for r in members])),
            **_optional_rates(members),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BucketRow:
        """A row as ``summary.json`` holds it (its ``occurrences_from`` follows from the
        bucket)."""
        return cls(**{key: value for key, value in data.items() if key != "occurrences_from"})

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields, in the order they are written (an uncounted rate left out)."""
        data = _without_none(self.__dict__)
        return {"bucket": data.pop("bucket"), "occurrences_from": self.occurrences_from, **data}


@dataclass(frozen=True)
class Summary:
    """A run's summary: its rows, the settings and the metric signatures behind them.

    Attributes:
        settings: the run's settings (``ExperimentSettings.to_dict()``).
        signatures: the metric signatures of its records, sorted (one, unless records of other
            metric settings were mixed).
        rows: one per (style, defense), original style first, defenses in report order.
        buckets: one per (repetition bucket, defense) of the original style, when counted.
    """

    settings: dict[str, Any]
    signatures: tuple[str, ...]
    rows: tuple[SummaryRow, ...]
    buckets: tuple[BucketRow, ...]

    @classmethod
    def of(cls, records: Sequence[MemorizationRecord], settings: dict[str, Any]) -> Summary:
        """The summary of a run's records."""
        return cls(
            settings=settings,
            signatures=tuple(sorted({r.signature for r in records})),
            rows=tuple(summary_rows(records)),
            buckets=tuple(bucket_rows(records)),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """A summary as ``summary.json`` holds it."""
        return cls(
            settings=data["settings"],
            signatures=tuple(data["signatures"]),
            rows=tuple(SummaryRow.from_dict(row) for row in data["rows"]),
            buckets=tuple(BucketRow.from_dict(row) for row in data["buckets"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """What ``summary.json`` holds."""
        return {
            "settings": self.settings,
            "signatures": list(self.signatures),
            "rows": [row.to_dict() for row in self.rows],
            "buckets": [row.to_dict() for row in self.buckets],
        }


def as_records(records: Sequence[Mapping[str, Any]]) -> list[MemorizationRecord]:
    """Records typed once: a :class:`~eval.records.MemorizationRecord` as it is, a record read
    back from ``records.jsonl`` (a dict) parsed."""
    return [
        r if isinstance(r, MemorizationRecord) else MemorizationRecord.from_dict(r) for r in records
    ]


def as_scored(records: Sequence[Mapping[str, Any]]) -> list[Scored]:
    """Records as the summaries read them, typed once: a
    :class:`~eval.records.MemorizationRecord` as it is, a dict parsed (:class:`ScoredRecord`)."""
    return [r if isinstance(r, MemorizationRecord) else ScoredRecord.from_dict(r) for r in records]


def summary_rows(records: Sequence[Scored]) -> list[SummaryRow]:
    """One row per (style, defense): original style first, then styles by name; defenses in
    report order."""
    groups: dict[tuple[str, str], list[Scored]] = defaultdict(list)
    for record in records:
        groups[record.style, record.defense].append(record)
    order = sorted(
        groups,
        key=lambda key: (0 if key[0] == "original" else 1, key[0], defense_order(key[1])),
    )
    return [SummaryRow.of(style, defense, groups[style, defense]) for style, defense in order]


def bucket_rows(records: Sequence[Scored]) -> list[BucketRow]:
    """One row per repetition bucket (the paper's 2^(i/4) buckets) and defense, of the records
    of original prompts whose occurrences were counted."""
    groups: dict[tuple[int, str], list[Scored]] = defaultdict(list)
    for record in records:
        if record.bucket is not None and record.style == "original":
            groups[record.bucket, record.defense].append(record)
    order = sorted(groups, key=lambda key: (key[0], defense_order(key[1])))
    return [BucketRow.of(bucket, defense, groups[bucket, defense]) for bucket, defense in order]


def _optional_rates(members: Sequence[Scored]) -> dict[str, float]:
    """The share of members above 0 in each count a record may lack (a run before it existed,
    or without a word filter), over the members that hold it: a stored token n-gram in the text
    tokenized again, a stored word n-gram."""
    rates = {}
    for rate, counts in (
        ("text_verbatim_rate", [r.stored_text_ngrams for r in members]),
        ("word_verbatim_rate", [r.stored_word_ngrams for r in members]),
    ):
        counted = [count for count in counts if count is not None]
        if counted:
            rates[rate] = sum(count > 0 for count in counted) / len(counted)
    return rates


def _without_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields but the optional rates that were not counted."""
    optional = ("text_verbatim_rate", "word_verbatim_rate")
    return {key: value for key, value in fields.items() if key not in optional or value is not None}


__all__ = [
    "BucketRow",
    "Scored",
    "ScoredRecord",
    "Summary",
    "SummaryRow",
    "as_records",
    "as_scored",
    "bucket_rows",
    "summary_rows",
]
