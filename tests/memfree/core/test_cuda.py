"""The guard on a CUDA device: the same masks as the CPU and as an exact reference set, the promise
that nothing stored is emitted in any decoding mode, a real generate() on the GPU, the CPU
fallback when the filter does not fit, and the word guard. Skipped where no GPU is present (CI);
run on a lent GPU with ``pytest tests/memfree/core/test_cuda.py``."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree import MemFreeLogitsProcessor, NgramFilter
from memfree.filterfile.bloom.writer import FilterFileWriter, set_fingerprint_bits
from memfree.filterfile.hashing import fingerprints_np
from tests.memfree.engines.test_processor import MODES, emitted_windows, left_pad

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@st.composite
def mask_cases(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(1, 5))
    vocab_size = draw(st.integers(5, 70))
    token = st.integers(0, vocab_size - 1)
    stored = draw(st.lists(st.lists(token, min_size=n, max_size=n), min_size=1, max_size=60))
    rows = draw(st.lists(st.lists(token, min_size=n + 2, max_size=n + 2), min_size=1, max_size=6))
    special = draw(st.lists(token, max_size=3, unique=True))
    return {"n": n, "vocab": vocab_size, "stored": stored, "rows": rows, "special": special}


@settings(max_examples=200, deadline=None)
@given(case=mask_cases())
def test_cuda_mask_equals_cpu_and_exact_reference(case: dict[str, Any]) -> None:
    n, vocab_size, special = case["n"], case["vocab"], case["special"]
    stored = {tuple(ngram) for ngram in case["stored"]}
    with tempfile.TemporaryDirectory() as directory:
        filt = NgramFilter.from_ngrams(
            Path(directory) / "f.memfree", case["stored"], false_positive_rate=1e-9
        )
        # eos_token_id=[] keeps the guard from taking vocab-1 as a special id of its own
        kwargs: dict[str, Any] = {"special_token_ids": special, "eos_token_id": []}
        cpu = MemFreeLogitsProcessor(filt, **kwargs)
        gpu = MemFreeLogitsProcessor(filt, **kwargs)
        ids = torch.tensor(case["rows"])
        on_cpu, _ = cpu.blocked_mask(ids, vocab_size)
        on_gpu, checked = gpu.blocked_mask(ids.cuda(), vocab_size)
        assert on_gpu.device.type == "cuda" and checked.device.type == "cuda"
        assert torch.equal(on_gpu.cpu(), on_cpu)
        for row, tokens in zip(case["rows"], on_gpu.cpu().tolist(), strict=True):
            context = tuple(row[len(row) - (n - 1) :]) if n > 1 else ()
            for token in range(vocab_size):
                exact = (*context, token) in stored
                clean = not set((*context, token)) & set(special)
                if exact and clean:
                    assert tokens[token], (context, token)  # no false negative, ever
                if not clean:
                    assert not tokens[token]  # a window with a special id is never blocked
        filt.close()


@pytest.mark.parametrize("mode", list(MODES))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_stored_ngram_is_ever_emitted_on_cuda(mode: str, data: Any, scripted_lm: Any) -> None:
    from tests.memfree.engines.test_processor import scenarios

    scenario = data.draw(scenarios())
    n, eos = scenario["n"], scenario["eos"]
    model = scripted_lm(
        scenario["vocab_size"], scenario["stored"], scenario["boost"], scenario["seed"]
    ).cuda()
    model.table = model.table.cuda()  # a plain attribute: .cuda() leaves it behind
    reference = {tuple(ngram) for ngram in scenario["stored"]}
    with tempfile.TemporaryDirectory() as directory:
        filt = NgramFilter.from_ngrams(Path(directory) / "f.memfree", scenario["stored"])
        guard = MemFreeLogitsProcessor(filt, eos_token_id=eos)
        ids, mask = left_pad(scenario["prompts"], eos)
        torch.manual_seed(scenario["seed"])
        out = model.generate(
            ids.cuda(),
            attention_mask=mask.cuda(),
            logits_processor=[guard],
            max_new_tokens=8,
            use_cache=False,
            **MODES[mode],
        )
        assert out.device.type == "cuda"
        for row in out.tolist():
            windows = emitted_windows(row, ids.shape[1], n, eos)
            assert not reference.intersection(windows), (row, reference)
        filt.close()


def test_tiny_llama_generates_guarded_on_cuda(
    tmp_path: Path, tokenizer: Any, memorizing_llama: Any
) -> None:
    """A trained tiny Llama copies its documents on the GPU; guarded, it copies no stored 8-gram,
    and the statistics (kept on the GPU during the call) say where it intervened."""
    from tests.conftest import MEMORIZED_DOCUMENTS

    n = 8
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in MEMORIZED_DOCUMENTS]
    ngrams = [row[i : i + n] for row in rows for i in range(len(row) - n + 1)]
    filt = NgramFilter.from_ngrams(tmp_path / "f.memfree", ngrams)
    model = memorizing_llama.cuda()
    try:
        prompts = torch.tensor([row[:12] for row in rows], device="cuda")
        kwargs: dict[str, Any] = {
            "attention_mask": torch.ones_like(prompts),
            "max_new_tokens": 24,
            "do_sample": False,
            "pad_token_id": tokenizer.pad_token_id,
        }
        plain = model.generate(prompts, **kwargs)
        stored = {tuple(g) for g in ngrams}
        copied = [
            tuple(row[i : i + n]) in stored
            for row in plain.tolist()
            for i in range(12 - n + 1, len(row) - n + 1)
        ]
        assert any(copied)  # the model does copy, so the guard has something to stop
        guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
        out = model.generate(prompts, logits_processor=[guard], **kwargs)
        for row in out.tolist():
            for i in range(12 - n + 1, len(row) - n + 1):
                assert tuple(row[i : i + n]) not in stored
        assert guard.stats.interventions().sum() > 0
        assert guard.stats.num_steps == 24
    finally:
        memorizing_llama.cpu()


def test_a_filter_too_large_for_the_gpu_falls_back_to_the_cpu(tmp_path: Path) -> None:
    """Fill the GPU so that the filter cannot move there: the guard warns once, computes on the
    CPU and returns the same mask on the scores' device."""
    num_blocks = (1 << 30) // 64  # a 1 GiB bit array
    stored = np.array([[1, 2, 3], [4, 5, 6], [1, 2, 7]])
    meta = {"unit": "token", "n": 3, "num_probes": 6, "hash_seed": 0, "num_ngrams": 3}
    with FilterFileWriter(tmp_path / "big.memfree", num_blocks, meta) as writer:
        set_fingerprint_bits(writer.bit_words, fingerprints_np(stored, 0), 6)
    filt = NgramFilter.open(tmp_path / "big.memfree")
    ids = torch.tensor([[9, 1, 2], [0, 4, 5], [3, 3, 3]], device="cuda")
    scores = torch.zeros(3, 10, device="cuda")
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(max(free - (256 << 20), 0), dtype=torch.uint8, device="cuda")
    try:
        guard = MemFreeLogitsProcessor(filt, eos_token_id=9)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = guard(ids, scores)
            guard(ids, scores)
        assert sum(issubclass(w.category, RuntimeWarning) for w in caught) == 1
        assert "does not fit" in str(caught[0].message)
    finally:
        del hog
        torch.cuda.empty_cache()
    assert out.device.type == "cuda"
    blocked = torch.isneginf(out).cpu().tolist()
    assert [[t for t in range(10) if row[t]] for row in blocked] == [[3, 7], [6], []]
    filt.close()


