"""The JSON-lines reader: one document per line's text field (or, with ``ids_field``, its list
of token ids); a unit is a byte range, and a line belongs to the unit holding its first byte.
Bad lines are recorded with their line number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from bloom_builder.segments import Document
from bloom_builder.sources.remote import is_url, open_url
from bloom_builder.sources.streams import opened, read_bytes
from bloom_builder.sources.work_units import ProblemLog, SourceOptions, WorkUnit, reason, token_ids

_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number"}


def read_jsonl(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> Iterator[Document]:
    """The documents of a JSONL unit, in line order.

    With ``options.ids_field``, each line's field must hold a list of integer token ids; each
    document then names its line (``path:LINE``) for the encoder's problems, or, in a later byte
    range of a split file, its first byte (``path:byte OFFSET``: a line number there would cost
    reading the file up to it).
    """
    with opened(unit, problems) as stream:
        if stream is None:
            return
        position = unit.start
        if unit.start > 0:  # a line belongs to the unit holding its first byte: skip the rest
            skipped = read_bytes(stream, -1, unit, problems)  # of the line holding byte start - 1
            if skipped is None:
                return
            position += len(skipped) - 1
        first_byte, first_line, count = position, 1 if position == 0 else 0, 0
        while unit.stop < 0 or position < unit.stop:
            line = read_bytes(stream, -1, unit, problems)
            if not line:
                return
            start, position, count = position, position + len(line), count + 1
            if not line.strip():
                continue
            value, kind, reason = _parse_line(line, start, options)
            if isinstance(value, str):
                yield Document(value)
                continue
            if value is not None:
                line_number = f"{first_line + count - 1}" if unit.start == 0 else f"byte {start}"
                yield Document("", ids=value, where=f"{unit.path}:{line_number}")
                continue
            first_line = first_line or _line_number(unit.path, first_byte)  # rereads: only once
            problems.record(kind, f"{unit.path}:{first_line + count - 1}", reason)


def _parse_line(
    line: bytes, start: int, options: SourceOptions
) -> tuple[str | np.ndarray | None, str, str]:
    """(text or ids, "", "") for a good JSONL line starting at byte ``start``, else
    (None, kind, why)."""
    try:
        record = json.loads(line.decode("utf-8").removeprefix("\ufeff" if start == 0 else ""))
    except UnicodeDecodeError as error:
        return None, "not utf-8", f"invalid UTF-8 at byte {start + error.start}"
    except (ValueError, RecursionError) as error:
        return None, "malformed json", reason(error)
    ids = options.ids_field is not None
    name = options.ids_field if options.ids_field is not None else options.text_field
    value = record.get(name) if isinstance(record, dict) else record
    held = _JSON_TYPES.get(type(value), "null" if value is None else "boolean")
    if not isinstance(record, dict):
        return None, "missing field", f"the line holds a JSON {held}, not an object"
    if name not in record:
        fields = ", ".join(list(record)[:8])
        option = "--ids-field" if ids else "text_field"
        return None, "missing field", f"no field {name!r} (fields: {fields}); set {option}"
    if ids:
        if not isinstance(value, list):
            return (
                None,
                "missing field",
                f"field {name!r} holds a JSON {held}, not a list of token ids",
            )
        if not value:
            return None, "empty", f"field {name!r} holds no token ids"
        array, kind, why = token_ids(value)
        return (array, "", "") if array is not None else (None, kind, why)
    if not isinstance(value, str):
        return None, "missing field", f"field {name!r} holds a JSON {held}, not a string"
    if not value.strip():
        return None, "empty", f"field {name!r} is empty or whitespace"
    return value, "", ""


def _line_number(path: str, offset: int) -> int:
    """1-based number of the line that starts at byte ``offset`` of an uncompressed file."""
    newlines = 0
    try:
        with open_url(path) if is_url(path) else open(path, "rb") as handle:
            while chunk := handle.read(min(offset, 1 << 20)):
                newlines, offset = newlines + chunk.count(b"\n"), offset - len(chunk)
    except OSError:
        pass  # the line number is only for the report
    return newlines + 1
