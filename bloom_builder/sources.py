"""Corpus sources: find a corpus's documents, cut them into work units, stream them back.

The input side of the MemFree n-gram filter build (Ippolito et al., 2023): text, JSON lines,
Parquet and saved Hugging Face datasets, gzip/zstd or not. Bad inputs are counted, not raised.
"""

from __future__ import annotations

import contextlib
import errno
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

from bloom_builder.segments import SEGMENT_BYTES, Document, cut_point
from memfree.errors import require

STDLIB = "stdlib:"
KINDS = ("text", "jsonl", "parquet", "dataset")
COMPRESSIONS = ("", "gzip", "zstd")
MAX_EXAMPLES = 3
MIN_CHUNK_BYTES = 1024

_COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_BINARY_PROBE_BYTES = 8192
_COMPRESSION_RATIO = 4  # typical for text; sizes only balance shards
_DATASET_ROWS_PER_UNIT = 10_000
_BATCH_ROWS = 256
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number"}


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
    """

    text_field: str = "text"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    segment_bytes: int = SEGMENT_BYTES
    split_bytes: int = 64 << 20
    follow_symlinks: bool = True

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
                    f"SourceOptions.{name} must be an integer >= {MIN_CHUNK_BYTES} bytes, got "
                    f"{value!r}; the default is {getattr(SourceOptions, name)}"
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
    """

    path: str
    kind: str
    compression: str
    start: int = 0
    stop: int = -1
    size_bytes: int = 0

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


_Documents = Iterator[Document]


def discover(
    paths: Sequence[str],
    options: SourceOptions,
    problems: ProblemLog,
    reserved: Sequence[str] = (),
) -> list[WorkUnit]:
    """Expand files, directories, globs and :data:`STDLIB` into work units.

    Args:
        paths: files; directories (walked recursively, hidden entries skipped, saved datasets
            taken whole); glob patterns (``**`` allowed); ``"stdlib:"`` for the standard library.
        options: selection, splitting and symbolic-link settings.
        problems: receives "missing", "unreadable", "missing column", "symlink" and "symlink loop"
            entries.
        reserved: paths the build writes (its filter, sidecar, work directory): never read when
            a walk or a glob meets them, and not reported (they are not part of the corpus).

    Returns:
        Units sorted by path, then start; a file reached twice (through links too) appears once.
    """
    if isinstance(paths, str):
        raise ValueError(f"discover() takes a list of paths, got the string {paths!r}; pass [path]")
    chosen: dict[str, tuple[str, bool]] = {}  # real path -> (absolute path, is a dataset)
    walk = _Walk(options.follow_symlinks, {os.path.realpath(path) for path in reserved}, problems)

    def add(path: str, relative: str | None, is_dataset: bool) -> None:
        """Take ``path``; ``relative`` (None: named explicitly, always taken) meets the patterns."""
        names = () if relative is None else (relative, os.path.basename(relative))
        if names and options.include and not _matches(names, options.include):
            return
        absolute, key = os.path.abspath(path), os.path.realpath(path)
        if key in walk.reserved:
            return  # the build's own output: never part of the corpus, so not reported either
        if not _matches(names, options.exclude) and (
            key not in chosen or absolute < chosen[key][0]
        ):
            chosen[key] = (absolute, is_dataset)

    for spec in paths:
        path = os.path.expanduser(spec)
        if spec == STDLIB:
            walk.run(sysconfig.get_paths()["stdlib"], add, python_only=True)
        elif os.path.isdir(path):
            walk.run(path, add)
        elif os.path.exists(path):
            add(path, None, False)
        elif glob.has_magic(path):
            matches = sorted(glob.glob(path, recursive=True))
            for match in matches:
                if walk.refuse_link(match):
                    continue
                if os.path.isdir(match):
                    walk.run(match, add)
                else:
                    add(match, os.path.basename(match), False)
            if not matches:
                problems.record("missing", spec, "the glob pattern matched nothing")
        elif os.path.islink(path):
            try:
                os.stat(path)
                problems.record("missing", spec, _dangling(path))
            except OSError as error:
                if error.errno == errno.ELOOP:
                    problems.record("symlink loop", spec, "a symbolic link that leads to itself")
                else:
                    problems.record("missing", spec, _dangling(path))
        else:
            problems.record("missing", spec, "no such file or directory")
    units: list[WorkUnit] = []
    for absolute, is_dataset in sorted(chosen.values()):
        units += (_dataset_units if is_dataset else _file_units)(absolute, options, problems)
    return units


