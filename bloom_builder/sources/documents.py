"""The documents of a corpus: one reader per unit kind, and :func:`iter_documents`, the one
"discover, then read" loop everything outside the builder's map step uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from bloom_builder.segments import Document
from bloom_builder.sources.discovery import discover
from bloom_builder.sources.jsonl import read_jsonl
from bloom_builder.sources.megatron import read_megatron
from bloom_builder.sources.parquet import read_parquet
from bloom_builder.sources.saved_datasets import read_dataset
from bloom_builder.sources.text import read_text
from bloom_builder.sources.work_units import ProblemLog, SourceOptions, WorkUnit

Reader = Callable[[WorkUnit, SourceOptions, ProblemLog], Iterator[Document]]

# WorkUnit.kind -> the reader of that format (compression is the streams' business).
READERS: dict[str, Reader] = {
    "text": read_text,
    "jsonl": read_jsonl,
    "parquet": read_parquet,
    "dataset": read_dataset,
    "megatron": read_megatron,
}


def read_unit(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> Iterator[Document]:
    """Stream the documents of one unit, holding one document, segment or batch at a time.

    Args:
        unit: a unit from :func:`discover` (or built by hand).
        options: the options that discovered it.
        problems: receives what is skipped: "binary", "not utf-8", "empty", "unreadable",
            "malformed json", "missing field", "missing column".

    Yields:
        Documents in file order. A text file larger than ``segment_bytes`` comes in segments
        that end after a newline, all but the last with ``continues=True``.
    """
    yield from READERS[unit.kind](unit, options, problems)


@dataclass(frozen=True)
class SourcedDocument:
    """A document and where it came from.

    Attributes:
        unit: the work unit that holds it.
        index: its position among the documents (or segments) read from that unit, from 0.
        document: its text, and whether the next document continues it (a long text file's
            segments).
    """

    unit: WorkUnit
    index: int
    document: Document

    @property
    def text(self) -> str:
        """The document's text."""
        return self.document.text


def documents_of(
    units: Iterable[WorkUnit], options: SourceOptions, problems: ProblemLog
) -> Iterator[SourcedDocument]:
    """The documents of already-discovered ``units``, unit by unit, in file order."""
    for unit in units:
        for index, document in enumerate(read_unit(unit, options, problems)):
            yield SourcedDocument(unit, index, document)


def iter_documents(
    paths: Sequence[str],
    options: SourceOptions,
    problems: ProblemLog,
    reserved: Sequence[str] = (),
) -> Iterator[SourcedDocument]:
    """The documents of a corpus: :func:`discover` ``paths``, then read every unit in order.

    Documents are streamed (one unit open at a time), so a caller may stop early. A corpus with
    nothing readable yields nothing; ``problems`` then says why (missing paths, bad files, ...).

    Args:
        paths: files, directories, globs or ``"stdlib:"``, as :func:`discover` takes them.
        options: selection and reading settings.
        problems: receives every skipped path, file, line or row, by kind.
        reserved: paths never read when a walk or a glob meets them (a build's own outputs).

    Yields:
        Each document with its unit and its index within the unit. Long text files come as
        segments (``document.continues``); nothing is cut further here.

    Example:
        >>> problems = ProblemLog()
        >>> for found in iter_documents(["corpus/"], SourceOptions(), problems):  # doctest: +SKIP
        ...     print(found.unit.path, len(found.text))
    """
    yield from documents_of(discover(list(paths), options, problems, reserved), options, problems)
