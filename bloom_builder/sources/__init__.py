"""Corpus sources, the input side of the MemFree filter build (Ippolito et al., 2023): find a
corpus's text, JSON-lines, Parquet, saved-dataset and Megatron files (gzip/zstd or not) as work
units, and stream their documents (text, or token ids); bad inputs are counted in a ProblemLog,
not raised."""

from __future__ import annotations

from bloom_builder.segments import Document
from bloom_builder.sources.discovery import STDLIB, discover
from bloom_builder.sources.documents import (
    READERS,
    SourcedDocument,
    documents_of,
    iter_documents,
    read_unit,
)
from bloom_builder.sources.work_units import (
    COMPRESSIONS,
    KINDS,
    MAX_EXAMPLES,
    MIN_CHUNK_BYTES,
    ProblemLog,
    SourceOptions,
    WorkUnit,
)

__all__ = [
    "COMPRESSIONS",
    "KINDS",
    "MAX_EXAMPLES",
    "MIN_CHUNK_BYTES",
    "READERS",
    "STDLIB",
    "Document",
    "ProblemLog",
    "SourceOptions",
    "SourcedDocument",
    "WorkUnit",
    "discover",
    "documents_of",
    "iter_documents",
    "read_unit",
]
