"""The results committed in ``eval/results`` (the README's figures) agree with the code that reads
them: every record passes the record checks, each summary is what ``summarize`` makes of its
records, every record counts its text tokenized again, and no token-guarded output holds a
stored n-gram in its ids."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from eval.records import MemorizationRecord
from eval.report import summarize, summarize_buckets
from eval.resultfiles import OPTIONAL_RECORD_FIELDS, RECORD_FIELDS, RECORDS_FIX, check_fields

RESULTS = Path(__file__).resolve().parents[2] / "eval" / "results"
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
