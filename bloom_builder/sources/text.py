"""The plain-text reader: one document per file, long files in line-aligned segments.

A file with a NUL byte near its start is binary and skipped; invalid UTF-8 stops the file there.
"""

from __future__ import annotations

from collections.abc import Iterator

from bloom_builder.segments import Document, cut_point
from bloom_builder.sources.streams import opened, read_bytes
from bloom_builder.sources.work_units import ProblemLog, SourceOptions, WorkUnit

BINARY_PROBE_BYTES = 8192


def read_text(unit: WorkUnit, options: SourceOptions, problems: ProblemLog) -> Iterator[Document]:
    limit, want = options.segment_bytes, max(BINARY_PROBE_BYTES, options.segment_bytes + 1)
    pending: str | None = None  # one segment held back, to learn whether it is the last
    failed = False
    with opened(unit, problems) as stream:
        if stream is None:
            return
        buffer = read_bytes(stream, want, unit, problems)
        if buffer is None or b"\0" in buffer[:BINARY_PROBE_BYTES]:
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
                more = read_bytes(stream, want, unit, problems)
                failed = more is None
                if more is None:
                    break
                at_end, buffer = len(more) < want, buffer + more
    if pending is not None:
        yield Document(pending)
    elif not failed:
        problems.record("empty", unit.path, "the file holds nothing but whitespace")
