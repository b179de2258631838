"""Guard-side bad input (round 3): a word guard over a tokenizer with no decoder, a filter header
edited with its hashing binding deleted, a damaged model's weights, and command-line messages that
name the option a user typed."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import NgramFilter
from memfree.cli import main as cli_main
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.errors import DamagedFilterError
from memfree.filterfile.header import MAX_NGRAM_SIZE
from memfree.filterfile.protocol import NgramSet
from memfree.filterfile.sizing import expected_false_positive_rate
from memfree.vocab.token_bytes import UnsupportedTokenizerError, token_bytes
from memfree.vocab.words import NORMALIZER, words
from tests.memfree.filterfile.test_header import STORED, read_header, rewrite

SLOW = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

# ------------------------------------------------------------------------------------------------
# 3. A tokenizer with no decoder: `tokenizers` joins its tokens with one space.

FIVE_WORDS = ["the", "quick", "brown", "fox", "jumps"]


def word_level(clean_up: bool = False, decoder: Any = None, extra: tuple[str, ...] = ()) -> Any:
    """A real WordLevel tokenizer over FIVE_WORDS (and ``extra``), wrapped as transformers does."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate([*FIVE_WORDS, *extra, "[UNK]"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_tokens([AddedToken("over the", normalized=False)])  # an added token with a space
    if decoder is not None:
        backend.decoder = decoder
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        eos_token="[UNK]",
        clean_up_tokenization_spaces=clean_up,
    )


@pytest.fixture(scope="module")
def five_word_filter(tmp_path_factory: pytest.TempPathFactory) -> NgramSet:
    """A real word 3-gram filter of "the quick brown fox jumps", built by the builder (the
    default layout: the word index)."""
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings

    directory = tmp_path_factory.mktemp("five-words")
    corpus = directory / "corpus.txt"
    corpus.write_text(" ".join(FIVE_WORDS) + "\n", encoding="utf-8")
    output = directory / "words.memfree"
    build_filter(
        [str(corpus)],
        output,
        # 1e-7: the three-record index's remainder (25 bits) is wide enough that no other
        # prefix of these tests collides with a stored one (at 1e-5, 18 bits, rarely one would;
        # 1e-9 is out of reach: three records tell little of how common their next words are).
        BuildSettings(ngram_size=3, unit="word", workers=1, false_positive_rate=1e-7),
        progress=False,
    )
    filt = NgramFilter.open(output)
    assert filt.layout == "prefix-index-v1" and filt.unit == "word" and filt.n == 3
    return filt


def banned_words(guard: Any, tok: Any, context: str) -> set[str]:
    ids = torch.tensor([tok(context, add_special_tokens=False)["input_ids"]])
    out = guard(ids, torch.zeros(1, len(tok)))
    return set(tok.convert_ids_to_tokens(torch.isneginf(out[0]).nonzero().flatten().tolist()))


def test_word_guard_over_a_tokenizer_without_decoder_bans_the_stored_word(
    five_word_filter: NgramSet,
) -> None:
    """The issue's case: context "the quick" must ban "brown" (before: nothing banned, as the
    guard read the row as "thequick")."""
    tok = word_level()
    assert tok.backend_tokenizer.decoder is None
    assert tok.decode(tok("the quick brown")["input_ids"]) == "the quick brown"
    guard = MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)
    assert banned_words(guard, tok, "the quick") == {"brown"}
    assert banned_words(guard, tok, "quick brown") == {"fox"}
    assert banned_words(guard, tok, "brown fox") == {"jumps"}
    assert banned_words(guard, tok, "the brown") == set()  # (the brown x) begins nothing


def test_guarded_generation_over_a_wordlevel_tokenizer_emits_no_stored_ngram(
    five_word_filter: NgramSet, scripted_lm: Any
) -> None:
    """A model that insists on "the quick brown fox jumps", guarded through generate()."""
    from memfree.units import get_unit

    tok = word_level()
    ids = [tok.convert_tokens_to_ids(word) for word in FIVE_WORDS]
    stored = [ids[i : i + 3] for i in range(3)]
    model = scripted_lm(len(tok), stored, boost=50.0, eos=tok.eos_token_id)
    guard = MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)
    prompt = torch.tensor([ids[:2]])
    options = dict(attention_mask=torch.ones_like(prompt), do_sample=False, use_cache=False)
    out = model.generate(prompt, logits_processor=[guard], max_new_tokens=4, **options)
    new = out[0, 2:].tolist()
    found, _ = get_unit("word").created_ngram_counts(five_word_filter, ids[:2], new, tokenizer=tok)
    assert found == 0 and new[0] != ids[2]
    plain = model.generate(prompt, max_new_tokens=3, **options)
    assert plain[0, 2].item() == ids[2]  # unguarded, the model does emit "brown"


