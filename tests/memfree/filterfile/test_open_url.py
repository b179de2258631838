"""A filter given by URL (issue 37): ``NgramFilter.open("s3://...")`` downloads the object once
into memfree's cache and maps the copy; a changed object is fetched again, a damaged download
refused and dropped; against a real S3 API server on the loopback (moto's), read through s3fs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memfree import NgramFilter
from memfree.errors import DamagedFilterError, FilterError
from memfree.storage import fetched


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEMFREE_CACHE", str(folder))
    return folder


def _filter(path: Path, rows: list[list[int]]) -> bytes:
    NgramFilter.from_ngrams(path, rows)
    return path.read_bytes()


def _holds(filt: Any, row: list[int]) -> bool:
    return bool(filt.contains(np.array([row], dtype=np.int64))[0])


def test_a_filter_by_url_is_the_objects_not_a_local_file_of_that_name(
    s3: Any, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local file at the path the URL would fold to (``s3:/corpus/...``) is never opened in
    its place: the object is downloaded into the cache and opened from there."""
    monkeypatch.chdir(tmp_path)
    decoy = Path("s3:/corpus/filters/f.memfree")
    decoy.parent.mkdir(parents=True)
    _filter(decoy, [[1, 2, 3]])
    s3.pipe_file("corpus/filters/f.memfree", _filter(tmp_path / "real.memfree", [[4, 5, 6]]))
    opened = NgramFilter.open("s3://corpus/filters/f.memfree")
    assert _holds(opened, [4, 5, 6]) and not _holds(opened, [1, 2, 3])
    assert Path(opened.path).is_relative_to(cache)  # type: ignore[attr-defined]


def test_the_copy_is_fetched_once_and_again_when_the_object_changes(
    s3: Any, cache: Path, tmp_path: Path
) -> None:
    url = "s3://corpus/filters/changing.memfree"
    s3.pipe_file(url[5:], _filter(tmp_path / "one.memfree", [[1, 2, 3]]))
    first = fetched(url)
    stamp = first.stat().st_mtime_ns, first.stat().st_ino
    assert fetched(url) == first and (first.stat().st_mtime_ns, first.stat().st_ino) == stamp
    s3.pipe_file(url[5:], _filter(tmp_path / "two.memfree", [[7, 8, 9], [1, 2, 4]]))
    opened = NgramFilter.open(url)
    assert _holds(opened, [7, 8, 9]) and not _holds(opened, [1, 2, 3])
    assert (first.stat().st_mtime_ns, first.stat().st_ino) != stamp


def test_a_damaged_object_is_refused_naming_the_url_and_dropped_from_the_cache(
    s3: Any, cache: Path, tmp_path: Path
) -> None:
    data = _filter(tmp_path / "whole.memfree", [[1, 2, 3]])
    url = "s3://corpus/filters/cut.memfree"
    s3.pipe_file(url[5:], data[: len(data) - 100])  # cut short
    with pytest.raises(DamagedFilterError, match=r"s3://corpus/filters/cut.memfree.*dropped"):
        NgramFilter.open(url)
    assert not list((cache / "objects").iterdir())
    s3.pipe_file(url[5:], data)  # fixed at the source: the next open fetches it again
    assert _holds(NgramFilter.open(url), [1, 2, 3])


