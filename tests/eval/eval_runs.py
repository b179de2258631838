"""What several eval test files share: a finished ``memfree eval discoverable`` run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bloom_builder.build import build_filter
from bloom_builder.settings import BuildSettings
from memfree.cli import main as cli_main
from tests.conftest import MEMORIZED_DOCUMENTS, tiny_llama_model


def finished_eval_run(root: Path, tokenizer: Any, tokenizer_dir: Path) -> tuple[list[str], Any]:
    """Under ``root``: a corpus of 3 documents, its filter (token 4-grams), a saved tiny model,
    and a finished ``memfree eval discoverable`` run in ``run``; the run's arguments (without
    ``--out``) and the model."""
    corpus = root / "corpus"
    corpus.mkdir()
    for index, text in enumerate(MEMORIZED_DOCUMENTS):
        (corpus / f"d{index}.txt").write_text(text)
    build_filter(
        [str(corpus)],
        root / "f.memfree",
        BuildSettings(ngram_size=4, tokenizer=str(tokenizer_dir), workers=1),
        progress=False,
    )
    model = tiny_llama_model(tokenizer, hidden_size=32, key_value_heads=2).eval()
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    arguments = [
        "eval",
        "discoverable",
        "--model",
        str(root / "model"),
        "--filter",
        str(root / "f.memfree"),
        "--corpus",
        str(corpus),
        "--num-examples",
        "2",
        "--prompt-tokens",
        "5",
        "--truth-tokens",
        "5",
        "--defenses",
        "none",
        "memfree",
    ]
    assert cli_main([*arguments, "--out", str(root / "run")]) == 0
    return arguments, model
