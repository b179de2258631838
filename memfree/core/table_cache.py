"""Canonical decoding's tables on disk: built once per tokenizer, read back by every process.

A canonical masker's tables (the BPE model's merge trees, the split pattern's token shapes, the
characters written with several tokens) take 1-2 s to build for a 49k vocabulary and 10-20 s for
a 151k one, in every process that guards with that tokenizer: each vLLM worker, each server
restart. They depend only on the tokenizer (:func:`memfree.vocab.bpe.tables_key`: its
fingerprint and the steps around its model) and on memfree's version, so the first process keeps
them in memfree's cache directory (``$MEMFREE_CACHE/canonical``, by default
``~/.cache/memfree/canonical``) and the next ones read them back.

A file is never trusted: it begins with a header naming the format, memfree's version, the
tables' key and the SHA-256 and length of what follows; a file whose header, length or checksum
does not match is rebuilt (with a warning saying why) and written again. Files are written to a
temporary name and renamed, so a reader never sees half a file; two processes that build the same
tables at once both write whole files, and the last rename wins. What follows the header is a
pickle of the tables (format 2: the tokenizer named, not held, since the reader holds it and
its fingerprint is part of the key; caches filled by use written empty): reading it runs as much
code as reading a ``.pyc`` file from the same directory would, so the cache is trusted as the
user's own files are (``MEMFREE_CACHE`` can point it elsewhere). A cache directory that cannot be
written (read-only, full) is said once per process; the tables are then built in each process,
as without a cache. Writing a tokenizer's tables removes the files of the same family and
tokenizer that another version of memfree wrote (15-55 MB each: an upgrade does not leave its
predecessor's behind).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import pickle
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

FORMAT = 2  # 2: the tokenizer named, not held; caches written empty
MAGIC = b"memfree canonical tables\n"
_MAX_HEADER = 4096
T = TypeVar("T")

_warned: set[str] = set()
_lock = threading.Lock()


def tables_dir() -> Path:
    """Where the tables are kept: ``canonical`` in memfree's cache directory."""
    from memfree.vocab.tokenizer import cache_dir

    return cache_dir() / "canonical"


def key_digest(kind: str, key: tuple[Any, ...]) -> str:
    """The file name's digest of a family's tables for one tokenizer and the code that builds
    them (memfree's version and the source of :mod:`memfree.core` and :mod:`memfree.vocab`, so
    that a checkout between releases never reads tables an older build of them wrote)."""
    identity = repr((FORMAT, _version(), _code_digest(), kind, key))
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memfree")
    except PackageNotFoundError:  # a source tree on the path, not installed
        return "0+unknown"


