"""The JSON-lines reader: one document per line's text field; a unit is a byte range, and a line
belongs to the unit holding its first byte. Bad lines are recorded with their line number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from bloom_builder.segments import Document
from bloom_builder.sources.streams import opened, read_bytes
from bloom_builder.sources.units import ProblemLog, SourceOptions, WorkUnit, reason

_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number"}


def read_jsonl(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> Iterator[Document]:
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
        return None, "malformed json", reason(error)
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
