"""A filter written to object storage: ``-o s3://bucket/filters/web.memfree``.

The build runs as for a local output, into a staging folder on this machine (the work directory
given, or one in memfree's cache named for the URL, so a rerun after an interruption reuses its
finished tasks); the finished filter is opened and its checksums verified, then uploaded to the
key in one request (a single or multipart upload: the store shows the object only once it is
whole, so no half filter is ever at the key), and checked there by size. A pybloomfiltermmap3
output's sidecar goes up first, the filter last. An existing object at the key that is not a
memfree filter is replaced only with ``force``, as a local file would be.
"""

from __future__ import annotations

import hashlib
import posixpath
import shutil
from pathlib import Path
from typing import Any

from bloom_builder.errors import BuildError
from bloom_builder.outputs import sidecar_of
from bloom_builder.settings import BuildSettings
from bloom_builder.summary import BuildSummary
from memfree.storage import address_problem, cache_dir, filesystem


def staging_folder(url: str) -> Path:
    """Where a build to ``url`` stages its output and, by default, its work directory."""
    return cache_dir() / "builds" / hashlib.sha256(url.encode()).hexdigest()[:24]


def check_store_output(url: str, force: bool, pybloom: bool) -> tuple[Any, str]:
    """The store and key of ``-o URL``, refused (before anything is built) where the URL is not
    taken or the key holds an object that is not a filter (without ``force``)."""
    problem = address_problem(url, "the output")
    if problem is not None:
        raise BuildError(problem)
    fs, path = filesystem(url)
    if not posixpath.basename(path.rstrip("/")) or path.endswith("/"):
        raise BuildError(f"the output {url!r} names a prefix, not an object: end it with a name")
    bucket = path.split("/", 1)[0]
    try:
        there = "/" not in path or fs.exists(bucket)
    except OSError as error:
        raise BuildError(f"the output {url}: the store refused: {error}") from None
    if not there:
        raise BuildError(f"the output {url}: no bucket {bucket!r} (create it first)")
    if force:
        return fs, path
    from memfree.filterfile.header import MAGIC
    from memfree.filterfile.pybloom import MAGIC as PYBLOOM_MAGIC

    try:
        if fs.isdir(path):
            raise BuildError(f"the output {url} is a prefix holding objects; give an object name")
        if fs.exists(path):
            head = fs.cat_file(path, start=0, end=max(len(MAGIC), len(PYBLOOM_MAGIC)))
            if not (head.startswith(MAGIC) or head.startswith(PYBLOOM_MAGIC)):
                raise BuildError(
                    f"the output {url} exists and is not a memfree filter; memfree does not "
                    "replace other objects. Choose another -o, or pass --force to overwrite it"
                )
    except FileNotFoundError:
        raise BuildError(f"the output {url}: no such bucket (create it first)") from None
    except OSError as error:
        raise BuildError(f"the output {url}: the store refused: {error}") from None
    del pybloom  # a sidecar at the key's name is replaced with the filter it describes
    return fs, path


def build_to_store(
    build: Any,
    paths: list[str],
    url: str,
    settings: BuildSettings,
    *,
    work_dir: str | Path | None,
    keep_work: bool,
    progress: bool,
    tokenizer: Any,
    force: bool,
) -> BuildSummary:
    """``build`` (:func:`~bloom_builder.build.build_filter`) into a local staging file, then
    the verified filter uploaded to ``url``; the summary names the URL."""
    pybloom = settings.output_format != "memfree"
    fs, key = check_store_output(url, force, pybloom)
    staging = staging_folder(url)
    local = staging / posixpath.basename(key)
    work = work_dir if work_dir else staging / (local.name + ".work")
    summary = build(
        paths, local, settings, work_dir=work, keep_work=keep_work, progress=progress,
        tokenizer=tokenizer, force=True,
    )  # fmt: skip
    from memfree.filterfile import open_filter

    open_filter(local, verify=True)  # its checksums, before it goes up
    uploads = [(sidecar_of(local), key + ".json")] if pybloom else []
    uploads.append((local, key))
    try:
        for source, target in uploads:
            fs.put_file(str(source), target)
            if int(fs.info(target).get("size") or -1) != source.stat().st_size:
                raise BuildError(f"the upload of {url} did not land whole; build again")
    except OSError as error:
        raise BuildError(
            f"the filter was built ({local}) but its upload to {url} failed: {error}; upload "
            "that file, or build again (finished work is reused)"
        ) from None
    for source, _ in uploads:
        source.unlink(missing_ok=True)
    if not keep_work and not work_dir:
        shutil.rmtree(staging, ignore_errors=True)
    summary.output = url
    return summary


__all__ = ["build_to_store", "check_store_output", "staging_folder"]
