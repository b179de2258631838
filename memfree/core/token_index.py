"""The token unit's masker over a prefix-keyed index (:mod:`memfree.filterfile.index.layout`):
per row, one lookup of its (n-1)-token prefix returns the tokens to ban, so a step's cost follows
the rows and the few tokens stored after each prefix, not the vocabulary.

On the CPU (numpy) each row's bucket is read and its records whose remainder matches are
scattered into the mask. On an accelerator the same computation has fixed shapes: every row reads
``max_bucket`` record slots (the largest bucket, recorded in the header and checked when the file
is verified), so there is no host synchronisation and the step is captured as a CUDA graph.
Both give the same masks (the tests compare them), and both ban exactly the tokens
:meth:`~memfree.filterfile.index.reader.IndexFilter.contains` finds.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from memfree.core import MaskerOptions
from memfree.core.token import exempt_mask
from memfree.filterfile.hashing import fingerprints_np, fmix64_torch, horner_states_torch
from memfree.filterfile.index import IndexArrays, lookup
from memfree.filterfile.protocol import NgramSet

_SIGN_OFF = (1 << 63) - 1


@dataclass
class _DeviceIndex:
    """The index's arrays as int64 tensors on one accelerator."""

    directory: torch.Tensor
    words: torch.Tensor
    section_words: torch.Tensor
    special: torch.Tensor
    slots: torch.Tensor  # arange(max(1, max_bucket))
    never_blocked: dict[int, torch.Tensor] = field(default_factory=dict)