@functools.cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for folder in ("core", "vocab"):
        for source in sorted((root / folder).glob("*.py")):
            digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def cached_tables(
    kind: str,
    key: tuple[Any, ...],
    fingerprint: str,
    build: Callable[[], T],
    outside: Mapping[str, Any] | None = None,
    left_empty: Callable[[T], Iterable[Any]] | None = None,
) -> T:
    """The tables of ``kind`` (a family's name) for the tokenizer of ``key``: read from the
    cache when a whole, matching file is there, else built with ``build()`` and kept.

    Args:
        outside: objects the tables hold that the file names instead of holding them, by name
            (the tokenizer itself, which the caller holds already: its fingerprint is part of
            the key); reading the file gives back the caller's objects of those names.
        left_empty: the tables' caches (dicts and lists filled as they are used): written as
            empty ones of their type, so the file holds only what was built.
    """
    digest = key_digest(kind, key)
    path = tables_dir() / f"{kind}-{digest}.tables"
    found = _read(path, digest, outside or {})
    if found is not None:
        return found
    started = time.perf_counter()
    tables = build()
    header = {
        "format": FORMAT,
        "kind": kind,
        "key": digest,
        "tokenizer_fingerprint": fingerprint,
        "build_seconds": round(time.perf_counter() - started, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if _write(path, header, tables, outside or {}, list(left_empty(tables)) if left_empty else []):
        _remove_superseded(path, kind, fingerprint)
    return tables


def _remove_superseded(kept: Path, kind: str, fingerprint: str) -> None:
    """Remove the other files of ``kind`` for the same tokenizer (other versions of memfree or
    of its tables' code wrote them; this one never reads them)."""
    for path in kept.parent.glob(f"{kind}-*.tables"):
        if path == kept:
            continue
        try:
            header, _ = read_header(path)
            if header.get("tokenizer_fingerprint") == fingerprint:
                path.unlink()
        except (OSError, ValueError):
            continue


class _Pickler(pickle.Pickler):
    """Writes the objects of ``outside`` by name and the caches of ``empty`` as empty ones."""

    def __init__(self, file: Any, outside: Mapping[str, Any], empty: list[Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._names = {id(value): name for name, value in outside.items()}
        self._empty = {id(cache): type(cache).__name__ for cache in empty}

    def persistent_id(self, obj: Any) -> Any:
        name = self._names.get(id(obj))
        if name is not None:
            return ("outside", name)
        kind = self._empty.get(id(obj))
        return None if kind is None else ("empty", kind)


_EMPTY: dict[str, Callable[[], Any]] = {"dict": dict, "list": list}


class _Unpickler(pickle.Unpickler):
    """Gives back the caller's objects for the names the file holds, and empty caches."""

    def __init__(self, file: Any, outside: Mapping[str, Any]) -> None:
        super().__init__(file)
        self._outside = outside

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 2:
            what, name = pid
            if what == "outside" and name in self._outside:
                return self._outside[name]
            if what == "empty" and name in _EMPTY:
                return _EMPTY[name]()
        raise pickle.UnpicklingError(f"it names an object this process does not give ({pid!r})")


def _dumps(tables: Any, outside: Mapping[str, Any], empty: list[Any]) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, outside, empty).dump(tables)
    return buffer.getvalue()


def _loads(payload: bytes, outside: Mapping[str, Any]) -> Any:
    return _Unpickler(io.BytesIO(payload), outside).load()


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """A tables file's header and the offset of what follows it.

    Raises:
        ValueError: not a tables file of this format (what is wrong, in words).
        OSError: the file cannot be read.
    """
    with open(path, "rb") as handle:
        start = handle.read(len(MAGIC) + _MAX_HEADER)
    if not start.startswith(MAGIC):
        raise ValueError("it does not begin as a memfree tables file")
    end = start.find(b"\n", len(MAGIC))
    if end < 0:
        raise ValueError("its header is cut short")
    try:
        header = json.loads(start[len(MAGIC) : end])
    except ValueError:
        raise ValueError("its header is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError("its header is of another format")
    return header, end + 1


def _read(path: Path, digest: str, outside: Mapping[str, Any]) -> Any | None:
    """The tables in ``path`` if the file is whole and of ``digest``; None if there is none or
    it is damaged (then said once)."""
    try:
        header, offset = read_header(path)
        if header.get("key") != digest:
            raise ValueError("its header names other tables")
        with open(path, "rb") as handle:
            handle.seek(offset)
            payload = handle.read()
        if len(payload) != header.get("bytes"):
            raise ValueError(
                f"it holds {len(payload)} bytes of tables, its header says {header.get('bytes')}"
            )
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            raise ValueError("its checksum does not match (the file is damaged)")
        return _loads(payload, outside)
    except FileNotFoundError:
        return None
    except (
        OSError,
        ValueError,
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
        ImportError,
    ) as error:
        _say_once(
            str(path),
            f"memfree: {path}: canonical decoding's cached tables are unusable ({error}); "
            "they are built again and the file rewritten",
        )
        return None


def _write(
    path: Path, header: dict[str, Any], tables: Any, outside: Mapping[str, Any], empty: list[Any]
) -> bool:
    """Keep ``tables`` at ``path`` (a whole file or none); a directory that cannot take it is
    said once per process. Returns whether the file was written."""
    try:
        payload = _dumps(tables, outside, empty)
        header = {**header, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n")
                out.write(payload)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return True
    except OSError as error:
        _say_once(
            str(path.parent),
            f"memfree: cannot keep canonical decoding's tables in {path.parent} ({error}); each "
            "process builds them again. Set MEMFREE_CACHE to a writable directory with room.",
        )
        return False


def _say_once(what: str, message: str) -> None:
    with _lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def kept_tables() -> list[dict[str, Any]]:
    """The tables files in the cache: each one's header, path, size and whether it is whole
    (its checksum read through), for ``memfree tables``."""
    found = []
    folder = tables_dir()
    for path in sorted(folder.glob("*.tables")) if folder.is_dir() else []:
        entry: dict[str, Any] = {"path": str(path), "size_bytes": path.stat().st_size}
        try:
            header, offset = read_header(path)
            with open(path, "rb") as handle:
                handle.seek(offset)
                payload = handle.read()
            entry.update(header)
            entry["whole"] = len(payload) == header.get("bytes") and hashlib.sha256(
                payload
            ).hexdigest() == header.get("sha256")
        except (OSError, ValueError) as error:
            entry.update(whole=False, problem=str(error))
        found.append(entry)
    return found


__all__ = ["cached_tables", "kept_tables", "key_digest", "read_header", "tables_dir"]
