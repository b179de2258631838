"""What a build may write and delete: the output path, the lock on it, and the work directory
(only what memfree created and marked is ever deleted).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfree.fileio import LockHeld, atomic_write, take_lock

WORK_MARKER = ".memfree-work.json"
# Entries a build creates inside its work directory; nothing else there is ever deleted.
_WORK_ENTRIES = ("map", "reduce-min*", "sections")


class OutputError(ValueError):
    """The output or work directory cannot be used; the message names the path and the fix."""


def sidecar_of(output: Path) -> Path:
    """The ``.json`` sidecar a pybloomfiltermmap3 output gets beside it."""
    return output.with_name(output.name + ".json")


def _is_filter_file(path: Path) -> bool:
    from memfree.filterfile.header import MAGIC
    from memfree.filterfile.pybloom import MAGIC as PYBLOOM_MAGIC

    try:
        with open(path, "rb") as handle:
            head = handle.read(max(len(MAGIC), len(PYBLOOM_MAGIC)))
    except OSError:
        return False
    return head.startswith(MAGIC) or head.startswith(PYBLOOM_MAGIC)


def _is_sidecar_file(path: Path) -> bool:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(loaded, dict) and "key_encoding" in loaded and "header_xxh3" in loaded


def output_path(raw: str | os.PathLike[str]) -> Path:
    """The absolute path of ``-o``, refused when it cannot name a file.

    An empty path, one ending in a separator, ``.`` or ``..`` names a folder, never a filter file
    (``-o new/`` used to write a file named ``new``; ``-o x/..`` read the whole corpus before the
    rename failed). The path is made absolute here, once, so that every task of the build (Ray
    workers have a working directory of their own) writes where the user meant.

    Raises:
        OutputError: the path cannot name a file.
    """
    text = os.fspath(raw)
    if not text.strip():
        raise OutputError("-o is empty; give the filter's file path, e.g. -o corpus.memfree")
    if text.endswith(("/", os.sep)) or os.path.basename(text) in (".", ".."):
        suggestion = os.path.join(text.rstrip("/" + os.sep) or os.sep, "filter.memfree")
        raise OutputError(
            f"{text}: names a folder, not a file; give the filter's file path, e.g. -o {suggestion}"
        )
    return Path(os.path.abspath(text))


def check_output(output: Path, force: bool, pybloom: bool) -> None:
    """Refuse an output that is a directory, a device, or an existing file of another kind.

    Overwriting a previous filter (either format) is the normal rebuild; any other existing file,
    and a read-only filter (its owner protected it: ``mv`` would ask), needs ``force``. The
    output's folder is not created here (see :func:`make_folders`).
    """
    targets = [(output, _is_filter_file)] + (
        [(sidecar_of(output), _is_sidecar_file)] if pybloom else []
    )
    for target, is_ours in targets:
        try:
            mode = target.stat().st_mode
        except FileNotFoundError:
            continue
        except OSError as error:
            raise OutputError(f"{target}: cannot use it as the output ({error.strerror})") from None
        if stat.S_ISDIR(mode):
            raise OutputError(f"{target}: is a directory; give a file path for the filter (-o)")
        if not stat.S_ISREG(mode):
            raise OutputError(f"{target}: not a regular file; give a file path for the filter (-o)")
        if force:
            continue
        if not is_ours(target):
            raise OutputError(
                f"{target}: exists and is not a memfree filter; memfree does not replace other "
                "files. Choose another -o, or pass --force to overwrite it"
            )
        if not mode & 0o222:
            raise OutputError(
                f"{target}: is read-only (mode {stat.S_IMODE(mode):04o}): its owner protected it. "
                "Make it writable (chmod u+w), choose another -o, or pass --force to replace it "
                "(the new filter keeps the mode)"
            )


def missing_folders(path: Path) -> list[Path]:
    """The folders above ``path`` (absolute) that do not exist yet, the highest first."""
    missing: list[Path] = []
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            break
        missing.append(parent)
    return missing[::-1]


def make_folders(output: Path) -> None:
    """Create the output's folder if needed and try it with a temporary file, so that an
    unwritable output fails now, not after the corpus was read."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(
            prefix=f".{output.name}.", suffix=".probe", dir=output.parent
        )
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise OutputError(
            f"{output}: cannot write the filter there ({error.strerror or error}); choose another -o"
        ) from None


