"""A filter error inside a step fails only the rows it concerns (:func:`step_masks`): the rows
are asked one by one after the batch failed, unless the step fails with no row at all; a filter
file rewritten in place is never a row's problem; each distinct problem is logged once
(:class:`StepFaults`). Stand-in maskers make every case exact."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from memfree.engines.faults import StepFaults, StepMasks, step_masks
from memfree.errors import DamagedFilterError, FilterChangedError

VOCAB = 8


class Masker:
    """Bans token ``row[-1] % VOCAB`` of each row; raises for a row whose first id is in
    ``bad`` (the message names that id as its block), or for every call (``always``)."""

    context_width = 2

    def __init__(
        self, bad: set[int] = frozenset(), always: bool = False, error: type = DamagedFilterError
    ) -> None:
        self.bad = set(bad)
        self.always = always
        self.error = error
        self.calls = 0

    def banned_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        if self.always:
            raise self.error("f.memfree: section 0: checksum mismatch")
        for row in contexts.tolist():
            if row[0] in self.bad:
                raise self.error(f"f.memfree: section 1, block {row[0]}: checksum mismatch")
        mask = torch.zeros(contexts.shape[0], vocab_width, dtype=torch.bool)
        mask[torch.arange(contexts.shape[0]), contexts[:, -1] % vocab_width] = True
        return mask, torch.ones(contexts.shape[0], dtype=torch.bool)


CONTEXTS = torch.tensor([[1, 3], [2, 4], [1, 5], [6, 6], [2, 7]])


def test_a_step_without_error_is_the_maskers_answer() -> None:
    masker = Masker()
    step = step_masks(masker, None, CONTEXTS, VOCAB)
    expected, _ = Masker().banned_mask(CONTEXTS, VOCAB)
    assert torch.equal(step.banned, expected) and step.failed is None and step.errors == ()
    assert masker.calls == 1


def test_only_the_rows_whose_lookup_raises_fail() -> None:
    masker = Masker(bad={2, 6})
    step = step_masks(masker, None, CONTEXTS, VOCAB)
    assert step.failed is not None and step.failed.tolist() == [False, True, False, True, True]
    healthy, _ = Masker().banned_mask(CONTEXTS, VOCAB)
    rows = ~step.failed
    assert torch.equal(step.banned[rows], healthy[rows])  # exactly the batch's answer
    assert not step.banned[step.failed].any() and not step.checked[step.failed].any()
    # Each distinct problem once (rows 1 and 4 read the same block).
    assert sorted(str(e) for e in step.errors) == [
        "f.memfree: section 1, block 2: checksum mismatch",
        "f.memfree: section 1, block 6: checksum mismatch",
    ]


def test_an_error_without_any_row_fails_every_row_at_once() -> None:
    masker = Masker(always=True)
    step = step_masks(masker, None, CONTEXTS, VOCAB)
    assert step.failed is not None and step.failed.all()
    assert len(step.errors) == 1
    assert masker.calls == 2  # the batch, then the same step with no row: not once per row


def test_a_filter_rewritten_in_place_is_not_a_rows_problem() -> None:
    for masker in (
        Masker(always=True, error=FilterChangedError),
        Masker(bad={6}, error=FilterChangedError),
    ):
        with pytest.raises(FilterChangedError):
            step_masks(masker, None, CONTEXTS, VOCAB)
        assert masker.calls == 1


def test_each_problem_is_logged_once_and_every_one_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Exception] = []
    faults = StepFaults(logging.getLogger("memfree.test"), seen.append)
    first = DamagedFilterError("f.memfree: section 1, block 2: checksum mismatch")
    second = DamagedFilterError("f.memfree: section 1, block 6: checksum mismatch")
    mask = torch.zeros(1, VOCAB, dtype=torch.bool)
    with caplog.at_level(logging.ERROR, logger="memfree.test"):
        faults.report(StepMasks(mask, mask[:, 0], mask[:, 0], (first,)), 1, 4)
        faults.report(StepMasks(mask, mask[:, 0], mask[:, 0], (first, second)), 2, 4)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert "block 2" in lines[0] and "(1 of 4 rows at this step)" in lines[0]
    assert "block 6" in lines[1]
    assert seen == [first, first, second]
    assert faults.problems == (first, second)


def test_a_masker_that_refuses_an_empty_batch_is_asked_row_by_row() -> None:
    class NoEmpty(Masker):
        def banned_mask(
            self, contexts: torch.Tensor, vocab_width: int, device: Any = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not contexts.shape[0]:
                raise IndexError("no row")
            return super().banned_mask(contexts, vocab_width, device)

    step = step_masks(NoEmpty(bad={6}), None, CONTEXTS, VOCAB)
    assert step.failed is not None and step.failed.tolist() == [False, False, False, True, False]
