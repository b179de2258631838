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
