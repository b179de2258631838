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
    prompts = result["prompts"]
    plain = [
        cp437_filters["stored"]("token", p, o)
        for p, o in zip(prompts, result["plain"], strict=True)
    ]
    assert sum(plain) > 0, "the default model should copy cp437.py unguarded"
    for name, unit in (
        ("guarded", "token"),
        ("sampled", "token"),
        ("word", "word"),
        ("word_sampled", "word"),
    ):
        for prompt, output in zip(prompts, result[name], strict=True):
            assert cp437_filters["stored"](unit, prompt, output) == 0, (name, output)
