"""The one way memfree writes a file: beside its target, fsynced, renamed into place.

A reader never sees a half-written filter, manifest or report: the bytes go to a temporary name
in the same folder, are flushed to disk, take the permission bits the target should have, and
replace it with one ``os.replace``; the folder entry is then fsynced so the rename survives a
power cut. A failure removes the temporary file and leaves the old target untouched.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Literal, overload


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode(path: Path) -> int:
    """Permission bits for a file about to replace ``path``: those of the file it replaces (a
    rebuild keeps what its owner chose), else what ``open()`` would give a new file under the
    process umask (a filter says what its corpus holds, so ``umask 077`` keeps it private)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~current_umask()


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


class PendingFile:
    """A temporary file beside ``path`` that replaces it on :meth:`commit`: the one place where
    memfree fsyncs, sets the new file's mode, renames into place and fsyncs the folder.

    Write the temporary any way (a handle, a memory map), then commit or discard it. Used as a
    context manager it yields the temporary path and commits unless the block raises.

    Args:
        path: the target; its folder is created if missing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
        os.close(handle)
        self.temporary = Path(name)

    def commit(self) -> None:
        """Flush the temporary to disk and rename it over the target (discarded on failure)."""
        try:
            handle = os.open(self.temporary, os.O_RDWR)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
            os.chmod(self.temporary, new_file_mode(self.path))
            os.replace(self.temporary, self.path)
        except BaseException:
            self.discard()
            raise
        fsync_directory(self.path.parent)

    def discard(self) -> None:
        """Remove the temporary file; the target is left as it was."""
        self.temporary.unlink(missing_ok=True)

    def __enter__(self) -> Path:
        return self.temporary

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


@overload
def atomic_file(
    path: Path, text: Literal[False] = ...
) -> contextlib.AbstractContextManager[IO[bytes]]: ...
@overload
def atomic_file(path: Path, text: Literal[True]) -> contextlib.AbstractContextManager[IO[str]]: ...
def atomic_file(path: Path, text: bool = False) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file handle whose contents replace ``path`` when the ``with`` block ends without error.

    Args:
        path: the target; its folder is created if missing.
        text: open in UTF-8 text mode (``"\\n"`` newlines) instead of binary.

    Example:
        >>> with atomic_file(Path("report.json"), text=True) as out:  # doctest: +SKIP
        ...     out.write("{}\\n")
    """
    return _atomic_file(Path(path), text)


@contextlib.contextmanager
def _atomic_file(path: Path, text: bool) -> Iterator[IO[Any]]:
    with PendingFile(path) as temporary:
        if text:
            with open(temporary, "w", encoding="utf-8", newline="\n") as out:
                yield out
        else:
            with open(temporary, "wb") as out:
                yield out


def atomic_write(path: Path, chunks: Iterable[bytes | memoryview] | str | bytes) -> None:
    """Write ``chunks`` (bytes pieces, or one ``str`` written as UTF-8) to ``path`` atomically."""
    if isinstance(chunks, str):
        chunks = [chunks.encode("utf-8")]
    elif isinstance(chunks, (bytes, memoryview)):
        chunks = [chunks]
    with atomic_file(Path(path)) as out:
        for chunk in chunks:
            out.write(chunk)


class LockHeld(Exception):
    """:func:`take_lock` found the lock held; ``holder`` is what its holder wrote in it."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def take_lock(path: Path) -> IO[str] | None:
    """Take an exclusive ``flock`` on ``path`` (created if missing) without waiting, and write
    who holds it (process id, host, start time, command) for the next one to read. The kernel
    drops the lock if the holder dies; the holder keeps the returned handle open until it
    releases (unlink the file, then close the handle). None where there is no ``flock``.

    Raises:
        LockHeld: another process holds it (``holder`` says who).
        OSError: the lock file cannot be opened.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: nothing is locked
        return None
    while True:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise LockHeld(holder) from None
        # The previous holder may have removed the lock file between our open and our lock:
        # then we locked a file nobody else sees, so start again.
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()
    handle.seek(0)
    handle.truncate()
    command = " ".join(["memfree", *sys.argv[1:]]) if sys.argv else "memfree"
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started}: {command}")
    handle.flush()
    return handle


__all__ = [
    "LockHeld",
    "PendingFile",
    "atomic_file",
    "atomic_write",
    "current_umask",
    "fsync_directory",
    "new_file_mode",
    "take_lock",
]
