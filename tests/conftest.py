"""Shared fixtures: a real Hugging Face tokenizer trained here on a tiny corpus, saved to disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TRAINING_TEXT = [
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "import os\nimport sys\nprint(os.path.join('a', 'b'))\n",
    "the quick brown fox jumps over the lazy dog " * 3,
    "for i in range(10):\n    total += i * i\n",
]


def train_tokenizer(directory: Path, vocab_size: int = 300) -> Any:
    """A byte-level BPE tokenizer trained on TRAINING_TEXT, saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(TRAINING_TEXT, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<pad>"
    )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    return tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Any:
    from memfree.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)
