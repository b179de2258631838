"""Discovery: expand files, directories, globs and ``stdlib:`` into a corpus's work units, with
the symbolic-link policy, hidden paths skipped (and counted), reserved paths skipped, saved
datasets taken whole and Megatron datasets read through their ``.idx``.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import glob
import os
import stat
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bloom_builder.sources.megatron import bin_path, is_megatron_index, megatron_units
from bloom_builder.sources.parquet import parquet_units
from bloom_builder.sources.remote import is_url, listed, stamp
from bloom_builder.sources.saved_datasets import dataset_splits, dataset_units
from bloom_builder.sources.streams import COMPRESSION_RATIO, COMPRESSION_SUFFIXES
from bloom_builder.sources.work_units import ProblemLog, SourceOptions, WorkUnit, reason

STDLIB = "stdlib:"
_HIDDEN = {
    "file": "a hidden file (its name starts with '.'), not read; name it to read it",
    "directory": "a hidden folder (its name starts with '.'), not walked; name it to read it",
}


def discover(
    paths: Sequence[str],
    options: SourceOptions,
    problems: ProblemLog,
    reserved: Sequence[str] = (),
) -> list[WorkUnit]:
    """Expand files, directories, globs and :data:`STDLIB` into work units.

    Args:
        paths: files; directories (walked recursively, hidden entries skipped and counted,
            saved datasets taken whole); glob patterns (``**`` allowed); ``"stdlib:"`` for the
            standard library's ``.py`` files. A Megatron ``.bin`` stands for its dataset, read
            through the ``.idx`` beside it.
        options: selection, splitting and symbolic-link settings.
        problems: receives "missing", "unreadable", "missing column", "symlink", "symlink loop",
            "hidden" (files and folders a walk passed over; the stdlib walk's are not counted),
            "no ids" (plain text with ``ids_field``) and "empty" entries.
        reserved: paths that are the build's own (its filter, sidecar, work directory, locks):
            never read when a walk or a glob meets them, and not reported (they are not part of
            the corpus). A caller must pass only what it wrote there: a corpus file at one of
            these paths would be left out unsaid.

    Returns:
        Units sorted by path, then start; a file reached twice (through links too, or a
        Megatron dataset through its ``.bin`` and ``.idx``) appears once.
    """
    if isinstance(paths, str):
        raise ValueError(f"discover() takes a list of paths, got the string {paths!r}; pass [path]")
    chosen: dict[str, tuple[str, bool]] = {}  # real path -> (absolute path, is a dataset)
    hidden_seen: set[str] = set()  # real paths of the hidden entries counted
    walk = _Walk(options.follow_symlinks, {os.path.realpath(path) for path in reserved}, problems)

    def add(path: str, relative: str | None, is_dataset: bool, hidden: str = "") -> None:
        """Take ``path``; ``relative`` (None: named explicitly, always taken) meets the patterns.
        A ``hidden`` "file" or "directory" the patterns select is counted instead."""
        names = () if relative is None else (relative, os.path.basename(relative))
        selecting = options.include and hidden != "directory"  # include patterns name files
        if names and selecting and not _matches(names, options.include):
            return
        if not is_dataset and not hidden:
            path = _megatron_index_of(path) or path  # a .bin stands for its dataset
        absolute, key = os.path.abspath(path), os.path.realpath(path)
        if key in walk.reserved or _matches(names, options.exclude):
            return  # reserved: the build's own output, not part of the corpus, so not reported
        if hidden:
            if key not in hidden_seen:  # a folder walked twice (named twice, nested) counts once
                hidden_seen.add(key)
                problems.record("hidden", absolute, _HIDDEN[hidden])
        elif key not in chosen or absolute < chosen[key][0]:
            chosen[key] = (absolute, is_dataset)

    remote: dict[str, tuple[int, tuple[Any, ...]]] = {}  # object URL -> size, stamp
    for spec in paths:
        path = os.path.expanduser(spec)
        if is_url(spec):  # object storage: listed through the store
            found = listed(spec, problems)
            stamps = {url: listed_stamp for url, _, _, listed_stamp in found}
            for url, relative, size, listed_stamp in found:
                if url.lower().endswith(".bin") and url[:-4] + ".idx" in stamps:
                    continue  # a Megatron dataset: read through the .idx listed beside it
                names = (relative, relative.rsplit("/", 1)[-1])
                named = url == spec  # named by itself: always taken
                seen = listed_stamp
                if named and url.lower().endswith(".bin"):
                    index = tuple(stamp(url[:-4] + ".idx"))
                    if index[0]:  # a .bin named alone stands for its dataset
                        url, seen = url[:-4] + ".idx", (*index, *listed_stamp)
                elif url.lower().endswith(".idx") and url[:-4] + ".bin" in stamps:
                    seen = (*listed_stamp, *stamps[url[:-4] + ".bin"])  # both files' stamps
                if not named and options.include and not _matches(names, options.include):
                    continue
                if not _matches(names, options.exclude):
                    remote[url] = (size, seen)
        elif spec == STDLIB:
            walk.run(sysconfig.get_paths()["stdlib"], add, python_only=True)
        elif os.path.isdir(path):
            walk.run(path, add)
        elif os.path.exists(path):
            add(path, None, False, "")
        elif glob.has_magic(path):
            matches = sorted(glob.glob(path, recursive=True))
            for match in matches:
                if walk.refuse_link(match):
                    continue
                if os.path.isdir(match):
                    walk.run(match, add)
                else:
                    add(match, os.path.basename(match), False, "")
            if not matches:
                problems.record("missing", spec, "the glob pattern matched nothing")
        elif os.path.islink(path):
            try:
                os.stat(path)
                problems.record("missing", spec, _dangling(path))
            except OSError as error:
                if error.errno == errno.ELOOP:
                    problems.record("symlink loop", spec, "a symbolic link that leads to itself")
                else:
                    problems.record("missing", spec, _dangling(path))
        else:
            problems.record("missing", spec, "no such file or directory")
    units: list[WorkUnit] = []
    for absolute, is_dataset in sorted(chosen.values()):
        units += (dataset_units if is_dataset else _file_units)(absolute, options, problems)
    for url, (size, seen) in sorted(remote.items()):
        # Each unit of an object keeps what the store said of it, to refuse a rewritten one.
        units += [
            dataclasses.replace(unit, stamp=seen) if unit.path == url else unit
            for unit in _units_of(url, size, options, problems)
        ]
    return units


def _matches(names: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for name in names for pattern in patterns)


def _megatron_index_of(path: str) -> str | None:
    """The ``.idx`` beside a Megatron ``.bin`` file, which stands for the dataset; else None."""
    if path.lower().endswith(".bin") and os.path.isfile(path[:-4] + ".idx"):
        return path[:-4] + ".idx"
    return None


def _dangling(path: str) -> str:
    return f"a symbolic link to {os.readlink(path)!r}, which does not exist"


@dataclass
class _Walk:
    """Directory walks of one discovery: the symbolic-link policy, and the directories already
    walked (by real path), so that links never make a file read twice or a walk loop."""

    follow: bool
    reserved: set[str]
    problems: ProblemLog
    walked: set[str] = field(default_factory=set)

    def refuse_link(self, path: str) -> bool:
        """True (and recorded) for a symbolic link that the policy does not follow."""
        if self.follow or not os.path.islink(path):
            return False
        target = os.readlink(path)
        reason = f"a symbolic link to {target!r}, not followed (--no-follow-symlinks)"
        self.problems.record("symlink", path, reason)
        return True

    def run(
        self,
        root: str,
        add: Callable[[str, str | None, bool, str], None],
        python_only: bool = False,
    ) -> None:
        """Offer every file under ``root`` to ``add``, saved datasets as a whole, and hidden
        entries as such (except in a ``python_only`` walk, which passes over all but ``.py``)."""
        splits = dataset_splits(root, self.problems)
        for split in splits or ():
            add(split, None, True, "")  # a root is named by the user (or matched by a glob)
        if splits is not None:
            return
        skipped = {"site-packages", "dist-packages", "__pycache__"} if python_only else set()
        self.walked.add(os.path.realpath(root))

        def unreadable(error: OSError) -> None:
            self.problems.record("unreadable", str(error.filename or root), reason(error))

        for directory, subdirectories, files in os.walk(
            root, onerror=unreadable, followlinks=self.follow
        ):
            kept = []
            for name in sorted(set(subdirectories) - skipped):
                path = os.path.join(directory, name)
                if name.startswith("."):
                    if not python_only:
                        add(path, os.path.relpath(path, root), False, "directory")
                    continue
                if self.refuse_link(path) or not self._enter(path):
                    continue
                splits = dataset_splits(path, self.problems)
                for split in splits or ():
                    add(split, os.path.relpath(split, root), True, "")
                if splits is None:
                    kept.append(name)
            subdirectories[:] = kept
            for name in sorted(files):
                path = os.path.join(directory, name)
                if python_only and (name.startswith(".") or not name.endswith(".py")):
                    continue
                if name.startswith("."):
                    add(path, os.path.relpath(path, root), False, "file")
                elif not self.refuse_link(path):
                    add(path, os.path.relpath(path, root), False, "")

    def _enter(self, path: str) -> bool:
        """Whether to walk the directory ``path``: not reserved, not walked yet, not a loop."""
        real = os.path.realpath(path)
        if real in self.reserved:
            return False  # the build's own work directory
        if os.path.islink(path):
            parent = os.path.realpath(os.path.dirname(path))
            if os.path.commonpath([real, parent]) == real:
                reason = f"a symbolic link back to {real}, which is being read already"
                self.problems.record("symlink loop", path, reason)
                return False
            if real in self.walked:
                return False  # reached before through another path: its files are read once
        self.walked.add(real)
        return True


def _file_units(path: str, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    try:
        info = os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            problems.record("symlink loop", path, "a symbolic link that leads back to itself")
        elif os.path.islink(path) and isinstance(error, FileNotFoundError):
            problems.record("missing", path, _dangling(path))
        else:
            problems.record("unreadable", path, reason(error))
        return []
    if not stat.S_ISREG(info.st_mode):
        problems.record("unreadable", path, "not a regular file (a device, socket or pipe)")
        return []
    return _units_of(path, info.st_size, options, problems)


def _units_of(path: str, size: int, options: SourceOptions, problems: ProblemLog) -> list[WorkUnit]:
    """A file's (or an object's) work units, by its name and size."""
    name, compression = path.lower(), ""
    for suffix, method in COMPRESSION_SUFFIXES.items():
        if name.endswith(suffix):
            name, compression = name[: -len(suffix)], method
    kind = "jsonl" if name.endswith((".jsonl", ".ndjson", ".json")) else "text"
    step = options.split_bytes
    if is_url(path) and name.endswith(".idx") and not compression:
        return megatron_units(path, problems)  # its .bin missing: recorded there
    if name.endswith(".idx") and not compression:
        if os.path.exists(bin_path(path)):
            return megatron_units(path, problems)
        if is_megatron_index(path):
            missing = f"a Megatron index without its .bin: {bin_path(path)} does not exist"
            problems.record("missing", path, f"{missing}; put the .bin beside it")
            return []
    if name.endswith(".parquet"):
        if not compression:
            return parquet_units(path, options, problems)
        problems.record("unreadable", path, "compressed Parquet: decompress it first")
        return []
    if kind == "text" and options.ids_field is not None:
        problems.record(
            "no ids",
            path,
            f"plain text holds no token ids for --ids-field {options.ids_field!r} (it reads "
            "Parquet, saved datasets and JSON lines); leave --ids-field out to tokenize the "
            "text, or leave the file out of this corpus",
        )
        return []
    if compression:
        return [WorkUnit(path, kind, compression, size_bytes=size * COMPRESSION_RATIO)]
    if kind == "jsonl" and size > step:
        bounds = [
            (start, start + step if start + step < size else -1) for start in range(0, size, step)
        ]
        return [WorkUnit(path, kind, "", a, b, (size if b < 0 else b) - a) for a, b in bounds]
    return [WorkUnit(path, kind, "", size_bytes=size)]
