"""Nothing a user owns is ever lost, nothing in a corpus is silently left out: work directories,
outputs that are inputs or other files, concurrent builds, symbolic links, file modes, memory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.build import BuildError, build_filter
from bloom_builder.outputs import WORK_MARKER
from memfree import NgramFilter
from memfree.cli import main as cli_main
from tests.bloom_builder.test_build import settings_for, write_corpus


def cli_build(corpus: Path | str, output: Path | str, tokenizer_dir: Path, *extra: str) -> int:
    return cli_main(
        [
            "build",
            str(corpus),
            "-o",
            str(output),
            "--tokenizer",
            str(tokenizer_dir),
            "--n",
            "4",
            "--workers",
            "1",
            "--no-progress",
            *extra,
        ]
    )


# ------------------------------------------------------------------------------------------------
# The work directory: memfree deletes only what it created and marked


def test_a_folder_memfree_did_not_make_is_never_deleted(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "config.json").write_text("{}")
    (victim / "model.safetensors").write_text("w")
    output = tmp_path / "x.memfree"
    assert cli_build(tmp_path / "corpus", output, tokenizer_dir, "--work-dir", str(victim)) == 2
    error = capsys.readouterr().err
    assert "not a memfree work directory" in error and str(victim) in error
    assert sorted(p.name for p in victim.iterdir()) == ["config.json", "model.safetensors", "sub"]
    assert not output.exists()


def test_an_existing_empty_work_dir_is_used_and_left_in_place(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    write_corpus(tmp_path / "corpus", 2)
    empty = tmp_path / "scratch"
    empty.mkdir()
    assert cli_build(tmp_path / "corpus", tmp_path / "x.memfree", tokenizer_dir, "--work-dir", str(empty)) == 0  # fmt: skip
    assert empty.is_dir() and not any(empty.iterdir())  # what memfree put there is gone, not it
    made = tmp_path / "made" / "work"
    assert cli_build(tmp_path / "corpus", tmp_path / "y.memfree", tokenizer_dir, "--work-dir", str(made)) == 0  # fmt: skip
    assert not made.exists()  # memfree created it, so memfree removes it


def test_a_marked_work_dir_keeps_what_others_put_in_it(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 2)
    output = tmp_path / "x.memfree"
    build_filter(
        [str(tmp_path / "corpus")],
        output,
        settings_for(tokenizer_dir),
        keep_work=True,
        progress=False,
    )
    work = tmp_path / "x.memfree.work"
    assert (work / WORK_MARKER).is_file()
    (work / "notes.txt").write_text("mine")
    build_filter([str(tmp_path / "corpus")], output, settings_for(tokenizer_dir, ngram_size=5), progress=False)  # fmt: skip
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


def test_a_build_with_nothing_usable_leaves_no_work_dir(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "blank.txt").write_text("   \n")
    with pytest.raises(BuildError, match="no usable document"):
        build_filter([str(tmp_path / "corpus")], tmp_path / "x.memfree", settings_for(tokenizer_dir), progress=False)  # fmt: skip
    assert not (tmp_path / "x.memfree.work").exists()
    assert not list(tmp_path.glob(".x.memfree*"))  # no lock or temporary file left


# ------------------------------------------------------------------------------------------------
# The output: never an input, never another kind of file, never written by two builds


def test_output_equal_to_an_input_is_refused(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    write_corpus(data, 1)
    corpus_file = data / "doc000.txt"
    original = corpus_file.read_bytes()
    link = tmp_path / "link.memfree"
    link.symlink_to(corpus_file)
    hard = tmp_path / "hard.memfree"
    os.link(corpus_file, hard)
    for output in (corpus_file, link, hard):
        assert cli_build(corpus_file, output, tokenizer_dir, "--force") == 2
        assert "is also an input" in capsys.readouterr().err
    assert cli_build(data, hard, tokenizer_dir, "--force") == 2  # reached by walking data/
    assert "is also an input" in capsys.readouterr().err
    assert corpus_file.read_bytes() == original


def test_an_output_inside_the_corpus_is_never_read_back(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    corpus = tmp_path / "corpus"
    write_corpus(corpus, 3)
    output = corpus / "f.memfree"
    settings = settings_for(tokenizer_dir)
    first = build_filter([str(corpus)], output, settings, keep_work=True, progress=False)
    first_bytes = output.read_bytes()
    second = build_filter([str(corpus)], output, settings, keep_work=True, progress=False)
    assert second.documents == first.documents == 3
    assert second.skipped["counts"] == {}  # the filter and its work directory are not corpus
    assert output.read_bytes() == first_bytes


def test_a_file_that_is_not_a_filter_is_not_overwritten_without_force(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus", 1)
    thesis = tmp_path / "thesis.docx"
    thesis.write_text("draft")
    thesis.chmod(0o600)
    assert cli_build(tmp_path / "corpus", thesis, tokenizer_dir) == 2
    assert "--force" in capsys.readouterr().err
    assert thesis.read_text() == "draft"
    assert cli_build(tmp_path / "corpus", thesis, tokenizer_dir, "--force") == 0
    assert NgramFilter.open(thesis).n == 4
    assert cli_build(tmp_path / "corpus", thesis, tokenizer_dir) == 0  # now a filter: rebuilt
    sidecar = tmp_path / "out.bloom.json"
    sidecar.write_text('{"mine": 1}')
    pytest.importorskip("pybloomfilter")
    assert cli_build(tmp_path / "corpus", tmp_path / "out.bloom", tokenizer_dir, "--format", "pybloomfiltermmap3") == 2  # fmt: skip
    assert "out.bloom.json" in capsys.readouterr().err and sidecar.read_text() == '{"mine": 1}'


@pytest.mark.parametrize(
    ("output", "reason"),
    [("/proc/version", "not a memfree filter"), ("somefile/x.memfree", "Not a directory")],
)
def test_unwritable_outputs_fail_cleanly(
    tmp_path: Path,
    tokenizer_dir: Path,
    capsys: pytest.CaptureFixture[str],
    output: str,
    reason: str,
) -> None:
    write_corpus(tmp_path / "corpus", 1)
    (tmp_path / "somefile").write_text("x")
    target = output if output.startswith("/") else str(tmp_path / output)
    assert cli_build(tmp_path / "corpus", target, tokenizer_dir) == 2
    error = capsys.readouterr().err
    assert reason in error and target in error and "Traceback" not in error
    if output.startswith("/proc"):
        assert cli_build(tmp_path / "corpus", target, tokenizer_dir, "--force") == 2
        assert "cannot write" in capsys.readouterr().err


def test_info_refuses_a_zero_ngram_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pybloomfilter")
    from memfree.filterfile.pybloom.reader import PybloomWriter

    writer = PybloomWriter(10, 1e-3, 0)
    writer.add_ngrams(np.array([[1, 2, 3]]))
    writer.write(tmp_path / "f.bloom", {"n": 3}, 1)
    (tmp_path / "f.bloom.json").unlink()
    assert cli_main(["info", str(tmp_path / "f.bloom"), "--ngram-size", "0"]) == 2
    assert "--ngram-size must be a positive integer" in capsys.readouterr().err


def test_a_second_build_of_the_same_output_is_refused_while_the_first_runs(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus", 40, words_per_file=2000)
    output = tmp_path / "x.memfree"
    command = [sys.executable, "-m", "memfree.cli", "build", str(tmp_path / "corpus"), "-o", str(output),
               "--tokenizer", str(tokenizer_dir), "--n", "4", "--workers", "1", "--shard-size", "1",
               "--no-progress"]  # fmt: skip
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".x.memfree.lock"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (lock.exists() and lock.read_text()):
        time.sleep(0.01)
    assert first.poll() is None, "the first build must still be running"
    assert cli_build(tmp_path / "corpus", output, tokenizer_dir) == 2
    error = capsys.readouterr().err
    assert "another build is writing it" in error and f"pid {first.pid}" in error
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert NgramFilter.open(output).n == 4
    assert not lock.exists()


# ------------------------------------------------------------------------------------------------
# Symbolic links: followed, each file once, loops cut; or refused and reported


def unique_text(tag: str) -> str:
    return f"zebra {tag} quartz {tag} vortex {tag} jumps {tag}\n"


def stored(filt: NgramFilter, tokenizer: Any, text: str) -> bool:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    windows = np.lib.stride_tricks.sliding_window_view(np.array(ids), filt.n)
    return bool(filt.contains(windows).all())


@pytest.fixture
def linked_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    write_corpus(corpus, 2)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "far.txt").write_text(unique_text("far"))
    (tmp_path / "lone.txt").write_text(unique_text("lone"))
    (corpus / "linked_dir").symlink_to(outside)
    (corpus / "linked_file.txt").symlink_to(tmp_path / "lone.txt")
    (corpus / "again.txt").symlink_to(corpus / "doc000.txt")  # the same file twice
    (corpus / "loop").symlink_to(corpus)
    (corpus / "dangling.txt").symlink_to(tmp_path / "gone.txt")
    return corpus


def test_symlinks_are_followed_once_and_reported_when_not_read(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, linked_corpus: Path
) -> None:
    output = tmp_path / "f.memfree"
    summary = build_filter(
        [str(linked_corpus)], output, settings_for(tokenizer_dir), progress=False
    )
    assert summary.documents == 4  # doc000, doc001, far, lone: doc000 once
    assert summary.skipped["counts"] == {"symlink loop": 1, "missing": 1}
    assert "gone.txt" in summary.skipped["examples"]["missing"][0]
    filt = NgramFilter.open(output)
    assert stored(filt, tokenizer, unique_text("far")) and stored(
        filt, tokenizer, unique_text("lone")
    )


def test_no_follow_symlinks_skips_and_reports_every_link(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, linked_corpus: Path
) -> None:
    output = tmp_path / "f.memfree"
    settings = settings_for(tokenizer_dir, follow_symlinks=False)
    summary = build_filter([str(linked_corpus)], output, settings, progress=False)
    assert summary.documents == 2
    assert summary.skipped["counts"] == {"symlink": 5}
    filt = NgramFilter.open(output)
    assert not stored(filt, tokenizer, unique_text("far"))
    explicit = build_filter([str(linked_corpus / "linked_file.txt")], tmp_path / "g.memfree", settings, progress=False)  # fmt: skip
    assert explicit.documents == 1  # a link named on the command line is read


# ------------------------------------------------------------------------------------------------
# File modes and memory


def test_the_filter_and_its_sidecar_follow_the_umask(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 1)
    previous = os.umask(0o077)
    try:
        build_filter([str(tmp_path / "corpus")], tmp_path / "f.memfree", settings_for(tokenizer_dir), progress=False)  # fmt: skip
        pytest.importorskip("pybloomfilter")
        pybloom = settings_for(tokenizer_dir, output_format="pybloomfiltermmap3")
        build_filter([str(tmp_path / "corpus")], tmp_path / "f.bloom", pybloom, progress=False)
    finally:
        os.umask(previous)
    for name in ("f.memfree", "f.bloom", "f.bloom.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name


PEAK_SCRIPT = """
import sys
from memfree.cli import main
code = main(sys.argv[1:])
# VmHWM: the peak of this program alone (ru_maxrss would include the parent's size at fork)
peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print(int(peak) // 1024)
sys.exit(code)
"""


def peak_mib(tmp_path: Path, corpus: Path, tokenizer_dir: Path, limit: str) -> int:
    output = tmp_path / f"{corpus.name}.memfree"
    result = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, "build", str(corpus), "-o", str(output), "--tokenizer",
         str(tokenizer_dir), "--workers", "1", "--memory-limit", limit, "--no-progress", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    summary = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert summary["documents"] == 1 and summary["tokens"] > 0
    return int(result.stdout.split()[-1])


def test_memory_limit_covers_tokenizing_one_huge_line(tmp_path: Path, tokenizer_dir: Path) -> None:
    """A 12 MB single line at --memory-limit 64M: the build grows by less than the limit plus a
    fixed allowance over a build of a tiny file (tokenized whole, it would take over 1 GB)."""
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "return", "self", "def", "class", "print"]
    (tmp_path / "huge.txt").write_text(" ".join(rng.choice(words, size=2_000_000)))
    (tmp_path / "tiny.txt").write_text("alpha beta gamma delta return self def class print\n")
    baseline = peak_mib(tmp_path, tmp_path / "tiny.txt", tokenizer_dir, "64M")
    peak = peak_mib(tmp_path, tmp_path / "huge.txt", tokenizer_dir, "64M")
    assert peak - baseline < 64 + 100, (baseline, peak)
