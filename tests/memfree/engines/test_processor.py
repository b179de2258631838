"""The guard: exact masks on hand-made vocabularies, refusals, statistics, and the promise that no
stored n-gram is ever emitted, checked by Hypothesis across every decoding mode."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import FilterMismatchError, MemFreeLogitsProcessor, NgramFilter

NEG = float("-inf")


def make_filter(path: Path, ngrams: list[list[int]], **kwargs: Any) -> NgramFilter:
    width = len(ngrams[0]) if ngrams else kwargs.pop("n", 3)
    array = np.asarray(ngrams, dtype=np.int64).reshape(-1, width)
    kwargs.setdefault("false_positive_rate", 1e-9)
    return NgramFilter.from_ngrams(path, array, **kwargs)


# ------------------------------------------------------------------------------------------------
# Exact masks on 5-token vocabularies (token 4 is end-of-sequence)


@pytest.fixture
def trigram_guard(tmp_path: Path) -> MemFreeLogitsProcessor:
    # Stored: (0 1 2), (0 1 3), (3 3 0), and (1 4 2), which holds the special token 4.
    filt = make_filter(tmp_path / "f.memfree", [[0, 1, 2], [0, 1, 3], [3, 3, 0], [1, 4, 2]])
    return MemFreeLogitsProcessor(filt, eos_token_id=4)


def test_exact_mask_per_row(trigram_guard: MemFreeLogitsProcessor) -> None:
    input_ids = torch.tensor([[2, 0, 1], [1, 3, 3], [3, 0, 2], [2, 1, 4]])
    scores = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    original = scores.clone()
    out = trigram_guard(input_ids, scores)
    expected = original.clone()
    expected[0, [2, 3]] = NEG  # (0 1) -> 2 and 3 complete stored trigrams
    expected[1, 0] = NEG  # (3 3) -> 0
    # row 2: (0 2) begins nothing; row 3: (1 4) holds the special token, so never checked
    assert torch.equal(out, expected)
    assert torch.equal(scores, original)  # not edited in place
    assert out.data_ptr() != scores.data_ptr()


@pytest.mark.parametrize("skip_rows", [True, False])
def test_fast_and_dense_paths_block_the_same_tokens(tmp_path: Path, skip_rows: bool) -> None:
    rng = np.random.default_rng(0)
    stored = rng.integers(0, 6, size=(40, 3))
    filt = make_filter(tmp_path / "f.memfree", stored.tolist(), false_positive_rate=0.2)
    guard = MemFreeLogitsProcessor(filt, eos_token_id=7, skip_rows=skip_rows)
    reference = MemFreeLogitsProcessor(filt, eos_token_id=7, skip_rows=not skip_rows)
    input_ids = torch.from_numpy(rng.integers(0, 8, size=(64, 5)))
    mask, _ = guard.blocked_mask(input_ids, 8)
    assert torch.equal(mask, reference.blocked_mask(input_ids, 8)[0])
    # ... and both equal the filter's own answer for every (row, token), special 7 excepted.
    for row in range(input_ids.shape[0]):
        window = input_ids[row, -2:].tolist()
        expected = filt.contains([[*window, token] for token in range(8)])
        expected[7] = False
        if 7 in window:
            expected[:] = False
        assert mask[row].tolist() == expected.tolist()


def test_special_tokens_are_never_blocked_and_eos_rescues_a_dead_row(tmp_path: Path) -> None:
    filt = make_filter(tmp_path / "f.memfree", [[0, 1], [0, 2], [0, 3], [0, 4]])
    guard = MemFreeLogitsProcessor(filt, eos_token_id=4, special_token_ids=[3])
    scores = torch.tensor([[0.0, NEG, 1.0, 2.0, NEG]])  # earlier processors removed 1 and 4
    out = guard(torch.tensor([[0]]), scores)
    # 1 and 2 are blocked; 3 is special (kept); 4 stays -inf because 3 is still allowed
    assert out.tolist() == [[0.0, NEG, NEG, 2.0, NEG]]
    scores = torch.tensor([[NEG, 5.0, 1.0, NEG, NEG]])
    out = guard(torch.tensor([[0]]), scores)
    assert out.tolist() == [[NEG, NEG, NEG, NEG, 0.0]]  # every token gone: end-of-sequence allowed


def test_unigram_and_short_rows(tmp_path: Path) -> None:
    unigram = MemFreeLogitsProcessor(make_filter(tmp_path / "u.memfree", [[2], [3]]))
    out = unigram(torch.tensor([[0], [1]]), torch.zeros(2, 5))
    assert torch.isneginf(out).tolist() == [[False, False, True, True, False]] * 2
    four = MemFreeLogitsProcessor(make_filter(tmp_path / "f.memfree", [[0, 1, 2, 3]]))
    # fewer than n-1 tokens: nothing can be completed yet
    assert torch.equal(four(torch.tensor([[0, 1]]), torch.zeros(1, 5)), torch.zeros(1, 5))
    assert torch.isneginf(four(torch.tensor([[0, 1, 2]]), torch.zeros(1, 5)))[0, 3]


def test_refuses_wrong_tokenizer_and_wrong_n(
    tmp_path: Path, tokenizer_dir: Path, tokenizer: Any
) -> None:
    from memfree.vocab.tokenizer import tokenizer_fingerprint

    filt = make_filter(
        tmp_path / "f.memfree",
        [[1, 2, 3]],
        metadata={"tokenizer_fingerprint": "0123456789abcdef", "tokenizer": "someone-else"},
    )
    with pytest.raises(FilterMismatchError, match=r"someone-else.*fingerprint.*Rebuild"):
        MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
    good = make_filter(
        tmp_path / "g.memfree",
        [[1, 2, 3]],
        metadata={"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)},
    )
    guard = MemFreeLogitsProcessor(good, tokenizer=tokenizer)
    assert tokenizer.eos_token_id in guard.special_token_ids
    assert tokenizer.pad_token_id in guard.special_token_ids
    with pytest.raises(FilterMismatchError, match="holds 3-grams, but ngram_size=10"):
        MemFreeLogitsProcessor(good, tokenizer=tokenizer, ngram_size=10)


def test_only_ids_the_builder_cut_at_are_exempt(tmp_path: Path) -> None:
    # The filter records that the builder cut at 4 only; (0 1 3) is stored.
    filt = make_filter(
        tmp_path / "f.memfree", [[0, 1, 3], [3, 0, 1]], metadata={"special_token_ids": [4]}
    )
    assert filt.special_token_ids == (4,)
    # 3 asked to be special (e.g. a user-chosen pad token) would exempt a stored n-gram: refused.
    guard = MemFreeLogitsProcessor(filt, eos_token_id=np.int64(4), pad_token_id=3)
    assert guard.special_token_ids == (4,) and guard.eos_token_ids == (4,)
    out = guard(torch.tensor([[0, 1], [3, 0]]), torch.zeros(2, 5))
    assert torch.isneginf(out).tolist() == [
        [False, False, False, True, False],
        [False, True, False, False, False],
    ]


def test_special_ids_in_many_forms(tmp_path: Path) -> None:
    filt = make_filter(tmp_path / "f.memfree", [[0, 1, 3]])
    for form in (5, np.int64(5), torch.tensor(5), [5], (5,), torch.tensor([5])):
        assert MemFreeLogitsProcessor(filt, special_token_ids=form).special_token_ids == (5,)
    with pytest.raises(ValueError, match="special_token_ids must be a token id or a list"):
        MemFreeLogitsProcessor(filt, special_token_ids=object())  # type: ignore[arg-type]


def test_bad_arguments(tmp_path: Path) -> None:
    filt = make_filter(tmp_path / "f.memfree", [[1, 2, 3]])
    with pytest.raises(ValueError, match="eos_token_id must hold non-negative"):
        MemFreeLogitsProcessor(filt, eos_token_id=-3)
    with pytest.raises(TypeError, match="ngram_filter must be an NgramFilter"):
        MemFreeLogitsProcessor(42)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="memfree build"):
        MemFreeLogitsProcessor(tmp_path / "missing.memfree")
    guard = MemFreeLogitsProcessor(filt)
    with pytest.raises(ValueError, match="same batch"):
        guard(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 5))


def test_pybloom_interchange_filter_guards_the_same(tmp_path: Path) -> None:
    from memfree.filterfile.pybloom.reader import PybloomWriter

    stored = np.array([[0, 1, 2], [0, 1, 3], [3, 3, 0]])
    writer = PybloomWriter(10, 1e-9, 0)
    writer.add_ngrams(stored)
    writer.write(tmp_path / "f.bloom", {"n": 3, "unit": "token", "hash_seed": 0}, 3)
    filt = NgramFilter.open(tmp_path / "f.bloom")
    guard = MemFreeLogitsProcessor(filt, eos_token_id=4)
    out = guard(torch.tensor([[2, 0, 1], [1, 3, 3], [4, 3, 3]]), torch.zeros(3, 5))
    assert torch.isneginf(out).tolist() == [
        [False, False, True, True, False],
        [True, False, False, False, False],
        [True, False, False, False, False],  # the 4 lies outside the window (3 3)
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_without_host_synchronisation(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    filt = make_filter(tmp_path / "f.memfree", rng.integers(0, 50, size=(500, 4)).tolist())
    special = list(range(50, 64))  # many ids: torch.isin would take its syncing sort path
    cpu = MemFreeLogitsProcessor(filt, eos_token_id=63, special_token_ids=special)
    cuda = MemFreeLogitsProcessor(filt, eos_token_id=63, special_token_ids=special)
    input_ids = torch.from_numpy(rng.integers(0, 52, size=(1, 7)))
    scores = torch.randn(1, 64)
    ids_gpu, scores_gpu = input_ids.cuda(), scores.cuda()
    cuda(ids_gpu, scores_gpu)  # the bit arrays move to the GPU once, here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation in a step now raises
    try:
        on_gpu = cuda(ids_gpu, scores_gpu)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), cpu(input_ids, scores))


# ------------------------------------------------------------------------------------------------
# Statistics


def test_stats_record_interventions_exactly(tmp_path: Path, scripted_lm: Any) -> None:
    stored = [[0, 1, 2], [1, 2, 3], [2, 3, 0]]
    model = scripted_lm(6, stored, boost=50.0, seed=3)
    filt = make_filter(tmp_path / "f.memfree", stored)
    guard = MemFreeLogitsProcessor(filt, eos_token_id=5)
    prompt = torch.tensor([[0, 1], [4, 0]])
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        logits_processor=[guard],
        max_new_tokens=6,
        min_new_tokens=6,
        do_sample=False,
        use_cache=False,
    )
    stats = guard.stats
    assert stats.num_rows == 2 and stats.num_steps == 6
    assert stats.positions.tolist() == [2, 3, 4, 5, 6, 7]
    assert stats.first_choice_blocked[0, 0]  # the model wants 2 after (0 1): blocked
    for row in range(2):
        for step, position in enumerate(stats.positions):
            chosen = int(out[row, position])
            first = int(stats.first_choice[row, step])
            window = out[row, position - 2 : position].tolist()
            if stats.first_choice_blocked[row, step]:
                assert chosen != first and filt.contains([*window, first])
            else:
                assert chosen == first
            blocked = filt.contains([[*window, token] for token in range(5)]).sum()
            assert stats.blocked_counts[row, step] == (blocked if 5 not in window else 0)
    assert stats.interventions().tolist() == stats.first_choice_blocked.sum(1).tolist()
    assert stats.summary()["interventions"] >= 1
    # A new generate() call starts new statistics.
    model.generate(prompt[:1], logits_processor=[guard], max_new_tokens=2, use_cache=False)
    assert guard.stats.num_rows == 1 and guard.stats.num_steps <= 2


# ------------------------------------------------------------------------------------------------
# The promise, by Hypothesis: no guarded output ever holds a stored n-gram


MODES: dict[str, dict[str, Any]] = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "temperature": 1.3},
    "top_k": {"do_sample": True, "top_k": 2},
    "top_p": {"do_sample": True, "top_p": 0.7},
    "beam": {"num_beams": 3, "num_return_sequences": 2},
    "beam_sample": {"num_beams": 2, "do_sample": True},
    "several_samples": {"do_sample": True, "num_return_sequences": 3},
}


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    vocab_size = draw(st.integers(4, 9))
    eos = vocab_size - 1
    n = draw(st.integers(1, 4))
    token = st.integers(0, vocab_size - 2)
    stored = draw(
        st.lists(st.lists(token, min_size=n, max_size=n), min_size=1, max_size=3 * vocab_size)
    )
    prompts = draw(st.lists(st.lists(token, min_size=1, max_size=6), min_size=1, max_size=3))
    return {
        "vocab_size": vocab_size,
        "eos": eos,
        "n": n,
        "stored": stored,
        "prompts": prompts,
        "seed": draw(st.integers(0, 2**16)),
        "boost": draw(st.sampled_from([0.0, 4.0, 30.0])),
    }


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def emitted_windows(row: list[int], width: int, n: int, eos: int) -> list[tuple[int, ...]]:
    """n-grams of a row holding at least one generated token and no special token."""
    windows = []
    for start in range(max(width - n + 1, 0), len(row) - n + 1):
        window = tuple(row[start : start + n])
        if eos not in window:
            windows.append(window)
    return windows


@pytest.mark.parametrize("mode", list(MODES))
@settings(
    max_examples=150,
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
        filt = NgramFilter.from_ngrams(Path(directory) / "f.memfree", scenario["stored"])
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
        width = ids.shape[1]
        for row in out.tolist():
            windows = emitted_windows(row, width, n, eos)
            assert not reference.intersection(windows), (row, reference)
            if windows:  # nor anything the filter answers yes to (false positives included)
                assert not filt.contains(np.array(windows)).any()
        filt.close()


@pytest.mark.parametrize("mode", list(MODES))
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios())
def test_nothing_stored_changes_nothing(
    mode: str, scenario: dict[str, Any], scripted_lm: Any
) -> None:
    eos = scenario["eos"]
    model = scripted_lm(
        scenario["vocab_size"], scenario["stored"], scenario["boost"], scenario["seed"]
    )
    with tempfile.TemporaryDirectory() as directory:
        empty = np.zeros((0, scenario["n"]), dtype=np.int64)
        filt = NgramFilter.from_ngrams(Path(directory) / "f.memfree", empty)
        guard = MemFreeLogitsProcessor(filt, eos_token_id=eos, allow_empty=True)
        ids, mask = left_pad(scenario["prompts"], eos)
        outputs = []
        for processors in ([guard], None):
            torch.manual_seed(scenario["seed"])
            outputs.append(
                model.generate(
                    ids,
                    attention_mask=mask,
                    logits_processor=processors,
                    max_new_tokens=6,
                    use_cache=False,
                    **MODES[mode],
                )
            )
        assert torch.equal(outputs[0], outputs[1])
        filt.close()
