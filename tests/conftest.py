"""Shared fixtures: a real Hugging Face tokenizer trained here on a tiny corpus, saved to disk."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import warnings
from collections.abc import Iterator
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
    from memfree.vocab.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)


# ------------------------------------------------------------------------------------------------
# Tiny language models for the guard's tests: a scripted one (exact, adversarial logits) and a
# real transformers architecture (Llama) with random weights.


def _scripted_classes() -> tuple[Any, Any]:
    import torch
    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

    class ScriptedConfig(PretrainedConfig):
        model_type = "memfree-scripted"

        def __init__(
            self,
            vocab_size: int = 8,
            seed: int = 0,
            context: int = 2,
            boost: float = 0.0,
            stored: Any = (),
            **kwargs: Any,
        ) -> None:
            self.vocab_size = vocab_size
            self.seed = seed
            self.context = context
            self.boost = boost
            self.stored = [list(ngram) for ngram in stored]
            super().__init__(**kwargs)

    class ScriptedLM(PreTrainedModel, GenerationMixin):
        """Logits = a seeded random table of the last token, plus ``boost`` for every token that
        completes one of ``stored`` after the last ``context`` tokens: a model that has
        "memorized" the stored n-grams and tries to emit them."""

        config_class = ScriptedConfig
        main_input_name = "input_ids"

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            generator = torch.Generator().manual_seed(config.seed)
            self.table = torch.randn(config.vocab_size, config.vocab_size, generator=generator) * 2
            self.anchor = torch.nn.Parameter(torch.zeros(1))
            self.completions: dict[tuple[int, ...], list[int]] = {}
            for ngram in config.stored:
                self.completions.setdefault(tuple(ngram[:-1]), []).append(ngram[-1])

        def forward(
            self, input_ids: Any = None, attention_mask: Any = None, **kwargs: Any
        ) -> CausalLMOutputWithPast:
            batch, length = input_ids.shape
            logits = self.table[input_ids].clone()
            context = self.config.context
            rows = input_ids.tolist()
            for b in range(batch):
                for i in range(length):
                    key = tuple(rows[b][max(0, i - context + 1) : i + 1]) if context else ()
                    for token in self.completions.get(key, []):
                        logits[b, i, token] += self.config.boost
            return CausalLMOutputWithPast(logits=logits)

    return ScriptedConfig, ScriptedLM


@pytest.fixture(scope="session")
def scripted_lm() -> Any:
    """Factory: ``scripted_lm(vocab_size, stored, boost, seed, eos)`` -> a ScriptedLM."""
    config_class, model_class = _scripted_classes()

    def make(vocab_size: int, stored: Any, boost: float = 8.0, seed: int = 0, eos: int = -1) -> Any:
        eos = vocab_size - 1 if eos < 0 else eos
        context = len(stored[0]) - 1 if len(stored) else 1
        config = config_class(
            vocab_size=vocab_size,
            seed=seed,
            context=context,
            boost=boost,
            stored=stored,
            eos_token_id=eos,
            pad_token_id=eos,
            bos_token_id=eos,
        )
        return model_class(config).eval()

    return make


def tiny_llama_model(tokenizer: Any, hidden_size: int = 64, key_value_heads: int = 4) -> Any:
    """A 2-layer Llama with random weights over ``tokenizer``'s vocabulary (seeded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=key_value_heads,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def train_on_windows(
    tokenizer: Any, texts: list[str], window: int, stride: int = 1, steps: int = 100
) -> Any:
    """A tiny Llama trained on every ``window``-token window of ``texts`` (full batch, AdamW), so
    that it continues memorized text from any offset, not only from a document's first token."""
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    return train_on_rows(tokenizer, rows, window, stride, steps)


def train_on_rows(
    tokenizer: Any, rows: list[list[int]], window: int, stride: int = 1, steps: int = 100
) -> Any:
    """:func:`train_on_windows` for token id rows (a text spelled with any token split).

    Training takes 5-30 s; the weights are kept in memfree's cache directory (``test-models``),
    named for everything that decides them (the rows, the training's settings, the model's
    configuration and the versions of torch and transformers), and read back by later test
    processes; a kept file that does not load is trained again."""
    import json
    from importlib.metadata import version

    import torch

    from memfree.storage import cache_dir

    model = tiny_llama_model(tokenizer)
    identity = json.dumps(
        [rows, window, stride, steps, model.config.to_dict(), version("torch"),
         version("transformers")], sort_keys=True, default=str,
    )  # fmt: skip
    kept = cache_dir() / "test-models" / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.pt"
    try:
        model.load_state_dict(torch.load(kept, weights_only=True))
        return model.eval()
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
        model = tiny_llama_model(tokenizer)  # fresh weights, as if nothing had been read
    windows = torch.tensor(
        [row[i : i + window] for row in rows for i in range(0, len(row) - window + 1, stride)]
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=windows, labels=windows).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        temporary = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        torch.save(model.state_dict(), temporary)
        os.replace(temporary, kept)  # whole or absent: two processes may write it at once
    except OSError:
        pass
    return model.eval()