def remove_empty_folders(folders: Iterable[Path]) -> None:
    """Remove the folders a failed build created, deepest first, where they are still empty
    (a folder holding finished tasks to resume, or anybody's file, stays)."""
    for folder in sorted(folders, key=lambda path: len(path.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()


def owned_paths(written: Iterable[str]) -> list[str]:
    """The build's paths that a corpus walk or glob may pass over unsaid: each of ``written``
    (filter, sidecar, work directory) that does not exist yet, is a directory, or holds a
    filter or sidecar an earlier build wrote, and each one's lock file (``.NAME.lock``).

    Any other file at one of those paths is corpus, not the build's: leaving it out would hide
    it from :func:`check_not_an_input`, which must refuse it (even with ``--force``).
    """
    owned = []
    for name in written:
        path = Path(os.path.abspath(name))
        owned.append(str(BuildLock(path).path))
        try:
            mode: int | None = path.stat().st_mode
        except FileNotFoundError:
            mode = None  # nothing there yet: whatever appears there is the build's
        except OSError:
            continue
        if mode is None or stat.S_ISDIR(mode) or _is_filter_file(path) or _is_sidecar_file(path):
            owned.append(str(path))
    return owned


def check_not_an_input(output: Path, inputs: Iterable[str], pybloom: bool) -> None:
    """Refuse an output (or its sidecar) that is, or resolves to, one of the corpus files."""
    targets = [output] + ([sidecar_of(output)] if pybloom else [])
    identities = {}
    for target in targets:
        identities[os.path.realpath(target)] = target
        with contextlib.suppress(OSError):
            info = target.stat()
            identities[f"{info.st_dev}:{info.st_ino}"] = target
    for path in inputs:
        keys = [os.path.realpath(path)]
        with contextlib.suppress(OSError):
            info = os.stat(path)
            keys.append(f"{info.st_dev}:{info.st_ino}")
        for key in keys:
            if key in identities:
                raise OutputError(
                    f"{identities[key]}: is also an input of this build ({path}); writing the "
                    "filter there would destroy the corpus. Choose another -o"
                )


# ------------------------------------------------------------------------------------------------
# Temporaries left by interrupted builds

#: The random part of a temporary file's name (``tempfile.mkstemp``: 8 of ``[a-z0-9_]``), which
#: :class:`memfree.fileio.PendingFile` puts between ``.NAME.`` and ``.tmp``.
_RANDOM_PART = r"[a-z0-9_]{8}"


def temporaries_of(target: Path) -> list[Path]:
    """The temporary files an atomic write of ``target`` leaves beside it when its writer dies
    (``kill -9``, a power cut): ``.NAME.XXXXXXXX.tmp`` (:class:`memfree.fileio.PendingFile`).

    Only names of exactly that form are matched: ``.NAME.json.XXXXXXXX.tmp`` (another target's)
    and the lock file ``.NAME.lock`` are not.
    """
    pattern = re.compile(re.escape(f".{target.name}.") + _RANDOM_PART + r"\.tmp")
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    return sorted(target.parent / name for name in names if pattern.fullmatch(name))


def remove_stale_temporaries(output: Path, pybloom: bool) -> list[tuple[Path, int]]:
    """Remove the temporary filters (and sidecars) earlier builds of ``output`` left behind.

    A build writes its filter to a temporary beside the output, full size from the start (the
    index's section tasks write into it in place), and renames it into place; a build killed
    before the rename leaves it there. Call this holding the output's lock
    (:func:`locked`): then every temporary named for this output is a build's own, and none
    is being written.

    Args:
        output: the build's output (absolute).
        pybloom: the build writes a pybloomfiltermmap3 sidecar too (its temporaries go as well).

    Returns:
        Each file removed, with its size in bytes.
    """
    targets = [output] + ([sidecar_of(output)] if pybloom else [])
    removed = []
    for target in targets:
        for path in temporaries_of(target):
            try:
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode):
                    continue  # a build writes regular files only: anything else is not its own
                path.unlink()
            except OSError:
                continue
            removed.append((path, info.st_size))
    return removed


# ------------------------------------------------------------------------------------------------
# Locks


@dataclass
class BuildLock:
    """An exclusive lock held by this build on ``target`` (a lock file beside it).

    The lock file names its holder (process id, host, command, start time), so a second build is
    refused with a message saying who holds it. The kernel drops the lock if the holder dies,
    so a crashed build never blocks the next one.
    """

    target: Path
    _handle: Any = None

    @property
    def path(self) -> Path:
        return self.target.with_name(f".{self.target.name}.lock")

    def acquire(self) -> BuildLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._handle = take_lock(self.path)
        except LockHeld as held:
            raise OutputError(
                f"{self.target}: another build is writing it "
                f"({held.holder or 'another memfree build'}); wait for it to finish, or choose "
                "another -o / --work-dir"
            ) from None
        return self

    def release(self) -> None:
        if self._handle is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._handle.close()
        self._handle = None


@contextlib.contextmanager
def locked(*targets: Path) -> Iterator[None]:
    """Hold build locks on every target (in order) for the duration of the block."""
    locks: list[BuildLock] = []
    try:
        for target in dict.fromkeys(Path(os.path.abspath(t)) for t in targets):
            locks.append(BuildLock(target).acquire())
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


# ------------------------------------------------------------------------------------------------
# The work directory


@dataclass(frozen=True)
class WorkDir:
    """A work directory this build may use: ``created`` says whether the build made the folder
    itself (then it removes the folder at the end; else only what it put inside)."""

    path: Path
    created: bool

    def clear(self) -> None:
        """Remove what a build put here (task outputs and markers), nothing else."""
        for pattern in _WORK_ENTRIES:
            for entry in self.path.glob(pattern):
                shutil.rmtree(entry, ignore_errors=True)

    def remove_temporaries(self) -> int:
        """Remove the temporary files that tasks killed mid-write left inside what a build put
        here (``.NAME.tmp`` of a run, ``.NAME.XXXXXXXX.tmp`` of a kept file or a marker); the
        task that wrote one runs again and writes a new one. Call it holding the work
        directory's lock. Returns how many bytes were freed."""
        freed = 0
        for pattern in _WORK_ENTRIES:
            for entry in self.path.glob(pattern):
                for path in entry.rglob(".*.tmp") if entry.is_dir() else ():
                    try:
                        info = path.lstat()
                        if stat.S_ISREG(info.st_mode):
                            path.unlink()
                            freed += info.st_size
                    except OSError:
                        continue
        return freed

    def remove(self) -> None:
        """Clear it, drop the marker, and remove the folder if this build created it and it is
        now empty (a file someone else put there is never deleted)."""
        self.clear()
        with contextlib.suppress(OSError):
            (self.path / WORK_MARKER).unlink()
        if self.created:
            with contextlib.suppress(OSError):
                self.path.rmdir()


def prepare_work_dir(work: Path, config: dict[str, Any], config_hash: str) -> WorkDir:
    """Reuse ``work`` if a build with the same inputs and settings marked it, clear it if another
    build did, adopt it if it is empty, and refuse it otherwise."""
    marker = work / WORK_MARKER
    try:
        mode = work.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise OutputError(
            f"{work}: cannot use it as the work directory ({error.strerror})"
        ) from None
    if mode is not None and not stat.S_ISDIR(mode):
        raise OutputError(f"{work}: exists and is not a directory; pass another --work-dir")
    if mode is None:
        try:
            work.mkdir(parents=True)
        except OSError as error:
            raise OutputError(
                f"{work}: cannot create the work directory ({error.strerror}); pass --work-dir"
            ) from None
        created = True
    elif marker.is_file():
        try:
            previous = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            previous = {}
        created = bool(previous.get("created")) if isinstance(previous, dict) else False
        if isinstance(previous, dict) and previous.get("config_hash") == config_hash:
            return WorkDir(work, created)
        WorkDir(work, created).clear()
    elif any(work.iterdir()):
        raise OutputError(
            f"{work}: exists, is not empty and is not a memfree work directory (it has no "
            f"{WORK_MARKER}); memfree only deletes what it created. Pass an empty or new "
            "--work-dir"
        )
    else:
        created = False
    (work / "map").mkdir(exist_ok=True)
    payload = {
        "memfree_work_dir": 1,
        "config_hash": config_hash,
        "created": created,
        "config": config,
    }
    atomic_write(marker, json.dumps(payload))  # a half-written marker would disown the folder
    return WorkDir(work, created)