class IndexMasker:
    """Bans every candidate token that completes a stored token n-gram, by one lookup per row.

    Args:
        ngram_filter: a filter whose :meth:`prefix_index` is not None.
        special_token_ids: exempt ids: never banned, and a row whose last n-1 tokens hold one is
            never looked up (the builder stores no window that holds one).
        options: ``skip_rows=False`` computes on the CPU with the accelerator's fixed-shape step
            (the same masks; for tests and comparison); ``cuda_graphs`` as for the Bloom masker.
    """

    def __init__(
        self,
        ngram_filter: NgramSet,
        special_token_ids: Iterable[int] = (),
        options: MaskerOptions | None = None,
    ) -> None:
        index = ngram_filter.prefix_index()
        if index is None:
            raise TypeError(f"{ngram_filter.path}: not a prefix-keyed index filter")
        self.filter = ngram_filter
        self.n = ngram_filter.n
        self.context_width: int | None = self.n - 1
        self.special_token_ids = tuple(sorted({int(token) for token in special_token_ids}))
        self.options = options or MaskerOptions()
        self._index: IndexArrays = index
        self._special_np = np.asarray(self.special_token_ids, dtype=np.int64)
        self._devices: dict[torch.device, _DeviceIndex | None] = {}
        self._graph_cache = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_graph_cache", None)
        state["_devices"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._graph_cache = threading.local()

    def describe(self) -> dict[str, Any]:
        return {"layout": "prefix-index"}

    def holds_own_copy(self, device: torch.device) -> bool:
        """Whether steps on ``device`` read only the masker's own copy of the index."""
        device = torch.device(device)
        return device.type != "cpu" and self._devices.get(device) is not None

    def banned_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which tokens complete a stored n-gram for each row.

        Args:
            contexts: int64 `(rows, seq_len)` token ids; only the last n-1 columns are read.
            vocab_width: number of candidate tokens (the scores' last dimension).
            device: where the results go (default: that of ``contexts``).

        Returns:
            (bool `(rows, vocab_width)` banned tokens, bool `(rows,)` rows whose prefix is
            stored: the others ban nothing).
        """
        device = torch.device(device or contexts.device)
        batch, length = contexts.shape
        context = self.n - 1
        if length < context:
            nothing = torch.zeros(batch, dtype=torch.bool, device=device)
            return torch.zeros(batch, vocab_width, dtype=torch.bool, device=device), nothing
        window = contexts[:, length - context :]
        if device.type == "cpu":
            if self.options.skip_rows:
                return self._numpy_step(window, vocab_width)
            tables = self._tables(device)
            assert tables is not None
            return self._torch_step(window.long(), tables, vocab_width)
        tables = self._tables(device)
        if tables is None:  # the index did not fit on the accelerator
            mask, active = self._numpy_step(window, vocab_width)
            return mask.to(device), active.to(device)
        window = window.to(device).long().contiguous()
        if device.type == "cuda" and self.options.cuda_graphs:
            return self._graphed(tables, vocab_width, device)(window)
        return self._torch_step(window, tables, vocab_width)

    # -- CPU ------------------------------------------------------------------------------------

    def banned_into(self, contexts: torch.Tensor, vocab_width: int, into: np.ndarray) -> np.ndarray:
        """:meth:`banned_mask` on the CPU, its bans set in ``into`` (a bool `(rows,
        vocab_width)` array whose other entries stay: another masker's bans, so the two need no
        union); returns the rows whose prefix is stored. What a CPU step of the token guard with
        canonical decoding asks."""
        batch, length = contexts.shape
        context = self.n - 1
        if length < context:
            return np.zeros(batch, dtype=bool)
        if not self.options.skip_rows:  # the fixed-shape path: its own mask, then the union
            mask, active = self.banned_mask(contexts, vocab_width, torch.device("cpu"))
            np.logical_or(into, mask.numpy(), out=into)
            return active.numpy()
        return self._numpy_step(contexts[:, length - context :], vocab_width, into)[1].numpy()

    def _numpy_step(
        self, window: torch.Tensor, vocab_width: int, into: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows_np = window.cpu().numpy().astype(np.int64, copy=False)
        batch = rows_np.shape[0]
        mask = np.zeros((batch, vocab_width), dtype=bool) if into is None else into
        active = np.zeros(batch, dtype=bool)
        clean = np.arange(batch)
        if self._special_np.size and rows_np.size:
            # np.isin sorts: Tekken's 1,000 special ids against 256 windows of 9 ids each,
            # compared pairwise, took 1 ms a step.
            holds = np.isin(rows_np, self._special_np).any(axis=1)
            clean = np.flatnonzero(~holds)
        if clean.size:
            fingerprints = fingerprints_np(rows_np[clean], self._index.hash_seed)
            rows, tokens = lookup(self._index, fingerprints)
            keep = tokens < vocab_width
            if self._special_np.size:  # never banned by the filter
                # Left out of the lookup's answer, not cleared in the mask afterwards: a
                # column written in every row faults in a page of each row of a new mask
                # (256 pages a step at 256 rows, 1.4 ms of Qwen 2's 2.2 ms ids-only step).
                keep &= ~np.isin(tokens, self._special_np)
            mask[clean[rows[keep]], tokens[keep]] = True
            active[clean[rows]] = True
        return torch.from_numpy(mask), torch.from_numpy(active)

    # -- fixed shapes (accelerators; the CPU with skip_rows=False) --------------------------------

    def _torch_step(
        self, window: torch.Tensor, tables: _DeviceIndex, vocab_width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self._index.shape
        batch = window.shape[0]
        if tables.special.numel():
            active = ~(window[:, :, None] == tables.special).any(dim=2).any(dim=1)
        else:
            active = torch.ones(batch, dtype=torch.bool, device=window.device)
        fingerprints = fmix64_torch(horner_states_torch(window, self._index.hash_seed))
        bucket_bits, token_bits = shape.bucket_bits, shape.token_bits
        if bucket_bits:
            buckets = _lshr(fingerprints, 64 - bucket_bits)
        else:
            buckets = torch.zeros_like(fingerprints)
        sections = buckets >> (bucket_bits - shape.section_bits)
        entries = (buckets + sections).clamp(0, tables.directory.shape[0] - 2)
        first, end = tables.directory[entries], tables.directory[entries + 1]
        remainders = torch.zeros_like(fingerprints)
        if shape.remainder_bits:
            remainders = _lshr(fingerprints, 64 - bucket_bits - shape.remainder_bits) & (
                (1 << shape.remainder_bits) - 1
            )
        slots = first[:, None] + tables.slots  # (rows, max_bucket)
        valid = slots < end[:, None]
        width = shape.record_bits
        bit_offsets = tables.section_words[sections][:, None] * 64 + slots * width
        values = _read_fields(tables.words, bit_offsets, width)
        tokens = values & ((1 << token_bits) - 1)
        hits = valid & (_lshr(values, token_bits) == remainders[:, None]) & active[:, None]
        hits &= tokens < vocab_width
        target = torch.where(hits, tokens, torch.full_like(tokens, vocab_width))
        mask = torch.zeros(batch, vocab_width + 1, dtype=torch.bool, device=window.device)
        mask.scatter_(1, target, True)
        mask = mask[:, :vocab_width] & ~self._never_blocked(tables, vocab_width, window.device)
        return mask, hits.any(dim=1)

    def _graphed(self, tables: _DeviceIndex, vocab_width: int, device: torch.device) -> Any:
        from memfree.core.cuda_graphs import thread_graph

        def step(window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self._torch_step(window, tables, vocab_width)

        return thread_graph(self._graph_cache, (vocab_width, device), step)

    def _tables(self, device: torch.device) -> _DeviceIndex | None:
        if device in self._devices:
            return self._devices[device]
        index = self._index
        if index.ensure_all is not None:  # the copy reads every block: check them all first
            index.ensure_all()
        try:
            tables: _DeviceIndex | None = _DeviceIndex(
                torch.from_numpy(index.directory.astype(np.int64)).to(device),
                torch.from_numpy(np.asarray(index.words).view(np.int64).copy()).to(device),
                torch.from_numpy(np.asarray(index.section_words, dtype=np.int64)).to(device),
                torch.tensor(self.special_token_ids, dtype=torch.long, device=device),
                torch.arange(max(1, index.max_bucket), device=device),
            )
        except torch.OutOfMemoryError:
            warnings.warn(
                f"memfree: the filter {self.filter.path} does not fit in {device} memory; the "
                "guard looks rows up on the CPU and copies each step's mask to the device",
                RuntimeWarning,
                stacklevel=4,
            )
            tables = None
        self._devices[device] = tables
        return tables

    def _never_blocked(
        self, tables: _DeviceIndex, vocab_width: int, device: torch.device
    ) -> torch.Tensor:
        never = tables.never_blocked.get(vocab_width)
        if never is None:
            never = exempt_mask(self.special_token_ids, vocab_width).to(device)
            tables.never_blocked[vocab_width] = never
        return never


def _lshr(values: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 bits by a constant in [1, 63]."""
    return (values >> shift) & ((1 << (64 - shift)) - 1)


def _read_fields(words: torch.Tensor, bit_offsets: torch.Tensor, width: int) -> torch.Tensor:
    """The ``width``-bit fields at ``bit_offsets`` (int64) of int64 ``words`` (the torch twin of
    :func:`memfree.filterfile.index.query.read_fields`)."""
    index = (bit_offsets >> 6).clamp(0, words.shape[0] - 2)
    shifts = bit_offsets & 63
    low_word = words[index]
    # A logical shift by a per-element amount: shift by one with the sign bit cleared, then by
    # the rest (an arithmetic shift of a non-negative value is logical).
    low = torch.where(
        shifts == 0, low_word, ((low_word >> 1) & _SIGN_OFF) >> (shifts - 1).clamp(min=0)
    )
    high = (words[index + 1] << 1) << (63 - shifts)
    return (low | high) & ((1 << width) - 1)


__all__ = ["IndexMasker"]
