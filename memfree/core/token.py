"""The token unit's masker: for each row, every token ``t`` such that (last n-1 tokens, t) is in
the filter (MemFree decoding, Ippolito et al. 2023, Algorithm 1), on the rows' device.

A filter in memfree's blocked layout (``blocked_bits()``) is hashed on any device: the row's
(n-1)-token prefix once, then every candidate with a multiply-add and the finalizer
(:mod:`memfree.filterfile.hashing`). On the CPU only rows whose prefix may begin a stored n-gram are looked
up, sparsely; on an accelerator every row is computed densely (no data-dependent shapes, so no
host synchronisation), replayed from a CUDA graph; a filter too large for the accelerator is
queried on the CPU. A filter of another layout (pybloomfiltermmap3) answers through ``contains``.
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
from memfree.filterfile.hashing import (
    extend_fingerprints_np,
    extend_fingerprints_torch,
    fmix64_torch,
    horner_states_torch,
    next_token_states_torch,
    query_bits_torch,
    sparse_members_np,
)
from memfree.filterfile.protocol import NgramSet


@dataclass
class _Tables:
    """The filter's bit arrays (and per-vocabulary constants) on one device."""

    bit_words: torch.Tensor | None  # int64 (num_blocks * 8,), None: query on the CPU instead
    prefix_bit_words: torch.Tensor | None
    special: torch.Tensor  # int64 ids
    never_blocked: dict[int, torch.Tensor] = field(default_factory=dict)  # width -> bool (V,)
    vocab: dict[int, torch.Tensor] = field(default_factory=dict)  # width -> arange(V)


