"""The token masker over a prefix-keyed index: exact masks against a reference set, the CPU
lookup and the fixed-shape step equal, and the promise through real generate() calls."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import MemFreeLogitsProcessor
from memfree.core import MaskerOptions
from memfree.core.token_index import IndexMasker
from memfree.filterfile.index.reader import IndexFilter
from tests.memfree.engines.test_processor import MODES, emitted_windows, left_pad, scenarios


def reference_mask(
    stored: set[tuple[int, ...]], rows: np.ndarray, n: int, width: int, special: set[int]
) -> np.ndarray:
    mask = np.zeros((rows.shape[0], width), dtype=bool)
    for row, ids in enumerate(rows.tolist()):
        prefix = tuple(ids[len(ids) - (n - 1) :]) if n > 1 else ()
        if special.intersection(prefix):
            continue
        for ngram in stored:
            if ngram[:-1] == prefix and ngram[-1] < width and ngram[-1] not in special:
                mask[row, ngram[-1]] = True
    return mask


@settings(max_examples=80, deadline=None)
@given(
    vocab=st.integers(3, 400),
    n=st.integers(1, 4),
    count=st.integers(0, 300),
    extra_width=st.integers(0, 5),
    seed=st.integers(0, 2**32),
    rate=st.sampled_from([1e-9, 1e-3, 0.3]),
)
def test_masks_are_the_reference_set_plus_explained_collisions(
    vocab: int, n: int, count: int, extra_width: int, seed: int, rate: float
) -> None:
    rng = np.random.default_rng(seed)
    alphabet = min(vocab, 6)
    stored_array = rng.integers(0, alphabet, size=(count, n))
    if count:
        stored_array[:, -1] = rng.integers(0, vocab, size=count)
    stored = {tuple(row) for row in stored_array.tolist()}
    special = {int(rng.integers(0, vocab))}
    rows = rng.integers(0, alphabet, size=(24, n + 2))
    width = vocab + extra_width
    with tempfile.TemporaryDirectory() as directory:
        filt = IndexFilter.from_ngrams(
            Path(directory) / "f.memfree",
            stored_array,
            vocab_size=vocab,
            false_positive_rate=rate,
        )
        lookup = IndexMasker(filt, special)
        fixed = IndexMasker(filt, special, MaskerOptions(skip_rows=False))
        contexts = torch.from_numpy(rows)
        mask, active = lookup.banned_mask(contexts, width)
        fixed_mask, fixed_active = fixed.banned_mask(contexts, width)
        assert torch.equal(mask, fixed_mask) and torch.equal(active, fixed_active)
        expected = reference_mask(stored, rows, n, width, special)
        got = mask.numpy()
        assert got[expected].all()  # every stored n-gram banned
        # Every other ban is a stored token of a prefix colliding with the row's; at the
        # strictest rate there is none in practice.
        extra = got & ~expected
        if rate == 1e-9:
            assert not extra.any()
        for row, token in zip(*np.nonzero(extra), strict=True):
            ngram = (*rows[row, rows.shape[1] - (n - 1) :].tolist(), int(token))
            assert filt.contains(np.array([ngram]))[0]
            assert any(stored_ngram[-1] == token for stored_ngram in stored)
        filt.close()


def test_special_tokens_rows_and_short_contexts(tmp_path: Path) -> None:
    filt = IndexFilter.from_ngrams(
        tmp_path / "f.memfree", [[0, 1, 2], [0, 1, 3], [3, 3, 0], [1, 4, 2]], vocab_size=5
    )
    masker = IndexMasker(filt, [4])
    mask, active = masker.banned_mask(torch.tensor([[2, 0, 1], [1, 3, 3], [3, 0, 2], [2, 1, 4]]), 5)
    assert mask.tolist() == [
        [False, False, True, True, False],
        [True, False, False, False, False],
        [False] * 5,
        [False] * 5,  # (1 4) holds the special token: never checked
    ]
    assert active.tolist() == [True, True, False, False]
    short, checked = masker.banned_mask(torch.tensor([[0]]), 5)
    assert not short.any() and not checked.any()
    copy = pickle.loads(pickle.dumps(masker))
    assert torch.equal(copy.banned_mask(torch.tensor([[0, 1]]), 5)[0], mask[:1])


def test_the_processor_picks_the_index_masker(tmp_path: Path) -> None:
    filt = IndexFilter.from_ngrams(tmp_path / "f.memfree", [[0, 1, 2]], vocab_size=5)
    guard = MemFreeLogitsProcessor(filt, eos_token_id=4)
    out = guard(torch.tensor([[0, 1]]), torch.zeros(1, 5))
    assert out[0, 2] == float("-inf") and torch.isfinite(out[0, [0, 1, 3, 4]]).all()


@pytest.mark.parametrize("mode", list(MODES))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios())
def test_no_stored_ngram_is_ever_emitted(
    mode: str, scenario: dict[str, Any], scripted_lm: Any
) -> None:
    n, eos = scenario["n"], scenario["eos"]
    model = scripted_lm(
        scenario["vocab_size"], scenario["stored"], scenario["boost"], scenario["seed"]
    )
    reference = {tuple(ngram) for ngram in scenario["stored"]}
    with tempfile.TemporaryDirectory() as directory:
        filt = IndexFilter.from_ngrams(
            Path(directory) / "f.memfree", scenario["stored"], vocab_size=scenario["vocab_size"]
        )
        guard = MemFreeLogitsProcessor(filt, eos_token_id=eos)
        ids, mask = left_pad(scenario["prompts"], eos)
        torch.manual_seed(scenario["seed"])
        out = model.generate(
            ids,
            attention_mask=mask,
            logits_processor=[guard],
            max_new_tokens=8,
            use_cache=False,
            **MODES[mode],
        )
        for row in out.tolist():
            windows = emitted_windows(row, ids.shape[1], n, eos)
            assert not reference.intersection(windows), (row, reference)
        filt.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_without_host_synchronisation(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    stored = rng.integers(0, 50, size=(500, 4))
    stored[:300, :3] = [1, 2, 3]  # one prefix with many next tokens
    stored[:300, 3] = rng.integers(0, 60, size=300)
    filt = IndexFilter.from_ngrams(tmp_path / "f.memfree", stored, vocab_size=64)
    special = list(range(60, 64))
    cpu = IndexMasker(filt, special)
    cuda = IndexMasker(filt, special)
    contexts = torch.from_numpy(rng.integers(0, 52, size=(16, 7)))
    contexts[0, -3:] = torch.tensor([1, 2, 3])
    on_device = contexts.cuda()  # a copy from pageable memory waits for the host: not a step's
    cuda.banned_mask(on_device, 64)  # the arrays move to the GPU once, here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu, active = cuda.banned_mask(on_device, 64)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected, expected_active = cpu.banned_mask(contexts, 64)
    assert torch.equal(on_gpu.cpu(), expected) and torch.equal(active.cpu(), expected_active)


def test_a_filter_rewritten_in_place_stops_the_guard(tmp_path: Path) -> None:
    from memfree.errors import FilterChangedError

    rng = np.random.default_rng(5)
    first = rng.integers(0, 50, size=(300, 3))
    second = first.copy()
    second[:, -1] = (second[:, -1] + 1) % 50  # same prefixes and counts: same size, other bytes
    path, other = tmp_path / "live.memfree", tmp_path / "other.memfree"
    filt = IndexFilter.from_ngrams(path, first, vocab_size=64)
    IndexFilter.from_ngrams(other, second, vocab_size=64).close()
    assert path.stat().st_size == other.stat().st_size
    guard = MemFreeLogitsProcessor(filt, eos_token_id=63)
    ids = torch.from_numpy(first[:4, :2].copy())
    guard(ids, torch.zeros(4, 64))
    with open(path, "r+b") as handle:  # `cp other live`: the same inode, other bytes
        handle.write(other.read_bytes())
    with pytest.raises(FilterChangedError, match="changed in place"):
        guard(ids, torch.zeros(4, 64))


def test_a_memorizing_model_guarded_by_an_index_emits_no_stored_ngram_in_ids_or_text(
    tmp_path: Path, tokenizer: Any, memorizing_llama: Any
) -> None:
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.units import TOKEN
    from tests.conftest import MEMORIZED_DOCUMENTS

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index, text in enumerate(MEMORIZED_DOCUMENTS):
        (corpus / f"doc{index}.py").write_text(text)
    settings = BuildSettings(
        ngram_size=4, tokenizer=None, layout="prefix-index", workers=1, false_positive_rate=1e-9
    )
    output = tmp_path / "f.memfree"
    build_filter([str(corpus)], output, settings, tokenizer=tokenizer, progress=False)
    from memfree.filterfile import open_filter

    index = open_filter(output)
    assert isinstance(index, IndexFilter)
    guard = MemFreeLogitsProcessor(index, tokenizer=tokenizer)  # canonical by default
    assert guard.canonical
    unguarded_hits = 0
    for text in MEMORIZED_DOCUMENTS:
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"][:12]
        batch = torch.tensor([prompt])
        for processors in (None, [guard]):
            out = memorizing_llama.generate(
                batch,
                attention_mask=torch.ones_like(batch),
                logits_processor=processors,
                max_new_tokens=24,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(prompt) :].tolist()
            in_ids = TOKEN.created_ngram_counts(index, prompt, out)[0]
            in_text = TOKEN.created_text_ngram_counts(index, prompt, out, tokenizer=tokenizer)[0]
            if processors is None:
                unguarded_hits += in_ids
            else:
                assert in_ids == 0 and in_text == 0, tokenizer.decode(out)
    assert unguarded_hits > 0  # the model does reproduce what the index holds
