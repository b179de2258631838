"""The guard inside vLLM's Model Runner V2: :class:`V2Guard`, the implementation that
:class:`~memfree.engines.vllm_plugin.MemFreeVllmLogitsProcessor` runs when MRV2 builds it.

MRV2 keeps every request's committed ids on the device (``req_states.all_token_ids``, valid up to
``total_len``) in a slot that is recycled, calls ``add_request(slot, params)`` when a request takes
one, and ``apply(logits, ctx)`` once per step, where a logits row is not a request: under
speculative decoding a request owns one row per draft token, and row ``j`` of a request samples
the token after its committed ids and its first ``j`` draft tokens (``ctx.input_ids`` holds the
last committed token at local position 0 and the drafts after it). The guard reads each row's
context exactly so, as vLLM's own bad-words stage does.

The token unit's contexts are gathered on the device (no host synchronisation); the word unit
reads the rows' ids back to the host, as its core works on text. MRV2 needs Triton, which this
project's CPU machines lack: this class is tested against faithful replicas of its state objects,
not inside a running engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from memfree.core.exempt import PromptNgrams
from memfree.engines.faults import step_masks
from memfree.engines.policy import ServingConfig
from memfree.engines.scores import ban_scores, fail_closed
from memfree.engines.vllm_common import (
    ChangedFilterGuard,
    RequestPolicy,
    guard_for,
)
from memfree.errors import FilterChangedError


class V2Guard:
    """MemFree decoding in vLLM's Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``), including
    speculative decoding: each draft token's row is guarded over the committed ids and the drafts
    before it. Configured like :class:`~memfree.engines.vllm.MemFreeV1LogitsProcessor`.

    Args:
        vllm_config: the engine's configuration.
        req_states: MRV2's per-slot request state (read only).
        config: the operator's settings, found once by the plugin.

    Raises:
        ServingConfigError: a missing or bad configuration.
        FilterError: the filter cannot be opened or does not fit the engine's tokenizer.
    """

    def __init__(self, vllm_config: Any, req_states: Any, *, config: ServingConfig) -> None:
        self.config, self.rows = config, guard_for(config, vllm_config)
        self.policy = RequestPolicy(self.config)
        self.req_states = req_states
        self.device = torch.device(req_states.device)
        self._guarded = np.zeros(req_states.max_num_reqs, dtype=bool)
        self._guarded_device = torch.from_numpy(self._guarded.copy()).to(self.device)
        self.changed = ChangedFilterGuard()
        self._exempt: dict[int, PromptNgrams | None] = {}  # slot -> its prompt's n-grams or None
        self._exempting = np.zeros(req_states.max_num_reqs, dtype=bool)  # slot asks exempt_prompt

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """Whether the request that takes slot ``req_idx`` is guarded (the slot's old state is
        overwritten)."""
        guarded = self.policy.guards(sampling_params)
        self._guarded[req_idx] = guarded
        self._exempt.pop(req_idx, None)  # read from the slot's prompt at its first step
        self._exempting[req_idx] = self.policy.exempts(sampling_params)
        return guarded

    def apply_staged_writes(self) -> None:
        """The slots' guard flags to the device, once per step."""
        self._guarded_device = torch.from_numpy(self._guarded.copy()).to(self.device)

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The logits (edited in place) with every stored n-gram's last token at ``-inf``.

        A row whose lookup raises a filter error (a damaged block of the filter) is closed at
        this step, the others are answered, and the error is logged once
        (:func:`~memfree.engines.faults.step_masks`). If the filter file was rewritten in place,
        every guarded row is closed from then on and the error is logged (see
        :class:`~memfree.engines.vllm_common.ChangedFilterGuard`).
        """
        if not self._guarded[np.asarray(ctx.idx_mapping_np)].any():
            return logits
        slots = ctx.expanded_idx_mapping.to(torch.long)
        guarded = self._guarded_device.to(logits.device)[slots]
        try:
            prompts = self._prompts(slots) if self.config.exempt_prompt is not False else None
            if self.rows.window is not None:
                ids, full = self._windows(ctx, slots, self.rows.window)
                setup = self.rows.setup
                step = step_masks(
                    setup.masker, setup.file_watch, ids, logits.shape[1], logits.device, prompts
                )
                mask = step.banned
                mask &= (full & guarded).unsqueeze(1)
                eos = self.rows.eos_token_ids
                out = ban_scores(logits, mask, eos, inplace=True, rows=guarded)
                if step.failed is None:
                    return out
                # A row of fewer than n-1 ids completes no n-gram: its lookup is not needed.
                failed = step.failed & full & guarded
                closed = int(failed.sum())
                if closed:
                    self.rows.faults.report(step, closed, logits.shape[0])
                return fail_closed(out, failed, eos)
            rows = self._host_rows(ctx, slots)
            return self.rows.guard(
                logits, rows, guarded=guarded.cpu().numpy(), inplace=True, prompts=prompts
            )
        except FilterChangedError as error:  # raising here would kill the engine
            return self.changed.closed(logits, guarded, self.rows.eos_token_ids, error)

    def _prompts(self, slots: torch.Tensor) -> list[PromptNgrams | None]:
        """Each row's prompt n-grams, read from its slot's prompt ids at the slot's first step."""
        found: list[PromptNgrams | None] = []
        for slot in slots.cpu().tolist():
            if slot not in self._exempt:
                self._exempt[slot] = None
                if self._exempting[slot]:
                    length = int(self.req_states.prompt_len.np[slot])
                    prompt = self.req_states.all_token_ids.gpu[slot, :length].cpu().tolist()
                    self._exempt[slot] = self.rows.setup.prompt_ngrams(prompt)
            found.append(self._exempt[slot])
        return found

    def _windows(
        self, ctx: Any, slots: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's last ``width`` context ids, gathered on the device, and whether it has that
        many (int64 `(rows, width)`, bool `(rows,)`)."""
        history = self.req_states.all_token_ids.gpu
        device = history.device
        count = slots.shape[0]
        total = self.req_states.total_len.gpu.to(device)[slots].to(torch.long)
        local = ctx.expanded_local_pos.to(device, torch.long)
        positions = (total + local).unsqueeze(1) - width + torch.arange(width, device=device)
        committed = history[slots.unsqueeze(1), positions.clamp(0, history.shape[1] - 1)]
        first_row = torch.arange(count, device=device) - local  # the request's local position 0
        draft_rows = first_row.unsqueeze(1) + (positions - total.unsqueeze(1)) + 1
        drafts = ctx.input_ids.to(device)[draft_rows.clamp(0, max(count - 1, 0))]
        ids = torch.where(positions < total.unsqueeze(1), committed, drafts).to(torch.long)
        full = (positions >= 0).all(dim=1)
        return ids, full

    def _host_rows(self, ctx: Any, slots: torch.Tensor) -> list[list[int]]:
        """Each row's whole context (committed ids, then its drafts), on the host."""
        slots_host = slots.cpu()
        history = self.req_states.all_token_ids.gpu[slots_host.to(self.device)].cpu().numpy()
        total = self.req_states.total_len.gpu[slots_host.to(self.device)].cpu().numpy()
        local = ctx.expanded_local_pos.cpu().numpy()
        inputs = ctx.input_ids.cpu().numpy()
        rows = []
        for row in range(slots_host.shape[0]):
            first = row - int(local[row])
            drafts = inputs[first + 1 : row + 1].tolist()
            rows.append(history[row, : int(total[row])].tolist() + drafts)
        return rows


__all__ = ["V2Guard"]
