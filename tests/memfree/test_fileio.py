"""The one atomic write: a failure leaves the old target and no temporary, modes follow the umask
or the replaced file, text mode writes UTF-8 with "\\n", and the filter writers go through it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from memfree.fileio import PendingFile, atomic_file, atomic_write, current_umask, new_file_mode
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.filterfile.bloom.writer import FilterFileWriter
from memfree.filterfile.pybloom.reader import PybloomWriter


class Interrupted(Exception):
    pass


def _chunks_then_failure() -> Iterator[bytes]:
    yield b"new first half"
    raise Interrupted


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_old_target_survives_a_failure_mid_write(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_bytes(b"old")
    with pytest.raises(Interrupted):
        atomic_write(target, _chunks_then_failure())
    with pytest.raises(Interrupted), atomic_file(target, text=True) as out:
        out.write("half")
        raise Interrupted
    assert target.read_bytes() == b"old"
    assert sorted(tmp_path.iterdir()) == [target]  # no temporary left beside it


def test_a_write_replaces_the_target_and_creates_folders(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "out.bin"
    atomic_write(target, [b"ab", memoryview(b"cd")])
    assert target.read_bytes() == b"abcd"
    atomic_write(target, b"xyz")
    assert target.read_bytes() == b"xyz"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]


def test_text_mode_writes_utf8_with_unix_newlines(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    with atomic_file(target, text=True) as out:
        out.write("zürich\nnext\n")
    assert target.read_bytes() == "zürich\nnext\n".encode()
    atomic_write(target, "é\n")
    assert target.read_bytes() == b"\xc3\xa9\n"


@pytest.mark.parametrize(("umask", "expected"), [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_a_new_file_follows_the_umask(tmp_path: Path, umask: int, expected: int) -> None:
    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        assert new_file_mode(tmp_path / "absent") == expected
        atomic_write(tmp_path / "new.bin", b"x")
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "new.bin") == expected


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "kept.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    atomic_write(target, b"new")
    assert _mode(target) == 0o640 and target.read_bytes() == b"new"


def test_pending_file_commits_or_discards(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    pending = PendingFile(target)
    assert pending.temporary.parent == tmp_path and pending.temporary.name.startswith(".f.bin.")
    pending.temporary.write_bytes(b"one")
    pending.commit()
    assert target.read_bytes() == b"one" and not pending.temporary.exists()
    pending = PendingFile(target)
    pending.temporary.write_bytes(b"two")
    pending.discard()
    assert target.read_bytes() == b"one" and sorted(tmp_path.iterdir()) == [target]
    with pytest.raises(Interrupted), PendingFile(target) as temporary:
        temporary.write_bytes(b"three")
        raise Interrupted
    assert target.read_bytes() == b"one" and sorted(tmp_path.iterdir()) == [target]


def test_a_failed_rename_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "occupied"
    (target / "inside").mkdir(parents=True)  # os.replace cannot put a file over a folder
    pending = PendingFile(target)
    pending.temporary.write_bytes(b"data")
    with pytest.raises(OSError):
        pending.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["occupied"]


def test_filter_file_writer_failure_keeps_the_old_filter(tmp_path: Path) -> None:
    target = tmp_path / "f.memfree"
    NgramFilter.from_ngrams(target, np.arange(30).reshape(10, 3)).close()
    before = target.read_bytes()
    metadata = {"n": 3, "num_probes": 2, "hash_seed": 1, "num_ngrams": 1}
    with pytest.raises(Interrupted), FilterFileWriter(target, 2, metadata) as writer:
        writer.bit_words[:3] = 7
        raise Interrupted
    assert target.read_bytes() == before and sorted(tmp_path.iterdir()) == [target]
    with FilterFileWriter(target, 2, metadata) as writer:  # committed: a new, valid filter
        writer.bit_words[0] = 0b11
    assert NgramFilter.open(target).metadata["num_bits"] == 1024 and target.read_bytes() != before
    assert sorted(tmp_path.iterdir()) == [target]


def test_pybloom_writer_goes_through_the_atomic_write(tmp_path: Path) -> None:
    writer = PybloomWriter(capacity=10, error_rate=0.1, hash_seed=0)
    writer.add_ngrams(np.array([[1, 2], [3, 4]]))
    previous = os.umask(0o077)
    try:
        path = writer.write(tmp_path / "f.bloom", {"unit": "token"}, num_ngrams=2)
    finally:
        os.umask(previous)
    assert _mode(path) == 0o600 and _mode(Path(f"{path}.json")) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bloom", "f.bloom.json"]
