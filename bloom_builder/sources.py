"""Corpus sources: find a corpus's documents, cut them into work units, and stream them back.

Reads plain text, JSON lines, Parquet and Hugging Face ``datasets`` saved to disk, gzip- or
zstd-compressed or not: the input of the n-gram filter build of MemFree decoding (Ippolito et al.,
2023). Whatever cannot be read is counted in a :class:`ProblemLog`, never raised.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import io
import json
import os
import stat
import sysconfig
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

STDLIB = "stdlib:"
KINDS = ("text", "jsonl", "parquet", "dataset")
COMPRESSIONS = ("", "gzip", "zstd")
MAX_EXAMPLES = 3
MIN_CHUNK_BYTES = 1024

_COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_BINARY_PROBE_BYTES = 8192
_COMPRESSION_RATIO = 4  # typical for text; only used to estimate sizes for balancing shards
_DATASET_ROWS_PER_UNIT = 10_000
_BATCH_ROWS = 256
_ZSTD_READ_BYTES = 1 << 16
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number"}


@dataclass(frozen=True)
class SourceOptions:
    """How corpus files are selected and read.

    Attributes:
        text_field: JSONL field, Parquet column or ``datasets`` column holding the text.
        include: fnmatch patterns, matched against a file's path relative to the walked
            directory and against its basename; empty selects every file.
        exclude: fnmatch patterns, applied after ``include``.
        segment_bytes: plain-text files larger than this are read in line-aligned segments.
        split_bytes: uncompressed JSONL files larger than this become several byte-range units.
    """

    text_field: str = "text"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    segment_bytes: int = 8 << 20
    split_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError(
                f"SourceOptions.text_field must name the field holding the text, got "
                f"{self.text_field!r}; pass e.g. text_field='text'"
            )
        for name in ("include", "exclude"):
            patterns = getattr(self, name)
            if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
                raise ValueError(
                    f"SourceOptions.{name} must be a tuple of fnmatch patterns, got "
                    f"{patterns!r}; write {name}=('*.txt',) for a single pattern"
                )
            object.__setattr__(self, name, tuple(patterns))
        for name in ("segment_bytes", "split_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < MIN_CHUNK_BYTES:
                raise ValueError(
                    f"SourceOptions.{name} must be an integer of at least {MIN_CHUNK_BYTES} "
                    f"bytes, got {value!r}; the default is {getattr(SourceOptions, name)}"
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
        size_bytes: estimated (uncompressed) bytes of this unit, for balancing shards.
    """

    path: str
    kind: str
    compression: str
    start: int = 0
    stop: int = -1
    size_bytes: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.compression not in COMPRESSIONS:
            raise ValueError(
                f"work unit {self.path!r}: kind {self.kind!r} / compression {self.compression!r} "
                f"unknown; use a kind in {KINDS} and a compression in {COMPRESSIONS}"
            )
        ranged = self.start != 0 or self.stop != -1
        if self.compression and (self.kind != "text" and self.kind != "jsonl" or ranged):
            raise ValueError(
                f"work unit {self.path!r}: a {self.compression} stream can only be read whole as "
                "text or jsonl; decompress the file to split it or to read it as Parquet"
            )
        if self.start < 0 or -1 < self.stop < self.start:
            raise ValueError(f"work unit {self.path!r}: bad range [{self.start}:{self.stop}]")

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
        counts: problem kind (e.g. "missing", "not utf-8") -> number of occurrences.
        examples: problem kind -> up to ``MAX_EXAMPLES`` strings "where: reason".
    """

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def record(self, kind: str, where: str, reason: str) -> None:
        """Count one problem of ``kind`` at ``where`` (a path, ``path:line``, ...)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        kept = self.examples.setdefault(kind, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append(f"{where}: {reason}")

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
        """JSON-able ``{"counts": {...}, "examples": {...}}``, keys sorted."""
        return {
            "counts": dict(sorted(self.counts.items())),
            "examples": {kind: list(found) for kind, found in sorted(self.examples.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProblemLog:
        """Rebuild a log written by :meth:`to_dict`."""
        if not isinstance(data, dict) or not isinstance(data.get("counts", {}), dict):
            raise ValueError(f"a ProblemLog dict needs 'counts' and 'examples' maps, got {data!r}")
        counts = {str(kind): int(count) for kind, count in data.get("counts", {}).items()}
        examples = {
            str(kind): [str(example) for example in found][:MAX_EXAMPLES]
            for kind, found in dict(data.get("examples", {})).items()
        }
        return cls(counts, examples)


@dataclass(frozen=True)
class Document:
    """One document's text; ``continues`` says the next Document yielded goes on with it."""

    text: str
    continues: bool = False


# ------------------------------------------------------------------------------------------------
# Discovery


def discover(paths: Sequence[str], options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    """Expand files, directories, globs and :data:`STDLIB` into work units, sorted by path.

    Args:
        paths: files, directories (walked recursively, hidden entries skipped, saved datasets
            taken whole), glob patterns (``**`` allowed) or ``"stdlib:"``.
        options: selection and splitting settings.
        problems: receives "missing", "unreadable" and "missing column" entries.

    Returns:
        Units sorted by path then start; a file reached twice appears once.
    """
    if isinstance(paths, str):
        raise ValueError(f"discover() takes a list of paths, got the string {paths!r}; pass [path]")
    chosen: dict[str, tuple[str, bool]] = {}  # real path -> (absolute path, is a dataset)

    def add(path: str, relative: str, is_dataset: bool) -> None:
        names = (relative, os.path.basename(relative))
        if options.include and not _matches(names, options.include):
            return
        if _matches(names, options.exclude):
            return
        absolute = os.path.abspath(path)
        key = os.path.realpath(path)
        if key not in chosen or absolute < chosen[key][0]:
            chosen[key] = (absolute, is_dataset)

    for spec in paths:
        if spec == STDLIB:
            _walk(sysconfig.get_paths()["stdlib"], add, problems, python_only=True)
            continue
        path = os.path.expanduser(spec)
        matches = [path] if os.path.exists(path) else []
        if not matches and glob.has_magic(path):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                problems.record("missing", spec, "the glob pattern matched nothing")
        elif not matches:
            problems.record("missing", spec, "no such file or directory")
        for match in matches:
            if os.path.isdir(match):
                _walk(match, add, problems, python_only=False)
            else:
                add(match, os.path.basename(match), False)
    units: list[WorkUnit] = []
    for absolute, is_dataset in sorted(chosen.values()):
        found = _dataset_units if is_dataset else _file_units
        units.extend(found(absolute, options, problems))
    return units


def _matches(names: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for name in names for pattern in patterns)


def _walk(
    root: str, add: Callable[[str, str, bool], None], problems: ProblemLog, python_only: bool
) -> None:
    """Offer every file under ``root`` to ``add``, and saved datasets as a whole."""
    splits = _dataset_splits(root, problems)
    if splits is not None:
        for split in splits:
            add(split, os.path.relpath(split, os.path.dirname(root)), True)
        return
    skipped = {"site-packages", "dist-packages", "__pycache__"} if python_only else set()

    def unreadable(error: OSError) -> None:
        problems.record("unreadable", str(error.filename or root), _reason(error))

    for directory, subdirectories, files in os.walk(root, onerror=unreadable):
        kept = []
        for name in sorted(subdirectories):
            path = os.path.join(directory, name)
            if name.startswith(".") or name in skipped:
                continue
            splits = _dataset_splits(path, problems)
            if splits is None:
                kept.append(name)
            for split in splits or ():
                add(split, os.path.relpath(split, root), True)
        subdirectories[:] = kept
        for name in sorted(files):
            if not name.startswith(".") and (name.endswith(".py") or not python_only):
                path = os.path.join(directory, name)
                add(path, os.path.relpath(path, root), False)


def _dataset_splits(directory: str, problems: ProblemLog) -> list[str] | None:
    """Directories of the saved ``datasets`` Dataset(s) at ``directory``, or None if none."""
    manifest = os.path.join(directory, "dataset_dict.json")
    if os.path.isfile(manifest):
        try:
            with open(manifest, encoding="utf-8") as handle:
                names = json.load(handle)["splits"]
            return [os.path.join(directory, str(name)) for name in names]
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.record("unreadable", manifest, _reason(error))
            return []
    saved = ("dataset_info.json", "state.json")
    if all(os.path.isfile(os.path.join(directory, name)) for name in saved):
        return [directory]
    return None


def _classify(path: str) -> tuple[str, str]:
    """(kind, compression) from the file name."""
    name = path.lower()
    compression = ""
    for suffix, method in _COMPRESSION_SUFFIXES.items():
        if name.endswith(suffix):
            name, compression = name[: -len(suffix)], method
            break
    if name.endswith(_JSONL_SUFFIXES):
        return "jsonl", compression
    return ("parquet" if name.endswith(".parquet") else "text"), compression


def _file_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    try:
        info = os.stat(path)
    except OSError as error:
        problems.record("unreadable", path, _reason(error))
        return []
    if not stat.S_ISREG(info.st_mode):
        problems.record("unreadable", path, "not a regular file (a device, socket or pipe)")
        return []
    kind, compression = _classify(path)
    size = info.st_size
    if kind == "parquet":
        if compression:
            problems.record("unreadable", path, "compressed Parquet: decompress it first")
            return []
        return _parquet_units(path, options, problems)
    if compression:
        return [WorkUnit(path, kind, compression, size_bytes=size * _COMPRESSION_RATIO)]
    if kind == "jsonl" and size > options.split_bytes:
        step = options.split_bytes
        return [
            WorkUnit(path, kind, "", start, start + step if start + step < size else -1,
                     min(step, size - start))
            for start in range(0, size, step)
        ]  # fmt: skip
    return [WorkUnit(path, kind, "", size_bytes=size)]


def _parquet_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_metadata(path)
        problem = _column_problem(metadata.schema.to_arrow_schema(), options.text_field)
    except (OSError, pa.ArrowException) as error:
        problems.record("unreadable", path, _reason(error))
        return []
    if problem:
        problems.record("missing column", path, problem)
        return []
    return [
        WorkUnit(path, "parquet", "", group, group + 1, metadata.row_group(group).total_byte_size)
        for group in range(metadata.num_row_groups)
    ]


def _dataset_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    dataset = _load_dataset(path, options, problems)
    if dataset is None:
        return []
    rows = dataset.num_rows
    data_bytes = sum(os.path.getsize(name) for name in glob.glob(os.path.join(path, "*.arrow")))
    step = _DATASET_ROWS_PER_UNIT
    return [
        WorkUnit(path, "dataset", "", start, min(start + step, rows),
                 data_bytes * (min(start + step, rows) - start) // rows)
        for start in range(0, rows, step)
    ]  # fmt: skip


def _load_dataset(path: str, options: SourceOptions, problems: ProblemLog) -> Any:
    """The memory-mapped Dataset at ``path`` if it has a string ``text_field`` column, else None."""
    from memfree.errors import require

    require("datasets", "sources")
    import datasets

    try:
        dataset = datasets.load_from_disk(path)
    except Exception as error:  # a damaged directory raises OSError, ValueError, KeyError, ...
        problems.record("unreadable", path, _reason(error))
        return None
    if not isinstance(dataset, datasets.Dataset):
        problems.record("unreadable", path, "a DatasetDict; name one split directory instead")
        return None
    problem = _column_problem(dataset.features.arrow_schema, options.text_field)
    if problem:
        problems.record("missing column", path, problem)
        return None
    return dataset


def _column_problem(schema: Any, column: str) -> str | None:
    """Why ``column`` of an Arrow schema cannot supply text, or None if it can."""
    import pyarrow as pa

    if column not in schema.names:
        return f"no column {column!r}; columns: {', '.join(schema.names)}; set text_field"
    column_type = schema.field(column).type
    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    if str(column_type) not in ("string", "large_string", "string_view"):
        return f"column {column!r} holds {column_type}, not strings; set text_field"
    return None


# ------------------------------------------------------------------------------------------------
# Reading


def read_unit(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> Iterator[Document]:
    """Stream the documents of one unit; memory holds one document, segment or batch at a time.

    Args:
        unit: a unit from :func:`discover` (or built by hand).
        options: the same options that discovered it.
        problems: receives everything skipped: "binary", "not utf-8", "empty", "unreadable",
            "malformed json", "missing field", "missing column".

    Yields:
        Documents in file order. A text file larger than ``segment_bytes`` comes as segments
        split after newlines, all but the last with ``continues=True``.
    """
    readers = {
        "text": _read_text,
        "jsonl": _read_jsonl,
        "parquet": _read_parquet,
        "dataset": _read_dataset,
    }
    yield from readers[unit.kind](unit, options, problems)


def _read_text(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> Iterator[Document]:
    errors = _stream_errors(unit.compression)
    limit = options.segment_bytes
    pending: str | None = None  # held back one segment, to know whether it is the last
    failed = False
    try:
        stream = _open(unit.path, unit.compression)
    except errors as error:
        problems.record("unreadable", unit.path, _reason(error))
        return
    with stream:
        want = max(_BINARY_PROBE_BYTES, limit + 1)
        try:
            buffer = stream.read(want)
        except errors as error:
            problems.record("unreadable", unit.path, _reason(error))
            return
        if b"\0" in buffer[:_BINARY_PROBE_BYTES]:
            where = buffer.index(b"\0")
            problems.record("binary", unit.path, f"NUL byte at offset {where}: not a text file")
            return
        at_end, offset = len(buffer) < want, 0
        while buffer:  # invariant: at_end or len(buffer) > limit
            cut = len(buffer) if at_end and len(buffer) <= limit else _cut_point(buffer, limit)
            try:
                text = buffer[:cut].decode("utf-8")
            except UnicodeDecodeError as error:
                reason = f"invalid UTF-8 at byte {offset + error.start}"
                problems.record("not utf-8", unit.path, reason)
                failed = True
                break
            if offset == 0:
                text = text.removeprefix("\ufeff")
            buffer, offset = buffer[cut:], offset + cut
            if pending is not None:
                yield Document(pending, continues=True)
                pending = text
            elif text.strip():  # leading whitespace-only segments carry no document
                pending = text
            if not at_end and len(buffer) <= limit:
                want = limit + 1 - len(buffer)
                try:
                    more = stream.read(want)
                except errors as error:
                    problems.record("unreadable", unit.path, _reason(error))
                    failed = True
                    break
                at_end, buffer = len(more) < want, buffer + more
    if pending is not None:
        yield Document(pending)
    elif not failed:
        problems.record("empty", unit.path, "the file holds nothing but whitespace")


def _cut_point(buffer: bytes, limit: int) -> int:
    """End of the next segment (at most ``limit`` bytes): after the last newline, else after the
    last space or tab, else at a UTF-8 character boundary. ``buffer`` is longer than ``limit``."""
    newline = buffer.rfind(b"\n", 0, limit)
    if newline >= 0:
        return newline + 1
    space = max(buffer.rfind(b" ", 0, limit), buffer.rfind(b"\t", 0, limit))
    if space >= 0:
        return space + 1
    cut = limit
    while cut > limit - 3 and (buffer[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


def _read_jsonl(
    unit: WorkUnit, options: SourceOptions, problems: ProblemLog
) -> Iterator[Document]:
    errors = _stream_errors(unit.compression)
    position = unit.start
    try:
        stream = _open(unit.path, unit.compression)
    except errors as error:
        problems.record("unreadable", unit.path, _reason(error))
        return
    with stream:
        try:
            if unit.start > 0:  # a line belongs to the unit holding its first byte
                stream.seek(unit.start - 1)
                position += len(stream.readline()) - 1
        except errors as error:
            problems.record("unreadable", unit.path, _reason(error))
            return
        first_byte, first_line, line_count = position, 1 if position == 0 else 0, 0
        while unit.stop < 0 or position < unit.stop:
            try:
                line = stream.readline()
            except errors as error:
                problems.record("unreadable", unit.path, _reason(error))
                return
            if not line:
                return
            line_start, position, line_count = position, position + len(line), line_count + 1
            if not line.strip():
                continue
            text, kind, reason = _parse_line(line, line_start, options.text_field)
            if text is not None:
                yield Document(text)
                continue
            if not first_line:  # counted only when needed: it rereads the file up to here
                first_line = _line_number(unit.path, first_byte)
            problems.record(kind, f"{unit.path}:{first_line + line_count - 1}", reason)


def _parse_line(line: bytes, line_start: int, name: str) -> tuple[str | None, str, str]:
    """(text, "", "") for a good JSONL line, else (None, problem kind, reason)."""
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, "not utf-8", f"invalid UTF-8 at byte {line_start + error.start}"
    try:
        record = json.loads(decoded.removeprefix("\ufeff") if line_start == 0 else decoded)
    except (ValueError, RecursionError) as error:
        return None, "malformed json", _reason(error)
    if not isinstance(record, dict):
        held = _JSON_TYPES.get(type(record), "value")
        return None, "missing field", f"the line holds a JSON {held}, not an object"
    if name not in record:
        fields = ", ".join(list(record)[:8])
        return None, "missing field", f"no field {name!r} (fields: {fields}); set text_field"
    value = record[name]
    if not isinstance(value, str):
        held = _JSON_TYPES.get(type(value), "null" if value is None else "value")
        return None, "missing field", f"field {name!r} holds a JSON {held}, not a string"
    if not value.strip():
        return None, "empty", f"field {name!r} is empty or whitespace"
    return value, "", ""


def _line_number(path: str, offset: int) -> int:
    """1-based number of the line starting at byte ``offset`` of an uncompressed file."""
    newlines = 0
    with open(path, "rb") as handle:
        while offset > 0:
            chunk = handle.read(min(offset, 1 << 20))
            if not chunk:
                break
            newlines, offset = newlines + chunk.count(b"\n"), offset - len(chunk)
    return newlines + 1


def _read_parquet(
    unit: WorkUnit, options: SourceOptions, problems: ProblemLog
) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(unit.path) as parquet:
            problem = _column_problem(parquet.schema_arrow, options.text_field)
            if problem:
                problems.record("missing column", unit.path, problem)
                return
            stop = parquet.num_row_groups if unit.stop < 0 else unit.stop
            row = sum(parquet.metadata.row_group(group).num_rows for group in range(unit.start))
            groups = list(range(unit.start, stop))
            columns = [options.text_field]
            batches = parquet.iter_batches(
                batch_size=_BATCH_ROWS, row_groups=groups, columns=columns, use_threads=False
            )
            for batch in batches:
                for value in batch.column(0).to_pylist():
                    document = _checked(value, f"{unit.path}:row {row}", problems)
                    row += 1
                    if document is not None:
                        yield document
    except (OSError, pa.ArrowException) as error:
        problems.record("unreadable", unit.path, _reason(error))


def _read_dataset(
    unit: WorkUnit, options: SourceOptions, problems: ProblemLog
) -> Iterator[Document]:
    dataset = _load_dataset(unit.path, options, problems)
    if dataset is None:
        return
    stop = dataset.num_rows if unit.stop < 0 else min(unit.stop, dataset.num_rows)
    rows = dataset.select_columns([options.text_field]).select(range(unit.start, stop))
    row = unit.start
    for batch in rows.iter(batch_size=_BATCH_ROWS):
        for value in batch[options.text_field]:
            document = _checked(value, f"{unit.path}:row {row}", problems)
            row += 1
            if document is not None:
                yield document


def _checked(value: Any, where: str, problems: ProblemLog) -> Document | None:
    """A Document for a non-blank string column value; nulls and blanks count as "empty"."""
    if value is None or not str(value).strip():
        problems.record("empty", where, "null value" if value is None else "blank text")
        return None
    return Document(str(value))


# ------------------------------------------------------------------------------------------------
# Byte streams


def _open(path: str, compression: str) -> io.BufferedIOBase:
    if compression == "gzip":
        return gzip.open(path, "rb")
    raw = open(path, "rb")  # noqa: SIM115 - the caller closes it
    if compression == "zstd":
        return io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 20)
    return raw


def _stream_errors(compression: str) -> tuple[type[Exception], ...]:
    """Exceptions that mean a damaged or unreadable byte stream."""
    if compression != "zstd":
        return (OSError, EOFError, zlib.error)
    from memfree.errors import require

    require("zstandard", "sources")
    import zstandard

    return (OSError, EOFError, zstandard.ZstdError)


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class _ZstdReader(io.RawIOBase):
    """Every frame of a zstd stream; unlike ``zstandard``'s stream reader, a truncated last
    frame raises EOFError instead of ending quietly."""

    def __init__(self, raw: io.BufferedIOBase) -> None:
        from memfree.errors import require

        require("zstandard", "sources")
        import zstandard

        super().__init__()
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame: Any = None  # decompressor of the frame being read; None between frames
        self._output = b""
        self._taken = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._taken >= len(self._output):
            compressed = self._raw.read(_ZSTD_READ_BYTES)
            if not compressed:
                if self._frame is not None:
                    raise EOFError("the zstd stream ends inside a frame: the file is truncated")
                return 0
            self._output, self._taken = self._decompress(compressed), 0
        size = min(len(buffer), len(self._output) - self._taken)
        memoryview(buffer).cast("B")[:size] = self._output[self._taken : self._taken + size]
        self._taken += size
        return size

    def _decompress(self, compressed: bytes) -> bytes:
        pieces = []
        while compressed:
            if self._frame is None:
                self._frame = self._decompressor.decompressobj()
            pieces.append(self._frame.decompress(compressed))
            if not self._frame.eof:
                break
            compressed, self._frame = self._frame.unused_data, None
        return b"".join(pieces)

    def close(self) -> None:
        self._raw.close()
        super().close()
