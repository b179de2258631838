"""The Parquet reader (one document per row of the text column, a row group per unit), and the
two checks every Arrow-backed format shares: can a column supply text, is a value a document.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bloom_builder.segments import Document
from bloom_builder.sources.remote import is_store_failure, is_url, open_url, store_error
from bloom_builder.sources.work_units import ProblemLog, SourceOptions, WorkUnit, reason, token_ids
from memfree.errors import StorageError, require

BATCH_ROWS = 256  # rows converted to Python at once: bounds memory on wide rows


def column_problem(schema: Any, column: str, ids: bool = False) -> str | None:
    """Why ``column`` of an Arrow schema cannot supply text (or, with ``ids``, lists of token
    ids), or None if it can."""
    import pyarrow as pa

    if ids:
        if column not in schema.names:
            return f"no column {column!r}; columns: {', '.join(schema.names)}; set --ids-field"
        column_type = schema.field(column).type
        if (
            pa.types.is_list(column_type)
            or pa.types.is_large_list(column_type)
            or pa.types.is_fixed_size_list(column_type)
        ) and pa.types.is_integer(column_type.value_type):
            return None
        return f"column {column!r} holds {column_type}, not lists of integers; set --ids-field"
    if column not in schema.names:
        return f"no column {column!r}; columns: {', '.join(schema.names)}; set text_field"
    column_type = schema.field(column).type
    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    if str(column_type) in ("string", "large_string", "string_view"):
        return None
    return f"column {column!r} holds {column_type}, not strings; set text_field"


def checked(value: Any, where: str, problems: ProblemLog, ids: bool = False) -> Iterator[Document]:
    """The Document of a non-blank column value; nulls and blanks are recorded as "empty".
    With ``ids``, the value is a list of token ids (a pre-tokenized document); a list holding a
    null, or an id past int64 (a uint64 column), is recorded as "bad ids" or "ids out of range"
    and the document skipped, as the encoder skips ids outside the vocabulary."""
    if ids:
        if not value:
            problems.record("empty", where, "null value" if value is None else "no token ids")
            return
        array, kind, why = token_ids(value)
        if array is None:
            problems.record(kind, where, why)
        else:
            yield Document("", ids=array, where=where)
        return
    if value is not None and str(value).strip():
        yield Document(str(value))
    else:
        problems.record("empty", where, "null value" if value is None else "blank text")


def column_of(options: SourceOptions) -> tuple[str, bool]:
    """The column to read, and whether it holds token ids."""
    if options.ids_field is not None:
        return options.ids_field, True
    return options.text_field, False


def parquet_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    """One work unit per row group of the Parquet file ``path`` (none, recorded, if unusable)."""
    require("pyarrow", "sources")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_metadata(_source(path))
        problem = column_problem(metadata.schema.to_arrow_schema(), *column_of(options))
    except Exception as error:
        if is_url(path) and is_store_failure(error):
            raise store_error(path, "reading its footer", error) from None
        if not isinstance(error, (OSError, pa.ArrowException)):
            raise
        problems.record("unreadable", path, reason(error))
        return []
    if problem:
        problems.record("missing column", path, problem)
        return []
    groups = range(metadata.num_row_groups)
    sizes = [metadata.row_group(group).total_byte_size for group in groups]
    return [WorkUnit(path, "parquet", "", group, group + 1, sizes[group]) for group in groups]


def read_parquet(
    unit: WorkUnit, options: SourceOptions, problems: ProblemLog
) -> Iterator[Document]:
    """The documents of a Parquet unit's row groups, in row order."""
    require("pyarrow", "sources")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(_source(unit.path, unit.stamp)) as parquet:
            problem = column_problem(parquet.schema_arrow, *column_of(options))
            if problem:
                problems.record("missing column", unit.path, problem)
                return
            stop = parquet.num_row_groups if unit.stop < 0 else unit.stop
            row = sum(parquet.metadata.row_group(group).num_rows for group in range(unit.start))
            column, ids = column_of(options)
            groups, columns = list(range(unit.start, stop)), [column]
            batches = parquet.iter_batches(BATCH_ROWS, groups, columns, use_threads=False)
            for batch in batches:
                for value in batch.column(0).to_pylist():
                    row += 1
                    yield from checked(value, f"{unit.path}:row {row - 1}", problems, ids)
    except Exception as error:
        if is_url(unit.path) and is_store_failure(error):
            raise store_error(unit.path, "reading its row groups", error) from None
        if isinstance(error, StorageError) or not isinstance(error, (OSError, pa.ArrowException)):
            raise  # a store that failed, or an object rewritten since the build listed it
        problems.record("unreadable", unit.path, reason(error))


def _source(path: str, expected: tuple[Any, ...] = ()) -> Any:
    """What pyarrow reads: a local path, or a seekable file over an object (ranged reads),
    refused if rewritten since the build listed it (``expected``: its stamp then)."""
    return open_url(path, expected) if is_url(path) else path
