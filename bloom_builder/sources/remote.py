"""Corpora on object storage: ``s3://bucket/web/**/*.jsonl.gz`` and every fsspec protocol whose
package is installed (``gs://`` with gcsfs, ``az://`` with adlfs, ``hf://``...), read through
fsspec the way datatrove reads them.

A corpus URL is listed through the store (a glob, or every object under a prefix), each object
becomes work units as a local file would (text, JSON lines in byte ranges read as ranged
requests, Parquet by row group, gzip and zstd whole), and its reuse key is what the store says
of it: its size and ETag (or generation, else its modification time). Credentials come from the
environment and fsspec's configuration, never from the URL: a URL that carries them
(``s3://key:secret@bucket/...``) or a query string is refused, so no credential reaches a
filter's header, a log line or an error. The URL helpers this shares with opening a filter by
URL are :mod:`memfree.storage`'s.
"""

from __future__ import annotations

import posixpath
from typing import Any

from bloom_builder.sources.work_units import ProblemLog, reason
from memfree.storage import (
    address_problem,
    filesystem,
    is_store_failure,
    is_url,
    open_url,
    stamp,
    stamp_of,
    store_error,
)

_HIDDEN = "a hidden object (its name starts with '.'), not read; name it to read it"


def url_problem(url: str) -> str | None:
    """What is wrong with a corpus URL before anything is listed (credentials or a query in it,
    an unknown protocol); None where the store can be asked."""
    return address_problem(url, "the corpus URL")


def listed(spec: str, problems: ProblemLog) -> list[tuple[str, str, int, tuple[Any, ...]]]:
    """The objects a corpus URL names: one object, every object under a prefix (a "folder"),
    or those a glob matches (``**`` allowed), each as ``(url, relative name, size)``; hidden
    objects under a prefix are counted, not read; nothing found is recorded as missing.
    Failures of the store (a missing bucket, access denied) are recorded too."""
    fs, path = filesystem(spec)
    found: list[tuple[str, str, int, tuple[Any, ...]]] = []
    try:
        # The store as it is now, not as this process listed it before (fsspec keeps listings:
        # a second build in one process would key its reuse on the first one's sizes and ETags).
        fs.invalidate_cache()
        if any(char in path for char in "*?["):
            matches = fs.glob(path, detail=True)
            base = path.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0].rsplit("/", 1)[0]
            entries = {n: info for n, info in matches.items() if info.get("type") != "directory"}
            if not entries:
                problems.record("missing", spec, "the glob pattern matched no object")
        elif fs.isdir(path):
            entries, base = fs.find(path, detail=True), path.rstrip("/")
            if not entries:
                problems.record("missing", spec, "no object under this prefix")
        else:
            entries, base = {path: fs.info(path)}, posixpath.dirname(path)
    except FileNotFoundError as error:
        problems.record("missing", spec, _store_reason(error, "no such object or bucket"))
        return []
    except Exception as error:
        if is_store_failure(error):  # not an answer: skipping the prefix would lose it unsaid
            raise store_error(spec, "listing it", error) from None
        if not isinstance(error, (OSError, ValueError)):
            raise
        problems.record("unreadable", spec, _store_reason(error, reason(error)))
        return []
    for name in sorted(entries):
        info = entries[name]
        relative = posixpath.relpath(name, base) if base else name
        url = fs.unstrip_protocol(name)
        if any(part.startswith(".") for part in relative.split("/")) and name != path:
            problems.record("hidden", url, _HIDDEN)
            continue
        found.append((url, relative, int(info.get("size") or 0), tuple(stamp_of(info))))
    return found


def _store_reason(error: BaseException, default: str) -> str:
    """The store's own words where they say more than the key (s3fs names a missing key by
    the key alone, a missing bucket in words)."""
    text = str(error).strip()
    if not text or " " not in text:
        return default
    return text[:1].lower() + text[1:]


__all__ = [
    "filesystem",
    "is_store_failure",
    "is_url",
    "listed",
    "open_url",
    "stamp",
    "store_error",
    "url_problem",
]
