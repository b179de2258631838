"""The audit end to end: canaries planted in a small corpus, a tiny Llama trained on it here;
exposure grows with repetitions, the most repeated secret is extracted by greedy decoding and by
the shortest-path search, and the guard, given a filter of the training corpus, stops both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from eval.audit import run_exposure, run_extraction
from eval.audit_report import write_audit_report
from eval.canaries import CanaryFormat, insert_canaries, load_manifest
from memfree import MemFreeLogitsProcessor
from tests.conftest import TRAINING_TEXT, train_on_windows

FORMAT = CanaryFormat("my pin is {ddd}")


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, tokenizer_dir: Path) -> Any:
    root = tmp_path_factory.mktemp("audit")
    corpus = root / "corpus"
    corpus.mkdir()
    for index, text in enumerate(TRAINING_TEXT):
        (corpus / f"d{index}.txt").write_text(text)
    insert_canaries([str(corpus)], root / "planted", FORMAT, repetitions=(1, 4, 32), seed=0)
    texts = [json.loads(line)["text"] for line in (root / "planted/corpus.jsonl").open()]
    model = train_on_windows(tokenizer, texts, window=16, stride=2, steps=80)
    build_filter(
        [str(root / "planted/corpus.jsonl")],
        root / "train.memfree",
        BuildSettings(ngram_size=4, tokenizer=str(tokenizer_dir), workers=1),
        progress=False,
    )
    guard = MemFreeLogitsProcessor(root / "train.memfree", tokenizer=tokenizer)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root, model, guard


def test_exposure_grows_with_repetitions_and_the_guard_removes_it(
    audited: Any, tokenizer: Any
) -> None:
    root, model, guard = audited
    canary_format, canaries, manifest = load_manifest(root / "planted")
    assert manifest["space_size"] == 1_000
    plain = run_exposure(model, tokenizer, canary_format, canaries)
    assert plain["exact"] and plain["references"] == 1_000 - 3
    rows = {row["repetitions"]: row for row in plain["canaries"]}
    # More repetitions, more likely: ranks saturate at the top of a small space, extrapolation
    # and the log-perplexity itself keep separating the canaries.
    assert rows[32]["secret_log_perplexity"] < rows[1]["secret_log_perplexity"]
    assert rows[32]["extrapolated_exposure"] > rows[1]["extrapolated_exposure"]
    assert rows[32]["rank_exposure"] >= rows[1]["rank_exposure"]
    assert rows[32]["rank_exposure"] > plain["max_exposure"] - 1  # near the top of 1,000
    guarded = run_exposure(model, tokenizer, canary_format, canaries, guard)
    for row in guarded["canaries"]:
        assert row["secret_log_perplexity"] == float("inf")  # probability zero under the guard
        assert row["rank_exposure"] < 0.01
    written = write_audit_report(root / "report", {"unguarded": plain, "guarded": guarded}, "t")
    assert "exposure.png" in written and (root / "report/audit.md").read_text().count("|") > 10


def test_extraction_succeeds_unguarded_and_fails_guarded(audited: Any, tokenizer: Any) -> None:
    root, model, guard = audited
    canary_format, canaries, _ = load_manifest(root / "planted")
    plain = run_extraction(model, tokenizer, canary_format, canaries)
    by_count = {row["repetitions"]: row for row in plain["canaries"]}
    assert by_count[32]["greedy_recovered"]
    search = plain["shortest_path"]
    assert search["recovered_repetitions"] == 32
    assert search["queries"] < canary_format.space_size / 10
    guarded = run_extraction(model, tokenizer, canary_format, canaries, guard)
    assert not any(row["greedy_recovered"] for row in guarded["canaries"])
    assert guarded["shortest_path"]["recovered_canary"] is None


def test_cli_audit_extract_and_exposure(audited: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from memfree.cli import main as cli_main

    root, _, _ = audited
    common = [
        "--manifest",
        str(root / "planted"),
        "--model",
        str(root / "model"),
        "--filter",
        str(root / "train.memfree"),
    ]
    assert cli_main(["audit", "extract", *common, "--out", str(root / "cli"), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["unguarded"]["shortest_path"]["recovered_repetitions"] == 32
    assert results["guarded"]["shortest_path"]["recovered_canary"] is None
    assert (root / "cli/audit.md").exists()
    assert cli_main(["audit", "exposure", *common, "--out", str(root / "cli2")]) == 0
    text = capsys.readouterr().out
    assert "inserted  32x: median exposure" in text and "guarded" in text
    assert (root / "cli2/exposure.png").stat().st_size > 0


def test_k_extractability_with_and_without_the_guard(
    audited: Any, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from eval.audit import run_extractability
    from memfree.cli import main as cli_main

    root, model, guard = audited
    corpus = [str(root / "planted/corpus.jsonl")]
    plain = run_extractability(model, tokenizer, corpus, [4, 8], 6, per_bucket=4)
    assert [row["k"] for row in plain["by_k"]] == [4, 8]
    assert plain["by_bucket"] and max(row["extractable"] for row in plain["by_k"]) > 0
    guarded = run_extractability(model, tokenizer, corpus, [4, 8], 6, guard, per_bucket=4)
    assert all(row["extractable"] == 0 for row in guarded["by_k"])  # every window is stored
    out = root / "extractable"
    assert (
        cli_main(
            [
                "audit",
                "extractable",
                *corpus,
                "--model",
                str(root / "model"),
                "--filter",
                str(root / "train.memfree"),
                "--k",
                "4",
                "--m",
                "6",
                "--num-examples",
                "5",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "guarded: extractable k=4: 0%" in capsys.readouterr().out
    assert "k-extractability" in (out / "audit.md").read_text()


def test_cli_audit_insert_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memfree.cli import main as cli_main

    (tmp_path / "a.txt").write_text("one\ntwo\n")
    assert (
        cli_main(
            [
                "audit",
                "insert",
                str(tmp_path / "a.txt"),
                "-o",
                str(tmp_path / "out"),
                "--format",
                "pin {dd}",
                "--repetitions",
                "1",
                "3",
            ]
        )
        == 0
    )
    assert "planted 2 canaries (|R| = 100)" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert [c["repetitions"] for c in manifest["canaries"]] == [1, 3]
    assert (
        cli_main(
            [
                "audit",
                "insert",
                str(tmp_path / "a.txt"),
                "-o",
                str(tmp_path / "x"),
                "--format",
                "no holes",
            ]
        )
        == 2
    )
    assert "has no hole" in capsys.readouterr().err
    assert (
        cli_main(["audit", "exposure", "--manifest", str(tmp_path / "nowhere"), "--model", "x"])
        == 2
    )
    assert "memfree audit insert" in capsys.readouterr().err


def test_cli_audit_insert_refuses_to_replace_the_record_of_planted_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.cli import main as cli_main

    (tmp_path / "a.txt").write_text("one\ntwo\n")
    insert = ["audit", "insert", str(tmp_path / "a.txt"), "-o", str(tmp_path / "out")]
    assert cli_main([*insert, "--format", "pin {dd}"]) == 0
    manifest = (tmp_path / "out/manifest.json").read_text()
    capsys.readouterr()
    assert cli_main([*insert, "--format", "pin {dd}", "--seed", "1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"memfree: error: {tmp_path / 'out'}: already holds manifest.json")
    assert "--force" in error
    assert (tmp_path / "out/manifest.json").read_text() == manifest
    assert cli_main([*insert, "--format", "pin {dd}", "--seed", "1", "--force"]) == 0
    assert (tmp_path / "out/manifest.json").read_text() != manifest


@pytest.mark.parametrize("kind", ["list", "directory", "loop"])
def test_cli_audit_refuses_a_damaged_or_unreadable_manifest(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.cli import main as cli_main

    manifest = tmp_path / "planted/manifest.json"
    manifest.parent.mkdir()
    if kind == "list":
        manifest.write_text("[]")
    elif kind == "directory":
        manifest.mkdir()
    else:
        manifest.symlink_to("manifest.json")
    expected = {
        "list": "expected a JSON object, found a list",
        "directory": "is a directory",
        "loop": "is a symbolic link loop",
    }[kind]
    for step in ("exposure", "extract"):
        code = cli_main(["audit", step, "--manifest", str(tmp_path / "planted"), "--model", "x"])
        assert code == 2
        assert capsys.readouterr().err == f"memfree: error: {manifest}: {expected}; " + (
            "give the manifest.json that `memfree audit insert` wrote (or its directory), or run "
            "`memfree audit insert` again\n"
        )


@pytest.mark.parametrize("kind", ["directory", "loop"])
def test_cli_audit_says_what_an_unreadable_input_is(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.cli import main as cli_main

    (tmp_path / "a.txt").write_text("one\ntwo\n")
    bad = tmp_path / "bad"
    if kind == "directory":
        bad.mkdir()
    else:
        bad.symlink_to("bad")
    expected = "is a directory" if kind == "directory" else "is a symbolic link loop"
    insert = ["audit", "insert", "-o", str(tmp_path / "out"), "--format", "the {word} is {d}"]
    assert cli_main([*insert, str(tmp_path / "a.txt"), "--words", str(bad)]) == 2
    assert f"memfree: error: {bad}: {expected}" in capsys.readouterr().err
    if kind == "loop":  # a directory is a fine corpus; a loop is reported as what it is
        assert cli_main([*insert, str(bad), "--format", "pin {dd}"]) == 2
        assert f"{bad}: {expected}" in capsys.readouterr().err
        assert cli_main(["audit", "extractable", str(bad), "--model", "x"]) == 2
        assert f"{bad}: {expected}" in capsys.readouterr().err
