"""Corpora on object storage: ``s3://bucket/web/**/*.jsonl.gz`` and every fsspec protocol whose
package is installed (``gs://`` with gcsfs, ``az://`` with adlfs, ``hf://``...), read through
fsspec the way datatrove reads them.

A corpus URL is listed through the store (a glob, or every object under a prefix), each object
becomes work units as a local file would (text, JSON lines in byte ranges read as ranged
requests, Parquet by row group, gzip and zstd whole), and its reuse key is what the store says
of it: its size and ETag (or generation, else its modification time). Credentials come from the
environment and fsspec's configuration, never from the URL: a URL that carries them
(``s3://key:secret@bucket/...``) or a query string is refused, so no credential reaches a
filter's header, a log line or an error.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from bloom_builder.sources.work_units import ProblemLog, reason
from memfree.errors import MissingDependencyError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# The package a protocol needs, and the extra of memfree that installs it.
_PACKAGES = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}
_HIDDEN = "a hidden object (its name starts with '.'), not read; name it to read it"


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``), never a local path."""
    return isinstance(path, str) and _URL.match(path) is not None


def url_problem(url: str) -> str | None:
    """What is wrong with a corpus URL before anything is listed: credentials or a query in it,
    or a protocol fsspec does not know. None where it can be read (its package installed:
    :func:`filesystem` says otherwise)."""
    scheme = _URL.match(url).group(1).lower()  # type: ignore[union-attr]
    rest = url.split("://", 1)[1]
    if "@" in rest.split("/", 1)[0]:
        return (
            f"the corpus URL {scheme}://...@{rest.split('@', 1)[1].split('/', 1)[0]}/... holds "
            "credentials; memfree never takes them from a URL (they would be written into the "
            "filter's header): give them through the environment (AWS_ACCESS_KEY_ID, "
            "AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS) or fsspec's configuration"
        )
    if "?" in rest or "#" in rest:
        return (
            f"the corpus URL {url.split('?', 1)[0].split('#', 1)[0]!r} has a query string or "
            "fragment; name the objects by bucket and key only (settings go in fsspec's "
            "configuration or the environment)"
        )
    from fsspec.registry import known_implementations

    if scheme not in known_implementations and scheme not in ("file", "local"):
        return f"the corpus URL {url!r}: fsspec knows no {scheme}:// protocol"
    return None


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it.

    Raises:
        MissingDependencyError: the protocol's package is not installed (the message names the
            extra that installs it).
    """
    scheme = _URL.match(url).group(1).lower()  # type: ignore[union-attr]
    try:
        import fsspec.core

        return fsspec.core.url_to_fs(url)
    except ImportError:
        package, extra = _PACKAGES.get(scheme, (f"the fsspec implementation of {scheme}://", ""))
        install = f"pip install 'memfree[{extra}]'" if extra else f"install {package}"
        raise MissingDependencyError(
            f"reading {scheme}:// URLs needs the {package} package: {install}"
        ) from None


def listed(spec: str, problems: ProblemLog) -> list[tuple[str, str, int]]:
    """The objects a corpus URL names: one object, every object under a prefix (a "folder"),
    or those a glob matches (``**`` allowed), each as ``(url, relative name, size)``; hidden
    objects under a prefix are counted, not read; nothing found is recorded as missing.
    Failures of the store (a missing bucket, access denied) are recorded too."""
    fs, path = filesystem(spec)
    found: list[tuple[str, str, int]] = []
    try:
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
    except (OSError, ValueError) as error:
        problems.record("unreadable", spec, _store_reason(error, reason(error)))
        return []
    for name in sorted(entries):
        info = entries[name]
        relative = posixpath.relpath(name, base) if base else name
        url = fs.unstrip_protocol(name)
        if any(part.startswith(".") for part in relative.split("/")) and name != path:
            problems.record("hidden", url, _HIDDEN)
            continue
        found.append((url, relative, int(info.get("size") or 0)))
    return found


def stamp(url: str) -> list[Any]:
    """What tells a changed object from the one whose tasks are kept: its size and what the
    store says of its content (an ETag, a generation), else its modification time."""
    fs, path = filesystem(url)
    try:
        info = fs.info(path)
    except OSError:
        return [0, "", ""]
    tag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")
    modified = info.get("LastModified") or info.get("mtime") or info.get("updated") or ""
    return [int(info.get("size") or 0), str(tag or ""), "" if tag else str(modified)]


def open_url(url: str) -> Any:
    """A seekable binary file over the object (reads are ranged requests)."""
    fs, path = filesystem(url)
    return fs.open(path, "rb")


def _store_reason(error: BaseException, default: str) -> str:
    """The store's own words where they say more than the key (s3fs names a missing key by
    the key alone, a missing bucket in words)."""
    text = str(error).strip()
    if not text or " " not in text:
        return default
    return text[:1].lower() + text[1:]


__all__ = ["filesystem", "is_url", "listed", "open_url", "stamp", "url_problem"]