def test_word_guard_on_cuda_matches_cpu(tmp_path: Path, tokenizer: Any) -> None:
    from memfree.testing import word_filter_from_texts
    from tests.conftest import WORD_TEXTS

    filt = word_filter_from_texts(tmp_path / "w.memfree", WORD_TEXTS, 2)
    guard = MemFreeLogitsProcessor(filt, tokenizer)
    rows = [
        tokenizer("def add(a, b):\n    return", add_special_tokens=False)["input_ids"][-6:],
        tokenizer("the quick brown fox jumps", add_special_tokens=False)["input_ids"][-6:],
    ]
    width = min(len(r) for r in rows)
    ids = torch.tensor([r[-width:] for r in rows])
    scores = torch.randn(2, len(tokenizer))
    on_cpu = guard(ids, scores)
    on_gpu = guard(ids.cuda(), scores.cuda())
    assert on_gpu.device.type == "cuda"
    assert torch.equal(torch.isneginf(on_gpu).cpu(), torch.isneginf(on_cpu))
    assert torch.isneginf(on_cpu).any()  # the case blocks something


def test_graphed_and_eager_steps_give_the_same_masks(tmp_path: Path) -> None:
    """The CUDA-graph replay gives the eager step's masks for every shape and content, and a
    returned mask is the caller's own (a later replay does not overwrite it)."""
    rng = np.random.default_rng(1)
    filt = NgramFilter.from_ngrams(tmp_path / "f.memfree", rng.integers(0, 40, size=(300, 3)))
    kwargs: dict[str, Any] = {"special_token_ids": [41, 42], "eos_token_id": 42}
    graphed = MemFreeLogitsProcessor(filt, **kwargs)
    eager = MemFreeLogitsProcessor(filt, cuda_graphs=False, **kwargs)
    previous, blocked = None, 0
    for rows in (1, 3, 8, 3, 1, 5, 2, 7, 1):
        ids = torch.from_numpy(rng.integers(0, 43, size=(rows, 6))).cuda()
        mask, active = graphed.blocked_mask(ids, 48)
        reference, reference_active = eager.blocked_mask(ids, 48)
        assert torch.equal(mask, reference) and torch.equal(active, reference_active)
        if previous is not None:
            assert torch.equal(previous[0], previous[1])  # not overwritten by this replay
        previous, blocked = (mask, reference), blocked + int(reference.sum())
    with torch.inference_mode():  # graphs captured there hold inference tensors: kept apart
        inside = graphed.blocked_mask(ids, 48)[0]
    assert torch.equal(inside, graphed.blocked_mask(ids, 48)[0])
    assert blocked > 0  # the cases block something


