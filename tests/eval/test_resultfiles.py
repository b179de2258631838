"""Result folders memfree reads back (an eval's records, examples and settings): a damaged or
hand-edited file is refused with its name, its line and the fix, through the library and the
command line alike, and no record is ever dropped in silence. The results committed in
``docs/results`` (the README's figures) read back and agree with their summaries."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from eval.experiments import RecordLog, run_memorization
from eval.records import MemorizationRecord
from eval.report import summarize, summarize_buckets
from eval.resultfiles import OPTIONAL_RECORD_FIELDS, RECORD_FIELDS, RECORDS_FIX, check_fields
from eval.settings import ExperimentSettings
from memfree import NgramFilter
from memfree.cli import main as cli_main
from tests.eval.eval_runs import finished_eval_run


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, tokenizer_dir: Path) -> Any:
    """A corpus, its filter, a saved tiny model, and a finished ``memfree eval`` run."""
    root = tmp_path_factory.mktemp("finished")
    arguments, model = finished_eval_run(root, tokenizer, tokenizer_dir)
    corpus = root / "corpus"
    settings = ExperimentSettings(
        corpus=(str(corpus),),
        num_examples=2,
        prompt_tokens=5,
        truth_tokens=5,
        defenses=("none", "memfree"),
    )
    filt = NgramFilter.open(root / "f.memfree")
    run_memorization(settings, root / "library-run", model, tokenizer, filt)
    return root, arguments, model, settings


def replace_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("name", "damage", "where"),
    [
        ("records.jsonl", lambda p: p.write_text(p.read_text() + '{"foo": 1}\n'), ":5: "),
        ("records.jsonl", lambda p: replace_line(p, 2, "{cut"), ":2: not JSON"),
        ("examples.jsonl", lambda p: replace_line(p, 1, "[1, 2]"), ":1: expected a JSON object"),
        ("settings.json", lambda p: p.write_text("[]"), ": expected a JSON object"),
        ("settings.json", lambda p: p.write_text('{"fingerprint": '), ": not JSON"),
    ],
    ids=["record-without-fields", "record-not-json", "example-a-list", "settings-a-list", "cut"],
)
def test_cli_refuses_a_damaged_result_file_naming_it(
    tmp_path: Path,
    finished: Any,
    name: str,
    damage: Any,
    where: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, arguments, _, _ = finished
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    damage(out / name)
    before = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    capsys.readouterr()
    assert cli_main([*arguments, "--out", str(out)]) == 2
    error = capsys.readouterr().err  # after the progress bar
    assert f"memfree: error: {out / name}{where}" in error and "Traceback" not in error
    assert "delete" in error or "restore" in error  # says how to go on
    # Nothing the user had is lost: every result file is as it was.
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"foo": 1}', r"records\.jsonl:3: no 'example_id', 'style', 'defense'"),
        ('{"example_id": "a", "style": "original"}', r"records\.jsonl:3: no 'defense'"),
        ("{cut", r"records\.jsonl:3: not JSON .*; fix or delete that line"),
        ("7", r"records\.jsonl:3: expected a JSON object, found a number"),
    ],
)
def test_a_damaged_record_is_refused_not_dropped(
    tmp_path: Path, finished: Any, tokenizer: Any, line: str, message: str
) -> None:
    root, _, model, settings = finished
    out = tmp_path / "run"
    shutil.copytree(root / "library-run", out)
    records = out / "records.jsonl"
    replace_line(records, 3, line)
    before = records.read_bytes()
    with pytest.raises(ValueError, match=message):
        run_memorization(settings, out, model, tokenizer, NgramFilter.open(root / "f.memfree"))
    assert records.read_bytes() == before


def test_a_record_of_the_wrong_type_names_its_field(tmp_path: Path, finished: Any) -> None:
    root, *_ = finished
    records = tmp_path / "records.jsonl"
    shutil.copy(root / "library-run/records.jsonl", records)
    record = json.loads(records.read_text().splitlines()[0])
    replace_line(records, 1, json.dumps({**record, "bleu": "high"}))
    with pytest.raises(ValueError, match=r"records\.jsonl:1: field 'bleu' is a string, expected"):
        RecordLog(records)


def test_a_line_cut_by_an_interruption_is_redone(tmp_path: Path, finished: Any) -> None:
    root, *_ = finished
    records = tmp_path / "records.jsonl"
    shutil.copy(root / "library-run/records.jsonl", records)
    lines = records.read_text().splitlines()
    records.write_text("\n".join(lines[:-1]) + "\n\n" + lines[-1][:20])  # a blank line, a cut one
    log = RecordLog(records)
    assert log.records == [json.loads(line) for line in lines[:-1]]
    kept = records.read_text().splitlines()
    assert kept == [json.dumps(r, ensure_ascii=False) for r in log.records]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{oops\n", r"examples\.jsonl:1: not JSON"),
        ('{"example_id": "x"}\n', r"examples\.jsonl:1: no 'source', 'prompt_ids', 'truth_ids'"),
        (
            '{"example_id": "x", "source": "s", "prompt_ids": "abc", "truth_ids": [1]}\n',
            r"examples\.jsonl:1: field 'prompt_ids' is a string, expected a list",
        ),
        (
            '{"example_id": "x", "source": "s", "prompt_ids": [1, "a"], "truth_ids": [1]}\n',
            r"examples\.jsonl:1: 'prompt_ids' holds something other than token ids",
        ),
        (
            '{"example_id": "x", "source": "s", "prompt_ids": [], "truth_ids": [1]}\n',
            r"examples\.jsonl:1: 'prompt_ids' is empty",
        ),
        ("\n", r"examples\.jsonl: holds no example; restore the file, or delete it"),
    ],
)
def test_damaged_examples_are_refused_naming_the_file(
    tmp_path: Path, finished: Any, tokenizer: Any, text: str, message: str
) -> None:
    root, _, model, settings = finished
    out = tmp_path / "run"
    shutil.copytree(root / "library-run", out)
    (out / "examples.jsonl").write_text(text)
    with pytest.raises(ValueError, match=message):
        run_memorization(settings, out, model, tokenizer, NgramFilter.open(root / "f.memfree"))
    assert (out / "examples.jsonl").read_text() == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{oops", r"settings\.json: not JSON"),
        ("[]", r"settings\.json: expected a JSON object, found a list"),
        ("{}", r"settings\.json: no 'fingerprint' field"),
        ('{"fingerprint": 5}', r"settings\.json: field 'fingerprint' is a number, expected"),
    ],
)
def test_damaged_settings_are_refused_naming_the_file(
    tmp_path: Path, finished: Any, tokenizer: Any, text: str, message: str
) -> None:
    root, _, model, settings = finished
    out = tmp_path / "run"
    shutil.copytree(root / "library-run", out)
    (out / "settings.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        run_memorization(settings, out, model, tokenizer, NgramFilter.open(root / "f.memfree"))
    assert (out / "settings.json").read_text() == text


def test_unreadable_result_files_say_what_they_are(tmp_path: Path) -> None:
    from eval.resultfiles import read_json, read_jsonl

    (tmp_path / "a-directory").mkdir()
    with pytest.raises(ValueError, match=r"a-directory: is a directory; fix it"):
        read_json(tmp_path / "a-directory", "fix it")
    os.symlink("loop", tmp_path / "loop")
    with pytest.raises(ValueError, match=r"loop: is a symbolic link loop"):
        read_jsonl(tmp_path / "loop", "fix it")
    (tmp_path / "latin1.json").write_bytes(b'"caf\xe9"')
    with pytest.raises(ValueError, match=r"latin1\.json: not UTF-8 text"):
        read_json(tmp_path / "latin1.json", "fix it")
    with pytest.raises(FileNotFoundError):  # the caller says what makes the file
        read_json(tmp_path / "nowhere.json", "fix it")


def test_jsonl_lines_keep_their_numbers_and_only_a_cut_last_line_is_left_out(
    tmp_path: Path,
) -> None:
    from eval.resultfiles import read_jsonl

    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n[2]\n{"b"')
    assert read_jsonl(path, "fix", cut_last_line=True) == [(1, {"a": 1}), (3, [2])]
    with pytest.raises(ValueError, match=r"x\.jsonl:4: not JSON"):
        read_jsonl(path, "fix")
    path.write_text('{"a": 1}\n{"b"\n')  # the newline was written: not cut, damaged
    with pytest.raises(ValueError, match=r"x\.jsonl:2: not JSON"):
        read_jsonl(path, "fix", cut_last_line=True)
    path.write_bytes(b'{"a": 1}\n"caf\xe9"\n{"b": 2}\n')  # a damaged byte: named by its line
    with pytest.raises(ValueError, match=r"x\.jsonl:2: not UTF-8 text .*; fix"):
        read_jsonl(path, "fix", cut_last_line=True)


# ------------------------------------------------------------------------------------------------
# The committed results: every record passes the record checks, each summary is what
# summarize() makes of its records, every record counts its text tokenized again, and no guarded
# output holds what its guard promises to keep out.

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
RUNS = sorted(path.name for path in RESULTS.iterdir() if path.is_dir())


def _records(run: Path) -> list[dict[str, Any]]:
    plain, packed = run / "records.jsonl", run / "records.jsonl.gz"
    text = plain.read_text() if plain.exists() else gzip.decompress(packed.read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines()]


def test_every_run_is_here() -> None:
    assert RUNS == ["buckets", "discoverable", "styles", "styles-buckets"]


@pytest.mark.parametrize("name", RUNS)
def test_a_committed_run_agrees_with_its_summary(name: str) -> None:
    run = RESULTS / name
    records = _records(run)
    for number, record in enumerate(records, 1):
        check_fields(record, f"{name}:{number}", RECORDS_FIX, RECORD_FIELDS, OPTIONAL_RECORD_FIELDS)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rows"] == summarize(records)
    assert summary["buckets"] == summarize_buckets(records)
    typed = [MemorizationRecord.from_dict(record) for record in records]
    assert all(record.stored_text_ngrams is not None for record in typed)
    guarded = [record for record in typed if record.defense == "memfree"]
    assert guarded and all(record.stored_ngrams == 0 for record in guarded)
    worded = [record for record in typed if record.defense == "word"]
    assert worded and all(record.stored_word_ngrams == 0 for record in worded)


@pytest.mark.parametrize("name", RUNS)
def test_a_committed_summary_reads_back_typed_and_writes_the_same_json(name: str) -> None:
    from eval.summary import Summary

    saved = json.loads((RESULTS / name / "summary.json").read_text())
    summary = Summary.from_dict(saved)
    assert summary.to_dict() == saved
    assert json.dumps(summary.to_dict(), indent=2) == json.dumps(saved, indent=2)  # key order
    assert all(row.generations > 0 for row in summary.rows)