class TokenMasker:
    """Bans every candidate token that completes a stored token n-gram.

    Args:
        ngram_filter: the filter (any format of the :class:`~memfree.filterfile.bloom.reader.NgramSet` protocol).
        special_token_ids: exempt ids: never banned, and a row whose last n-1 tokens hold one is
            never checked (the builder stores no window that holds one).
        options: how it computes (:class:`~memfree.core.MaskerOptions`): ``skip_rows`` on CPU
            skips rows whose last n-1 tokens begin no stored n-gram (exact: the same bans);
            ``cuda_graphs`` on CUDA captures the step once per (rows, vocabulary) shape as a
            CUDA graph and replays it (one launch instead of ~80 small kernels; the same masks;
            each thread captures its own graphs).

    Attributes:
        context_width: n-1, the ids of each row it reads.
    """

    def __init__(
        self,
        ngram_filter: NgramSet,
        special_token_ids: Iterable[int] = (),
        options: MaskerOptions | None = None,
    ) -> None:
        self.filter = ngram_filter
        self.n = ngram_filter.n
        self.context_width: int | None = self.n - 1
        self.special_token_ids = tuple(sorted({int(token) for token in special_token_ids}))
        self.options = options or MaskerOptions()
        self.skip_rows = self.options.skip_rows
        self.cuda_graphs = self.options.cuda_graphs
        bits = ngram_filter.blocked_bits()
        # A capability, not a format: any layout that hands over blocked bits is hashed here.
        self._blocked = bits is not None
        self._num_probes = bits.num_probes if bits is not None else 0
        self._prefix_num_probes = bits.prefix_num_probes if bits is not None else 0
        self._hash_seed = bits.hash_seed if bits is not None else 0
        self._graph_cache = threading.local()  # per thread: graphs replay shared buffers
        self._tables: dict[torch.device, _Tables] = {}
        self._cpu_fallback_warned = False
        self._candidates_cache: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles rebuild their device tables and graphs on first use."""
        state = self.__dict__.copy()
        state.pop("_graph_cache", None)
        state["_tables"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._graph_cache = threading.local()

    def describe(self) -> dict[str, Any]:
        return {"skip_rows": self.skip_rows}

    def holds_own_copy(self, device: torch.device) -> bool:
        """Whether steps on ``device`` read only the masker's copy of the bits there (made at
        the first step on an accelerator the filter fits), never the mapped filter file."""
        device = torch.device(device)
        tables = self._tables.get(device)
        return tables is not None and tables.bit_words is not None and device.type != "cpu"

    def banned_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which tokens complete a stored n-gram for each row.

        Args:
            contexts: int64 `(rows, seq_len)` token ids; only the last n-1 columns are read.
            vocab_width: number of candidate tokens (the scores' last dimension).
            device: where the results go (default: that of ``contexts``); computed there.

        Returns:
            (bool `(rows, vocab_width)` banned tokens, bool `(rows,)` rows checked).
        """
        device = torch.device(device or contexts.device)
        batch, length = contexts.shape
        context = self.n - 1
        if length < context:
            nothing = torch.zeros(batch, dtype=torch.bool, device=device)
            return torch.zeros(batch, vocab_width, dtype=torch.bool, device=device), nothing
        if not self._blocked:
            return self._generic_mask(contexts, vocab_width, device)
        tables = self._tables_for(device)
        compute_device = device
        if tables.bit_words is None:  # the filter did not fit on the accelerator
            tables, compute_device = self._tables_for(torch.device("cpu")), torch.device("cpu")
        window = contexts[:, length - context :].to(compute_device).long()
        if compute_device.type == "cuda" and self.cuda_graphs:
            mask, active = self._graphed(tables, vocab_width, compute_device)(window.contiguous())
        else:
            mask, active = self._step(window, tables, vocab_width, compute_device)
        if compute_device != device:
            mask, active = mask.to(device), active.to(device)
        return mask, active

    def _graphed(self, tables: _Tables, vocab_width: int, compute_device: torch.device) -> Any:
        """This thread's CUDA-graph replay of :meth:`_step` for one width and device."""
        from memfree.core.cuda_graphs import thread_graph

        def step(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self._step(rows, tables, vocab_width, compute_device)

        return thread_graph(self._graph_cache, (vocab_width, compute_device), step)

    def _step(
        self, window: torch.Tensor, tables: _Tables, vocab_width: int, compute_device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask and the rows checked, for ``window`` (rows, n-1) int64 on ``compute_device``."""
        batch, context = window.shape
        bit_words = tables.bit_words
        assert bit_words is not None
        if tables.special.numel():
            # A broadcast comparison, not torch.isin: isin switches to a sort-based path for
            # larger id sets, and on CUDA that waits for the host.
            active = ~(window[:, :, None] == tables.special).any(dim=2).any(dim=1)
        else:
            active = torch.ones(batch, dtype=torch.bool, device=compute_device)
        state = horner_states_torch(window, self._hash_seed)
        if tables.prefix_bit_words is not None and context > 0:
            found = query_bits_torch(
                tables.prefix_bit_words, fmix64_torch(state), self._prefix_num_probes
            )
            active = active & found
        state = next_token_states_torch(state)
        vocab = self._vocab(tables, vocab_width, compute_device)
        if compute_device.type == "cpu" and self.skip_rows:
            mask = self._sparse_mask(state, active, vocab_width, bit_words)
        else:  # dense: no data-dependent shapes, so no host synchronisation on an accelerator
            fingerprints = extend_fingerprints_torch(state, vocab)
            mask = query_bits_torch(bit_words, fingerprints, self._num_probes) & active[:, None]
        mask &= ~self._never_blocked(tables, vocab_width, compute_device)
        return mask, active

    def _sparse_mask(
        self, state: torch.Tensor, active: torch.Tensor, vocab_width: int, bit_words: torch.Tensor
    ) -> torch.Tensor:
        """CPU path: only the active rows, and each candidate only while its probes all hit.

        Every probe of a member must be set, so dropping a candidate at its first unset probe
        gives the same answer as testing all probes; about half the candidates drop per probe.
        numpy has native uint64 logical shifts, which makes this about twice as fast as torch.
        """
        batch = state.shape[0]
        mask = np.zeros((batch, vocab_width), dtype=bool)
        rows = np.flatnonzero(active.numpy())
        if rows.size:
            states = state.numpy().view(np.uint64)[rows]
            fingerprints = extend_fingerprints_np(states, self._candidates(vocab_width))
            index = sparse_members_np(
                bit_words.numpy().view(np.uint64), fingerprints.reshape(-1), self._num_probes
            )
            rows_of, tokens = np.divmod(index, vocab_width)
            mask[rows[rows_of], tokens] = True
        return torch.from_numpy(mask)

    def _candidates(self, vocab_width: int) -> np.ndarray:
        """Every candidate token id as uint64 (cached per width)."""
        cached = self._candidates_cache.get(vocab_width)
        if cached is None:
            cached = self._candidates_cache[vocab_width] = np.arange(vocab_width, dtype=np.uint64)
        return cached

    def _generic_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Any other layout (pybloomfiltermmap3 interchange files): the filter's own query."""
        batch, length = contexts.shape
        window_np = contexts[:, length - (self.n - 1) :].cpu().numpy().astype(np.int64)
        special_np = np.asarray(self.special_token_ids, dtype=np.int64)
        clean = ~np.isin(window_np, special_np).any(axis=1)
        mask = np.zeros((batch, vocab_width), dtype=bool)
        candidates = np.arange(vocab_width, dtype=np.int64)
        for row in np.flatnonzero(clean):
            ngrams = np.concatenate(
                [np.repeat(window_np[row][None, :], vocab_width, axis=0), candidates[:, None]], 1
            )
            mask[row] = self.filter.contains(ngrams)
        mask[:, special_np[special_np < vocab_width]] = False
        return torch.from_numpy(mask).to(device), torch.from_numpy(clean).to(device)

    # -- per-device tables ------------------------------------------------------------------------

    def _tables_for(self, device: torch.device) -> _Tables:
        tables = self._tables.get(device)
        if tables is not None:
            return tables
        special = torch.tensor(self.special_token_ids, dtype=torch.long)
        if device.type == "cpu":
            bits = self.filter.blocked_bits()
            assert bits is not None  # only blocked filters get tables
            prefix = bits.prefix_bit_words
            tables = _Tables(
                torch.from_numpy(bits.bit_words.view(np.int64)),
                None if prefix is None else torch.from_numpy(prefix.view(np.int64)),
                special,
            )
        else:
            tables = self._tables_on_accelerator(device, special)
        self._tables[device] = tables
        return tables

    def _tables_on_accelerator(self, device: torch.device, special: torch.Tensor) -> _Tables:
        cpu = self._tables_for(torch.device("cpu"))
        try:
            assert cpu.bit_words is not None
            bit_words = cpu.bit_words.to(device)
            prefix = cpu.prefix_bit_words.to(device) if cpu.prefix_bit_words is not None else None
            return _Tables(bit_words, prefix, special.to(device))
        except torch.OutOfMemoryError:
            if not self._cpu_fallback_warned:
                warnings.warn(
                    f"memfree: the filter {self.filter.path} ({self.filter.size_bytes / 2**20:.0f} "
                    f"MiB) does not fit in {device} memory; the guard queries it on the CPU and "
                    "copies each step's mask to the device (slower, same tokens blocked)",
                    RuntimeWarning,
                    stacklevel=6,
                )
                self._cpu_fallback_warned = True
            return _Tables(None, None, special.to(device))

    def _vocab(self, tables: _Tables, vocab_width: int, device: torch.device) -> torch.Tensor:
        vocab = tables.vocab.get(vocab_width)
        if vocab is None:
            vocab = tables.vocab[vocab_width] = torch.arange(vocab_width, device=device)
        return vocab

    def _never_blocked(
        self, tables: _Tables, vocab_width: int, device: torch.device
    ) -> torch.Tensor:
        never = tables.never_blocked.get(vocab_width)
        if never is None:
            never = tables.never_blocked[vocab_width] = exempt_mask(
                self.special_token_ids, vocab_width
            ).to(device)
        return never


def exempt_mask(special_token_ids: Iterable[int], vocab_width: int) -> torch.Tensor:
    """bool `(vocab_width,)` on the CPU: the exempt ids below ``vocab_width`` (never banned)."""
    never = torch.zeros(vocab_width, dtype=torch.bool)
    never[[i for i in special_token_ids if i < vocab_width]] = True
    return never


__all__ = ["TokenMasker", "exempt_mask"]
