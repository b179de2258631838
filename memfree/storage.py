"""Object storage through fsspec: ``s3://bucket/key`` and every protocol whose package is
installed (``gs://`` with gcsfs, ``az://`` with adlfs, ``hf://``...).

Two users: the builder reads corpora from a bucket (:mod:`bloom_builder.sources.remote`), and a
filter given by URL (``NgramFilter.open("s3://...")``, ``MEMFREE_FILTER``, ``--filter``) is
downloaded once into memfree's cache and mapped from there (:func:`fetched`), the way model
weights are cached: fetched again when the store says the object changed, never half written.

Credentials come from the environment and fsspec's configuration, never from a URL: a URL that
carries them (``s3://KEY:SECRET@bucket/...``) or a query string is refused
(:func:`address_problem`), so no credential reaches a filter's header, a log line or an error.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memfree.errors import MissingDependencyError, StorageError
from memfree.fileio import atomic_file, atomic_write

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
_COPY_BYTES = 8 << 20
_TRANSIENT = frozenset(
    {errno.EBUSY, errno.EIO, getattr(errno, "EREMOTEIO", errno.EIO), errno.EAGAIN,
     errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT}
)  # fmt: skip
# Where a store's client raises from: its failures (a refused or reset connection, a timeout, a
# server error after the client's own retries) are not the user's input.
_STORE_MODULES = frozenset(
    {"botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "google", "azure",
     "fsspec", "requests", "urllib3", "huggingface_hub"}
)  # fmt: skip


# The local disk refused the copy: full (ENOSPC), over a quota (EDQUOT), or past the process's
# file-size limit (EFBIG, ``ulimit -f``).
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``), never a local path."""
    return isinstance(path, str) and _URL.match(path) is not None


def cache_dir() -> Path:
    """memfree's cache directory: ``$MEMFREE_CACHE`` or ``~/.cache/memfree``."""
    root = os.environ.get("MEMFREE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memfree"
    )
    return Path(root)


