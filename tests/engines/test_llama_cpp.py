"""llama-cpp-python with the guard and the real default model (its GGUF file): greedy and
sampled, token and word filters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed: run `make test-engines`"
)


@pytest.mark.timeout(900)
def test_llama_cpp_greedy_and_sampled(cp437_filters: dict[str, Any], tmp_path: Path) -> None:
    result = cp437_filters["run_bench"]("llama", tmp_path / "llama.json")
    guarded = {"guarded": "token", "sampled": "token", "word": "word", "word_sampled": "word"}
    cp437_filters["check"](result, guarded)