@settings(max_examples=80, deadline=None, suppress_health_check=SLOW)
@given(ids=st.lists(st.integers(0, 9), max_size=12))
def test_token_bytes_of_a_tokenizer_without_decoder_read_as_it_decodes(ids: list[int]) -> None:
    """The guard's reading of a row (its tokens' bytes, joined) has the words of ``decode``."""
    tok = _no_decoder_tokenizer()
    table = token_bytes(tok)
    ids = [i for i in ids if i < len(tok)]
    joined = b"".join(table[i] or b"" for i in ids).decode("utf-8")
    assert words(joined) == words(tok.decode(ids, skip_special_tokens=True))


_CACHE: dict[str, Any] = {}


def _no_decoder_tokenizer() -> Any:
    if "tok" not in _CACHE:
        _CACHE["tok"] = word_level(extra=("n't", "'", "do", "not"))
    return _CACHE["tok"]


@settings(max_examples=80, deadline=None, suppress_health_check=SLOW)
@given(ids=st.lists(st.integers(0, 10), max_size=12))
def test_wordpiece_cleanup_is_read_token_by_token_as_tokenizers_does(ids: list[int]) -> None:
    """tokenizers' WordPiece decoder cleans each token up on its own (`" n't"` -> `"n't"`, gluing
    it to the word before): the table does the same (before: "do n't" read as do n t)."""
    from tokenizers import decoders

    if "wordpiece" not in _CACHE:
        _CACHE["wordpiece"] = word_level(
            decoder=decoders.WordPiece(cleanup=True), extra=("n't", "'", "do", "not", "##s")
        )
    tok = _CACHE["wordpiece"]
    table = token_bytes(tok)
    ids = [i for i in ids if i < len(tok)]
    joined = b"".join(table[i] or b"" for i in ids).decode("utf-8")
    assert words(joined) == words(tok.decode(ids, skip_special_tokens=True))
    do, nt = tok.convert_tokens_to_ids(["do", "n't"])
    assert words(b"".join([table[do] or b"", table[nt] or b""]).decode()) == ["don", "t"]


@pytest.mark.parametrize("decoder", [None, "wordpiece"])
def test_a_tokenizer_that_cleans_up_decoded_text_is_refused_by_name(
    five_word_filter: NgramSet, decoder: str | None
) -> None:
    """transformers' clean-up chains across tokens ("fox n ' t" -> "foxn't"): not modelled."""
    from tokenizers import decoders

    tok = word_level(
        clean_up=True,
        decoder=decoders.WordPiece(cleanup=False) if decoder else None,
        extra=("n", "'", "t"),
    )
    fox, n, quote, t = tok.convert_tokens_to_ids(["fox", "n", "'", "t"])
    assert words(tok.decode([fox, n, quote, t])) == ["foxn", "t"]  # words of no token
    with pytest.raises(UnsupportedTokenizerError, match="clean_up_tokenization_spaces") as error:
        MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)
    assert "--unit token" in str(error.value)
    tok.clean_up_tokenization_spaces = False  # the fix the message names
    MemFreeLogitsProcessor(five_word_filter, tokenizer=tok)


# ------------------------------------------------------------------------------------------------
# 5. The hashing binding is required: edits behind a recomputed header checksum, several at once.


@pytest.fixture
def filter_path(tmp_path: Path) -> Path:
    path = tmp_path / "f.memfree"
    NgramFilter.from_ngrams(path, STORED, false_positive_rate=1e-3).close()
    return path


def test_a_filter_without_its_hashing_binding_is_refused_with_the_fix(filter_path: Path) -> None:
    metadata, _ = read_header(filter_path)
    del metadata["hashing_xxh3"]
    rewrite(filter_path, metadata)
    for verify in (True, False):
        with pytest.raises(DamagedFilterError, match="hashing_xxh3") as error:
            NgramFilter.open(filter_path, verify=verify)
        assert "rebuild it with `memfree build`" in str(error.value)


