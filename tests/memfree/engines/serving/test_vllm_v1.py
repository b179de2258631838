"""The vLLM V1 adapter against a replica of V1's persistent batch: requests added into freed
slots, removed, moved into holes and swapped, through ``BatchUpdate``s in vLLM's shape; output
lists that the engine appends to by reference, with ``-1`` placeholders under async scheduling.
At every step each row's logits must be exactly the transformers guard's for that request's ids
(or untouched for an opted-out request, or end of sequence only where an id is not known), and no
guarded request ever emits a stored n-gram."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.engines.vllm import MemFreeV1LogitsProcessor
from memfree.units import get_unit


class MoveDirectionality(enum.Enum):  # vllm.v1.sample.logits_processor.interface
    UNIDIRECTIONAL = enum.auto()
    SWAP = enum.auto()


@dataclass(frozen=True)
class BatchUpdate:  # the same fields, in vLLM's order of processing: removed, added, moved
    batch_size: int
    removed: list[int]
    added: list[tuple[int, Any, list[int] | None, list[int]]]
    moved: list[tuple[int, int, MoveDirectionality]]


@dataclass
class Request:
    prompt: list[int]
    params: Any
    guarded: bool
    output: list[int] = field(default_factory=list)
    pending: bool = False  # its last sampled token is a -1 placeholder in ``output``
    sampled: int = -1


class PersistentBatch:
    """What vLLM's InputBatch does to its slots, reported as BatchUpdates."""

    def __init__(self) -> None:
        self.slots: list[Request | None] = []
        self.removed: list[int] = []
        self.added: list[tuple[int, Any, list[int] | None, list[int]]] = []
        self.moved: list[tuple[int, int, MoveDirectionality]] = []

    def remove(self, index: int) -> None:
        self.slots[index] = None
        self.removed.append(index)

    def add(self, request: Request) -> None:
        if self.removed:  # a freed slot is reused first (BatchUpdateBuilder.pop_removed)
            self.removed.sort()
            index = self.removed.pop(0)
            self.slots[index] = request
        else:
            index = len(self.slots)
            self.slots.append(request)
        self.added.append((index, request.params, request.prompt, request.output))

    def condense_and_swap(self, swaps: list[tuple[int, int]]) -> BatchUpdate | None:
        removed = sorted(self.removed, reverse=True)
        holes = sorted(i for i, slot in enumerate(self.slots) if slot is None)
        for hole in holes:  # the last requests move into the holes (one way)
            while self.slots and self.slots[-1] is None:
                self.slots.pop()
            if hole >= len(self.slots):
                break
            last = len(self.slots) - 1
            self.slots[hole], self.slots[last] = self.slots[last], None
            self.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        for a, b in swaps:
            if a < len(self.slots) and b < len(self.slots) and a != b:
                self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
                self.moved.append((a, b, MoveDirectionality.SWAP))
        update = None
        if removed or self.added or self.moved:
            update = BatchUpdate(len(self.slots), removed, self.added, self.moved)
        self.removed, self.added, self.moved = [], [], []
        return update


def _params(value: Any) -> Any:
    return SimpleNamespace(extra_args=None if value is None else {"memfree": value})


@pytest.mark.parametrize("allow_opt_out", [False, True])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_step_matches_the_core_through_batch_changes(
    data: Any, guarded: Any, helpers: Any, tokenizer_dir: Path, allow_opt_out: bool
) -> None:
    config = helpers.vllm_config(
        tokenizer_dir, {"filter": str(guarded.filter.path), "allow_opt_out": allow_opt_out}
    )
    processor = MemFreeV1LogitsProcessor(config, torch.device("cpu"), False)
    assert not processor.is_argmax_invariant()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    batch = PersistentBatch()
    finished: list[Request] = []
    for _step in range(data.draw(st.integers(1, 10))):
        live = [i for i, slot in enumerate(batch.slots) if slot is not None]
        for index in data.draw(st.lists(st.sampled_from(live), unique=True)) if live else []:
            finished.append(batch.slots[index])  # type: ignore[arg-type]
            batch.remove(index)
        for _ in range(data.draw(st.integers(0 if live else 1, 3))):
            source = guarded.corpus_ids[data.draw(st.integers(0, len(guarded.corpus_ids) - 1))]
            start = data.draw(st.integers(0, len(source) - 1))
            prompt = source[start : start + data.draw(st.integers(0, 8))]
            value = data.draw(st.sampled_from([None, 0, 1, True, False, "0", "true"]))
            opted_out = allow_opt_out and value in (0, False, "0")
            batch.add(Request(prompt, _params(value), guarded=not opted_out))
        swaps = data.draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=2))
        processor.update_state(batch.condense_and_swap(swaps))
        assert set(processor.active._requests) == set(
            range(len(batch.slots))
        )  # nothing left behind
        if not batch.slots:
            continue
        # Under async scheduling the engine fills placeholders in before apply(); a kv-load
        # failure may leave one.
        unresolved = set()
        for index, request in enumerate(batch.slots):
            assert request is not None
            if request.pending:
                if data.draw(st.integers(0, 9)) == 0:
                    unresolved.add(index)
                else:
                    request.output[-1] = request.sampled
                    request.pending = False
        rows = [request.prompt + request.output for request in batch.slots]  # type: ignore[union-attr]
        logits = torch.stack([guarded.adversarial_scores(row, rng) for row in rows])
        out = processor.apply(logits.clone())
        for index, request in enumerate(batch.slots):
            assert request is not None
            row = rows[index]
            if not request.guarded:
                assert torch.equal(out[index], logits[index])
            elif index in unresolved:  # the placeholder is the last id: every unit reads it
                allowed = torch.isfinite(out[index]).nonzero().flatten().tolist()
                assert allowed == [guarded.eos]
            else:
                assert torch.equal(out[index], guarded.reference(row, logits[index]))
            token = int(out[index].argmax())
            if request.guarded and index not in unresolved:
                assert not helpers.stored_emitted(guarded, row, token)
            if token == guarded.eos and request.guarded:
                continue
            async_step = data.draw(st.booleans())
            if index in unresolved:
                request.output[-1] = request.sampled  # the engine learns it later
            request.output.append(-1 if async_step else token)
            request.pending, request.sampled = async_step, token
    unit = get_unit(guarded.unit)
    for request in finished + [r for r in batch.slots if r is not None]:
        if request.pending:
            request.output[-1] = request.sampled
        if request.guarded:
            stored, _ = unit.created_ngram_counts(
                guarded.filter,
                request.prompt,
                request.output,
                special_token_ids=guarded.filter.special_token_ids,
                tokenizer=guarded.tokenizer,
            )
            assert stored == 0, (request.prompt, request.output)
