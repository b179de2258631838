"""Statistics: one :class:`~memfree.GuardStats` per ``generate()`` call (a call that continues
the previous call's output starts anew after ``reset()``, read from no private interface of
transformers), and one per thread when threads share a guard. Tiny Llama, real tokenizer, greedy, sampling and beam search, token and word guards.
"""

from __future__ import annotations

import copy
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from memfree import GuardStats, MemFreeLogitsProcessor, NgramFilter
from memfree.testing import word_filter_from_texts

N = 3
MODES: dict[str, dict[str, Any]] = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "top_k": 8},
    "beam": {"num_beams": 2, "do_sample": False},
}
# Per thread, the generate() calls it makes: (batch, prompt length, new tokens); a prompt length
# of 0 continues from the thread's previous output (whose batch it keeps).
CALLS: dict[int, list[tuple[int, int, int]]] = {
    0: [(2, 4, 6), (2, 0, 3), (2, 0, 5), (1, 5, 4)],
    1: [(3, 4, 5), (1, 6, 7), (1, 0, 4), (2, 3, 6)],
}


def prompt_ids(tokenizer: Any, batch: int, length: int, seed: int) -> torch.Tensor:
    """Ordinary (non-special) token ids, the same for the same seed."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    ordinary = np.array([i for i in range(len(tokenizer)) if i not in special])
    return torch.from_numpy(rng.choice(ordinary, size=(batch, length)))


def generate(
    model: Any,
    tokenizer: Any,
    processors: list[Any],
    input_ids: torch.Tensor,
    new_tokens: int,
    **kwargs: Any,
) -> torch.Tensor:
    return model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        logits_processor=processors,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )


def plan_inputs(tokenizer: Any, thread: int) -> list[tuple[torch.Tensor | None, int]]:
    """Each call's prompt (None: continue from the previous output) and new tokens."""
    return [
        (prompt_ids(tokenizer, batch, length, 10 * thread + index) if length else None, new)
        for index, (batch, length, new) in enumerate(CALLS[thread])
    ]


@pytest.fixture(scope="module")
def filters(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama: Any, tokenizer: Any
) -> dict[str, NgramFilter]:
    """Token 3-grams and word 2-grams of what the unguarded model emits for this file's prompts:
    "memorized" by construction, so the guards intervene often."""
    directory = tmp_path_factory.mktemp("stats-filters")
    rows: list[list[int]] = []
    for thread in CALLS:
        previous = None
        for prompt, new in plan_inputs(tokenizer, thread):
            input_ids = prompt if prompt is not None else previous
            assert input_ids is not None
            previous = generate(tiny_llama, tokenizer, [], input_ids, new)
            rows += previous.tolist()
    ngrams = [row[i : i + N] for row in rows for i in range(len(row) - N + 1)]
    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in rows]
    return {
        "token": NgramFilter.from_ngrams(
            directory / "t.memfree", np.array(ngrams), false_positive_rate=1e-6
        ),
        "word": word_filter_from_texts(directory / "w.memfree", texts, 2),
    }


@pytest.fixture
def make_guard(
    filters: dict[str, NgramFilter], tokenizer: Any
) -> Callable[[str], MemFreeLogitsProcessor]:
    # The prompts are random ids (not their text's tokenization): the token guard over the ids.
    return lambda unit: MemFreeLogitsProcessor(
        filters[unit], tokenizer=tokenizer, canonical=False if unit == "token" else None
    )


def same_stats(actual: GuardStats, expected: GuardStats) -> bool:
    return actual.to_dict() == expected.to_dict()


# ------------------------------------------------------------------------------------------------
# Continuations: a continuation's first step looks like the previous call's next step: reset()


