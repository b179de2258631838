"""Reliability round 3, the build's own files: output paths that name no file, read-only filters,
folders a failed build made, unreachable rates, damaged work reused, the reuse key, and the
filter checked before it is renamed into place."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from bloom_builder.build import BuildError, build_filter
from bloom_builder.counting import file_digest
from bloom_builder.settings import BuildSettings, lowest_reachable_rate
from memfree import NgramFilter
from tests.bloom_builder.test_build import settings_for, write_corpus
from tests.bloom_builder.test_outputs import cli_build


def build(corpus: Path, output: Path, tokenizer_dir: Path, **kwargs: object) -> object:
    return build_filter(
        [str(corpus)], output, settings_for(tokenizer_dir), progress=False, **kwargs
    )


# ------------------------------------------------------------------------------------------------
# -o that names no file (15)


@pytest.mark.parametrize("bad", ["", " ", ".", "/", "x/..", "new/", "sub/."])
def test_an_output_that_names_no_file_is_refused_before_any_work(
    tmp_path: Path,
    tokenizer_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    bad: str,
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    monkeypatch.chdir(tmp_path)
    before = sorted(path.name for path in tmp_path.iterdir())
    assert cli_build(tmp_path / "corpus", bad, tokenizer_dir) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert "-o" in error and ("folder" in error or "empty" in error)
    assert sorted(path.name for path in tmp_path.iterdir()) == before  # no x/...work, no "new"


def test_a_url_is_never_taken_for_a_local_path(
    tmp_path: Path,
    tokenizer_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``-o s3://bucket/f.memfree`` wrote a local folder named ``s3:`` (issue 37): a work
    directory given as a URL is a work directory on the store (tests/bloom_builder/
    test_store_work.py), never a local folder; one that cannot be taken (credentials in it, a
    protocol whose package is missing) is refused before anything is made, naming it and what
    to do, the secret unrepeated; nothing appears in the working directory."""
    import importlib.util

    from memfree.cli import main

    write_corpus(tmp_path / "corpus", 2)
    monkeypatch.chdir(tmp_path)
    before = sorted(path.name for path in tmp_path.iterdir())
    corpus, output = str(tmp_path / "corpus"), "out.memfree"
    cases = [("s3://KEY:TOPSECRET@bucket/work", "credentials")]
    if not importlib.util.find_spec("gcsfs"):
        cases.append(("gs://bucket/work", "memfree[gcs]"))
    for url, said in cases:
        argv = ["build", corpus, "-o", output, "--tokenizer", str(tokenizer_dir), "--work-dir", url]
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert "Traceback" not in error and "TOPSECRET" not in error
        assert said in error, error
        assert sorted(path.name for path in tmp_path.iterdir()) == before  # no "s3:", no work
    with pytest.raises(BuildError, match="credentials"):
        build_filter([corpus], output, settings_for(tokenizer_dir), work_dir=cases[0][0])


