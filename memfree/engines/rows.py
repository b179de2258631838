"""Rows of different lengths, as engines keep them, for the guard core.

An engine keeps each request's token ids as its own list (vLLM's prompt and output lists, llama.cpp's
input ids), some of them not known yet (vLLM's ``-1`` placeholders under async scheduling). The
core takes one `(rows, width)` tensor. :class:`RowGuard` builds it for the filter's unit: the token
unit reads only each row's last n-1 ids; the word unit reads the whole row, left-padded with ``-1``
(which adds no text). A row whose ids the masker would read are not all known is *closed*: the
adapter lets it take nothing but end of sequence, so no unchecked token is ever emitted. So is a row
whose lookup raised a filter error (a damaged block of the filter): the other rows are answered,
and the error is logged once (:mod:`memfree.engines.faults`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from memfree.core.exempt import PromptNgrams
from memfree.engines.faults import StepFaults, step_masks
from memfree.engines.scores import ban_scores, fail_closed
from memfree.engines.setup import GuardSetup


class RowGuard:
    """The guard core over ragged rows of token ids.

    Args:
        setup: the guard's checked settings and core (:class:`~memfree.engines.setup.GuardSetup`).
        faults: where filter errors inside a step are logged (default: the ``memfree`` logger).
    """

    def __init__(self, setup: GuardSetup, faults: StepFaults | None = None) -> None:
        self.setup = setup
        self.faults = faults or StepFaults(logging.getLogger("memfree"))
        self.n = setup.n
        self.eos_token_ids = setup.eos_token_ids
        # The ids of a row the masker reads: the token masker's last n-1; the word masker's, all.
        self.window: int | None = setup.masker.context_width

    def contexts(
        self, rows: Sequence[Sequence[int] | np.ndarray | None], guarded: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The core's input for ``rows``.

        Args:
            rows: each row's ids (prompt and generated, oldest first); None or a negative id
                where the engine does not know it yet.
            guarded: bool `(rows,)`, the rows to guard (None: all); the others are neither
                checked nor closed.

        Returns:
            (int64 `(rows, width)` contexts, bool `(rows,)` rows to check, bool `(rows,)` rows
            to close). A row of the token unit with fewer than n-1 ids completes no n-gram and is
            not checked.
        """
        count = len(rows)
        closed = np.zeros(count, dtype=bool)
        checked = np.zeros(count, dtype=bool)
        skip = np.zeros(count, dtype=bool) if guarded is None else ~np.asarray(guarded, bool)
        if self.window is not None:
            width = self.window
            contexts = np.zeros((count, width), dtype=np.int64)
            for index, row in enumerate(rows):
                if skip[index]:
                    continue
                if row is None:
                    closed[index] = True
                    continue
                last = np.asarray(row[-width:] if width else row[:0], dtype=np.int64)
                if (last < 0).any():
                    closed[index] = True
                elif last.shape[0] == width:
                    contexts[index] = last
                    checked[index] = True
            return contexts, checked, closed
        arrays = []
        for index, row in enumerate(rows):
            ids = np.asarray(row if row is not None and not skip[index] else (), dtype=np.int64)
            if skip[index]:
                pass
            elif row is None or (ids < 0).any():
                closed[index] = True
                ids = ids[:0]
            else:
                checked[index] = True
            arrays.append(ids)
        width = max((ids.shape[0] for ids in arrays), default=0)
        contexts = np.full((count, width), -1, dtype=np.int64)
        for index, ids in enumerate(arrays):
            if ids.shape[0]:
                contexts[index, width - ids.shape[0] :] = ids
        return contexts, checked, closed

    def banned(
        self,
        rows: Sequence[Sequence[int] | np.ndarray | None],
        vocab_width: int,
        device: torch.device | str = "cpu",
        guarded: np.ndarray | None = None,
        prompts: Sequence[PromptNgrams | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which candidates each row may not take (``guarded``: see :meth:`contexts`;
        ``prompts``: each row's prompt n-grams that it may repeat, ``exempt_prompt``).

        Returns:
            (bool `(rows, vocab_width)` banned candidates, bool `(rows,)` closed rows), on
            ``device``. A row whose lookup raised a filter error is closed, and the error logged
            (once per problem, :attr:`faults`).

        Raises:
            FilterChangedError: the filter file was rewritten in place (see
                :mod:`memfree.filterfile.filewatch`); the adapter fails the step closed.
        """
        device = torch.device(device)
        contexts, checked, closed = self.contexts(rows, guarded)
        banned = torch.zeros((len(rows), vocab_width), dtype=torch.bool, device=device)
        if checked.any():
            which = np.flatnonzero(checked)
            step = step_masks(
                self.setup.masker,
                self.setup.file_watch,
                torch.from_numpy(np.ascontiguousarray(contexts[which])),
                vocab_width,
                device,
                None if prompts is None else [prompts[i] for i in which.tolist()],
            )
            banned[torch.from_numpy(which).to(device)] = step.banned
            if step.failed is not None:
                failed = which[step.failed.cpu().numpy()]
                closed[failed] = True
                self.faults.report(step, len(failed), len(rows))
        return banned, torch.from_numpy(closed).to(device)

    def guard(
        self,
        scores: torch.Tensor,
        rows: Sequence[Sequence[int] | np.ndarray | None],
        *,
        guarded: np.ndarray | None = None,
        inplace: bool = True,
        prompts: Sequence[PromptNgrams | None] | None = None,
    ) -> torch.Tensor:
        """``scores`` `(rows, vocab_width)` with every banned candidate at ``-inf``, closed rows
        (ids not known yet, or a lookup that raised a filter error) left with end of sequence
        only, and no guarded row left with nothing allowed.

        Args:
            scores: the step's scores.
            rows: each row's ids (see :meth:`contexts`).
            guarded: bool `(rows,)`, the rows to guard (None: all); the others are left as
                they are.
            inplace: edit ``scores`` itself or return a new tensor.
            prompts: each row's prompt n-grams that it may repeat (``exempt_prompt``), or None.

        Raises:
            FilterChangedError: the filter file was rewritten in place; ``scores`` is untouched.
        """
        banned, closed = self.banned(rows, scores.shape[1], scores.device, guarded, prompts)
        rescued = None if guarded is None else torch.from_numpy(np.asarray(guarded, bool))
        out = ban_scores(
            scores,
            banned,
            self.eos_token_ids,
            inplace=inplace,
            rows=None if rescued is None else rescued.to(scores.device),
        )
        return fail_closed(out, closed, self.eos_token_ids)


__all__ = ["RowGuard"]