@pytest.mark.parametrize(
    "url, error, words",
    [
        ("s3://corpus/filters/none.memfree", FileNotFoundError, ["no such object"]),
        ("s3://no-such-bucket/f.memfree", FileNotFoundError, ["no such object or bucket"]),
        ("s3://KEY:secret@corpus/f.memfree", FilterError, ["credentials", "environment"]),
        ("s3://corpus/f.memfree?versionId=1", FilterError, ["query string"]),
    ],
    ids=["missing key", "missing bucket", "credentials", "query"],
)
def test_urls_that_give_no_filter_say_why(
    s3: Any, cache: Path, url: str, error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as caught:
        NgramFilter.open(url)
    message = str(caught.value)
    assert all(word in message for word in words) and "secret" not in message
    assert not cache.exists() or not list((cache / "objects").glob("*/*.memfree"))


def test_the_guard_takes_a_filter_by_url(
    s3: Any, cache: Path, tmp_path: Path, tokenizer: Any
) -> None:
    """``MemFreeLogitsProcessor("s3://...")`` (as ``MEMFREE_FILTER`` and ``--filter`` give it)
    guards with the bucket's filter."""
    import torch

    from bloom_builder.build import build_filter
    from memfree import MemFreeLogitsProcessor
    from tests.bloom_builder.test_build import settings_for

    (tmp_path / "c.txt").write_text("the cat sat on the mat and the dog ran far away\n" * 3)
    settings = settings_for(Path(tokenizer.name_or_path), min_count=1)
    build_filter([str(tmp_path / "c.txt")], tmp_path / "f.memfree", settings, progress=False)
    s3.put_file(str(tmp_path / "f.memfree"), "corpus/filters/guard.memfree")
    guard = MemFreeLogitsProcessor(
        "s3://corpus/filters/guard.memfree", tokenizer=tokenizer, canonical=False
    )
    ids = tokenizer("the cat sat on the mat and the dog ran far away")["input_ids"]
    n = guard.masker.n
    scores = guard(torch.tensor([ids[: n - 1]]), torch.zeros(1, len(tokenizer)))
    assert torch.isinf(scores[0, ids[n - 1]])


def test_a_protocol_memfree_cannot_read_is_refused_without_asking_any_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown protocol, and one whose package is not installed (gcsfs here), are refused
    by name before any network call; a local file of the folded name is not opened."""
    import importlib.util

    from memfree.errors import MissingDependencyError

    monkeypatch.chdir(tmp_path)
    Path("nosuch:/bucket").mkdir(parents=True)
    NgramFilter.from_ngrams(Path("nosuch:/bucket/f.memfree"), [[1, 2, 3]])
    with pytest.raises(FilterError, match="knows no nosuch://"):
        NgramFilter.open("nosuch://bucket/f.memfree")
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(MissingDependencyError, match=r"gcsfs.*memfree\[gcs\]"):
            NgramFilter.open("gs://bucket/f.memfree")


def test_an_object_rewritten_during_the_download_is_not_kept(
    s3: Any, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object is rewritten while its bytes are being copied (the copy is started, then the
    writer's upload lands): the download is refused, saying so, and nothing is kept; the next
    open fetches the new object whole."""
    import shutil

    import memfree.storage

    url = "s3://corpus/filters/racing.memfree"
    s3.pipe_file(url[5:], _filter(tmp_path / "old.memfree", [[1, 2, 3]]))
    new = _filter(tmp_path / "new.memfree", [[4, 5, 6], [7, 8, 9]])
    copy = shutil.copyfileobj

    def rewritten_midway(source: Any, out: Any, length: int = 0) -> None:
        s3.pipe_file(url[5:], new)
        copy(source, out, length)

    monkeypatch.setattr(memfree.storage.shutil, "copyfileobj", rewritten_midway)
    with pytest.raises(OSError, match="changed while it was downloaded"):
        fetched(url)
    assert not list((cache / "objects").glob("*/*.memfree"))
    monkeypatch.undo()
    assert _holds(NgramFilter.open(url), [4, 5, 6])


def test_a_cache_with_no_room_is_named_with_the_fix_and_keeps_no_half_copy(
    s3: Any, cache: Path, tmp_path: Path
) -> None:
    """The local disk refuses the download (here the kernel's file-size limit, EFBIG, as a full
    disk gives ENOSPC): the error names the cache, the object and ``MEMFREE_CACHE``, and no
    partial copy is left to be mapped later."""
    from tests.conftest import run_with_file_limit

    url = "s3://corpus/filters/big.memfree"
    rows = [[i, i + 1, i + 2] for i in range(0, 60_000, 3)]
    data = _filter(tmp_path / "big.memfree", rows)
    assert len(data) > 32 * 1024
    s3.pipe_file(url[5:], data)
    code = (
        "from memfree.storage import fetched\n"
        "try:\n"
        f"    fetched({url!r})\n"
        "except OSError as error:\n"
        "    print('refused:', error)\n"
    )
    done = run_with_file_limit(code, 16 * 1024, {"MEMFREE_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    message = done.stdout
    assert "refused: [Errno 27] no room in memfree's cache" in message
    assert url in message and "MEMFREE_CACHE" in message and str(cache / "objects") in message
    assert not [p for p in (cache / "objects").rglob("*") if p.is_file()]
    assert _holds(NgramFilter.open(url), [3, 4, 5])  # with room, the same call works