def address_problem(url: str, what: str) -> str | None:
    """What is wrong with a URL before the store is asked: credentials or a query in it, or a
    protocol fsspec does not know (``what``: "the corpus URL", "the filter"...). None where it
    can be asked (whether its package is installed, :func:`filesystem` says)."""
    scheme = _scheme(url)
    rest = url.split("://", 1)[1]
    host = rest.split("/", 1)[0]
    if "@" in host:
        return (
            f"{what} {scheme}://...@{host.rsplit('@', 1)[1]}/... holds credentials; memfree never "
            "takes them from a URL (they would be written into a filter's header or a log): give "
            "them through the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, "
            "GOOGLE_APPLICATION_CREDENTIALS) or fsspec's configuration"
        )
    if "?" in rest or "#" in rest:
        return (
            f"{what} {url.split('?', 1)[0].split('#', 1)[0]!r} has a query string or fragment; "
            "name the object by bucket and key only (settings go in fsspec's configuration or "
            "the environment)"
        )
    from fsspec.registry import known_implementations, registry

    if scheme not in known_implementations and scheme not in registry:
        return f"{what} {url!r}: fsspec knows no {scheme}:// protocol"
    return None


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it.

    Raises:
        MissingDependencyError: fsspec, or the protocol's package, is not installed (the
            message names the extra that installs it).
    """
    scheme = _scheme(url)
    package, extra = _PACKAGES.get(scheme, (f"the fsspec implementation of {scheme}://", ""))
    install = f"pip install 'memfree[{extra}]'" if extra else f"install {package}"
    try:
        import fsspec.core
    except ImportError:
        raise MissingDependencyError(f"reading {scheme}:// URLs needs fsspec: {install}") from None
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError:
        raise MissingDependencyError(
            f"reading {scheme}:// URLs needs the {package} package: {install}"
        ) from None
    return fs, path


def is_store_failure(error: BaseException) -> bool:
    """Whether ``error`` is the store failing (a connection refused or reset, a timeout, a
    server error, after its client's own retries), not an answer about the object: a missing
    key or bucket (FileNotFoundError), access denied (PermissionError) and an object rewritten
    while read (s3fs pins the ETag it opened: EBUSY) are answers."""
    if type(error).__name__ == "FileExpired":  # s3fs: the object was rewritten while read
        return False
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    if type(error).__module__.split(".")[0] in _STORE_MODULES:
        return True
    # s3fs turns a store's error codes into a plain OSError (SlowDown, a 5xx: EBUSY, EIO); a
    # subclass (gzip's BadGzipFile) or one without an errno (a corrupt zstd frame) is the data's.
    return type(error) is OSError and error.errno in _TRANSIENT


def store_error(url: str, doing: str, error: BaseException) -> StorageError:
    """The error for a store that failed while ``doing`` something with ``url``."""
    said = str(error).strip() or type(error).__name__
    return StorageError(
        errno.EIO,
        f"{url}: the store failed while {doing}, after its client's retries ({said}); nothing "
        "is lost: rerun once the store answers (a build keeps its finished tasks)",
    )


def stamp(url: str) -> list[Any]:
    """What tells a changed object from another: its size and what the store says of its
    content (an ETag, a generation), else its modification time; zeros where the object is
    gone.

    Raises:
        StorageError: the store failed (not an answer about the object).
    """
    fs, path = filesystem(url)
    try:
        return stamp_of(fs.info(path))
    except Exception as error:
        if is_store_failure(error):
            raise store_error(url, "asking for its size and ETag", error) from None
        if isinstance(error, OSError):
            return [0, "", ""]
        raise


def open_url(url: str, expected: Sequence[Any] = ()) -> Any:
    """A seekable binary file over the object (reads are ranged requests).

    Args:
        expected: the object's stamp (:func:`stamp`) when the caller listed it; the object is
            refused if the store now says otherwise (it was rewritten since).

    Raises:
        StorageError: the store failed, or the object changed since ``expected`` (ESTALE);
            FileNotFoundError, PermissionError: the store's answers.
    """
    fs, path = filesystem(url)
    try:
        if expected:  # what the store says now, not what this process listed before
            fs.invalidate_cache(path)
        handle = fs.open(path, "rb")
    except Exception as error:
        if is_store_failure(error):
            raise store_error(url, "opening it", error) from None
        if expected and isinstance(error, FileNotFoundError):
            refuse_changed(url, expected, [0, "", ""])  # deleted since the build listed it
        raise
    if expected:
        details = getattr(handle, "details", None)
        now = stamp_of(details) if isinstance(details, dict) else stamp(url)
        try:
            refuse_changed(url, expected, now)
        except StorageError:
            handle.close()
            raise
    return handle


def refuse_changed(url: str, expected: Sequence[Any], now: Sequence[Any] | None = None) -> None:
    """Refuse an object the store now describes otherwise than ``expected`` (its stamp when the
    build listed it): its size, and its content tag where the store gives one (a listing and an
    open file may write modification times differently: not compared). ``now``: the stamp
    already asked for (default: asked afresh).

    Raises:
        StorageError: ESTALE, naming the object, both stamps and the fix.
    """
    if now is None:
        fs, path = filesystem(url)
        fs.invalidate_cache(path)
        now = stamp(url)
    if list(now) == [0, "", ""] and expected[0]:
        raise StorageError(
            errno.ESTALE,
            f"{url}: deleted since this build listed it (size {expected[0]}); rerun the build: "
            "it lists the objects as they are now",
        )
    if now[0] != expected[0] or (expected[1] and now[1] != expected[1]):
        raise StorageError(
            errno.ESTALE,
            f"{url}: changed since this build listed it (size {expected[0]}, "
            f"{expected[1] or expected[2]!r} then; size {now[0]}, {now[1] or now[2]!r} now); "
            "rerun the build: it lists and reads the object as it is now",
        )


def fetched(url: str, what: str = "the filter") -> Path:
    """The local copy of the object ``url`` in memfree's cache (``$MEMFREE_CACHE/objects``):
    downloaded on first use and again whenever the store says the object changed (its size or
    ETag), to a temporary name renamed when whole (a reader never sees half a copy); a copy
    whose object changed during the download is not kept.

    Raises:
        ValueError: a URL memfree does not take (:func:`address_problem`).
        MissingDependencyError: the protocol's package is not installed.
        FileNotFoundError: no such object (or bucket).
        OSError: the store refused (the message names the URL), or the cache has no room (it
            names the cache and ``MEMFREE_CACHE``).
    """
    problem = address_problem(url, what)
    if problem is not None:
        raise ValueError(problem)
    fs, path = filesystem(url)
    current = _asked(fs, path, url, what)
    folder = cache_dir() / "objects" / hashlib.sha256(url.encode()).hexdigest()[:24]
    local, record = (
        folder / (posixpath.basename(path.rstrip("/")) or "object"),
        folder / "object.json",
    )
    try:
        kept = json.loads(record.read_text())
    except (OSError, ValueError):
        kept = None
    if kept == {"url": url, "stamp": current} and _size(local) == current[0]:
        return local
    changed = OSError(
        errno.EAGAIN,
        f"{what} {url} changed while it was downloaded (its size or ETag moved); try again once "
        "it is written",
    )
    try:
        with atomic_file(local) as out, fs.open(path, "rb") as source:
            shutil.copyfileobj(source, out, _COPY_BYTES)
    except Exception as error:
        if not isinstance(error, OSError):
            if is_store_failure(error):
                raise store_error(url, "downloading it", error) from None
            raise
        if error.errno in NO_ROOM:
            raise OSError(
                error.errno,
                f"no room in memfree's cache {folder.parent} for {what} {url} "
                f"({current[0]:,} bytes): free space there or set MEMFREE_CACHE to a folder "
                "with room",
            ) from None
        if _asked(fs, path, url, what) != current:  # s3fs pins the ETag it opened
            raise changed from None
        if is_store_failure(error):
            raise store_error(url, "downloading it", error) from None
        raise OSError(error.errno, f"{what} {url}: the download failed: {error}") from None
    if _asked(fs, path, url, what) != current or _size(local) != current[0]:
        local.unlink(missing_ok=True)
        raise changed
    atomic_write(record, json.dumps({"url": url, "stamp": current}))
    return local


def forget(url: str) -> None:
    """Drop the cached copy of ``url`` (a copy found damaged is fetched again next time)."""
    folder = cache_dir() / "objects" / hashlib.sha256(url.encode()).hexdigest()[:24]
    shutil.rmtree(folder, ignore_errors=True)


def _asked(fs: Any, path: str, url: str, what: str) -> list[Any]:
    try:
        return stamp_of(fs.info(path))
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{what} {url}: no such object or bucket") from None
    except Exception as error:
        if is_store_failure(error):
            raise store_error(url, "asking for its size and ETag", error) from None
        if isinstance(error, OSError):
            raise OSError(error.errno, f"{what} {url}: the store refused: {error}") from None
        raise


def stamp_of(info: dict[str, Any]) -> list[Any]:
    """An object's stamp (see :func:`stamp`) from what the store said of it (a listing's or
    an open file's details), without asking again."""
    tag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")
    modified = info.get("LastModified") or info.get("mtime") or info.get("updated") or ""
    return [int(info.get("size") or 0), str(tag or ""), "" if tag else str(modified)]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _scheme(url: str) -> str:
    match = _URL.match(url)
    if match is None:
        raise ValueError(f"not a URL: {url!r}")
    return match.group(1).lower()


__all__ = [
    "NO_ROOM",
    "address_problem",
    "cache_dir",
    "fetched",
    "filesystem",
    "forget",
    "is_store_failure",
    "is_url",
    "open_url",
    "refuse_changed",
    "stamp",
    "stamp_of",
    "store_error",
]
