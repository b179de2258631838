"""Typed audit results: a result given as its JSON (audit.json's) is parsed once and reported as
the typed result is, and audit.json keeps what it was given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eval.audit_report import audit_kind, write_audit_report
from eval.audit_results import (
    CanaryExposure,
    CanaryExtraction,
    ExposureGroup,
    ExposureResult,
    ExtractabilityResult,
    ExtractableSequence,
    ExtractableShare,
    ExtractionResult,
    ShortestPathSearch,
    audit_result,
)

EXPOSURE = ExposureResult(
    space_size=1000,
    references=997,
    exact=True,
    guarded=False,
    canaries=(CanaryExposure("my pin is 123", 4, 30.5, 9.25, 7.5, 7.25),),
    by_repetitions=(ExposureGroup(4, 1, 7.5, (7.0, 8.0), 4.5),),
    settings={"step": "exposure"},
    signature="abc",
)
EXTRACTION = ExtractionResult(
    guarded=True,
    space_size=1000,
    canaries=(CanaryExtraction("my pin is 123", 32, True, "123"),),
    shortest_path=ShortestPathSearch("123", "my pin is 123", 32, 41, 1000),
)
EXTRACTABILITY = ExtractabilityResult(
    guarded=False,
    truth_tokens=6,
    by_k=(ExtractableShare(2, 0.5, k=4),),
    by_bucket=(ExtractableShare(2, 0.5, bucket=4),),
    sequences=(
        ExtractableSequence(4, "a#0", 2, 4, True),
        ExtractableSequence(4, "b#0", 2, 4, False),
    ),
)


@pytest.mark.parametrize("result", [EXPOSURE, EXTRACTION, EXTRACTABILITY])
def test_a_result_round_trips_through_its_json(result: Any) -> None:
    data = json.loads(json.dumps(result.to_dict()))
    parsed = audit_result(data)
    assert type(parsed) is type(result)
    assert parsed.to_dict() == result.to_dict()
    assert audit_result(result) is result


@pytest.mark.parametrize("result", [EXPOSURE, EXTRACTION, EXTRACTABILITY])
def test_the_report_of_a_result_and_of_its_json_are_the_same(tmp_path: Path, result: Any) -> None:
    typed, plain = tmp_path / "typed", tmp_path / "plain"
    written = write_audit_report(typed, {"unguarded": result}, "t")
    data = json.loads(json.dumps(result.to_dict()))
    assert write_audit_report(plain, {"unguarded": data}, "t") == written
    for name in ("audit.md", "audit.json"):
        assert (typed / name).read_text() == (plain / name).read_text()
    assert audit_kind({"unguarded": result}) == audit_kind({"unguarded": data})


def test_a_partial_json_result_is_reported_and_kept_as_given(tmp_path: Path) -> None:
    part = {"truth_tokens": 6, "by_k": [{"k": 4, "sequences": 2, "extractable": 0.5}]}
    part["by_bucket"] = []
    write_audit_report(tmp_path, {"unguarded": part}, "t")
    assert json.loads((tmp_path / "audit.json").read_text()) == {"unguarded": part}
    assert "| 4 | 2 | 50% |" in (tmp_path / "audit.md").read_text()
    with pytest.raises(ValueError, match="results of no audit step"):
        audit_result({"texts": 3})