def test_an_unedited_rewrite_still_opens(filter_path: Path) -> None:
    """The editing helper itself changes nothing but what a test edits."""
    metadata, _ = read_header(filter_path)
    rewrite(filter_path, metadata)
    assert NgramFilter.open(filter_path).contains(STORED).all()


def _other(value: int, low: int, high: int, draw: int) -> int:
    """A value in [low, high] other than ``value``."""
    choice = low + draw % (high - low)
    return choice if choice < value else choice + 1


# Each edit keeps the header self-consistent (the stated rates recomputed), so only the binding
# of the bits to their hashing parameters (and the share of set bits) can refuse it.
EDITS = ("hash_seed", "n", "num_probes", "prefix_num_probes", "unit")


def _edit(metadata: dict[str, Any], field: str, draw: int) -> None:
    if field == "hash_seed":
        # Any other seed: 1 + draw stays below 2**64, so the edit is never a no-op (a draw of
        # 2**64 - 1 once gave the same seed back, and an intact file opened).
        metadata["hash_seed"] = (metadata["hash_seed"] + 1 + draw % ((1 << 64) - 1)) % (1 << 64)
    elif field == "n":
        metadata["n"] = _other(metadata["n"], 2, MAX_NGRAM_SIZE, draw)
    elif field == "num_probes":
        metadata["num_probes"] = _other(metadata["num_probes"], 1, 32, draw)
        metadata["expected_false_positive_rate"] = expected_false_positive_rate(
            metadata["num_ngrams"], metadata["num_bits"] // 512, metadata["num_probes"]
        )
    elif field == "prefix_num_probes":
        prefix = metadata["prefix"]
        prefix["num_probes"] = _other(prefix["num_probes"], 1, 32, draw)
        prefix["expected_false_positive_rate"] = expected_false_positive_rate(
            prefix["num_prefixes"], prefix["num_bits"] // 512, prefix["num_probes"]
        )
    else:  # a token filter read as a word filter
        metadata["unit"], metadata["normalizer"] = "word", NORMALIZER


@settings(max_examples=150, deadline=None, suppress_health_check=SLOW)
@given(
    fields=st.sets(st.sampled_from(EDITS), min_size=1),
    draws=st.lists(st.integers(0, 2**64), min_size=len(EDITS), max_size=len(EDITS)),
    binding=st.sampled_from(["kept", "deleted"]),
)
def test_multi_field_edits_are_refused_with_or_without_the_binding(
    filter_path: Path, fields: set[str], draws: list[int], binding: str
) -> None:
    """Several hashing fields changed together, the header checksum recomputed, the binding left
    stale or deleted: refused, never a filter that opens and finds none of its n-grams."""
    original = filter_path.read_bytes()
    try:
        metadata, _ = read_header(filter_path)
        for index, field in enumerate(sorted(fields)):
            _edit(metadata, field, draws[index])
        if binding == "deleted":
            del metadata["hashing_xxh3"]
        rewrite(filter_path, metadata)
        with pytest.raises(DamagedFilterError):
            NgramFilter.open(filter_path)
        # Refused from the header alone, even unverified: the binding reads no bits.
        with pytest.raises(DamagedFilterError):
            NgramFilter.open(filter_path, verify=False)
    finally:
        filter_path.write_bytes(original)


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


def test_a_pybloom_sidecar_with_an_impossible_n_is_damaged(tmp_path: Path) -> None:
    from memfree.filterfile import pybloom

    writer = pybloom.PybloomWriter(100, 0.01, hash_seed=1)
    writer.add_ngrams(np.array([[1, 2, 3]]))
    path = writer.write(tmp_path / "f.bloom", {}, num_ngrams=1)
    sidecar = json.loads(pybloom.sidecar_path(path).read_text())
    sidecar["n"], sidecar["key_bytes"] = 100_000, 400_000
    pybloom.sidecar_path(path).write_text(json.dumps(sidecar))
    with pytest.raises(DamagedFilterError, match="'n' is 100000"):
        NgramFilter.open(path)


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
