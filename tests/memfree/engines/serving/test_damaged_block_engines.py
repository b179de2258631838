"""A filter error inside a step, in every engine: an index filter's blocks are verified on their
first read, so a damaged block passes start-up and surfaces at the first step whose row reads it.
No engine raises there (raising inside vLLM's ``apply()`` kills the engine and every request on
it): the rows whose lookup reads the damaged block take end of sequence only, every other row gets
exactly its answer over the intact filter, the problem (file, section and block) is logged once,
and the guard keeps serving."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from memfree.engines.llama_cpp import GuardStepError, MemFreeLlamaCppLogitsProcessor
from memfree.engines.transformers import MemFreeLogitsProcessor as TransformersGuard
from memfree.engines.vllm import MemFreeLogitsProcessor
from memfree.errors import DamagedFilterError, FilterChangedError
from memfree.filterfile import open_filter
from memfree.filterfile.index.reader import IndexFilter
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint
from tests.memfree.engines.serving.test_llama_cpp import FakeLlama

VLLM_LOGGER = "vllm.memfree"
PROBLEM = re.compile(r"section \d+, block \d+|section \d+: ")


@dataclass
class Damaged:
    """An index filter with one damaged block, and stored prefixes on either side of it."""

    path: Path  # the damaged file
    intact: Path  # the same n-grams, undamaged: the reference
    bad: list[list[int]]  # stored (n-1)-prefixes whose lookup reads the damaged block
    good: list[list[int]]  # stored prefixes whose lookup does not
    eos: int
    width: int  # the logits' width (the vocabulary and some padding)


def _raises(filt: Any, ngram: list[int]) -> bool:
    try:
        filt.contains(np.asarray([ngram]))
    except DamagedFilterError:
        return True
    return False


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Damaged:
    """Stored 3-grams of ordinary ids; one byte of the records flipped, found (with the public
    reader only) to be opened fine and then refused for some stored prefixes and not others."""
    directory = tmp_path_factory.mktemp("damaged")
    vocab = len(tokenizer)
    rng = np.random.default_rng(7)
    ngrams = rng.integers(2, vocab, size=(300, 3))  # 0 and 1 are the special tokens
    metadata = {
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "special_token_ids": list(special_token_ids(tokenizer)),
    }
    path, intact = directory / "damaged.memfree", directory / "intact.memfree"
    for target in (path, intact):
        IndexFilter.from_ngrams(target, ngrams, vocab_size=vocab, metadata=metadata).close()
    data = intact.read_bytes()
    prefixes = sorted({tuple(row[:2]) for row in ngrams.tolist()})
    for back in range(100, min(len(data) // 2, 2000), 37):  # inside the records, near the end
        flipped = bytearray(data)
        flipped[len(data) - back] ^= 0x10
        path.write_bytes(bytes(flipped))
        try:
            probe = open_filter(path)  # opening reads the header and the section table only
        except DamagedFilterError:
            continue
        refused = [_raises(probe, [*prefix, 0]) for prefix in prefixes]
        probe.close()
        bad = [list(p) for p, no in zip(prefixes, refused, strict=True) if no]
        good = [list(p) for p, no in zip(prefixes, refused, strict=True) if not no]
        if bad and len(good) >= 2:
            return Damaged(path, intact, bad, good, int(tokenizer.eos_token_id), vocab + 4)
    raise AssertionError("no flipped byte of the records gave a block refused on first read")


def _eos_only(row: torch.Tensor, eos: int) -> bool:
    return torch.isfinite(row).nonzero().flatten().tolist() == [eos]


def _reference(damaged: Damaged, tokenizer: Any) -> TransformersGuard:
    return TransformersGuard(
        damaged.intact, tokenizer=tokenizer, canonical=False, record_stats=False
    )


def _expected(reference: TransformersGuard, row: list[int], scores: torch.Tensor) -> torch.Tensor:
    return reference(torch.tensor([row]), scores[None].clone())[0]


def _logged(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.ERROR and record.name == name
    ]


def _assert_names_the_problem(message: str, damaged: Damaged) -> None:
    assert str(damaged.path) in message and PROBLEM.search(message), message
    assert "end of sequence only" in message and "keeps serving the others" in message


def test_vllm_v1_closes_only_the_rows_that_read_the_damaged_block(
    damaged: Damaged,
    helpers: Any,
    tokenizer_dir: Path,
    tokenizer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = helpers.vllm_config(tokenizer_dir, {"filter": str(damaged.path), "canonical": False})
    processor = MemFreeLogitsProcessor(config, torch.device("cpu"), False)
    params = SimpleNamespace(extra_args=None)
    rows = [[5, *damaged.good[0]], [9, *damaged.bad[0]], [7, *damaged.good[1]]]
    added = [(index, params, list(row), []) for index, row in enumerate(rows)]
    processor.update_state(SimpleNamespace(batch_size=3, removed=[], added=added, moved=[]))
    reference = _reference(damaged, tokenizer)
    logits = torch.randn(3, damaged.width)
    with caplog.at_level(logging.ERROR, logger=VLLM_LOGGER):
        for _ in range(2):  # the engine lives on; the problem is logged once
            out = processor.apply(logits.clone())
            assert _eos_only(out[1], damaged.eos)
            for index in (0, 2):
                assert torch.equal(out[index], _expected(reference, rows[index], logits[index]))
                assert torch.isneginf(out[index]).any() and not _eos_only(out[index], damaged.eos)
    errors = _logged(caplog, VLLM_LOGGER)
    assert len(errors) == 1
    _assert_names_the_problem(errors[0], damaged)
    assert "1 of 3 rows" in errors[0]
    assert processor.active.changed.error is None  # not the sticky in-place-rewrite closure
    # The damaged row's request ends; a new request on healthy prefixes is served as usual.
    replaced = [(1, params, [3, *damaged.good[-1]], [])]
    processor.update_state(SimpleNamespace(batch_size=3, removed=[1], added=replaced, moved=[]))
    out = processor.apply(logits.clone())
    assert torch.equal(out[1], _expected(reference, [3, *damaged.good[-1]], logits[1]))


def test_vllm_v2_closes_only_the_rows_that_read_the_damaged_block(
    damaged: Damaged,
    helpers: Any,
    tokenizer_dir: Path,
    tokenizer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = helpers.vllm_config(tokenizer_dir, {"filter": str(damaged.path), "canonical": False})
    states = SimpleNamespace(
        device=torch.device("cpu"),
        max_num_reqs=4,
        vocab_size=damaged.width,
        all_token_ids=SimpleNamespace(gpu=torch.zeros((4, 16), dtype=torch.int32)),
        total_len=SimpleNamespace(gpu=torch.zeros(4, dtype=torch.int32)),
    )
    processor = MemFreeLogitsProcessor(config, states)
    rows = {0: [4, *damaged.bad[0]], 2: [6, *damaged.good[0]], 3: [8, *damaged.good[1]]}
    for slot, row in rows.items():
        states.all_token_ids.gpu[slot, : len(row)] = torch.tensor(row)
        states.total_len.gpu[slot] = len(row)
        assert processor.add_request(slot, SimpleNamespace(extra_args=None))
    processor.apply_staged_writes()
    slots = list(rows)
    ctx = SimpleNamespace(
        expanded_idx_mapping=torch.tensor(slots),
        idx_mapping=torch.tensor(slots),
        idx_mapping_np=np.asarray(slots),
        expanded_local_pos=torch.zeros(len(slots), dtype=torch.long),
        input_ids=torch.tensor([row[-1] for row in rows.values()]),
    )
    reference = _reference(damaged, tokenizer)
    logits = torch.randn(len(slots), damaged.width)
    with caplog.at_level(logging.ERROR, logger=VLLM_LOGGER):
        for _ in range(2):
            out = processor.apply(logits.clone(), ctx)
            assert _eos_only(out[0], damaged.eos)
            for index, slot in enumerate(slots[1:], start=1):
                assert torch.equal(out[index], _expected(reference, rows[slot], logits[index]))
    errors = _logged(caplog, VLLM_LOGGER)
    assert len(errors) == 1
    _assert_names_the_problem(errors[0], damaged)


def test_llama_cpp_fails_the_step_closed_logs_once_and_serves_on(
    damaged: Damaged, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    guard = MemFreeLlamaCppLogitsProcessor(
        damaged.path, FakeLlama(tokenizer, damaged.eos), tokenizer=tokenizer, canonical=False
    )
    reference = _reference(damaged, tokenizer)
    scores = np.random.default_rng(0).normal(size=len(tokenizer)).astype(np.float32)
    bad, good = [3, *damaged.bad[0]], [3, *damaged.good[0]]
    with caplog.at_level(logging.ERROR, logger="memfree"):
        for _ in range(2):  # two generations, each checked
            out = guard(np.asarray(bad), scores)
            assert np.flatnonzero(np.isfinite(out)).tolist() == [damaged.eos]
            with pytest.raises(GuardStepError) as error:
                guard.check()
            assert isinstance(error.value.__cause__, DamagedFilterError)
            assert not isinstance(error.value.__cause__, FilterChangedError)
            out = guard(np.asarray(good), scores)
            expected = _expected(reference, good, torch.from_numpy(scores))
            assert np.array_equal(out, expected.numpy())
            guard.check()  # a healthy step after a failed one: nothing to raise
    errors = _logged(caplog, "memfree")
    assert len(errors) == 1
    _assert_names_the_problem(errors[0], damaged)


def test_transformers_closes_only_the_rows_that_read_the_damaged_block(
    damaged: Damaged, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    guard = TransformersGuard(damaged.path, tokenizer=tokenizer, canonical=False)
    reference = _reference(damaged, tokenizer)
    rows = [[5, *damaged.good[0]], [9, *damaged.bad[0]], [7, *damaged.good[1]]]
    scores = torch.randn(3, damaged.width)
    with caplog.at_level(logging.ERROR, logger="memfree"):
        for _ in range(2):
            before = scores.clone()
            out = guard(torch.tensor(rows), scores)
            assert torch.equal(scores, before)  # a new tensor, as ever
            assert _eos_only(out[1], damaged.eos)
            for index in (0, 2):
                assert torch.equal(out[index], _expected(reference, rows[index], scores[index]))
    errors = _logged(caplog, "memfree")
    assert len(errors) == 1
    _assert_names_the_problem(errors[0], damaged)
    assert len(guard.faults.problems) == 1 and str(guard.faults.problems[0]) in errors[0]
    # Without an end-of-sequence id no row can be closed: the error is raised instead.
    bare = TransformersGuard(damaged.path)
    with pytest.raises(DamagedFilterError, match=PROBLEM.pattern):
        bare(torch.tensor(rows), scores)


def test_a_whole_copy_of_the_filter_closes_every_row_at_once(
    damaged: Damaged, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The accelerator's step (``skip_rows=False`` runs it on the CPU) copies the whole index,
    so it checks every block first: a damaged block fails every row, without asking each."""
    guard = TransformersGuard(damaged.path, tokenizer=tokenizer, canonical=False, skip_rows=False)
    rows = [[5, *damaged.good[0]], [7, *damaged.good[1]]]
    scores = torch.randn(2, damaged.width)
    with caplog.at_level(logging.ERROR, logger="memfree"):
        out = guard(torch.tensor(rows), scores)
    assert all(_eos_only(row, damaged.eos) for row in out)
    errors = _logged(caplog, "memfree")
    assert len(errors) == 1 and "(2 of 2 rows at this step)" in errors[0]
    assert str(damaged.path) in errors[0]
