"""What every corpus reader shares: the read options, the work unit, the log of skipped inputs,
and the check of a pre-tokenized document's ids.

A work unit is the piece of a corpus one worker reads on its own; problems are counted, not raised.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bloom_builder.segments import SEGMENT_BYTES
from memfree.errors import SettingError

KINDS = ("text", "jsonl", "parquet", "dataset", "megatron")
COMPRESSIONS = ("", "gzip", "zstd")
MAX_EXAMPLES = 3
MIN_CHUNK_BYTES = 1024


@dataclass(frozen=True)
class SourceOptions:
    """How corpus files are selected and read.

    Attributes:
        text_field: JSONL field, Parquet column or ``datasets`` column holding the text.
        include: fnmatch patterns selecting the files met walking a directory or expanding a glob,
            matched against the path relative to the walked directory and against the basename;
            empty selects every file. Paths named explicitly are always read.
        exclude: fnmatch patterns, applied after ``include``, to the same files.
        segment_bytes: plain-text files larger than this are read in line-aligned segments.
        split_bytes: uncompressed JSONL files larger than this become byte-range units.
        follow_symlinks: follow symbolic links met walking a directory or expanding a glob (each
            file is read once, loops are cut and reported); False skips them and reports each
            one as "symlink". Paths named explicitly are always followed.
        ids_field: Parquet or ``datasets`` column, or JSONL field, of token ids (a pre-tokenized
            corpus: lists of integers), read instead of ``text_field``; None reads text. Plain
            text files have no ids: with it, each is skipped and recorded as "no ids". Megatron
            ``.bin``/``.idx`` datasets are token ids whatever it is.
    """

    text_field: str = "text"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    segment_bytes: int = SEGMENT_BYTES
    split_bytes: int = 64 << 20
    follow_symlinks: bool = True
    ids_field: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text_field, str) or not self.text_field:
            raise SettingError(
                f"SourceOptions.text_field must name the field holding the text, got "
                f"{self.text_field!r}; pass e.g. text_field='text'",
                field="text_field",
            )
        for name in ("include", "exclude"):
            patterns = getattr(self, name)
            if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
                raise SettingError(
                    f"SourceOptions.{name} must be a tuple of fnmatch patterns, got "
                    f"{patterns!r}; write {name}=('*.txt',) for a single pattern",
                    field=name,
                )
            object.__setattr__(self, name, tuple(patterns))
        for name in ("segment_bytes", "split_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < MIN_CHUNK_BYTES:
                raise SettingError(
                    f"SourceOptions.{name} must be an integer >= {MIN_CHUNK_BYTES} bytes, got "
                    f"{value!r}; the default is {getattr(SourceOptions, name)}",
                    field=name,
                )


@dataclass(frozen=True)
class WorkUnit:
    """A piece of the corpus that one worker reads on its own.

    Attributes:
        path: absolute path of the file, or of the dataset directory.
        kind: "text", "jsonl", "parquet" or "dataset".
        compression: "", "gzip" or "zstd".
        start: jsonl: first byte offset; parquet: first row group; dataset: first row.
        stop: exclusive end, in the same unit as ``start``; -1 reads to the end.
        size_bytes: estimated uncompressed bytes of this unit, for balancing shards.
        stamp: for an object on a store, what the store said of it when the build listed it
            (:func:`memfree.storage.stamp`): a reader refuses the object if it was rewritten
            since; a Megatron dataset's: its ``.idx``'s stamp, then its ``.bin``'s; ``()`` for
            a local file.
    """

    path: str
    kind: str
    compression: str
    start: int = 0
    stop: int = -1
    size_bytes: int = 0
    stamp: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        whole_stream = self.kind in ("text", "jsonl") and self.start == 0 and self.stop == -1
        if self.kind not in KINDS or self.compression not in COMPRESSIONS:
            problem = f"kind must be one of {KINDS} and compression one of {COMPRESSIONS}"
        elif self.compression and not whole_stream:
            problem = "a compressed file can only be read whole, as text or jsonl; decompress it"
        elif self.start < 0 or -1 < self.stop < self.start:
            problem = "start must be >= 0 and stop -1 or >= start"
        else:
            return
        raise ValueError(f"bad work unit {self!r}: {problem}")

    def describe(self) -> str:
        """Short human text naming the unit, e.g. ``data.jsonl[0:67108864]``."""
        name = os.path.basename(self.path)
        stop = "" if self.stop < 0 else str(self.stop)
        if self.kind == "parquet":
            groups = str(self.start) if self.stop == self.start + 1 else f"{self.start}:{stop}"
            return f"{name}[row group {groups}]"
        if self.kind == "dataset":
            return f"{name}[rows {self.start}:{stop}]"
        return f"{name}[{self.start}:{stop}]" if self.start or self.stop >= 0 else name


@dataclass
class ProblemLog:
    """Skipped inputs, counted by kind, with the first few examples of each.

    Attributes:
        counts: problem kind (e.g. "missing", "not utf-8") -> occurrences.
        examples: problem kind -> at most ``MAX_EXAMPLES`` strings "where: reason", first seen.
    """

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def record(self, kind: str, where: str, reason: str) -> None:
        """Count one problem of ``kind`` at ``where`` (a path, ``path:line``, ...)."""
        self.merge(ProblemLog({kind: 1}, {kind: [f"{where}: {reason}"]}))

    def merge(self, other: ProblemLog) -> None:
        """Add ``other``'s counts; examples keep this log's first, then ``other``'s, capped."""
        for kind, count in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + count
            kept = self.examples.setdefault(kind, [])
            kept.extend(other.examples.get(kind, [])[: max(0, MAX_EXAMPLES - len(kept))])

    def total(self) -> int:
        """Number of problems of every kind."""
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able ``{"counts": {...}, "examples": {...}}`` with sorted keys."""
        examples = {kind: list(found) for kind, found in sorted(self.examples.items())}
        return {"counts": dict(sorted(self.counts.items())), "examples": examples}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProblemLog:
        """Rebuild a log written by :meth:`to_dict`."""
        if not isinstance(data, dict) or not isinstance(data.get("counts"), dict):
            raise ValueError(f"a ProblemLog dict needs 'counts' and 'examples' maps, got {data!r}")
        counts = {str(kind): int(count) for kind, count in data["counts"].items()}
        examples = dict(data.get("examples") or {})
        return cls(
            counts, {str(k): [str(e) for e in v][:MAX_EXAMPLES] for k, v in examples.items()}
        )


def token_ids(values: list[Any]) -> tuple[np.ndarray | None, str, str]:
    """A pre-tokenized document's ids as int64 `(num_ids,)`, or why its list cannot be ids.

    Every value must be a Python ``int`` that fits in 64 bits: a null (a Parquet list with a
    missing element), a boolean, a float or a string is refused, not converted as numpy would
    (``True`` -> 1, ``2.5`` -> 2, ``"7"`` -> 7), and an id past int64 (a uint64 column's) is out
    of every vocabulary.

    Args:
        values: a list, as JSON or Arrow's ``to_pylist`` gives it.

    Returns:
        ``(ids, "", "")``, or ``(None, kind, reason)`` with kind "bad ids" or "ids out of range"
        and a reason naming the first bad position.
    """
    if set(map(type, values)) == {int}:  # the common case, checked at C speed
        try:
            return np.array(values, dtype=np.int64), "", ""
        except OverflowError:
            pass
    for position, value in enumerate(values):  # find the first bad value, to name it
        if type(value) is not int:
            held = _held(value)
            return None, "bad ids", f"position {position} holds {held}, not an integer token id"
        if not -(1 << 63) <= value < 1 << 63:
            return (
                None,
                "ids out of range",
                f"id {value} at position {position} is outside every tokenizer's vocabulary (it "
                "does not fit in 64 bits); check that --ids-field names the token ids",
            )
    return np.array(values, dtype=np.int64), "", ""


def _held(value: Any) -> str:
    """How a problem names a value that is not a token id."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return f"the number {value!r}"
    names: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), f"a {type(value).__name__}")


def reason(error: BaseException) -> str:
    """How a problem log names an exception: its type and message."""
    return f"{type(error).__name__}: {error}"