# -- canonical decoding on the GPU ---------------------------------------------------------------

ODD_TEXTS = [
    "Größe und Maß: 東京タワーは高い。\n\n한국어 문장입니다. 🙂👍 done\n",
    "x = 1\n\n\n# a comment\ndef f():\n    return 'it''s'  # 12345 67\n\n\nThe end.",
]


def _canonical_tokenizer(name: str, trained: Any) -> Any:
    if name == "trained":
        return trained
    if name == "qwen2":
        from tests.memfree.core.test_canonical_qwen import qwen2_tokenizer

        try:
            return qwen2_tokenizer()
        except (ImportError, OSError) as error:  # pragma: no cover - not set up there
            pytest.skip(f"Qwen 2's vocabulary is not installed: {error}")
    from tests.conftest import llama_cpp_tokenizer

    try:
        return llama_cpp_tokenizer(name)
    except OSError as error:  # pragma: no cover - not set up there
        pytest.skip(f"llama.cpp's {name} vocabulary is not set up: {error}")


def _text_rows(tokenizer: Any, count: int, length: int) -> torch.Tensor:
    """``count`` rows of ``length`` ids: each a text's own tokenization (with the special tokens
    the tokenizer adds) from a line that starts at column 0, standard-library modules and texts
    with characters the tokenizers write with several tokens."""
    import sysconfig

    texts = list(ODD_TEXTS)
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[20:]:
        text = path.read_text(errors="ignore")
        at = text.find("\n\n", 200)
        texts.append(text[at + 2 :] if at >= 0 else text)
        if len(texts) == 4 * count:
            break
    rows = [tokenizer(t * (1 + 4 * length // len(t)))["input_ids"] for t in texts]
    return torch.tensor([row[:length] for row in rows[:count]])


@pytest.mark.parametrize("name", ["trained", "llama-spm", "qwen2"])
def test_canonical_steps_on_cuda_equal_the_cpus(name: str, tmp_path: Path, tokenizer: Any) -> None:
    """Rows of real text growing one token a step: the default guard (canonical decoding, the
    n-gram side graphed) bans exactly the same candidates on the GPU as on the CPU, and the
    canonical side bans something the ids-only guard does not (the case exercises it)."""
    from memfree.testing import token_filter_from_ngrams

    chosen = _canonical_tokenizer(name, tokenizer)
    rows = _text_rows(chosen, 12, 48)
    ngrams = [rows[r, i : i + 4].tolist() for r in range(0, 12, 2) for i in range(8, 40)]
    filt = token_filter_from_ngrams(tmp_path / "f.memfree", ngrams, chosen)
    on_cpu = MemFreeLogitsProcessor(filt, tokenizer=chosen)
    on_gpu = MemFreeLogitsProcessor(filt, tokenizer=chosen)
    ids_only = MemFreeLogitsProcessor(filt, tokenizer=chosen, canonical=False)
    assert on_cpu.canonical and on_gpu.canonical
    width = len(chosen)
    generator = torch.Generator().manual_seed(0)
    canonical_only = ngram_banned = 0
    for length in range(8, rows.shape[1] + 1):
        ids = rows[:, :length]
        scores = torch.randn(ids.shape[0], width, generator=generator)
        expected = torch.isneginf(on_cpu(ids, scores.clone()))
        got = on_gpu(ids.cuda(), scores.cuda())
        assert got.device.type == "cuda"
        assert torch.equal(torch.isneginf(got).cpu(), expected), length
        plain = torch.isneginf(ids_only(ids, scores.clone()))
        ngram_banned += int(plain.sum())
        canonical_only += int((expected & ~plain).sum())
        assert not (plain & ~expected).any()  # canonical decoding only adds bans
    assert ngram_banned > 0 and canonical_only > 0


def test_generate_on_cuda_spelling_a_stored_passage_another_way(tmp_path: Path) -> None:
    """The SentencePiece-style attack of test_canonical_spm (a stored passage spelled one
    character piece at a time), generated on the GPU: the ids-only guard lets the copy through,
    the canonical guard writes its text's tokenization, which holds no stored n-gram."""
    from tests.memfree.core.test_canonical_spm import check_spelled_passage

    _canonical_tokenizer("llama-spm", None)  # skips where the vocabulary is not set up
    check_spelled_passage("llama-spm", tmp_path, "cuda")
