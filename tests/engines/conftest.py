"""The engines' own tests (`make test-engines`, in `.venv-engines`): filters of
encodings/cp437.py for the default model, built once, and the benchmark script that drives the
engines (its JSON holds every output's token ids)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_engines.py"
sys.path.insert(0, str(BENCH.parent))


@pytest.fixture(scope="session")
def cp437_filters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from bench_engines import build_filters

    from memfree.filterfile.bloom.reader import NgramFilter
    from memfree.units import get_unit
    from memfree.vocab.tokenizer import load_tokenizer

    paths = build_filters(tmp_path_factory.mktemp("filters"))
    filters = {unit: NgramFilter.open(path) for unit, path in paths.items()}
    tokenizer = load_tokenizer(None)

    def stored(unit: str, prompt: list[int], output: list[int]) -> int:
        """Stored n-grams that ``output`` created after ``prompt`` (token ids)."""
        filt = filters[unit]
        count, _ = get_unit(unit).created_ngram_counts(
            filt, prompt, output, special_token_ids=filt.special_token_ids, tokenizer=tokenizer
        )
        return count

    def stored_text(unit: str, prompt: list[int], output: list[int]) -> int:
        """Stored n-grams of ``output``'s text, tokenized again after ``prompt``'s."""
        from memfree.vocab.info import TokenizerInfo

        filt = filters[unit]
        count, _ = get_unit(unit).created_text_ngram_counts(
            filt,
            prompt,
            output,
            special_token_ids=filt.special_token_ids,
            tokenizer=TokenizerInfo.of(tokenizer),
        )
        return count

    def stored_split(unit: str, prompt: list[int], output: list[int]) -> tuple[int, int]:
        """Stored n-grams ``output`` created: (occurring in ``prompt``, not occurring in it)."""
        n = filters[unit].n
        row = prompt + output
        windows = {tuple(prompt[i : i + n]) for i in range(len(prompt) - n + 1)}
        created = [tuple(row[i - n + 1 : i + 1]) for i in range(len(prompt), len(row))]
        if not created:
            return 0, 0
        hits = filters[unit].contains(np.array(created))
        stored = [ngram for ngram, hit in zip(created, hits, strict=True) if hit]
        inside = sum(ngram in windows for ngram in stored)
        return inside, len(stored) - inside

    def run_bench(engine: str, out: Path) -> dict[str, Any]:
        command = [sys.executable, str(BENCH), engine, "--json", str(out)]
        command += ["--token-filter", str(paths["token"]), "--word-filter", str(paths["word"])]
        subprocess.run(command, check=True, timeout=900)
        return dict(json.loads(out.read_text()))

    def check(result: dict[str, Any], guarded: dict[str, str]) -> None:
        """Unguarded outputs hold stored n-grams; the ``guarded`` ones (name -> unit) none."""
        prompts = result["prompts"]
        plain = [stored("token", p, o) for p, o in zip(prompts, result["plain"], strict=True)]
        assert sum(plain) > 0, "the default model should copy cp437.py unguarded"
        for name, unit in guarded.items():
            for prompt, output in zip(prompts, result[name], strict=True):
                assert stored(unit, prompt, output) == 0, (name, output)

    return {
        "paths": paths,
        "stored": stored,
        "stored_text": stored_text,
        "stored_split": stored_split,
        "tokenizer": tokenizer,
        "run_bench": run_bench,
        "check": check,
    }
