"""The saved Hugging Face ``datasets`` reader: a ``save_to_disk`` directory, memory-mapped.

Each unit is a range of rows; the text column must hold strings (checked as for Parquet).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from typing import Any

from bloom_builder.segments import Document
from bloom_builder.sources.parquet import BATCH_ROWS, checked, column_of, column_problem
from bloom_builder.sources.work_units import ProblemLog, SourceOptions, WorkUnit, reason
from memfree.errors import require

ROWS_PER_UNIT = 10_000


def dataset_splits(directory: str, problems: ProblemLog) -> list[str] | None:
    """Directories of the Dataset(s) saved at ``directory`` by ``save_to_disk``, None if none."""
    manifest = os.path.join(directory, "dataset_dict.json")
    if os.path.isfile(manifest):
        try:
            with open(manifest, encoding="utf-8") as handle:
                return [os.path.join(directory, str(name)) for name in json.load(handle)["splits"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.record("unreadable", manifest, reason(error))
            return []
    saved = [os.path.join(directory, name) for name in ("dataset_info.json", "state.json")]
    return [directory] if all(os.path.isfile(name) for name in saved) else None


def dataset_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    """Work units of :data:`ROWS_PER_UNIT` rows of the dataset saved at ``path``."""
    dataset = load_dataset(path, options, problems)
    rows = 0 if dataset is None else dataset.num_rows
    data_bytes = sum(os.path.getsize(name) for name in glob.glob(os.path.join(path, "*.arrow")))
    bounds = [(a, min(a + ROWS_PER_UNIT, rows)) for a in range(0, rows, ROWS_PER_UNIT)]
    return [WorkUnit(path, "dataset", "", a, b, data_bytes * (b - a) // rows) for a, b in bounds]


def load_dataset(path: str, options: SourceOptions, problems: ProblemLog) -> Any:
    """The memory-mapped Dataset at ``path`` if it has a string ``text_field`` column, else None."""
    require("datasets", "sources")
    import datasets

    try:
        dataset = datasets.load_from_disk(path)
    except Exception as error:  # a damaged directory raises OSError, ValueError, KeyError, ...
        problems.record("unreadable", path, reason(error))
        return None
    if not isinstance(dataset, datasets.Dataset):
        problems.record("unreadable", path, "a DatasetDict; name one of its split directories")
        return None
    problem = column_problem(dataset.features.arrow_schema, *column_of(options))
    if problem:
        problems.record("missing column", path, problem)
    return None if problem else dataset


def read_dataset(
    unit: WorkUnit, options: SourceOptions, problems: ProblemLog
) -> Iterator[Document]:
    """The documents of a dataset unit's rows, in row order."""
    dataset = load_dataset(unit.path, options, problems)
    if dataset is None:
        return
    stop = dataset.num_rows if unit.stop < 0 else min(unit.stop, dataset.num_rows)
    column, ids = column_of(options)
    # Python values whatever format was saved with the dataset: a "numpy" format would give
    # float arrays, with NaN for a missing id, in place of a row's list of ids.
    rows = dataset.select_columns([column]).with_format(None).select(range(unit.start, stop))
    for number, batch in enumerate(rows.iter(batch_size=BATCH_ROWS)):
        for offset, value in enumerate(batch[column]):
            row = unit.start + number * BATCH_ROWS + offset
            yield from checked(value, f"{unit.path}:row {row}", problems, ids)
