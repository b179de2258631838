"""A filter error inside a guard's step, in every engine: the rows it concerns fail closed, the
others are served, each distinct problem is logged once.

A block of an index filter is verified when first read, not at start-up, so a damaged block
passes engine start-up and surfaces at the first step whose row reads it. Raising there would stop
a server (vLLM dies with every request on it) or, inside llama.cpp's callback, be swallowed.
:func:`step_masks` answers every row it can exactly and names the rows whose lookup raised, which
the adapters close (end of sequence only, :func:`~memfree.engines.scores.fail_closed`), and a
:class:`StepFaults` logs each distinct problem (the file, its section and block) once. A filter
file rewritten in place (:class:`~memfree.errors.FilterChangedError`) is not a row's problem: it
still reaches the adapter, which stops or closes every guarded row.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from memfree.core import Masker
from memfree.core.exempt import PromptNgrams
from memfree.engines.setup import checked_banned_mask
from memfree.errors import FilterChangedError, FilterError
from memfree.filterfile.filewatch import FileWatch


@dataclass(frozen=True)
class StepMasks:
    """A step's masks, row by row where a filter error hit some rows (:func:`step_masks`).

    Attributes:
        banned: bool `(rows, vocab_width)`, the banned tokens of every row answered (False on
            failed rows).
        checked: bool `(rows,)`, the masker's rows checked (False on failed rows).
        failed: bool `(rows,)` on the masks' device, the rows whose lookup raised a filter error:
            the adapter closes them (end of sequence only); None when no row failed.
        errors: the distinct errors the failed rows raised (empty when none failed).
    """

    banned: torch.Tensor
    checked: torch.Tensor
    failed: torch.Tensor | None = None
    errors: tuple[FilterError, ...] = ()


def step_masks(
    masker: Masker,
    file_watch: FileWatch | None,
    contexts: torch.Tensor,
    vocab_width: int,
    device: torch.device | None = None,
    prompts: Sequence[PromptNgrams | None] | None = None,
) -> StepMasks:
    """:func:`checked_banned_mask`, where a filter error fails only the rows it concerns.

    When the step raises a :class:`~memfree.errors.FilterError` (a damaged block of an index file,
    checked on its first read), the step is asked again with no row: if that raises too, the
    error does not depend on the rows (a filter copied whole to an accelerator, the word unit's
    vocabulary table) and every row fails; otherwise each row is asked alone, so the healthy rows
    get exactly their own masks and only the rows whose lookup raises fail. A row's mask depends
    on its own context alone, so asking rows one by one gives the batch's answer.

    Raises:
        FilterChangedError: the filter file was rewritten in place: the whole guard's problem,
            not a row's; the caller stops or closes every guarded row.
    """

    def ask(rows: torch.Tensor, asked: Sequence[PromptNgrams | None] | None) -> Any:
        return checked_banned_mask(masker, file_watch, rows, vocab_width, device, asked)

    try:
        banned, checked = ask(contexts, prompts)
        return StepMasks(banned, checked)
    except FilterChangedError:
        raise
    except FilterError:
        pass  # asked again below, to find the rows it concerns
    count = contexts.shape[0]
    target = torch.device(device or contexts.device)
    banned = torch.zeros((count, vocab_width), dtype=torch.bool, device=target)
    checked = torch.zeros(count, dtype=torch.bool, device=target)
    errors: dict[str, FilterError] = {}
    try:
        ask(contexts[:0], None if prompts is None else [])
    except FilterChangedError:
        raise
    except FilterError as error:  # it fails with no row at all: every row fails
        errors[str(error)] = error
        failed = torch.ones(count, dtype=torch.bool, device=target)
        return StepMasks(banned, checked, failed, tuple(errors.values()))
    except Exception:  # only a probe: a masker that refuses an empty batch; ask each row
        pass
    failed_rows = np.zeros(count, dtype=bool)
    for row in range(count):
        try:
            mask, row_checked = ask(
                contexts[row : row + 1], None if prompts is None else [prompts[row]]
            )
        except FilterChangedError:
            raise
        except FilterError as error:
            failed_rows[row] = True
            errors.setdefault(str(error), error)
            continue
        banned[row] = mask[0].to(target)
        checked[row] = row_checked[0].to(target)
    if not failed_rows.any():  # no row raises it alone: each row's answer is exact
        return StepMasks(banned, checked)
    failed = torch.from_numpy(failed_rows).to(target)
    return StepMasks(banned, checked, failed, tuple(errors.values()))


class StepFaults:
    """The filter errors a guard met inside its steps, each distinct problem (its message: the
    file, and the section and block) logged once as an error.

    Args:
        logger: where the lines go (``vllm.memfree`` under vLLM, else ``memfree``).
        on_error: called with every error reported (each step's), e.g. to raise it later.
    """

    def __init__(
        self, logger: logging.Logger, on_error: Callable[[FilterError], None] | None = None
    ) -> None:
        self.logger = logger
        self.on_error = on_error
        self._problems: dict[str, FilterError] = {}
        self._lock = threading.Lock()

    @property
    def problems(self) -> tuple[FilterError, ...]:
        """Every distinct error reported so far, first seen first."""
        with self._lock:
            return tuple(self._problems.values())

    def report(self, step: StepMasks, closed: int, rows: int) -> None:
        """Log the step's errors not seen before.

        Args:
            step: the step's masks, with its errors.
            closed: the rows closed for them at this step.
            rows: the step's rows.
        """
        fresh = []
        with self._lock:
            for error in step.errors:
                if str(error) not in self._problems:
                    self._problems[str(error)] = error
                    fresh.append(error)
        for error in fresh:
            self.logger.error(
                "memfree: a filter error inside a guarded step: %s. The rows whose lookup reads "
                "it take end of sequence only (%d of %d rows at this step); the guard keeps "
                "serving the others, and this problem is logged once",
                error,
                closed,
                rows,
            )
        if self.on_error is not None:
            for error in step.errors:
                self.on_error(error)


__all__ = ["StepFaults", "StepMasks", "step_masks"]
