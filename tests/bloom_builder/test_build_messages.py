"""What a build tells the user: the options' help as the defaults are, a word index's rate per
candidate word (both of its halves), and a filter of no n-gram written with a warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from memfree.cli import main as cli_main
from memfree.filterfile import open_filter
from memfree.filterfile.index.reader import IndexFilter
from tests.bloom_builder.test_interrupted_builds import write_corpus


def build_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli_main(["build", "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_layout_help_gives_the_index_as_every_unit_s_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = build_help(capsys)
    layout = text[text.index("--layout {blocked-512,prefix-index} layout") :]
    layout = layout[: layout.index("--work-dir")]
    assert "only layout" not in layout  # the word unit writes the index too, by default
    assert "prefix-index (the default, for --unit token and --unit word alike)" in layout
    assert BuildSettings(unit="word").resolved_layout == "prefix-index"
    assert "1e-5 false bans per natural query" in text  # --fpr's unit


def test_a_word_index_summary_gives_its_combined_rate_per_word(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", 4, 3000)
    output = tmp_path / "w.memfree"
    summary = build_filter(
        [str(corpus)],
        output,
        BuildSettings(unit="word", ngram_size=3, workers=1),
        progress=False,
    )
    filt = open_filter(output)
    assert isinstance(filt, IndexFilter) and filt.unit == "word"
    stated = filt.expected_false_positive_rate
    # The rate the header states, as `memfree info` and the guard read it: both halves of a word
    # index's rate, so at least the next-word field's chance match (1 in 2**t), never the lower
    # rate of the prefix remainder alone.
    assert summary.expected_false_positive_rate == pytest.approx(stated)
    assert stated >= 2.0 ** -filt.prefix_index().shape.token_bits
    text = summary.to_text()
    assert f"expected false bans per natural query {stated:.3g}" in text
    uniform = filt.metadata["uniform_false_positive_rate"]
    assert f"per candidate word of a whole-vocabulary row {uniform:.3g}" in text
    assert "per candidate token" not in text


@pytest.mark.parametrize(
    ("options", "why"),
    [
        (["--n", "50"], "no document has 50 words (--n 50 is above every document's length"),
        (
            ["--n", "2", "--min-count", "1000000"],
            "was seen 1000000 times (--min-count 1000000 is above every n-gram's count); "
            "lower --min-count",
        ),
    ],
)
@pytest.mark.parametrize("layout", ["prefix-index", "blocked-512"])
def test_a_filter_of_no_ngram_is_written_with_a_warning(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    why: str,
    layout: str,
) -> None:
    corpus = write_corpus(tmp_path / "corpus", 2, 30)
    output = tmp_path / "f.memfree"
    common = ["build", str(corpus), "-o", str(output), "--unit", "word", "--workers", "1"]
    assert cli_main([*common, "--layout", layout, "--no-progress", *options]) == 0
    captured = capsys.readouterr()
    assert output.exists()
    warning = f"memfree: warning: {output} holds no n-gram, so a guard using it blocks nothing: "
    assert warning in captured.err and why in captured.err
    assert captured.err.count("memfree: warning:") == 1
    assert "ngram_size" not in captured.err and "min_count" not in captured.err  # options' names
    assert "kept 0" in captured.out

    assert cli_main([*common, "--layout", layout, "--no-progress", "--json", *options]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["empty"] is True and summary["kept_ngrams"] == 0
    assert len(summary["warnings"]) == 1 and why in summary["warnings"][0]
    assert why in captured.err


def test_a_filter_of_some_ngrams_has_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus(tmp_path / "corpus", 2, 30)
    output = tmp_path / "f.memfree"
    argv = ["build", str(corpus), "-o", str(output), "--unit", "word", "--n", "3", "--json"]
    assert cli_main([*argv, "--workers", "1", "--no-progress"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["empty"] is False and summary["warnings"] == []
    assert "warning" not in captured.err


def test_a_disk_with_no_room_is_named_with_the_fix_and_leaves_nothing(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """Writes past the kernel's file-size limit fail (EFBIG, as a full disk fails with ENOSPC):
    the build says there is no room, names the work directory and the fix, exits 2 and leaves
    neither an output nor a work directory behind (no task had finished)."""
    from tests.conftest import run_with_file_limit

    corpus = write_corpus(tmp_path / "corpus", 4, 3000)
    output = tmp_path / "out" / "f.memfree"
    argv = [
        "build", str(corpus), "-o", str(output), "--tokenizer", str(tokenizer_dir),
        "--min-count", "1", "--no-progress",
    ]  # fmt: skip
    code = f"from memfree.cli import main\nraise SystemExit(main({argv!r}))\n"
    done = run_with_file_limit(code, 16 * 1024, {"MEMFREE_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("memfree: error: no room to write (File too large)"), error
    assert f"the work directory {output}.work" in error and "--work-dir" in error
    assert "Traceback" not in done.stderr
    assert not output.exists() and not Path(f"{output}.work").exists()
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_the_default_tokenizer_loads_where_its_cache_cannot_be_written(tmp_path: Path) -> None:
    """The default tokenizer's copy in memfree's cache is an optimisation: where the disk
    refuses it (the tokenizers library raises a bare Exception then), the tokenizer still
    loads from the GGUF file and no half-written copy is left to be read later."""
    from tests.conftest import run_with_file_limit

    cache = tmp_path / "cache"
    code = (
        "from memfree.vocab.tokenizer import load_tokenizer\n"
        "print(load_tokenizer(None)('Hello world')['input_ids'])\n"
    )
    done = run_with_file_limit(code, 64 * 1024, {"MEMFREE_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[19556, 905]"
    assert not [p for p in cache.rglob("*") if p.is_file()]