@pytest.mark.parametrize("unit", ["token", "word"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_continuation_starts_new_statistics(
    unit: str, mode: str, make_guard: Any, tiny_llama: Any, tokenizer: Any
) -> None:
    guard = make_guard(unit)
    prompt = prompt_ids(tokenizer, 2, 4, seed=1)
    torch.manual_seed(0)
    out = generate(tiny_llama, tokenizer, [guard], prompt, 5, **MODES[mode])
    rows = 2 * MODES[mode].get("num_beams", 1)
    assert guard.stats.num_steps == 5 and guard.stats.num_rows == rows
    guard.reset()  # the continuation's first step looks like the previous call's next step
    torch.manual_seed(1)
    generate(tiny_llama, tokenizer, [guard], out, 5, **MODES[mode])
    stats = guard.stats
    assert stats.num_steps == 5 and stats.num_rows == rows
    assert stats.positions.tolist() == list(range(out.shape[1], out.shape[1] + 5))
    # ... exactly what a guard that saw only the second call records
    fresh = make_guard(unit)
    torch.manual_seed(1)
    generate(tiny_llama, tokenizer, [fresh], out, 5, **MODES[mode])
    assert same_stats(stats, fresh.stats)


@pytest.mark.parametrize("unit", ["token", "word"])
def test_a_pipeline_gets_one_record_per_call(
    unit: str, make_guard: Any, tiny_llama: Any, tokenizer: Any
) -> None:
    from transformers import LogitsProcessorList, pipeline

    guard = make_guard(unit)
    generator = pipeline("text-generation", model=tiny_llama, tokenizer=tokenizer, device="cpu")
    for prompt in ("def add(a, b):", "import os"):
        length = len(tokenizer(prompt)["input_ids"])
        generator(
            prompt,
            logits_processor=LogitsProcessorList([guard]),
            max_new_tokens=5,
            min_new_tokens=5,
            do_sample=False,
        )
        assert guard.stats.num_steps == 5 and guard.stats.num_rows == 1
        assert guard.stats.positions.tolist() == list(range(length, length + 5))


def test_a_streamer_changes_nothing_and_stats_reach_the_reading_thread(
    make_guard: Any, tiny_llama: Any, tokenizer: Any
) -> None:
    """TextStreamer runs in the generating thread; TextIteratorStreamer's usual pattern runs
    generate() in a worker thread and reads the statistics in the main one, which made no call."""
    from transformers import TextIteratorStreamer, TextStreamer

    prompt = prompt_ids(tokenizer, 1, 4, seed=2)
    reference = make_guard("token")
    generate(tiny_llama, tokenizer, [reference], prompt, 6)
    guard = make_guard("token")
    streamer = TextStreamer(tokenizer)
    generate(tiny_llama, tokenizer, [guard], prompt, 6, streamer=streamer)
    assert same_stats(guard.stats, reference.stats)
    shared = make_guard("token")
    iterator = TextIteratorStreamer(tokenizer, timeout=60)
    worker = threading.Thread(
        target=generate,
        args=(tiny_llama, tokenizer, [shared], prompt, 6),
        kwargs={"streamer": iterator},
    )
    worker.start()
    text = "".join(iterator)
    worker.join()
    assert text
    assert same_stats(shared.stats, reference.stats)


# ------------------------------------------------------------------------------------------------
# Threads sharing one guard


class Lockstep:
    """Makes threads that are inside a generate() call run the guard strictly in turn.

    Each thread passes ``[lockstep.acquire(me), guard, lockstep.release(me)]``: the guard's steps
    of two concurrent calls then alternate one by one, the worst case for telling calls apart.
    """

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.inside: list[int] = []
        self.turn = -1
        self.order: list[int] = []  # which thread each guard step belonged to

    def enter(self, me: int) -> None:
        with self.condition:
            self.inside.append(me)
            if self.turn not in self.inside:
                self.turn = me

    def leave(self, me: int) -> None:
        with self.condition:
            self.inside.remove(me)
            if self.turn == me and self.inside:
                self.turn = self.inside[0]
            self.condition.notify_all()

    def acquire(self, me: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def step(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            with self.condition:
                if not self.condition.wait_for(
                    lambda: self.turn == me or self.turn not in self.inside, timeout=60
                ):
                    raise TimeoutError("lockstep: the other thread never took its turn")
                self.turn = me
                self.order.append(me)
            return scores

        return step

    def release(self, me: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def step(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            with self.condition:
                others = [thread for thread in self.inside if thread != me]
                self.turn = others[0] if others else me
                self.condition.notify_all()
            return scores

        return step


@pytest.mark.parametrize("unit", ["token", "word"])
def test_threads_sharing_a_guard_each_get_their_own_statistics(
    unit: str, make_guard: Any, tiny_llama: Any, tokenizer: Any
) -> None:
    # What a private guard records for each call, one call after the other.
    expected: dict[int, list[tuple[torch.Tensor, GuardStats]]] = {}
    for thread in CALLS:
        expected[thread], previous = [], None
        for prompt, new in plan_inputs(tokenizer, thread):
            private = make_guard(unit)
            input_ids = prompt if prompt is not None else previous
            assert input_ids is not None
            previous = generate(tiny_llama, tokenizer, [private], input_ids, new)
            expected[thread].append((previous, private.stats))
    assert any(stats.interventions().sum() for calls in expected.values() for _, stats in calls)

    guard = make_guard(unit)
    lockstep = Lockstep()
    barrier = threading.Barrier(len(CALLS), timeout=60)
    results: dict[int, list[tuple[torch.Tensor, GuardStats]]] = {thread: [] for thread in CALLS}
    errors: list[BaseException] = []

    def run(me: int) -> None:
        try:
            previous = None
            for prompt, new in plan_inputs(tokenizer, me):
                input_ids = prompt if prompt is not None else previous
                assert input_ids is not None
                processors = [lockstep.acquire(me), guard, lockstep.release(me)]
                guard.reset()  # this thread's next call starts anew (continuations too)
                barrier.wait()  # both threads start a call together
                lockstep.enter(me)
                try:
                    previous = generate(tiny_llama, tokenizer, processors, input_ids, new)
                finally:
                    lockstep.leave(me)
                results[me].append((previous, guard.stats))  # read right after the call
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(me,)) for me in CALLS]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert not errors, errors
    # Non-vacuous: the two calls' steps did interleave.
    switches = sum(a != b for a, b in zip(lockstep.order, lockstep.order[1:], strict=False))
    assert switches >= 2 * len(CALLS[0])
    for thread, calls in CALLS.items():
        assert len(results[thread]) == len(calls)
        for (out, stats), (want_out, want), (batch, _, new) in zip(
            results[thread], expected[thread], calls, strict=True
        ):
            assert torch.equal(out, want_out)
            assert stats.num_steps == new and stats.num_rows == batch
            start = out.shape[1] - new
            assert stats.positions.tolist() == list(range(start, start + new))
            assert stats.interventions().tolist() == want.interventions().tolist()
            assert same_stats(stats, want)


# ------------------------------------------------------------------------------------------------
# Outside generate(): direct calls, reset(), copies


def step(guard: MemFreeLogitsProcessor, rows: int, length: int, vocab_size: int = 5) -> None:
    """One step called directly, as a unit test or another engine calls the guard."""
    input_ids = cast(torch.LongTensor, torch.zeros(rows, length, dtype=torch.long))
    guard(input_ids, cast(torch.FloatTensor, torch.zeros(rows, vocab_size)))


def test_direct_calls_fall_back_on_the_data_and_reset_starts_over(tmp_path: Path) -> None:
    filt = NgramFilter.from_ngrams(tmp_path / "f.memfree", np.array([[0, 1, 2], [1, 2, 3]]))
    guard = MemFreeLogitsProcessor(filt, eos_token_id=4)
    for length in (3, 4, 5):
        step(guard, 2, length)
    assert guard.stats.num_steps == 3 and guard.stats.positions.tolist() == [3, 4, 5]
    step(guard, 2, 6)  # looks like the next step: the same record
    assert guard.stats.num_steps == 4
    step(guard, 1, 7)  # other rows: a new record
    assert guard.stats.num_steps == 1 and guard.stats.num_rows == 1
    step(guard, 1, 3)  # not one token longer: a new record
    assert guard.stats.positions.tolist() == [3]
    guard.reset()
    assert guard.stats.num_steps == 0 and guard.stats.num_rows == 0
    step(guard, 1, 4)  # after reset(), always a new record
    assert guard.stats.positions.tolist() == [4]


def test_a_direct_call_after_generate_continues_it_until_reset(
    make_guard: Any, tiny_llama: Any, tokenizer: Any
) -> None:
    guard = make_guard("token")
    out = generate(tiny_llama, tokenizer, [guard], prompt_ids(tokenizer, 1, 4, seed=3), 4)
    step(guard, 1, out.shape[1], len(tokenizer))  # the call's next step, by its data
    assert guard.stats.num_steps == 5
    guard.reset()
    step(guard, 1, out.shape[1], len(tokenizer))
    assert guard.stats.num_steps == 1 and guard.stats.positions.tolist() == [out.shape[1]]


class Timed:
    """A wrapper processor, as bench/ uses: the guard runs one frame further from the list."""

    def __init__(self, inner: MemFreeLogitsProcessor) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(input_ids, scores)


def test_a_wrapped_guard_records_the_same(make_guard: Any, tiny_llama: Any, tokenizer: Any) -> None:
    guard = make_guard("token")
    timed = Timed(guard)
    out = generate(tiny_llama, tokenizer, [timed], prompt_ids(tokenizer, 1, 4, seed=6), 5)
    guard.reset()
    generate(tiny_llama, tokenizer, [timed], out, 5)
    assert timed.calls == 10
    assert guard.stats.positions.tolist() == list(range(out.shape[1], out.shape[1] + 5))


def test_copies_keep_their_own_statistics(make_guard: Any, tiny_llama: Any, tokenizer: Any) -> None:
    guard = make_guard("token")
    generate(tiny_llama, tokenizer, [guard], prompt_ids(tokenizer, 1, 4, seed=4), 3)
    before = guard.stats.to_dict()
    for clone in (copy.copy(guard), copy.deepcopy(guard), pickle.loads(pickle.dumps(guard))):
        assert clone.stats.num_steps == 0
        generate(tiny_llama, tokenizer, [clone], prompt_ids(tokenizer, 2, 5, seed=5), 2)
        assert clone.stats.num_steps == 2 and clone.stats.num_rows == 2
        assert guard.stats.to_dict() == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_generate_records_per_call_without_host_synchronisation(
    make_guard: Any, tiny_llama: Any, tokenizer: Any
) -> None:
    from transformers import LogitsProcessorList

    model = copy.deepcopy(tiny_llama).cuda()
    guard = make_guard("token")
    prompt = prompt_ids(tokenizer, 2, 4, seed=7).cuda()
    out = cast(torch.LongTensor, generate(model, tokenizer, [guard], prompt, 5))
    guard.reset()
    generate(model, tokenizer, [guard], out, 5)
    assert guard.stats.positions.tolist() == list(range(out.shape[1], out.shape[1] + 5))
    # Steps run from a LogitsProcessorList, as generate() runs them: no host synchronisation.
    processors = LogitsProcessorList([guard])
    scores = torch.randn(2, len(tokenizer), device="cuda")
    processors(out, scores)  # the bit arrays move to the GPU once, here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        next_ids = cast(torch.LongTensor, torch.cat([out, out[:, -1:]], dim=1))
        processors(next_ids, scores)
        LogitsProcessorList([guard])(next_ids, scores)  # another call
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert guard.stats.num_steps == 1 and guard.stats.positions.tolist() == [out.shape[1] + 1]
