"""Typed results of the memorization experiments: one record per generation, and a run's records
with the settings and the signature that produced them (as sacrebleu's results carry theirs).

Each result is a frozen dataclass, parsed once where its file is read (``from_dict``) and read by
its attributes. It is also a read-only mapping over exactly the JSON fields it is written as
(:class:`JsonView`), so that code written against the JSON keeps working: ``record.bleu`` and
``record["bleu"]`` agree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload


class JsonView(Mapping[str, Any]):
    """A read-only mapping over :meth:`to_dict` (the JSON fields the result is written as)."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @functools.cached_property
    def _fields(self) -> dict[str, Any]:
        return self.to_dict()

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


# Fields a record of an older run may lack (RecordLog only requires those the report reads).
_MAY_BE_ABSENT = (
    "source",
    "occurrences",
    "bucket",
    "prompt",
    "truth",
    "censored",
    "ngrams",
    "stored_text_ngrams",
    "text_ngrams",
    "stored_word_ngrams",
    "word_ngrams",
)


@dataclass(frozen=True, eq=False)
class MemorizationRecord(JsonView):
    """One generation of a memorization experiment and how it compares with the truth.

    Attributes:
        example_id: the example (prompt and truth) it continues.
        source: the corpus document the example comes from.
        occurrences: how often the example's text occurs in the corpus (None: not counted).
        bucket: its repetition bucket, 2^(bucket/4) occurrences (None: not counted).
        style: the style transfer applied to prompt and truth ("original": none).
        defense: the defense, a name of :mod:`eval.defenses`.
        prompt: the prompt as text.
        truth: the true continuation as text.
        output: the generated continuation ("" when censored).
        censored: the censor defense withheld the output (it held a stored n-gram).
        bleu: BLEU against the truth.
        edit_similarity: edit similarity against the truth.
        exact_match: the output starts with the truth.
        approximately_memorized: BLEU above the threshold of :attr:`signature`.
        stored_ngrams: stored token n-grams reaching into the output (its token ids).
        ngrams: token n-grams reaching into the output.
        stored_text_ngrams: stored token n-grams of the output's text: the decoded prompt and
            output tokenized again, n-grams holding a token the output created or changed
            (None: not counted, a run before this count existed). The token guard with
            canonical decoding keeps it at 0 too; over the ids only (canonical=False) it promises
            nothing here: a model may spell a stored passage with another token split.
        text_ngrams: token n-grams of the output's text so counted (None: not counted).
        interventions: decoding steps where the guard removed a token.
        signature: every metric setting and library version behind the scores.
        stored_word_ngrams: stored word n-grams the output created (None: no word filter).
        word_ngrams: word n-grams the output created (None: no word filter).
    """

    example_id: str
    style: str
    defense: str
    output: str
    bleu: float
    edit_similarity: float
    exact_match: bool
    approximately_memorized: bool
    stored_ngrams: int
    interventions: int
    signature: str
    source: str | None = None
    occurrences: int | None = None
    bucket: int | None = None
    prompt: str | None = None
    truth: str | None = None
    censored: bool | None = None
    ngrams: int | None = None
    stored_text_ngrams: int | None = None
    text_ngrams: int | None = None
    stored_word_ngrams: int | None = None
    word_ngrams: int | None = None
    absent: frozenset[str] = field(default=frozenset(), repr=False)

    # The order records have always been written in.
    _ORDER = (
        "example_id",
        "source",
        "occurrences",
        "bucket",
        "style",
        "defense",
        "prompt",
        "truth",
        "output",
        "censored",
        "bleu",
        "edit_similarity",
        "exact_match",
        "approximately_memorized",
        "stored_ngrams",
        "ngrams",
        "stored_text_ngrams",
        "text_ngrams",
        "interventions",
        "signature",
        "stored_word_ngrams",
        "word_ngrams",
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemorizationRecord:
        """A record read back from ``records.jsonl`` (checked by :class:`eval.resultfiles.RecordLog`)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"absent"}
        values = {key: data[key] for key in names if key in data}
        return cls(**values, absent=frozenset(k for k in _MAY_BE_ABSENT if k not in data))

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields, in the order and with the keys they are written with."""
        words_counted = self.stored_word_ngrams is not None
        skip = set(self.absent)
        if not words_counted:
            skip |= {"stored_word_ngrams", "word_ngrams"}
        if self.stored_text_ngrams is None:
            skip |= {"stored_text_ngrams", "text_ngrams"}
        return {key: getattr(self, key) for key in self._ORDER if key not in skip}


@dataclass(frozen=True, eq=False)
class MemorizationResults(Sequence[MemorizationRecord]):
    """All records of one run, with what produced them.

    Attributes:
        records: one per (example, style, defense), in the order they were generated.
        settings: the run's settings as recorded in ``settings.json`` (experiment, model, filters).
        signature: the run's fingerprint (xxh3 of settings, model and filter checksums), computed
            once; a result directory holds the records of one signature only.
    """

    records: tuple[MemorizationRecord, ...]
    settings: dict[str, Any]
    signature: str

    @overload
    def __getitem__(self, index: int) -> MemorizationRecord: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[MemorizationRecord]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self.records[index]

    def __len__(self) -> int:
        return len(self.records)

    def __eq__(self, other: object) -> bool:
        """Equal to another run's results with the same records and signature, or to a plain
        sequence of records (typed or as the dicts read back from ``records.jsonl``)."""
        if isinstance(other, MemorizationResults):
            return self.signature == other.signature and list(self) == list(other)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [record.to_dict() for record in self.records]


@dataclass(frozen=True, eq=False)
class StoredNgramExample(JsonView):
    """A text that holds a stored n-gram, quoted by :class:`UtilityResult`."""

    text: str
    first_stored_ngram: str
    stored_ngrams: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, eq=False)
class UtilityResult(JsonView):
    """How much ordinary text a filter would block (Appendix B.4, Table 1).

    Attributes:
        texts: texts read.
        texts_with_stored_ngram: texts holding at least one stored n-gram.
        ngrams: n-grams of all texts.
        stored_ngrams: of those, stored in the filter.
        examples: some texts with stored n-grams.
        settings: the filter (path, unit, n, bits checksum) and the texts' count.
        signature: xxh3 of ``settings``.
    """

    texts: int
    texts_with_stored_ngram: int
    ngrams: int
    stored_ngrams: int
    examples: tuple[StoredNgramExample, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    signature: str = ""

    @property
    def share_of_texts(self) -> float:
        return self.texts_with_stored_ngram / self.texts if self.texts else 0.0

    @property
    def share_of_ngrams(self) -> float:
        return self.stored_ngrams / self.ngrams if self.ngrams else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "texts": self.texts,
            "texts_with_stored_ngram": self.texts_with_stored_ngram,
            "share_of_texts": self.share_of_texts,
            "ngrams": self.ngrams,
            "stored_ngrams": self.stored_ngrams,
            "share_of_ngrams": self.share_of_ngrams,
            "examples": [example.to_dict() for example in self.examples],
            "settings": self.settings,
            "signature": self.signature,
        }


def signature_of(payload: Any) -> str:
    """xxh3-64 of a JSON-able payload with sorted keys: the one way results are signed."""
    import json

    import xxhash

    return xxhash.xxh3_64_hexdigest(json.dumps(payload, sort_keys=True).encode("utf-8"))


__all__ = [
    "JsonView",
    "MemorizationRecord",
    "MemorizationResults",
    "StoredNgramExample",
    "UtilityResult",
    "signature_of",
]
