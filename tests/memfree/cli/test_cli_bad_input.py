"""The command line on bad input: a model directory whose weights are damaged or hostile ("cannot
load", exit 2), and messages that name the option a user typed (--ngram-size, --seed), with n
bounded as the native header bounds it."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck

from memfree import NgramFilter
from memfree.cli import main as cli_main
from memfree.filterfile.header import MAX_NGRAM_SIZE

SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

# ------------------------------------------------------------------------------------------------
# 18. A model directory whose weights are damaged or hostile: "cannot load", exit 2.


class _Planted:
    """Unpickled, it would create ``marker``: a weights file that runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    """A tiny Llama saved with its tokenizer (safetensors; tests swap in other weights)."""
    from tests.conftest import tiny_llama_model

    directory = tmp_path_factory.mktemp("model")
    tiny_llama_model(tokenizer, hidden_size=16, key_value_heads=2).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _weights(name: str, marker: Path) -> tuple[str, bytes]:
    if name == "malicious pickle":
        return "pytorch_model.bin", pickle.dumps({"weight": _Planted(marker)})
    if name == "garbage":
        return "pytorch_model.bin", b"not a checkpoint at all"
    if name == "empty":
        return "pytorch_model.bin", b""
    buffer = Path(marker.parent / "state.pt")
    torch.save({"weight": torch.zeros(3)}, buffer)
    data = buffer.read_bytes()
    if name == "truncated zip":
        return "pytorch_model.bin", data[: len(data) // 2]
    return "model.safetensors", b"\xff" * 64  # a damaged safetensors header


@pytest.mark.parametrize(
    "damage", ["malicious pickle", "garbage", "empty", "truncated zip", "safetensors"]
)
def test_generate_with_damaged_weights_says_cannot_load_and_exits_2(
    tmp_path: Path, model_dir: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    name, data = _weights(damage, marker)
    (model / name).write_bytes(data)
    NgramFilter.from_ngrams(tmp_path / "f.memfree", np.array([[1, 2, 3]]))
    argv = ["generate", "--filter", str(tmp_path / "f.memfree"), "--model", str(model)]
    assert cli_main([*argv, "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfree: error: model ") and "cannot load this directory" in err
    assert "Traceback" not in err and "weights_only` set to `False" not in err
    assert not marker.exists()  # nothing in the file ran


# ------------------------------------------------------------------------------------------------
# 21. Messages name the command-line option, and n is bounded as the native header bounds it.


def test_info_names_ngram_size_for_a_native_filter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "f.memfree"
    NgramFilter.from_ngrams(path, np.array([[1, 2, 3]])).close()
    assert cli_main(["info", str(path), "--ngram-size", "5"]) == 2
    err = capsys.readouterr().err
    assert "--ngram-size 5" in err and "3-grams" in err and "ngram_size'" not in err
    assert cli_main(["info", str(path), "--ngram-size", "3"]) == 0  # agrees: fine


@pytest.mark.parametrize("size", ["0", "65", "100000"])
def test_info_refuses_an_impossible_ngram_size_for_a_pybloom_file(
    tmp_path: Path, size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.filterfile import pybloom

    writer = pybloom.PybloomWriter(100, 0.01, hash_seed=1)
    writer.add_ngrams(np.array([[1, 2, 3]]))
    path = writer.write(tmp_path / "f.bloom", {}, num_ngrams=1)
    pybloom.sidecar_path(path).unlink()  # n must come from --ngram-size
    assert cli_main(["info", str(path), "--ngram-size", size]) == 2
    err = capsys.readouterr().err
    assert f"--ngram-size must be a positive integer at most {MAX_NGRAM_SIZE}" in err
    assert err.rstrip().endswith(f"got {size}")
    with pytest.raises(ValueError, match="at most 64"):
        pybloom.open_pybloom(path, ngram_size=int(size))
    assert cli_main(["info", str(path), "--ngram-size", "3"]) == 0


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_generate_names_seed(
    tmp_path: Path, seed: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before any model loads (before: numpy's "Seed must be between ..." after it)."""
    import memfree.models

    def no_loading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(memfree.models, "load_model", no_loading)
    NgramFilter.from_ngrams(tmp_path / "f.memfree", np.array([[1, 2, 3]]))
    argv = ["generate", "--filter", str(tmp_path / "f.memfree"), "--prompt", "x", "--seed", seed]
    assert cli_main(argv) == 2
    assert f"--seed must be in [0, 2**32 - 1], got {seed}" in capsys.readouterr().err