@pytest.fixture(scope="session")
def tiny_llama(tokenizer: Any) -> Any:
    """A 2-layer Llama with random weights over the test tokenizer's vocabulary (real cache,
    real attention masks, real generate())."""
    import torch

    model = tiny_llama_model(tokenizer, hidden_size=32, key_value_heads=2).eval()
    with torch.no_grad():  # sharper logits, so greedy output repeats itself like a real model's
        model.lm_head.weight.mul_(20)
    return model


MEMORIZED_DOCUMENTS = [
    "def add(a, b):\n    return a + b\n\nclass Stack:\n    def __init__(self):\n"
    "        self.items = []\n    def push(self, item):\n        self.items.append(item)\n",
    "import os\nimport sys\nfor i in range(10):\n    total += i * i\n"
    "print(os.path.join('a', 'b'))\nthe quick brown fox jumps over the lazy dog\n",
    "class Queue:\n    def __init__(self):\n        self.items = []\n    def add(self, a, b):\n"
    "        return a * b + i\nfor item in range(3):\n    print(item, total)\n",
]


@pytest.fixture(scope="session")
def memorizing_llama(tokenizer: Any) -> Any:
    """A tiny Llama trained here (about 7 s) until it reproduces MEMORIZED_DOCUMENTS verbatim."""
    return train_on_windows(tokenizer, MEMORIZED_DOCUMENTS, window=24, steps=100)


# ------------------------------------------------------------------------------------------------
# More tokenizer families for the word guard: SentencePiece-style BPE with byte fallback (Llama 2,
# Mistral) and WordPiece (BERT). Trained here; real `tokenizers` objects.

WORD_TEXTS = [
    *TRAINING_TEXT,
    "Café crème brûlée, naïve coöperation: résumé!",
    "The Quick Brown Fox said: hello, WORLD.",
]


