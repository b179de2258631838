"""A mapped filter file's identity, checked around every guard step that reads its bits.

A guard maps its filter file and reads the bits at each step. Replacing a filter by writing a new
file and renaming it over the old one (what ``memfree build`` and every memfree writer do) leaves a
running guard on the old file, intact. Rewriting the file *in place* changes the very pages the
guard reads: ``cp other.memfree live.memfree`` truncates, then writes, and a same-size overwrite
would silently change what the guard blocks.

So a filter records, when it is opened, the identity of its open file (``os.fstat`` of the mapped
descriptor: device, inode, size, modification and status-change times; users can set the
modification time back, not the status-change time), and the guard compares it before and after
each step's reads (:meth:`FileWatch.read`: two ``fstat`` calls, about a microsecond each, no
device synchronisation). A new identity does not prove new bytes (``chmod``, ``touch`` and a
rename over the path change it too), so the file's header and bit checksums are then verified
again; intact, the step is read again from the verified bits; changed, the guard stops with
:class:`~memfree.errors.FilterChangedError` and never returns a mask read from bits it did not
verify (the check is sticky: every later step raises too).

What it cannot stop: a truncation *during* a step's reads (or during that verification) makes the
kernel raise SIGBUS for pages past the new end, which kills the process; Python cannot resume from
it. A crash is loud and emits nothing; a rename never causes one. A shrunk file seen *between*
steps is refused before its pages are touched. Status-change times have the file system's clock
granularity: a same-size rewrite within the same clock tick as the check that verified the file
(possible only on kernels before 6.13, whose ctime is coarse-grained) can go unseen.

Copies of a filter (``pickle``, ``copy.deepcopy``) and filters copied to an accelerator hold their
own bits: nothing to watch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TypeVar

from memfree.errors import FilterChangedError

T = TypeVar("T")

#: How often a step is read again when the file's identity keeps moving with its bytes intact.
READ_ATTEMPTS = 3

REPLACE_HINT = (
    "replace a filter by writing a new file and renaming it over the old one (as `memfree build` "
    "does), never by rewriting it in place (`cp` onto it), and restart the guard to use the new one"
)


class FileIdentity(NamedTuple):
    """What ``os.fstat`` says about an open file that changes when its bytes may have changed
    (a tuple: it is built and compared at every step)."""

    device: int
    inode: int
    size_bytes: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> FileIdentity:
        return cls(
            status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns
        )


class FileWatch:
    """The identity of a mapped filter file, and the check every guard step runs around its reads.

    Args:
        path: the file (named in errors).
        handle: the open file the bits are mapped from; kept open while the mapping lives.
        identity: its identity, taken before its header and bits were read and verified.
        intact: verifies the file's current bytes against what was opened (header bytes, bit
            checksums); returns the problem found, or None when they are intact. None: the bytes
            cannot be verified, so any change of identity stops the guard.
    """

    def __init__(
        self,
        path: Path,
        handle: BinaryIO,
        identity: FileIdentity,
        intact: Callable[[], str | None] | None,
    ) -> None:
        self.path = path
        self._handle: BinaryIO | None = handle
        self._descriptor = handle.fileno()
        self._identity = identity
        self._intact = intact
        self._problem: str | None = None
        self._lock = threading.Lock()

    @property
    def identity(self) -> FileIdentity:
        """The identity last verified."""
        return self._identity

    def read(self, step: Callable[[], T]) -> T:
        """``step()``, run on bits that were verified before and unchanged after it.

        Raises:
            FilterChangedError: the file's bytes changed (now or at an earlier step).
        """
        self.check()  # a shrunk or changed file is refused before its pages are touched
        for _ in range(READ_ATTEMPTS):
            result = step()
            if not self.check():
                return result
        raise self._failed("its identity kept changing while the guard read it")

    def check(self) -> bool:
        """Compare the open file's identity with the one verified.

        Returns:
            False: unchanged. True: it changed but the bytes are intact (verified again and the
            new identity adopted): what was read in between must be read again.

        Raises:
            FilterChangedError: the bytes changed, or cannot be verified after a change.
        """
        if self._problem is not None:
            raise self._failed(self._problem)
        if self._descriptor < 0:  # a copy, or a closed filter: no file behind the bits
            return False
        status = os.fstat(self._descriptor)
        current = FileIdentity(
            status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns
        )
        if current == self._identity:
            return False
        with self._lock:
            if self._problem is not None:
                raise self._failed(self._problem)
            if current == self._identity:  # another thread verified it meanwhile
                return True
            problem = self._verify(current)
            if problem is not None:
                self._problem = problem
                raise self._failed(problem)
            self._identity = current
            return True

    def _verify(self, current: FileIdentity) -> str | None:
        """Why the file's bytes are no longer those opened, or None."""
        opened = self._identity
        if current.inode != opened.inode or current.device != opened.device:
            return "its open file is another file"  # not possible for one descriptor
        if current.size_bytes != opened.size_bytes:
            # Checked first: reading pages past a shrunk file's end would raise SIGBUS.
            return f"its size went from {opened.size_bytes:,} to {current.size_bytes:,} bytes"
        if self._intact is None:
            return "it was modified and its bits have no checksum to verify them against"
        return self._intact()

    def _failed(self, problem: str) -> FilterChangedError:
        return FilterChangedError(
            f"{self.path}: the filter file was changed in place while a guard had it open "
            f"({problem}); the guard stopped rather than block tokens by bits it did not verify: "
            f"{REPLACE_HINT}"
        )

    def close(self) -> None:
        """Close the descriptor; later checks pass (a closed filter's queries fail on their own)."""
        handle, self._handle = self._handle, None
        self._descriptor = -1
        self._intact = None  # it reads the bits, which may be unmapped now
        if handle is not None:
            handle.close()

    def __getstate__(self) -> dict[str, Any]:
        """A copy watches nothing: copies of a filter hold their bits in memory, not mapped."""
        return {
            "path": self.path,
            "_handle": None,
            "_descriptor": -1,
            "_identity": self._identity,
            "_intact": None,
            "_problem": self._problem,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


__all__ = ["READ_ATTEMPTS", "REPLACE_HINT", "FileIdentity", "FileWatch"]
