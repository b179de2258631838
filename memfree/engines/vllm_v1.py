"""The guard inside vLLM's V1 model runner: :class:`MemFreeV1LogitsProcessor`.

vLLM builds one processor per engine (``LLM(..., logits_processors=[MemFreeV1LogitsProcessor])``
or ``--logits-processors memfree.integrations.vllm:MemFreeV1LogitsProcessor``) and tells it how
its persistent batch changes through ``update_state(BatchUpdate)``: requests added (with their
prompt ids and a live reference to their output ids), removed, moved one way or swapped. At
each step ``apply(logits)`` gets one row per request in batch order.

Under async scheduling a request's output list may end in ``-1`` placeholders (tokens sampled
but not yet copied back). vLLM fills them in before ``apply()`` when a custom processor is
loaded, so they are read at ``apply()`` time, never at ``update_state()``; a row whose ids the
guard would read still holds one is closed (end of sequence only), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from memfree.engines.vllm_common import (
    ChangedFilterGuard,
    RequestPolicy,
    engine_guard,
    validate_request,
)
from memfree.errors import FilterChangedError

try:  # vLLM checks the subclass; without vLLM the class stays importable (and testable)
    from vllm.v1.sample.logits_processor.interface import LogitsProcessor as _V1Base
except ImportError:  # pragma: no cover - vLLM is optional
    _V1Base = object  # type: ignore[assignment,misc,unused-ignore]


@dataclass
class _Request:
    """One request of the persistent batch: its prompt ids (None: given as embeddings) and the
    engine's own list of its output ids (read at each step)."""

    prompt: list[int] | None
    output: list[int]
    guarded: bool

    def context(self, window: int | None) -> list[int]:
        """The ids the masker reads: the last ``window`` (None: all) of prompt ‖ output."""
        output = self.output
        if window is not None and len(output) >= window:
            return output[len(output) - window :]
        prompt = self.prompt or []
        if window is None:
            return prompt + output
        return prompt[max(len(prompt) - (window - len(output)), 0) :] + output


class MemFreeV1LogitsProcessor(_V1Base):
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

    Raises:
        ServingConfigError: a missing or bad configuration.
        FilterError: the filter cannot be opened or does not fit the engine's tokenizer.
    """

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Refuse a request whose ``extra_args["memfree"]`` is not 0/1/true/false (HTTP 400)."""
        validate_request(sampling_params)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.config, self.rows = engine_guard(vllm_config)
        self.policy = RequestPolicy(self.config)
        self.device = device
        self._requests: dict[int, _Request] = {}
        self.changed = ChangedFilterGuard()

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
            requests[index] = _Request(prompt, output_ids, self.policy.guards(params))
        for first, second, direction in batch_update.moved:
            a, b = requests.pop(first, None), requests.pop(second, None)
            if a is not None:
                requests[second] = a
            if b is not None and getattr(direction, "name", None) == "SWAP":
                requests[first] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits (edited in place) with every stored n-gram's last token at ``-inf``.

        A row no request was added for is closed: it may take only end of sequence. If the
        filter file was rewritten in place, every guarded row is closed from then on and the
        error is logged (see :class:`~memfree.engines.vllm_common.ChangedFilterGuard`).
        """
        count = logits.shape[0]
        window = self.rows.window
        rows: list[list[int] | None] = []
        guarded = np.ones(count, dtype=bool)
        for index in range(count):
            request = self._requests.get(index)
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
            return self.rows.guard(logits, rows, guarded=guarded, inplace=True)
        except FilterChangedError as error:  # raising here would kill the engine
            return self.changed.closed(logits, guarded, self.rows.eos_token_ids, error)


__all__ = ["MemFreeV1LogitsProcessor"]