def test_a_relative_output_is_written_where_the_user_meant(
    tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    monkeypatch.chdir(tmp_path)
    summary = build(Path("corpus"), Path("out/f.memfree"), tokenizer_dir, work_dir="w")
    assert Path(summary.output).is_absolute()  # type: ignore[attr-defined]
    assert (tmp_path / "out" / "f.memfree").is_file()
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------------------------------------
# A read-only filter; folders a failed build made (21)


def test_a_read_only_filter_is_replaced_only_with_force(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    output = tmp_path / "f.memfree"
    assert cli_build(tmp_path / "corpus", output, tokenizer_dir) == 0
    output.chmod(0o444)
    before = output.read_bytes()
    write_corpus(tmp_path / "corpus", 3, seed=1)
    assert cli_build(tmp_path / "corpus", output, tokenizer_dir) == 2
    error = capsys.readouterr().err
    assert "read-only" in error and "--force" in error and str(output) in error
    assert output.read_bytes() == before
    assert cli_build(tmp_path / "corpus", output, tokenizer_dir, "--force") == 0
    assert output.read_bytes() != before
    assert stat.S_IMODE(output.stat().st_mode) == 0o444  # a rebuild keeps the owner's mode


def test_a_failed_build_leaves_no_empty_folder_of_its_own(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    empty = tmp_path / "corpus"
    empty.mkdir()
    (empty / "blank.txt").write_text("")
    output = tmp_path / "a" / "b" / "f.memfree"
    work = tmp_path / "w1" / "w2" / "work"
    with pytest.raises(BuildError, match="no usable document"):
        build(empty, output, tokenizer_dir, work_dir=work)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus"]


def test_a_failed_build_keeps_folders_that_hold_work_to_resume(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    output = tmp_path / "new" / "f.memfree"
    with pytest.raises(BuildError, match="cannot be reached"):
        build_filter(
            [str(tmp_path / "corpus")],
            output,
            settings_for(tokenizer_dir, false_positive_rate=1e-45, layout="blocked-512"),
            progress=False,
        )
    assert (tmp_path / "new" / "f.memfree.work").is_dir()  # counting is kept for the rerun


# ------------------------------------------------------------------------------------------------
# Unreachable rates (16)


@pytest.mark.parametrize("layout", ["prefix-index", "blocked-512"])
@pytest.mark.parametrize("option", ["--fpr", "--prefix-fpr"])
def test_an_unreachable_rate_is_refused_before_the_corpus_is_read(
    tmp_path: Path,
    tokenizer_dir: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    layout: str,
) -> None:
    missing = tmp_path / "does-not-exist"  # were the corpus read, this would be the error
    arguments = (option, "1e-300", "--layout", layout)
    assert cli_build(missing, tmp_path / "f.memfree", tokenizer_dir, *arguments) == 2
    error = capsys.readouterr().err
    assert f"{option} 1e-300 cannot be reached" in error and "Traceback" not in error
    assert not (tmp_path / "f.memfree.work").exists()


def test_the_floor_is_the_rate_of_one_ngram_in_the_largest_filter() -> None:
    floor = lowest_reachable_rate()
    assert 1e-50 < floor < 1e-47
    BuildSettings(false_positive_rate=floor, layout="blocked-512")  # reachable: accepted
    with pytest.raises(ValueError, match="cannot be reached"):
        BuildSettings(false_positive_rate=floor / 2, layout="blocked-512")
    # The prefix index (the default for token filters) has its own floor: a 56-bit remainder.
    BuildSettings(false_positive_rate=2.0**-56)
    with pytest.raises(ValueError, match="no prefix index goes below"):
        BuildSettings(false_positive_rate=2.0**-57)
    # The interchange format sizes itself otherwise (its bits grow with -log p): not bounded here.
    BuildSettings(false_positive_rate=1e-300, output_format="pybloomfiltermmap3")


def test_a_rate_unreachable_for_the_counted_ngrams_fails_cleanly_and_keeps_the_counts(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Above the floor, below what 2**32 blocks give the corpus's count: known only after
    counting. A clear exit 2, and a rerun with a reachable rate reuses every task."""
    write_corpus(tmp_path / "corpus", 2)
    output = tmp_path / "f.memfree"
    # The Bloom layout: 1e-45 is above its floor, below what 2**32 blocks give these n-grams.
    # The index: 1e-16 is above its floor, below what the widest remainder gives them.
    for layout, rate in (("blocked-512", "1e-45"), ("prefix-index", "1e-16")):
        arguments = ("--fpr", rate, "--layout", layout)
        assert cli_build(tmp_path / "corpus", output, tokenizer_dir, *arguments) == 2
        error = capsys.readouterr().err
        assert f"--fpr {rate} cannot be reached for" in error and "Traceback" not in error
        assert not output.exists()
        assert (
            cli_build(tmp_path / "corpus", output, tokenizer_dir, "--json", "--layout", layout) == 0
        )
        summary = json.loads(capsys.readouterr().out)
        assert summary["reused_tasks"] == summary["map_tasks"] > 0
        output.unlink()


# ------------------------------------------------------------------------------------------------
# Damaged work is never reused (4); the filter is checked before it is renamed into place


def _kept_build(corpus: Path, output: Path, tokenizer_dir: Path) -> object:
    return build(corpus, output, tokenizer_dir, keep_work=True)


def _map_markers(work: Path) -> list[Path]:
    return sorted((work / "map").glob("shard-*.json"))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_map_run_is_run_again_not_reused(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: object, damage: str
) -> None:
    write_corpus(tmp_path / "corpus", 6)
    output = tmp_path / "f.memfree"
    first = _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    expected = output.read_bytes()
    work = tmp_path / "f.memfree.work"
    marker = json.loads(_map_markers(work)[0].read_text())
    keys = Path(marker["runs"][0] + ".keys")
    data = bytearray(keys.read_bytes())
    if damage == "truncate":
        data = data[: int(len(data) * 0.95) // 8 * 8]
    else:
        data[len(data) // 2] ^= 0xFF  # the same size, other bytes
    keys.write_bytes(bytes(data))
    output.unlink()
    again = _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    assert again.reused_tasks == first.map_tasks - 1  # type: ignore[attr-defined]
    assert output.read_bytes() == expected


def test_run_files_whose_times_moved_are_hashed_and_reused_when_intact(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """A marker trusts a file with its recorded size and times unread; a file touched since (or a
    copied work directory) is read and hashed instead, and reused when its bytes are intact."""
    write_corpus(tmp_path / "corpus", 6)
    output = tmp_path / "f.memfree"
    first = _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    expected = output.read_bytes()
    work = tmp_path / "f.memfree.work"
    for path in [*(work / "map").rglob("run-*"), *(work / "reduce-min1").glob("*.u64")]:
        os.utime(path, ns=(1, 1))  # times moved, bytes intact
    output.unlink()
    again = _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    assert again.reused_tasks == first.map_tasks  # type: ignore[attr-defined]
    assert output.read_bytes() == expected


def test_a_damaged_kept_file_is_counted_again(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 4)
    output = tmp_path / "f.memfree"
    _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    expected = output.read_bytes()
    kept = max((tmp_path / "f.memfree.work").glob("reduce-min1/ngrams-*.u64"), key=os.path.getsize)
    data = bytearray(kept.read_bytes())
    data[0] ^= 0x01
    kept.write_bytes(bytes(data))
    output.unlink()
    _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    assert output.read_bytes() == expected


def test_markers_record_each_output_size_and_checksum(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 3)
    _kept_build(tmp_path / "corpus", tmp_path / "f.memfree", tokenizer_dir)
    work = tmp_path / "f.memfree.work"
    for marker in _map_markers(work):
        files = json.loads(marker.read_text())["files"]
        assert files and all(
            file_digest(Path(name)) == tuple(entry[:2]) for name, entry in files.items()
        )
    for marker in (work / "reduce-min1").glob("*.json"):
        result = json.loads(marker.read_text())
        kept = marker.with_suffix(".u64")
        assert file_digest(kept) == (result["kept"] * 8, result["kept_file"][1])


def test_work_that_passes_its_markers_but_gives_a_damaged_filter_never_reaches_the_output(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """The worst case: kept files replaced behind their markers (checksums recomputed) with
    fingerprints that set almost no bits. The filter written from them is refused by every
    reader, so the build must check it before the rename: exit 2, the old filter untouched,
    the damaged work deleted, and a rerun builds the right filter."""
    write_corpus(tmp_path / "corpus", 4)
    output = tmp_path / "f.memfree"
    _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    expected = output.read_bytes()
    work = tmp_path / "f.memfree.work"
    for marker in (work / "reduce-min1").glob("ngrams-*.json"):
        result = json.loads(marker.read_text())
        kept = marker.with_suffix(".u64")
        zeros = np.zeros(result["kept"], dtype="<u8").tobytes()
        kept.write_bytes(zeros)
        result["kept_file"] = list(file_digest(kept))  # size and xxh3 agree: only reading tells
        marker.write_text(json.dumps(result))
    with pytest.raises(BuildError, match="failed its own check") as refused:
        _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    assert str(output) in str(refused.value) and "rerun" in str(refused.value)
    assert output.read_bytes() == expected  # untouched
    assert not list(tmp_path.glob(".f.memfree.*.tmp"))
    assert not work.exists()
    _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    assert output.read_bytes() == expected
    assert len(NgramFilter.open(output)) > 0


# ------------------------------------------------------------------------------------------------
# The reuse key (19)


def test_a_same_size_edit_with_its_mtime_restored_is_not_reused(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    output = tmp_path / "f.memfree"
    _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    first = output.read_bytes()
    document = tmp_path / "corpus" / "doc000.txt"
    info = document.stat()
    text = document.read_text()
    edited = text.replace(text.split()[0], text.split()[0][::-1], 1)
    assert len(edited) == len(text) and edited != text
    document.write_text(edited)
    os.utime(document, ns=(info.st_atime_ns, info.st_mtime_ns))  # as cp -p / rsync -t do
    assert document.stat().st_mtime_ns == info.st_mtime_ns
    again = _kept_build(tmp_path / "corpus", output, tokenizer_dir)
    assert again.reused_tasks == 0  # type: ignore[attr-defined]
    assert output.read_bytes() != first


@pytest.mark.parametrize(
    ("option", "value"), [("--shard-size", "0"), ("--memory-limit", "1K"), ("--partitions", "3")]
)
def test_setting_errors_name_the_option_as_typed(
    tmp_path: Path,
    tokenizer_dir: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
) -> None:
    write_corpus(tmp_path / "corpus", 1)
    assert cli_build(tmp_path / "corpus", tmp_path / "f.memfree", tokenizer_dir, option, value) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith("memfree: error: ") and option in error and "_" not in error.split(":")[2]
    )


def test_a_megatron_bin_rewritten_in_place_is_not_reused(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """A Megatron unit is named by its .idx; the .bin it reads is part of the reuse key too (two
    datasets of the same document lengths have byte-identical indexes)."""
    from bloom_builder.sources.megatron import write_megatron

    rng = np.random.default_rng(0)
    documents = [rng.integers(5, 250, size=40).tolist() for _ in range(4)]
    others = [rng.integers(5, 250, size=40).tolist() for _ in range(4)]
    (tmp_path / "d").mkdir()
    (tmp_path / "e").mkdir()
    write_megatron(str(tmp_path / "d" / "data"), documents)
    write_megatron(str(tmp_path / "e" / "data"), others)
    assert (tmp_path / "d/data.idx").read_bytes() == (tmp_path / "e/data.idx").read_bytes()
    output = tmp_path / "f.memfree"
    _kept_build(tmp_path / "d", output, tokenizer_dir)
    first = output.read_bytes()
    with open(tmp_path / "d" / "data.bin", "r+b") as handle:  # in place, as `cat e > d` does
        handle.write((tmp_path / "e" / "data.bin").read_bytes())
    again = _kept_build(tmp_path / "d", output, tokenizer_dir)
    assert again.reused_tasks == 0  # type: ignore[attr-defined]
    fresh = tmp_path / "fresh.memfree"
    build(tmp_path / "d", fresh, tokenizer_dir)
    assert output.read_bytes() == fresh.read_bytes() != first