def train_sentencepiece(vocab_size: int = 320) -> Any:
    """A Llama-style tokenizer: ▁ for spaces, BPE, <0xNN> byte-fallback tokens."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], max_token_length=8
    )
    base.train_from_iterator(WORD_TEXTS, trainer)
    spec = json.loads(base.to_str())["model"]
    vocab = dict(spec["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    backend = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizer
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )


# Llama 3's and Qwen 2's split patterns, as their tokenizer.json files write them.
# llama.cpp's test vocabularies (GGUF files), with the texts and ids llama.cpp checks its
# tokenizer against: make setup takes them out of llama-cpp-python's source distribution on PyPI.
# Where make setup puts llama.cpp's test vocabularies (another place: MEMFREE_LLAMA_CPP_VOCAB).
LLAMA_CPP = Path(
    os.environ.get("MEMFREE_LLAMA_CPP_VOCAB") or Path(sys.prefix, "vocab", "llama.cpp")
)


@functools.cache
def llama_cpp_tokenizer(name: str) -> Any:
    """The tokenizer transformers reads from ``ggml-vocab-{name}.gguf`` (once per process).

    Reading a GGUF vocabulary takes transformers 2-15 s (its GGUF reader parses every string
    field in Python), in each test process: the tokenizer it read is kept pickled in memfree's
    cache directory (``test-tokenizers``), named for the file's SHA-256 and the versions of
    transformers, tokenizers and gguf, and read back from there (0.1-0.8 s). A pickle keeps the
    object exactly (``save_pretrained`` does not: Qwen2Tokenizer rebuilds its own pattern and
    normalizer on loading). A kept file that does not load is read from the GGUF file again."""
    from importlib.metadata import version

    from transformers import AutoTokenizer

    from memfree.storage import cache_dir

    gguf = LLAMA_CPP / f"ggml-vocab-{name}.gguf"
    identity = hashlib.sha256(gguf.read_bytes())
    for package in ("transformers", "tokenizers", "gguf"):
        identity.update(f"\0{package} {version(package)}".encode())
    kept = cache_dir() / "test-tokenizers" / f"{name}-{identity.hexdigest()[:24]}.pickle"
    try:
        with open(kept, "rb") as handle:
            return pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(LLAMA_CPP, gguf_file=gguf.name)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        temporary = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        temporary.write_bytes(pickle.dumps(tokenizer))
        os.replace(temporary, kept)  # whole or absent: two processes may write it at once
    except OSError:
        pass
    return tokenizer


LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
# Mistral's Tekken (Mistral Nemo and later): letter runs split by case, marks inside words and
# in punctuation runs, single digits, slashes kept with a punctuation run's newlines.
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# OpenAI's o200k (GPT-4o, gpt-oss): Tekken's cased letter runs with contractions kept at a
# word's end, digits in groups of three.
O200K_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# DeepSeek V3's three Split steps, as its tokenizer.json writes them (it holds carriage returns
# and newlines themselves in the last one).
DEEPSEEK3_SPLITS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)


def train_split_bpe(family: str, vocab_size: int = 1500) -> Any:
    """A byte-level BPE built as Llama 3's (its split pattern, ``ignore_merges``), Qwen 2's
    (single digits, an NFC normalizer), Mistral's Tekken or OpenAI's o200k (their patterns,
    ``ignore_merges``) or DeepSeek V3's (three Split steps) are, trained on code, prose and
    the stdlib's text."""
    import string
    import textwrap

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    patterns = {
        "llama3": (LLAMA3_PATTERN,),
        "qwen2": (QWEN2_PATTERN,),
        "tekken": (TEKKEN_PATTERN,),
        "o200k": (O200K_PATTERN,),
        "deepseek3": DEEPSEEK3_SPLITS,
    }[family]
    backend = Tokenizer(models.BPE(ignore_merges=family not in ("qwen2", "deepseek3")))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *(pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in patterns),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    if family == "qwen2":
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    texts = [
        *WORD_TEXTS,
        Path(string.__file__).read_text(),
        Path(textwrap.__file__).read_text(),
        "It's, we're, THEY'LL, I've, he'D: 12345678 3.14 (self) x.(bar) 日本語 a\u0301\r\n\n",
    ]
    if family in ("tekken", "o200k", "deepseek3"):  # cases, marks, slashes, scripts, symbols
        texts.append(
            "HTTPServer camelCase XMLHttpRequest ÉCOLE école http://a/b//c ;\n\n// \u0627\u064b\n"
            "日本語のテキスト カタカナ 한국어 $x +1 -y _z ,.!? 。、 a\u0301\n"
        )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|end_of_text|>", "<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end_of_text|>")


def train_wordpiece(vocab_size: int = 300) -> Any:
    """A BERT-style WordPiece tokenizer (## continuations), case kept."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(cleanup=False)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]", "[PAD]", "[SEP]"]
    )
    backend.train_from_iterator(WORD_TEXTS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="[SEP]",
        clean_up_tokenization_spaces=False,
    )


@pytest.fixture(scope="session")
def word_tokenizers(tokenizer: Any) -> dict[str, Any]:
    """The small tokenizer families the word guard is tested with, by name."""
    return {
        "byte_bpe": tokenizer,
        "sentencepiece": train_sentencepiece(),
        "wordpiece": train_wordpiece(),
    }


@pytest.fixture(scope="session")
def default_tokenizer() -> Any:
    """The embedded default model's tokenizer (SmolLM2, byte-level BPE, 49,152 tokens)."""
    from memfree.vocab.tokenizer import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="session")
def s3() -> Iterator[Any]:
    """An S3 API server on the loopback and an s3fs filesystem over it; the environment (the
    standard AWS variables, which every worker process inherits) points memfree at it."""
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    patch = pytest.MonkeyPatch()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "memfree-test-key",
        "AWS_SECRET_ACCESS_KEY": "memfree-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }.items():
        patch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("corpus")
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        patch.undo()
        server.stop()


def run_with_file_limit(code: str, limit: int, env: dict[str, str], cwd: Path | None = None) -> Any:
    """Run ``code`` in a fresh Python whose files may not grow past ``limit`` bytes (the
    kernel's own ``ulimit -f``: a write past it fails with EFBIG, as a full disk fails with
    ENOSPC); returns the finished process (text output)."""
    import resource
    import signal
    import subprocess

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        cwd=cwd,
        preexec_fn=limited,
        capture_output=True,
        text=True,
        timeout=300,
    )