def _matches(names: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for name in names for pattern in patterns)


def _dangling(path: str) -> str:
    return f"a symbolic link to {os.readlink(path)!r}, which does not exist"


@dataclass
class _Walk:
    """Directory walks of one discovery: the symbolic-link policy, and the directories already
    walked (by real path), so that links never make a file read twice or a walk loop."""

    follow: bool
    reserved: set[str]
    problems: ProblemLog
    walked: set[str] = field(default_factory=set)

    def refuse_link(self, path: str) -> bool:
        """True (and recorded) for a symbolic link that the policy does not follow."""
        if self.follow or not os.path.islink(path):
            return False
        target = os.readlink(path)
        reason = f"a symbolic link to {target!r}, not followed (--no-follow-symlinks)"
        self.problems.record("symlink", path, reason)
        return True

    def run(
        self, root: str, add: Callable[[str, str | None, bool], None], python_only: bool = False
    ) -> None:
        """Offer every file under ``root`` to ``add``, and saved datasets as a whole."""
        splits = _dataset_splits(root, self.problems)
        for split in splits or ():
            add(split, None, True)  # a root is named by the user (or matched by a glob)
        if splits is not None:
            return
        skipped = {"site-packages", "dist-packages", "__pycache__"} if python_only else set()
        self.walked.add(os.path.realpath(root))

        def unreadable(error: OSError) -> None:
            self.problems.record("unreadable", str(error.filename or root), _reason(error))

        for directory, subdirectories, files in os.walk(
            root, onerror=unreadable, followlinks=self.follow
        ):
            kept = []
            for name in sorted(set(subdirectories) - skipped):
                path = os.path.join(directory, name)
                if name.startswith(".") or self.refuse_link(path) or not self._enter(path):
                    continue
                splits = _dataset_splits(path, self.problems)
                for split in splits or ():
                    add(split, os.path.relpath(split, root), True)
                if splits is None:
                    kept.append(name)
            subdirectories[:] = kept
            for name in sorted(files):
                path = os.path.join(directory, name)
                if name.startswith(".") or (python_only and not name.endswith(".py")):
                    continue
                if not self.refuse_link(path):
                    add(path, os.path.relpath(path, root), False)

    def _enter(self, path: str) -> bool:
        """Whether to walk the directory ``path``: not reserved, not walked yet, not a loop."""
        real = os.path.realpath(path)
        if real in self.reserved:
            return False  # the build's own work directory
        if os.path.islink(path):
            parent = os.path.realpath(os.path.dirname(path))
            if os.path.commonpath([real, parent]) == real:
                reason = f"a symbolic link back to {real}, which is being read already"
                self.problems.record("symlink loop", path, reason)
                return False
            if real in self.walked:
                return False  # reached before through another path: its files are read once
        self.walked.add(real)
        return True


