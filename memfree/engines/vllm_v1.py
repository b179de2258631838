"""The guard inside vLLM's V1 model runner: :class:`V1Guard`, the implementation that
:class:`~memfree.engines.vllm_plugin.MemFreeVllmLogitsProcessor` runs when V1 builds it.

vLLM builds one processor per engine and tells it how its persistent batch changes through
``update_state(BatchUpdate)``: requests added (with their prompt ids and a live reference to
their output ids), removed, moved one way or swapped. At each step ``apply(logits)`` gets one
row per request in batch order.

Under async scheduling a request's output list may end in ``-1`` placeholders (tokens sampled
but not yet copied back). vLLM 0.32 fills them in before ``apply()`` only when a processor was
named in ``logits_processors`` (not for entry-point plugins alone: the plugin then refuses to
start, see :mod:`memfree.engines.vllm_plugin`), so they are read at ``apply()`` time, never at
``update_state()``; a row whose ids the guard would read still holds one is closed (end of
sequence only), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from memfree.core.exempt import PromptNgrams
from memfree.engines.policy import ServingConfig
from memfree.engines.vllm_common import (
    ChangedFilterGuard,
    RequestPolicy,
    guard_for,
)
from memfree.errors import FilterChangedError


@dataclass
class _Request:
    """One request of the persistent batch: its prompt ids (None: given as embeddings) and the
    engine's own list of its output ids (read at each step)."""

    prompt: list[int] | None
    output: list[int]
    guarded: bool
    exempt: PromptNgrams | None = None  # its prompt's n-grams, where exempt_prompt is on

    def context(self, window: int | None) -> list[int]:
        """The ids the masker reads: the last ``window`` (None: all) of prompt ‖ output."""
        output = self.output
        if window is not None and len(output) >= window:
            return output[len(output) - window :]
        prompt = self.prompt or []
        if window is None:
            return prompt + output
        return prompt[max(len(prompt) - (window - len(output)), 0) :] + output


class V1Guard:
    """MemFree decoding in vLLM's V1 runner: every token that completes a stored n-gram gets
    ``-inf``, for every request (see :mod:`memfree.engines.policy` for opt-out).

    Configured by ``additional_config={"memfree": {"filter": PATH, "allow_opt_out": false}}``;
    the filter is opened and checked against the engine's tokenizer here, at construction.
    A prompt given as embeddings has no ids: its output is guarded from its first token, and
    n-grams that would span the prompt and the output are not checked.

    Args:
        vllm_config: the engine's configuration.
        device: where the logits live.
        is_pin_memory: unused.
        config: the operator's settings, found once by the plugin
            (:meth:`~memfree.engines.policy.ServingConfig.find`).

    Raises:
        ServingConfigError: a missing or bad configuration.
        FilterError: the filter cannot be opened or does not fit the engine's tokenizer.
    """

    def __init__(
        self,
        vllm_config: Any,
        device: torch.device,
        is_pin_memory: bool,
        *,
        config: ServingConfig,
    ) -> None:
        self.config, self.rows = config, guard_for(config, vllm_config)
        self.policy = RequestPolicy(self.config)
        self.device = device
        self._requests: dict[int, _Request] = {}
        self.changed = ChangedFilterGuard()

    @property
    def requests(self) -> dict[int, _Request]:
        """The persistent batch's requests by row (read only)."""
        return self._requests

    def is_argmax_invariant(self) -> bool:
        """False: the guard changes greedy choices."""
        return False

    def update_state(self, batch_update: Any) -> None:
        """Follow the persistent batch: removed, then added, then moved (vLLM's order)."""
        if batch_update is None:
            return
        requests = self._requests
        for index in batch_update.removed:
            requests.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            prompt = list(prompt_ids) if prompt_ids is not None else None
            exempt = None
            if prompt is not None and self.policy.exempts(params):
                exempt = self.rows.setup.prompt_ngrams(prompt)
            requests[index] = _Request(prompt, output_ids, self.policy.guards(params), exempt)
        for first, second, direction in batch_update.moved:
            a, b = requests.pop(first, None), requests.pop(second, None)
            if a is not None:
                requests[second] = a
            if b is not None and getattr(direction, "name", None) == "SWAP":
                requests[first] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits (edited in place) with every stored n-gram's last token at ``-inf``.

        A row no request was added for is closed: it may take only end of sequence. So is, at
        this step, a row whose lookup raises a filter error (a damaged block of the filter): the
        others are answered and the error is logged once (:mod:`memfree.engines.faults`). If
        the filter file was rewritten in place, every guarded row is closed from then on and
        the error is logged (see :class:`~memfree.engines.vllm_common.ChangedFilterGuard`).
        """
        count = logits.shape[0]
        window = self.rows.window
        rows: list[list[int] | None] = []
        prompts: list[PromptNgrams | None] = []
        guarded = np.ones(count, dtype=bool)
        for index in range(count):
            request = self._requests.get(index)
            prompts.append(None if request is None else request.exempt)
            if request is None:
                rows.append(None)
            elif not request.guarded:
                rows.append(None)
                guarded[index] = False
            else:
                rows.append(request.context(window))
        if not guarded.any():
            return logits
        try:
            exempt = prompts if any(p is not None for p in prompts) else None
            return self.rows.guard(logits, rows, guarded=guarded, inplace=True, prompts=exempt)
        except FilterChangedError as error:  # raising here would kill the engine
            return self.changed.closed(logits, guarded, self.rows.eos_token_ids, error)


__all__ = ["V1Guard"]
