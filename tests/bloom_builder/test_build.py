"""The streaming builder end to end: exact counts, determinism, resume after kill -9, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.build import BuildError, build_filter
from bloom_builder.counting import Run, RunWriter, count_range
from bloom_builder.plan import plan_shards
from bloom_builder.settings import BuildSettings, parse_size
from memfree import NgramFilter
from memfree.cli import main as cli_main
from memfree.filterfile.bloom.reader import BloomFilter
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "return",
    "self",
    "def",
    "class",
    "import",
    "for",
    "in",
    "range",
    "print",
    "total",
]


def write_corpus(
    directory: Path, num_files: int, seed: int = 0, words_per_file: int = 400
) -> list[str]:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    texts = []
    for index in range(num_files):
        text = " ".join(rng.choice(WORDS, size=words_per_file)) + "\n"
        (directory / f"doc{index:03d}.txt").write_text(text)
        texts.append(text)
    return texts


def reference_counts(tokenizer: Any, texts: list[str], n: int) -> Counter[tuple[int, ...]]:
    counts: Counter[tuple[int, ...]] = Counter()
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        counts.update(tuple(ids[i : i + n]) for i in range(len(ids) - n + 1))
    return counts


def settings_for(tokenizer_dir: Path, **overrides: Any) -> BuildSettings:
    values: dict[str, Any] = {
        "ngram_size": 4,
        "tokenizer": str(tokenizer_dir),
        "workers": 1,
        "memory_limit_bytes": 16 << 20,
        "shard_bytes": 2000,
    }
    values.update(overrides)
    return BuildSettings(**values)


@pytest.mark.parametrize("min_count", [1, 3])
def test_build_matches_exact_reference(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any, min_count: int
) -> None:
    texts = write_corpus(tmp_path / "corpus", 12)
    summary = build_filter(
        [str(tmp_path / "corpus")],
        tmp_path / "f.memfree",
        settings_for(
            tokenizer_dir, min_count=min_count, false_positive_rate=1e-6, layout="blocked-512"
        ),
        progress=False,
    )
    counts = reference_counts(tokenizer, texts, 4)
    kept = [ngram for ngram, count in counts.items() if count >= min_count]
    dropped = [ngram for ngram, count in counts.items() if count < min_count]
    assert summary.distinct_ngrams == len(counts)
    assert summary.kept_ngrams == len(kept)
    assert summary.ngrams == sum(counts.values())
    assert summary.documents == 12
    filt = NgramFilter.open(tmp_path / "f.memfree")
    assert filt.contains(np.array(kept)).all()  # no false negatives
    if dropped:
        # At a 1e-6 false-positive rate, n-grams under min_count are absent.
        assert not filt.contains(np.array(dropped)).any()
    metadata = filt.metadata
    assert metadata["tokenizer_fingerprint"] == tokenizer_fingerprint(tokenizer)
    assert metadata["min_count"] == min_count and metadata["n"] == 4
    assert filt.special_token_ids == special_token_ids(tokenizer) == (0, 1)
    assert not (tmp_path / "f.memfree.work").exists()
    # Prefix section: the prefixes that begin at least min_count n-gram occurrences, a superset
    # of the prefixes of stored n-grams (exactly them when min_count is 1).
    prefix_totals: Counter[tuple[int, ...]] = Counter()
    for ngram, count in counts.items():
        prefix_totals[ngram[:-1]] += count
    kept_prefixes = [prefix for prefix, total in prefix_totals.items() if total >= min_count]
    assert summary.kept_prefixes == metadata["prefix"]["num_prefixes"] == len(kept_prefixes)
    assert filt.contains_prefixes(np.array([ngram[:-1] for ngram in kept])).all()
    rng = np.random.default_rng(1)
    novel = rng.integers(300, 400, size=(2000, 3))  # ids outside the tokenizer's vocabulary
    assert filt.contains_prefixes(novel).mean() < 0.05  # sized for 1e-2


def test_windows_with_special_tokens_are_never_stored(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any
) -> None:
    text = "alpha beta gamma <|endoftext|> delta return self def class import\n"
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(text)
    summary = build_filter(
        [str(tmp_path / "corpus")],
        tmp_path / "f.memfree",
        settings_for(tokenizer_dir, false_positive_rate=1e-6),
        progress=False,
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert special in ids
    windows = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    clean = [window for window in windows if special not in window]
    assert summary.kept_ngrams == len(set(clean)) < len(set(windows))
    filt = NgramFilter.open(tmp_path / "f.memfree")
    assert filt.contains(np.array(clean)).all()
    assert not filt.contains(np.array([w for w in windows if special in w])).any()


def test_tiny_memory_limit_spills_and_splits_but_counts_the_same(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    write_corpus(tmp_path / "corpus", 6, words_per_file=3000)
    big = build_filter(
        [str(tmp_path / "corpus")],
        tmp_path / "a.memfree",
        settings_for(tokenizer_dir, memory_limit_bytes=1 << 30, num_partitions=1),
        progress=False,
    )
    small = build_filter(
        [str(tmp_path / "corpus")],
        tmp_path / "b.memfree",
        settings_for(tokenizer_dir, memory_limit_bytes=16 << 20, num_partitions=64),
        progress=False,
    )
    assert (big.distinct_ngrams, big.kept_ngrams) == (small.distinct_ngrams, small.kept_ngrams)
    assert (tmp_path / "a.memfree").read_bytes() == (tmp_path / "b.memfree").read_bytes()


def test_count_range_splits_into_subranges(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    writer = RunWriter(tmp_path / "runs", buffer_entries=500)
    keys = rng.integers(0, 2**64 - 1, size=300, dtype=np.uint64, endpoint=True)
    stream = rng.choice(keys, size=5000)
    for chunk in np.array_split(stream, 17):
        writer.add(chunk)
    runs = writer.close()
    assert len(runs) > 5
    expected = Counter(stream.tolist())
    for max_entries in (10, 10**9):
        kept = np.concatenate([k for k, _ in count_range(runs, 0, 1 << 64, 20, max_entries)])
        assert kept.tolist() == sorted(key for key, count in expected.items() if count >= 20)
    assert isinstance(runs[0], Run)


def test_workers_and_shards_do_not_change_the_bytes(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 10)
    one = build_filter(
        [str(tmp_path / "corpus")],
        tmp_path / "one.memfree",
        settings_for(tokenizer_dir, workers=1, shard_bytes=1 << 20),
        progress=False,
    )
    two = build_filter(
        [str(tmp_path / "corpus")],
        tmp_path / "two.memfree",
        settings_for(tokenizer_dir, workers=2, shard_bytes=1500),
        progress=False,
    )
    assert one.map_tasks == 1 and two.map_tasks > 1
    assert (tmp_path / "one.memfree").read_bytes() == (tmp_path / "two.memfree").read_bytes()


def test_resume_after_kill_9_is_byte_identical(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 60, words_per_file=2000)
    reference = tmp_path / "reference.memfree"
    command = [
        sys.executable,
        "-m",
        "memfree.cli",
        "build",
        str(tmp_path / "corpus"),
        "--tokenizer",
        str(tokenizer_dir),
        "--n",
        "4",
        "--workers",
        "1",
        "--shard-size",
        "1",
        "--no-progress",
        "--json",
    ]
    subprocess.run([*command, "-o", str(reference)], check=True, capture_output=True)

    output = tmp_path / "resumed.memfree"
    work = tmp_path / "resumed.memfree.work"
    process = subprocess.Popen(
        [*command, "-o", str(output)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list((work / "map").glob("shard-*.json"))) < 5:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    finished_before = len(list((work / "map").glob("shard-*.json")))
    assert 5 <= finished_before < 60, "the kill must land in the middle of the map stage"
    assert not output.exists(), "no half-written filter at the output path"

    rerun = subprocess.run(
        [*command, "-o", str(output)], check=True, capture_output=True, text=True
    )
    summary = json.loads(rerun.stdout)
    assert summary["reused_tasks"] >= finished_before
    assert output.read_bytes() == reference.read_bytes()
    assert not list(tmp_path.glob(".resumed.memfree.*.tmp"))


def test_changed_arguments_do_not_reuse_stale_work(tmp_path: Path, tokenizer_dir: Path) -> None:
    write_corpus(tmp_path / "corpus", 4)
    output = tmp_path / "f.memfree"
    build_filter(
        [str(tmp_path / "corpus")],
        output,
        settings_for(tokenizer_dir),
        keep_work=True,
        progress=False,
    )
    summary = build_filter(
        [str(tmp_path / "corpus")],
        output,
        settings_for(tokenizer_dir, ngram_size=5),
        keep_work=True,
        progress=False,
    )
    assert summary.reused_tasks == 0
    assert NgramFilter.open(output).n == 5
    again = build_filter(
        [str(tmp_path / "corpus")],
        output,
        settings_for(tokenizer_dir, ngram_size=5),
        progress=False,
    )
    assert again.reused_tasks == again.map_tasks


def test_bad_inputs_are_skipped_counted_and_reported(tmp_path: Path, tokenizer_dir: Path) -> None:
    corpus = tmp_path / "corpus"
    write_corpus(corpus, 2)
    (corpus / "binary.txt").write_bytes(b"\x00\x01\x02 binary")
    (corpus / "latin1.txt").write_bytes("caf\xe9 ol\xe9".encode("latin-1"))
    (corpus / "empty.txt").write_text("   \n")
    (corpus / "rows.jsonl").write_text(
        '{"text": "alpha beta gamma delta return"}\n{broken\n{"other": 1}\n'
    )
    summary = build_filter(
        [str(corpus), str(tmp_path / "missing.txt")],
        tmp_path / "f.memfree",
        settings_for(tokenizer_dir),
        progress=False,
    )
    counts = summary.skipped["counts"]
    assert counts == {
        "binary": 1,
        "not utf-8": 1,
        "empty": 1,
        "malformed json": 1,
        "missing field": 1,
        "missing": 1,
    }
    assert summary.documents == 3
    examples = summary.skipped["examples"]
    assert "latin1.txt" in examples["not utf-8"][0] and "missing.txt" in examples["missing"][0]
    assert "rows.jsonl:2" in examples["malformed json"][0]


def test_nothing_usable_fails_with_the_reasons(tmp_path: Path, tokenizer_dir: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "binary.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(BuildError, match=r"no usable document(.|\n)*binary: 1"):
        build_filter(
            [str(corpus)], tmp_path / "f.memfree", settings_for(tokenizer_dir), progress=False
        )
    with pytest.raises(BuildError, match="missing"):
        build_filter(
            [str(tmp_path / "nope")],
            tmp_path / "f.memfree",
            settings_for(tokenizer_dir),
            progress=False,
        )
    assert not (tmp_path / "f.memfree").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ngram_size": 0}, "ngram_size must be an integer >= 1"),
        ({"false_positive_rate": 1.0}, r"false_positive_rate must be in \(0, 1\)"),
        ({"false_positive_rate": 0.0}, r"false_positive_rate must be in \(0, 1\)"),
        ({"min_count": 0}, "min_count must be"),
        ({"workers": 0}, "workers must be"),
        ({"num_partitions": 3}, "num_partitions must be a power of two"),
        ({"output_format": "zip"}, "output_format must be one of"),
        ({"memory_limit_bytes": 1000}, "memory_limit_bytes must be at least"),
    ],
)
def test_bad_settings_are_refused_before_any_work(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BuildSettings(**overrides)


def test_cli_refuses_bad_arguments_without_a_traceback(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus", 1)
    base = [
        "build",
        str(tmp_path / "corpus"),
        "-o",
        str(tmp_path / "f.memfree"),
        "--tokenizer",
        str(tokenizer_dir),
    ]
    assert cli_main([*base, "--fpr", "2"]) == 2
    assert "--fpr must be in (0, 1)" in capsys.readouterr().err
    assert cli_main([*base, "--memory-limit", "lots"]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    assert (
        cli_main(
            [
                "build",
                str(tmp_path / "corpus"),
                "-o",
                str(tmp_path / "f.memfree"),
                "--tokenizer",
                str(tmp_path / "no-such-tokenizer"),
            ]
        )
        == 2
    )
    assert "memfree never downloads" in capsys.readouterr().err
    assert not (tmp_path / "f.memfree").exists()


def test_cli_build_json_and_info(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "corpus", 3)
    output = tmp_path / "f.memfree"
    assert (
        cli_main(
            [
                "build",
                str(tmp_path / "corpus"),
                "-o",
                str(output),
                "--tokenizer",
                str(tokenizer_dir),
                "--n",
                "3",
                "--workers",
                "1",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["kept_ngrams"] == NgramFilter.open(output).num_ngrams > 0
    assert cli_main(["info", str(output), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n"] == 3 and info["size_bytes"] == output.stat().st_size
    damaged = tmp_path / "damaged.memfree"
    damaged.write_bytes(output.read_bytes()[:-1])
    assert cli_main(["info", str(damaged)]) == 2
    assert "damaged" in capsys.readouterr().err


def test_plan_shards_and_sizes() -> None:
    from bloom_builder.sources import WorkUnit

    units = [WorkUnit(path=f"/x/{i}", kind="text", compression="", size_bytes=10) for i in range(7)]
    shards = plan_shards(units, 25)
    assert [len(shard) for shard in shards] == [3, 3, 1]
    assert [u for shard in shards for u in shard] == units
    assert (
        parse_size("2G") == 2 << 30 and parse_size("512M") == 512 << 20 and parse_size("100") == 100
    )


def test_pybloomfiltermmap3_format_opens_in_the_library(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any
) -> None:
    import pybloomfilter  # installed by `make setup` (the interchange extra); never skipped

    texts = write_corpus(tmp_path / "corpus", 5)
    output = tmp_path / "f.bloom"
    assert (
        cli_main(
            [
                "build",
                str(tmp_path / "corpus"),
                "-o",
                str(output),
                "--tokenizer",
                str(tokenizer_dir),
                "--n",
                "4",
                "--min-count",
                "2",
                "--format",
                "pybloomfiltermmap3",
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    counts = reference_counts(tokenizer, texts, 4)
    kept = np.array([ngram for ngram, count in counts.items() if count >= 2])
    library = pybloomfilter.BloomFilter.open(str(output), "r")
    assert len(library) == len(kept)
    ours = NgramFilter.open(output)
    assert ours.n == 4 and ours.metadata["tokenizer_fingerprint"] == tokenizer_fingerprint(
        tokenizer
    )
    keys = kept.astype("<u4")
    assert all(key.tobytes() in library for key in keys)
    assert ours.contains(kept).all()
    others = np.random.default_rng(0).integers(0, 300, size=(3000, 4))
    assert ours.contains(others).tolist() == [
        row.astype("<u4").tobytes() in library for row in others
    ]


@pytest.mark.parametrize("layout", ["prefix-index", "blocked-512"])
def test_word_unit_build_needs_no_tokenizer_and_matches_the_exact_set(
    tmp_path: Path, layout: str
) -> None:
    """`--unit word`: words from text (JSONL, gzip, a huge file in segments), min-count, resume,
    and the same bits as the in-memory helper for the same texts, in both layouts."""
    import gzip

    from memfree.filterfile import open_filter
    from memfree.testing import word_filter_from_texts
    from memfree.vocab.words import ngram_hash_rows, word_ngrams

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "# THE QUICK BROWN FOX\n",
        "def q_sqrt(number):\n    return number ** 0.5\n",
    ]
    (corpus / "a.jsonl").write_text(
        "".join(json.dumps({"text": text}) + "\n" for text in texts[:2]), encoding="utf-8"
    )
    with gzip.open(corpus / "b.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write(texts[2])
    settings = BuildSettings(ngram_size=3, unit="word", min_count=1, workers=2, layout=layout)
    summary = build_filter([str(corpus)], tmp_path / "w.memfree", settings, progress=False)
    built = open_filter(tmp_path / "w.memfree")
    assert built.unit == "word" and "tokenizer_fingerprint" not in built.metadata
    assert built.layout == ("prefix-index-v1" if layout == "prefix-index" else "blocked-512")
    assert summary.unit == "word" and "words" in summary.to_text()
    exact = {g for text in texts for g in word_ngrams(text, 3)}
    assert summary.kept_ngrams == len(exact) and summary.tokens == sum(
        len(t.split())
        for t in [
            "the quick brown fox jumps over the lazy dog",
            "the quick brown fox",
            "def q sqrt number return number 0 5",
        ]
    )
    assert built.contains(ngram_hash_rows(sorted(exact))).all()
    helper = word_filter_from_texts(tmp_path / "h.memfree", texts, 3, layout=layout)
    if isinstance(built, BloomFilter):
        assert isinstance(helper, BloomFilter)
        assert np.array_equal(built.bit_words, helper.bit_words)
        assert np.array_equal(built.prefix_bit_words, helper.prefix_bit_words)
    else:
        ours, theirs = built.prefix_index(), helper.prefix_index()
        assert ours is not None and theirs is not None and ours.shape == theirs.shape
        assert np.array_equal(ours.directory, theirs.directory)
        assert np.array_equal(ours.words, theirs.words)
    twice = build_filter(
        [str(corpus)],
        tmp_path / "w2.memfree",
        BuildSettings(ngram_size=3, unit="word", min_count=2, workers=1, layout=layout),
        progress=False,
    )
    assert twice.kept_ngrams == 2  # "the quick brown", "quick brown fox"
    with pytest.raises(ValueError, match="needs no tokenizer"):
        BuildSettings(unit="word", tokenizer="x")
    with pytest.raises(ValueError, match=r"^unit must be one of token, word"):
        BuildSettings(unit="sentence")


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killing_a_build_kills_its_pool_workers(tmp_path: Path, tokenizer_dir: Path) -> None:
    """A worker of a build killed with SIGKILL must not wait on its task queue forever."""
    write_corpus(tmp_path / "corpus", 60, words_per_file=2000)
    command = [
        sys.executable, "-m", "memfree.cli", "build", str(tmp_path / "corpus"), "--tokenizer",
        str(tokenizer_dir), "--n", "4", "--workers", "2", "--shard-size", "1", "--no-progress",
        "-o", str(tmp_path / "out.memfree"),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = tmp_path / "out.memfree.work"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((work / "map").glob("shard-*.json")):
        time.sleep(0.02)
    workers = _children(process.pid)
    assert len(workers) >= 2, "the pool's workers run as the build's children"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in workers):
        time.sleep(0.05)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