def _dataset_splits(directory: str, problems: ProblemLog) -> list[str] | None:
    """Directories of the Dataset(s) saved at ``directory`` by ``save_to_disk``, None if none."""
    manifest = os.path.join(directory, "dataset_dict.json")
    if os.path.isfile(manifest):
        try:
            with open(manifest, encoding="utf-8") as handle:
                return [os.path.join(directory, str(name)) for name in json.load(handle)["splits"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.record("unreadable", manifest, _reason(error))
            return []
    saved = [os.path.join(directory, name) for name in ("dataset_info.json", "state.json")]
    return [directory] if all(os.path.isfile(name) for name in saved) else None


def _file_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    try:
        info = os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            problems.record("symlink loop", path, "a symbolic link that leads back to itself")
        elif os.path.islink(path) and isinstance(error, FileNotFoundError):
            problems.record("missing", path, _dangling(path))
        else:
            problems.record("unreadable", path, _reason(error))
        return []
    if not stat.S_ISREG(info.st_mode):
        problems.record("unreadable", path, "not a regular file (a device, socket or pipe)")
        return []
    name, compression = path.lower(), ""
    for suffix, method in _COMPRESSION_SUFFIXES.items():
        if name.endswith(suffix):
            name, compression = name[: -len(suffix)], method
    kind = "jsonl" if name.endswith((".jsonl", ".ndjson", ".json")) else "text"
    size, step = info.st_size, options.split_bytes
    if name.endswith(".parquet"):
        if not compression:
            return _parquet_units(path, options, problems)
        problems.record("unreadable", path, "compressed Parquet: decompress it first")
        return []
    if compression:
        return [WorkUnit(path, kind, compression, size_bytes=size * _COMPRESSION_RATIO)]
    if kind == "jsonl" and size > step:
        bounds = [
            (start, start + step if start + step < size else -1) for start in range(0, size, step)
        ]
        return [WorkUnit(path, kind, "", a, b, (size if b < 0 else b) - a) for a, b in bounds]
    return [WorkUnit(path, kind, "", size_bytes=size)]


def _parquet_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    require("pyarrow", "sources")
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
    groups = range(metadata.num_row_groups)
    sizes = [metadata.row_group(group).total_byte_size for group in groups]
    return [WorkUnit(path, "parquet", "", group, group + 1, sizes[group]) for group in groups]


def _dataset_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    dataset = _load_dataset(path, options, problems)
    rows = 0 if dataset is None else dataset.num_rows
    data_bytes = sum(os.path.getsize(name) for name in glob.glob(os.path.join(path, "*.arrow")))
    bounds = [
        (a, min(a + _DATASET_ROWS_PER_UNIT, rows)) for a in range(0, rows, _DATASET_ROWS_PER_UNIT)
    ]
    return [WorkUnit(path, "dataset", "", a, b, data_bytes * (b - a) // rows) for a, b in bounds]


def _load_dataset(path: str, options: SourceOptions, problems: ProblemLog) -> Any:
    """The memory-mapped Dataset at ``path`` if it has a string ``text_field`` column, else None."""
    require("datasets", "sources")
    import datasets

    try:
        dataset = datasets.load_from_disk(path)
    except Exception as error:  # a damaged directory raises OSError, ValueError, KeyError, ...
        problems.record("unreadable", path, _reason(error))
        return None
    if not isinstance(dataset, datasets.Dataset):
        problems.record("unreadable", path, "a DatasetDict; name one of its split directories")
        return None
    problem = _column_problem(dataset.features.arrow_schema, options.text_field)
    if problem:
        problems.record("missing column", path, problem)
    return None if problem else dataset


def _column_problem(schema: Any, column: str) -> str | None:
    """Why ``column`` of an Arrow schema cannot supply text, or None if it can."""
    import pyarrow as pa

    if column not in schema.names:
        return f"no column {column!r}; columns: {', '.join(schema.names)}; set text_field"
    column_type = schema.field(column).type
    if pa.types.is_dictionary(column_type):
        column_type = column_type.value_type
    if str(column_type) in ("string", "large_string", "string_view"):
        return None
    return f"column {column!r} holds {column_type}, not strings; set text_field"


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
    readers = {"text": _read_text, "jsonl": _read_jsonl, "parquet": _read_parquet}
    yield from readers.get(unit.kind, _read_dataset)(unit, options, problems)


def _read_text(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> _Documents:
    limit, want = options.segment_bytes, max(_BINARY_PROBE_BYTES, options.segment_bytes + 1)
    pending: str | None = None  # one segment held back, to learn whether it is the last
    failed = False
    with _opened(unit, problems) as stream:
        if stream is None:
            return
        buffer = _read(stream, want, unit, problems)
        if buffer is None or b"\0" in buffer[:_BINARY_PROBE_BYTES]:
            if buffer is not None:
                reason = f"NUL byte at offset {buffer.index(0)}: not a text file"
                problems.record("binary", unit.path, reason)
            return
        at_end, offset = len(buffer) < want, 0
        while buffer:  # invariant: at_end or len(buffer) > limit
            cut = len(buffer) if at_end and len(buffer) <= limit else cut_point(buffer, limit)
            try:
                text = buffer[:cut].decode("utf-8")
            except UnicodeDecodeError as error:
                reason = f"invalid UTF-8 at byte {offset + error.start}"
                problems.record("not utf-8", unit.path, reason)
                failed = True
                break
            text = text.removeprefix("\ufeff") if offset == 0 else text
            buffer, offset = buffer[cut:], offset + cut
            if pending is not None:
                yield Document(pending, continues=True)
            if pending is not None or text.strip():  # leading blank segments are dropped
                pending = text
            if not at_end and len(buffer) <= limit:
                want = limit + 1 - len(buffer)
                more = _read(stream, want, unit, problems)
                failed = more is None
                if more is None:
                    break
                at_end, buffer = len(more) < want, buffer + more
    if pending is not None:
        yield Document(pending)
    elif not failed:
        problems.record("empty", unit.path, "the file holds nothing but whitespace")


def _read_jsonl(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> _Documents:
    with _opened(unit, problems) as stream:
        if stream is None:
            return
        position = unit.start
        if unit.start > 0:  # a line belongs to the unit holding its first byte: skip the rest
            skipped = _read(stream, -1, unit, problems)  # of the line holding byte start - 1
            if skipped is None:
                return
            position += len(skipped) - 1
        first_byte, first_line, count = position, 1 if position == 0 else 0, 0
        while unit.stop < 0 or position < unit.stop:
            line = _read(stream, -1, unit, problems)
            if not line:
                return
            start, position, count = position, position + len(line), count + 1
            if not line.strip():
                continue
            text, kind, reason = _parse_line(line, start, options.text_field)
            if text is not None:
                yield Document(text)
                continue
            first_line = first_line or _line_number(unit.path, first_byte)  # rereads: only once
            problems.record(kind, f"{unit.path}:{first_line + count - 1}", reason)


def _parse_line(line: bytes, start: int, name: str) -> tuple[str | None, str, str]:
    """(text, "", "") for a good JSONL line starting at byte ``start``, else (None, kind, why)."""
    try:
        record = json.loads(line.decode("utf-8").removeprefix("\ufeff" if start == 0 else ""))
    except UnicodeDecodeError as error:
        return None, "not utf-8", f"invalid UTF-8 at byte {start + error.start}"
    except (ValueError, RecursionError) as error:
        return None, "malformed json", _reason(error)
    value = record.get(name) if isinstance(record, dict) else record
    held = _JSON_TYPES.get(type(value), "null" if value is None else "boolean")
    if not isinstance(record, dict):
        return None, "missing field", f"the line holds a JSON {held}, not an object"
    if name not in record:
        fields = ", ".join(list(record)[:8])
        return None, "missing field", f"no field {name!r} (fields: {fields}); set text_field"
    if not isinstance(value, str):
        return None, "missing field", f"field {name!r} holds a JSON {held}, not a string"
    if not value.strip():
        return None, "empty", f"field {name!r} is empty or whitespace"
    return value, "", ""


def _line_number(path: str, offset: int) -> int:
    """1-based number of the line that starts at byte ``offset`` of an uncompressed file."""
    newlines = 0
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(min(offset, 1 << 20)):
                newlines, offset = newlines + chunk.count(b"\n"), offset - len(chunk)
    except OSError:
        pass  # the line number is only for the report
    return newlines + 1


def _read_parquet(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> _Documents:
    require("pyarrow", "sources")
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
            groups, columns = list(range(unit.start, stop)), [options.text_field]
            batches = parquet.iter_batches(_BATCH_ROWS, groups, columns, use_threads=False)
            for batch in batches:
                for value in batch.column(0).to_pylist():
                    row += 1
                    yield from _checked(value, f"{unit.path}:row {row - 1}", problems)
    except (OSError, pa.ArrowException) as error:
        problems.record("unreadable", unit.path, _reason(error))


def _read_dataset(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> _Documents:
    dataset = _load_dataset(unit.path, options, problems)
    if dataset is None:
        return
    stop = dataset.num_rows if unit.stop < 0 else min(unit.stop, dataset.num_rows)
    rows = dataset.select_columns([options.text_field]).select(range(unit.start, stop))
    for number, batch in enumerate(rows.iter(batch_size=_BATCH_ROWS)):
        for offset, value in enumerate(batch[options.text_field]):
            row = unit.start + number * _BATCH_ROWS + offset
            yield from _checked(value, f"{unit.path}:row {row}", problems)


def _checked(value: Any, where: str, problems: ProblemLog) -> Iterator[Document]:
    """The Document of a non-blank column value; nulls and blanks are recorded as "empty"."""
    if value is not None and str(value).strip():
        yield Document(str(value))
    else:
        problems.record("empty", where, "null value" if value is None else "blank text")


@contextlib.contextmanager
def _opened(unit: WorkUnit, problems: ProblemLog) -> Iterator[io.BufferedIOBase | None]:
    """The unit's decompressed byte stream at byte max(start - 1, 0); None (recorded) on error."""
    try:
        raw = open(unit.path, "rb")  # noqa: SIM115 - closed below
        raw.seek(max(unit.start - 1, 0) if unit.kind == "jsonl" else 0)
        if unit.compression == "gzip":
            stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb")
        elif unit.compression == "zstd":
            stream = io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 20)
        else:
            stream = raw
    except OSError as error:
        problems.record("unreadable", unit.path, _reason(error))
        yield None
        return
    with raw, stream:
        yield stream


def _read(
    stream: io.BufferedIOBase, size: int, unit: WorkUnit, problems: ProblemLog
) -> bytes | None:
    """``size`` bytes (a line for -1) of ``stream``; None, recorded, if the stream is damaged."""
    try:
        return stream.readline() if size < 0 else stream.read(size)
    except (OSError, EOFError, zlib.error) as error:
        problems.record("unreadable", unit.path, _reason(error))
        return None


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class _ZstdReader(io.RawIOBase):
    """All frames of a zstd stream, failing with OSError where data is corrupt and EOFError where
    the last frame is cut short (zstandard's own stream reader ends quietly there)."""

    def __init__(self, raw: io.BufferedIOBase) -> None:
        require("zstandard", "sources")
        import zstandard

        super().__init__()
        self._error = zstandard.ZstdError
        self._raw, self._decompressor = raw, zstandard.ZstdDecompressor()
        self._frame: Any = None  # decompressor of the frame being read; None between frames
        self._output, self._taken = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._taken >= len(self._output):
            compressed, pieces = self._raw.read(1 << 16), []
            if not compressed and self._frame is not None:
                raise EOFError("the zstd stream ends inside a frame: the file is truncated")
            if not compressed:
                return 0
            while compressed:
                self._frame = self._frame or self._decompressor.decompressobj()
                try:
                    pieces.append(self._frame.decompress(compressed))
                except self._error as error:
                    raise OSError(f"corrupt zstd data: {error}") from error
                if not self._frame.eof:
                    break
                compressed, self._frame = self._frame.unused_data, None
            self._output, self._taken = b"".join(pieces), 0
        size = min(len(buffer), len(self._output) - self._taken)
        memoryview(buffer).cast("B")[:size] = self._output[self._taken : self._taken + size]
        self._taken += size
        return size
