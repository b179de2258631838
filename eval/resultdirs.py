"""Results folders (``memfree eval --out``, ``memfree audit``): what kind of run wrote one, and the
lock a run holds on it while it writes there.

A folder's kind is read from the files memfree already writes, so folders of every earlier
version (those committed under ``docs/results`` among them) are recognized without a marker: an
eval run's ``settings.json`` (its settings' fingerprint), an audit step's ``audit.json`` (the
sections of its results: exposure, extraction or k-extractability). A run writes into a missing
or empty folder, or one of its own kind (to resume or re-render); any other folder only with
``--force``, since it would replace files of the names it writes.

The lock is ``.memfree.lock`` inside the folder, held with ``flock`` (as the builder's
``BuildLock``): it names its holder (process id, host, command, start time) so that a second run
is refused at once, saying who writes there, and the kernel drops it if the holder dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memfree.errors import os_problem
from memfree.fileio import LockHeld, take_lock

LOCK_NAME = ".memfree.lock"
#: Each kind of results folder, and the files its run writes there (for the messages).
KINDS = {
    "eval": "records.jsonl, examples.jsonl, settings.json, summary.json, report.md and PNG plots",
    "audit exposure": "audit.json, audit.md and exposure.png",
    "audit extract": "audit.json, audit.md",
    "audit extractable": "audit.json, audit.md",
}
# The section of an audit.json result that tells which step wrote it.
_AUDIT_SECTIONS = {
    "by_repetitions": "audit exposure",
    "shortest_path": "audit extract",
    "by_k": "audit extractable",
}


class ResultsDirError(ValueError):
    """A results folder cannot be used: another kind of folder, a file, or locked by another run.
    The message names the folder and the fix."""


def folder_kinds(folder: Path) -> set[str] | None:
    """The kinds of results in ``folder`` (see :data:`KINDS`); an empty set for a folder holding
    files but no memfree results; None for a missing or empty folder (a lock file aside).

    A ``settings.json`` marks an eval folder even when it cannot be read (the eval run then says
    what is wrong with it, naming the file). An ``audit.json`` is read to tell which audit steps
    wrote the folder: one that cannot be read is refused here, naming it (memfree would otherwise
    replace a damaged record of a run it cannot identify); one whose steps cannot be told marks
    none.

    Raises:
        ResultsDirError: ``folder`` is not a folder or cannot be listed, or its ``audit.json``
            cannot be read.
    """
    names = _entries(folder)
    if names is None:
        return None
    kinds: set[str] = set()
    if "settings.json" in names:
        kinds.add("eval")
    if "audit.json" in names:
        kinds |= _audit_kinds(folder / "audit.json")
    return kinds


def _entries(folder: Path) -> list[str] | None:
    """The names in ``folder`` but the lock file; None when it is missing or holds nothing else."""
    try:
        mode = folder.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ResultsDirError(f"{folder}: {os_problem(error)}") from None
    if not stat.S_ISDIR(mode):
        raise ResultsDirError(f"{folder}: is a file, not a folder")
    try:
        names = sorted(name for name in os.listdir(folder) if name != LOCK_NAME)
    except OSError as error:
        raise ResultsDirError(f"{folder}: {os_problem(error)}") from None
    return names or None


def _audit_kinds(path: Path) -> set[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        problem = os_problem(error) if isinstance(error, OSError) else f"not JSON ({error})"
        raise ResultsDirError(
            f"{path}: cannot be read ({problem}); memfree reads it to tell which audit steps "
            "wrote this folder. Repair or move it, or choose another --out"
        ) from None
    if not isinstance(data, dict):
        return set()
    return {
        kind
        for part in data.values()
        if isinstance(part, dict)
        for section, kind in _AUDIT_SECTIONS.items()
        if section in part
    }


def check_results_dir(folder: Path, kind: str, force: bool, option: str = "--out") -> None:
    """Refuse ``folder`` as the results folder of a ``kind`` run unless it is missing, empty or
    of that kind, or ``force`` is set (a file, never).

    Args:
        folder: where the run writes.
        kind: one of :data:`KINDS`.
        force: write into a non-empty folder of another kind (``--force``).
        option: the command-line option that names the folder, for the messages.

    Raises:
        ResultsDirError: naming the folder, what it holds, and the fix.
    """
    try:
        kinds = folder_kinds(folder)
    except ResultsDirError as error:
        raise ResultsDirError(f"{error}; {option} names the folder the results go in") from None
    if kinds is None or kind in kinds or force:
        return
    writes = KINDS[kind]
    if kinds:
        held = " and ".join(f"memfree {other}" for other in sorted(kinds))
        raise ResultsDirError(
            f"{folder}: holds the results of {held}; memfree {kind} writes {writes} there and "
            f"would replace them. Choose another {option}, or pass --force to replace them"
        )
    names = _entries(folder) or []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise ResultsDirError(
        f"{folder}: not empty ({shown}) and not a memfree {kind} results folder; memfree writes "
        f"{writes} there, replacing files of those names. Choose another {option} (a new or empty "
        "folder), or pass --force to write there anyway"
    )


# ------------------------------------------------------------------------------------------------
# The lock

# Folders this process holds the lock of, with how many times it took each: a run that holds its
# folder's lock (the command line) may call the library, which takes it again.
_HELD: dict[str, tuple[Any, int, bool]] = {}


class ResultsLock:
    """An exclusive lock on a results folder (``.memfree.lock`` inside it), held by one process
    at a time; taken again by the same process, it only counts.

    Args:
        folder: the results folder (created if missing; removed again on release if this lock
            created it and nothing was written there).
        option: the command-line option that names the folder, for the messages.

    Example:
        >>> with ResultsLock(Path("out/eval/discoverable")):  # doctest: +SKIP
        ...     ...  # write the results
    """

    def __init__(self, folder: str | os.PathLike[str], option: str = "--out") -> None:
        self.folder = Path(folder)
        self.option = option
        self._key = os.path.realpath(self.folder)
        self._held = False

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def acquire(self) -> ResultsLock:
        """Take the lock.

        Raises:
            ResultsDirError: another process holds it (naming it), or the folder cannot be made.
        """
        if self._held:
            return self
        if self._key in _HELD:
            handle, count, created = _HELD[self._key]
            _HELD[self._key] = (handle, count + 1, created)
            self._held = True
            return self
        created = self._make_folder()
        try:
            handle = self._lock()
        except BaseException:
            if created:
                with contextlib.suppress(OSError):
                    self.folder.rmdir()
            raise
        _HELD[self._key] = (handle, 1, created)
        self._held = True
        return self

    def _make_folder(self) -> bool:
        """Create the folder if missing; whether this call created it."""
        if os.path.isdir(self.folder):
            return False
        try:
            self.folder.mkdir(parents=True)
        except FileExistsError:
            if os.path.isdir(self.folder):
                return False
            raise ResultsDirError(
                f"{self.folder}: is a file, not a folder; {self.option} names the folder the "
                "results go in"
            ) from None
        except OSError as error:
            raise ResultsDirError(
                f"{self.folder}: cannot create the folder ({os_problem(error)}); choose another "
                f"{self.option}"
            ) from None
        return True

    def _lock(self) -> Any:
        try:
            return take_lock(self.path)
        except LockHeld as held:
            raise ResultsDirError(
                f"{self.folder}: another memfree run is writing there "
                f"({held.holder or 'another memfree run'}); wait for it to finish, or choose "
                f"another {self.option}"
            ) from None
        except OSError as error:
            raise ResultsDirError(
                f"{self.path}: cannot create the lock file ({os_problem(error)}); choose "
                f"another {self.option}"
            ) from None

    def release(self) -> None:
        """Give the lock back (the last release of this process removes the lock file)."""
        if not self._held:
            return
        self._held = False
        handle, count, created = _HELD[self._key]
        if count > 1:
            _HELD[self._key] = (handle, count - 1, created)
            return
        del _HELD[self._key]
        if handle is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            handle.close()
        if created:  # a folder this run made and wrote nothing into (it failed first)
            with contextlib.suppress(OSError):
                self.folder.rmdir()

    def __enter__(self) -> ResultsLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@contextlib.contextmanager
def claim_results_dir(
    folder: str | os.PathLike[str], kind: str, force: bool = False, option: str = "--out"
) -> Iterator[Path]:
    """Check ``folder`` for a ``kind`` run (:func:`check_results_dir`), then hold its lock for
    the block; checked again under the lock, since another run may have written there between.

    Raises:
        ResultsDirError: the folder is refused, or another run holds its lock.
    """
    path = Path(folder)
    check_results_dir(path, kind, force, option)
    with ResultsLock(path, option):
        check_results_dir(path, kind, force, option)
        yield path
