"""The decoding guard: a transformers ``LogitsProcessor`` that removes every token completing a
stored n-gram (MemFree decoding, Ippolito et al. 2023, Algorithm 1).

At each step, for each row of ``input_ids`` (prompt and generated tokens together), every token
``t`` such that (last n-1 tokens, t) is in the filter gets a score of ``-inf``. A Bloom filter has
no false negatives, so a guarded generation contains no stored n-gram, in any decoding mode.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
import torch

from memfree.errors import FilterError, FilterMismatchError
from memfree.filter import LAYOUT, NgramFilter
from memfree.hashing import (
    HORNER_MULTIPLIER,
    _fmix64_torch,
    _signed,
    fmix64_np,
    query_bits_torch,
    sparse_members_np,
)

try:  # a plain base class keeps the guard importable (and testable) without transformers
    from transformers import LogitsProcessor as _Base
    from transformers import LogitsProcessorList
except ImportError:  # pragma: no cover - transformers is a hard dependency
    _Base = object  # type: ignore[assignment,misc]
    LogitsProcessorList = None  # type: ignore[assignment,misc]

# generate() builds a new LogitsProcessorList in every call and runs each processor from that
# list's __call__: the list found in that frame names one call exactly, where the data cannot (the
# first step of a continuation looks just like the previous call's next step).
_LIST_CALL_CODE = (
    getattr(LogitsProcessorList.__call__, "__code__", None)
    if LogitsProcessorList is not None
    else None
)
_CALLER_FRAMES = 4  # frames searched above the guard's __call__ (subclasses, timing wrappers)


@dataclass
class GuardStats:
    """What the guard did during one ``generate()`` call, per row and step.

    A guard keeps its statistics per thread: ``guard.stats`` are those of the latest
    ``generate()`` call made by the calling thread, so threads that share one guard each read
    their own. A thread that made no call reads the latest call started by any thread (e.g.
    ``generate()`` running in a worker thread behind a ``TextIteratorStreamer``).

    Rows are the rows of ``input_ids`` as the processor sees them: batch x beams (beam search) or
    batch x ``num_return_sequences`` (sampling). Step ``s`` chose the token at sequence position
    ``positions[s]`` of each row.

    Attributes:
        positions: int `(num_steps,)`: index, in the row, of the token each step generated.
        blocked_counts: int `(num_rows, num_steps)`: tokens set to ``-inf`` by the guard.
        first_choice: int `(num_rows, num_steps)`: the token with the highest incoming score.
        first_choice_blocked: bool `(num_rows, num_steps)`: the guard removed that token (an
            *intervention*, the paper's Figures 9 and 10).
        checked: bool `(num_rows, num_steps)`: the row's last n-1 tokens may begin a stored n-gram,
            so the whole vocabulary was checked; False rows were skipped, exactly, by the prefix
            section (or held a special token, or were shorter than n-1 tokens).
    """

    positions: np.ndarray
    blocked_counts: np.ndarray
    first_choice: np.ndarray
    first_choice_blocked: np.ndarray
    checked: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.blocked_counts.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.positions.shape[0])

    def interventions(self) -> np.ndarray:
        """Steps per row where the model's first choice was blocked; int `(num_rows,)`."""
        return self.first_choice_blocked.sum(axis=1)

    def intervention_positions(self, row: int) -> list[int]:
        """Sequence positions in ``row`` where the model's first choice was blocked."""
        return [int(p) for p in self.positions[self.first_choice_blocked[row]]]

    def summary(self) -> dict[str, Any]:
        """Totals for reports: steps, rows, interventions, tokens blocked, rows skipped."""
        cells = max(self.num_rows * self.num_steps, 1)
        return {
            "rows": self.num_rows,
            "steps": self.num_steps,
            "interventions": int(self.first_choice_blocked.sum()),
            "interventions_per_row": self.interventions().tolist(),
            "tokens_blocked": int(self.blocked_counts.sum()),
            "row_steps_checked": int(self.checked.sum()),
            "fraction_skipped": 1.0 - float(self.checked.sum()) / cells,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions.tolist(),
            "blocked_counts": self.blocked_counts.tolist(),
            "first_choice": self.first_choice.tolist(),
            "first_choice_blocked": self.first_choice_blocked.tolist(),
            "checked": self.checked.tolist(),
        }


_Record = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class _Call:
    """The steps one thread recorded for one ``generate()`` call (or run of direct calls)."""

    __slots__ = ("caller", "next_length", "records", "rows")

    def __init__(self, caller: Any = None, rows: int | None = None) -> None:
        # The calling LogitsProcessorList, weakly: a strong one would keep the previous call's
        # processors alive, and a dead one can never match a new list at the same address.
        self.caller: weakref.ref[Any] | None = None if caller is None else weakref.ref(caller)
        self.rows = rows
        self.next_length: int | None = None
        # (position, tokens blocked, first choice, first choice blocked, checked): one append per
        # step, so another thread reading the statistics meanwhile sees whole steps only.
        self.records: list[_Record] = []

    def continues(self, caller: Any, rows: int, length: int) -> bool:
        """Whether a step with this caller and shape belongs to this call."""
        if rows != self.rows or length != self.next_length:
            return False
        if caller is None:
            return self.caller is None
        return self.caller is not None and self.caller() is caller


def _calling_list() -> Any:
    """The LogitsProcessorList whose ``__call__`` runs the guard's step, or None (a direct call).

    Called from the guard's ``__call__``; looks a few frames up, by code object (no frame's
    locals are read unless it is that method's).
    """
    if _LIST_CALL_CODE is None:  # pragma: no cover - without transformers
        return None
    try:
        frame: FrameType | None = sys._getframe(2)
    except (AttributeError, ValueError):  # pragma: no cover - no frames, or a short stack
        return None
    for _ in range(_CALLER_FRAMES):
        if frame is None:
            return None
        if frame.f_code is _LIST_CALL_CODE:
            owner = frame.f_locals.get("self")
            return owner if isinstance(owner, LogitsProcessorList) else None
        frame = frame.f_back
    return None


@dataclass
class _Tables:
    """The filter's bit arrays (and per-vocabulary constants) on one device."""

    words: torch.Tensor | None  # int64 (num_blocks * 8,), None: query on the CPU instead
    prefix_words: torch.Tensor | None
    special: torch.Tensor  # int64 ids
    never_blocked: dict[int, torch.Tensor] = field(default_factory=dict)  # vocab size -> bool (V,)
    vocab: dict[int, torch.Tensor] = field(default_factory=dict)  # vocab size -> arange(V)


class MemFreeLogitsProcessor(_Base):
    """Sets to ``-inf`` the score of every token that would complete an n-gram in the filter.

    Pass it to ``generate(logits_processor=[...])``. transformers runs it before the sampling
    warpers (temperature, top-k, top-p), so blocked tokens are removed before truncation. It works
    with greedy search, sampling, beam search, left-padded batches and ``num_return_sequences``,
    on the device of the scores.

    Special tokens (end of sequence, padding, chat markers) never complete an n-gram: they are
    never blocked, and a window holding one is never checked (the builder never stores such a
    window). So end-of-sequence always stays allowed; if a row would still end with every score
    at ``-inf`` (possible only when earlier processors removed everything else), its
    end-of-sequence score is set to 0.

    Statistics (:attr:`stats`) start anew with each ``generate()`` call, told apart by the
    ``LogitsProcessorList`` that transformers builds for every call (so a call that continues a
    previous output starts new statistics too). One guard may serve several threads at once: the
    masks never depend on earlier steps' statistics, and each thread records its own. Called
    directly (not from a ``LogitsProcessorList``: unit tests, other engines, continuous batching),
    a step starts new statistics when the number of rows changes or the rows are not one token
    longer than at the previous step; call :meth:`reset` between generations that this cannot
    tell apart. Assisted (speculative) generation also runs the guard inside the assistant's own
    ``generate()`` calls and on candidate tokens that are later rejected: its statistics describe
    the latest of those calls, not the output.

    Args:
        ngram_filter: an :class:`~memfree.NgramFilter` or the path of a filter file.
        tokenizer: the model's tokenizer. Its fingerprint must match the filter's (a filter built
            with another vocabulary would guard nothing); its special tokens are never blocked.
            Without one, nothing is checked: pass ``special_token_ids`` and ``eos_token_id``.
        ngram_size: the n you expect; refused if the filter holds another n.
        special_token_ids: more ids that are never blocked and never complete an n-gram.
        eos_token_id: end-of-sequence id(s) (default: the tokenizer's).
        pad_token_id: padding id (default: the tokenizer's); treated as special.
        skip_rows: on CPU, skip rows whose last n-1 tokens begin no stored n-gram (read from the
            filter's prefix section). Exact: it blocks the same tokens. On CUDA every row is
            computed densely instead, so that a step never waits for the host.
        record_stats: keep :class:`GuardStats` (small tensors, one per step).
        cuda_graphs: on CUDA, capture the step once per (rows, vocabulary) shape as a CUDA graph
            and replay it (one launch instead of ~80 small kernels; the same masks). Each thread
            captures its own graphs.

    Raises:
        FilterMismatchError: tokenizer fingerprint or n differs from the filter's.
        ValueError: a bad argument.

    Example:
        >>> from memfree import NgramFilter, MemFreeLogitsProcessor  # doctest: +SKIP
        >>> guard = MemFreeLogitsProcessor(NgramFilter.open("stdlib.memfree"), tokenizer=tok)
        >>> out = model.generate(**inputs, logits_processor=[guard], max_new_tokens=64)
        >>> guard.stats.interventions()
        array([3])
    """

    def __new__(cls, ngram_filter: Any = None, *args: Any, **kwargs: Any) -> MemFreeLogitsProcessor:
        """A word filter (``unit: "word"``) gives a :class:`MemFreeWordLogitsProcessor`."""
        opened: NgramFilter | None = None
        if ngram_filter is not None and cls is MemFreeLogitsProcessor:
            opened = _open_filter(ngram_filter)
            if opened.unit == "word":
                from memfree.word_guard import MemFreeWordLogitsProcessor

                cls = MemFreeWordLogitsProcessor
        instance = super().__new__(cls)
        instance._opened = opened  # type: ignore[assignment]
        return instance

    def __init__(
        self,
        ngram_filter: NgramFilter | str | os.PathLike[str],
        tokenizer: Any = None,
        *,
        ngram_size: int | None = None,
        special_token_ids: Iterable[int] | None = None,
        eos_token_id: int | Iterable[int] | None = None,
        pad_token_id: int | None = None,
        skip_rows: bool = True,
        record_stats: bool = True,
        cuda_graphs: bool = True,
    ) -> None:
        opened = getattr(self, "_opened", None)
        ngram_filter = opened if opened is not None else _open_filter(ngram_filter)
        self._opened = None
        self.filter = ngram_filter
        self.n = ngram_filter.n
        if ngram_size is not None and ngram_size != self.n:
            raise FilterMismatchError(
                f"{ngram_filter.path}: holds {self.n}-grams, but ngram_size={ngram_size} was "
                f"asked for; rebuild it with `memfree build --n {ngram_size}` or drop ngram_size"
            )
        special: set[int] = set()
        eos_ids: list[int] = []
        if tokenizer is not None:
            self._check_tokenizer(tokenizer)
            from memfree.tokenizer import special_token_ids as tokenizer_special_ids

            special.update(tokenizer_special_ids(tokenizer))
            if getattr(tokenizer, "eos_token_id", None) is not None:
                eos_ids.append(int(tokenizer.eos_token_id))
            if pad_token_id is None and getattr(tokenizer, "pad_token_id", None) is not None:
                pad_token_id = int(tokenizer.pad_token_id)
        if eos_token_id is not None:
            eos_ids = _token_ids("eos_token_id", eos_token_id)
        special.update(_token_ids("special_token_ids", special_token_ids))
        special.update(eos_ids)
        special.update(_token_ids("pad_token_id", pad_token_id))
        # Only ids the builder also cut at may be exempt: exempting another id would let a stored
        # n-gram that holds it through. Such an id is then an ordinary token for the guard.
        recorded = ngram_filter.special_token_ids
        if recorded is not None:
            special &= set(recorded)
        self.eos_token_ids: tuple[int, ...] = tuple(
            i for i in dict.fromkeys(eos_ids) if i in special
        )
        self.special_token_ids: tuple[int, ...] = tuple(sorted(special))
        self.skip_rows = bool(skip_rows)
        self.record_stats = bool(record_stats)
        self.cuda_graphs = bool(cuda_graphs)
        self._graph_cache = threading.local()  # per thread: graphs replay shared buffers
        self._native = ngram_filter.layout == LAYOUT
        self._tables: dict[torch.device, _Tables] = {}
        self._cpu_fallback_warned = False
        self._candidates_cache: dict[int, np.ndarray] = {}
        self._local = threading.local()
        self._latest = _Call()
        self.reset()

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with no statistics (thread-local state cannot be copied)."""
        state = self.__dict__.copy()
        state.pop("_local", None)
        state.pop("_latest", None)
        state.pop("_graph_cache", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._graph_cache = threading.local()
        self._local = threading.local()
        self._latest = _Call()

    def _check_tokenizer(self, tokenizer: Any) -> None:
        from memfree.tokenizer import tokenizer_fingerprint

        expected = self.filter.metadata.get("tokenizer_fingerprint")
        if expected is None:
            return  # a hand-made filter that records no tokenizer: nothing to compare
        actual = tokenizer_fingerprint(tokenizer)
        if actual != expected:
            built_with = self.filter.metadata.get("tokenizer", "another tokenizer")
            given = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise FilterMismatchError(
                f"{self.filter.path}: built with tokenizer {built_with!r} (fingerprint "
                f"{expected}), but the model's tokenizer {given!r} has fingerprint {actual}: "
                "token ids would not match and nothing would be guarded. Rebuild the filter with "
                "`memfree build --tokenizer <the model's tokenizer>`"
            )

    # -- statistics -------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the calling thread's statistics; its next step starts a new record.

        Each ``generate()`` call starts new statistics by itself; call this between generations
        that run the guard directly (not from a ``LogitsProcessorList``) when one may continue
        the other.
        """
        mine = getattr(self._local, "call", None)
        empty = _Call()
        if mine is not None:
            self._local.call = empty
        if mine is None or self._latest is mine:
            self._latest = empty

    @property
    def stats(self) -> GuardStats:
        """Statistics of the calling thread's latest ``generate()`` call (copied to the host).

        A thread that has not run the guard reads the latest call started by any thread.
        """
        call = getattr(self._local, "call", None)
        if call is None:
            call = self._latest
        records = list(call.records)  # a snapshot: the owning thread may still be appending
        rows = call.rows or 0
        if not records:
            empty = np.zeros((rows, 0), dtype=np.int64)
            return GuardStats(
                np.zeros(0, np.int64), empty, empty.copy(), empty.astype(bool), empty.astype(bool)
            )
        positions, *parts = zip(*records, strict=True)
        counts, first, first_blocked, checked = (
            torch.stack(column, dim=1).cpu().numpy() for column in parts
        )
        return GuardStats(
            positions=np.asarray(positions, dtype=np.int64),
            blocked_counts=counts.astype(np.int64),
            first_choice=first.astype(np.int64),
            first_choice_blocked=first_blocked.astype(bool),
            checked=checked.astype(bool),
        )

    # -- the step -----------------------------------------------------------------------------------

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Scores with every token that completes a stored n-gram at ``-inf``.

        Args:
            input_ids: `(batch, seq_len)` token ids (prompt and generated tokens; beams flattened).
            scores: `(batch, vocab)` scores of the next token.

        Returns:
            A new `(batch, vocab)` tensor; ``scores`` is not modified.
        """
        if input_ids.dim() != 2 or scores.dim() != 2 or input_ids.shape[0] != scores.shape[0]:
            raise ValueError(
                "expected input_ids (batch, seq_len) and scores (batch, vocab) with the same "
                f"batch, got {tuple(input_ids.shape)} and {tuple(scores.shape)}"
            )
        caller = _calling_list() if self.record_stats else None
        mask, checked = self.blocked_mask(input_ids, scores.shape[1], scores.device)
        guarded = scores.masked_fill(mask, float("-inf"))
        if self.eos_token_ids:
            eos = self.eos_token_ids[0]
            if eos < scores.shape[1]:
                dead = torch.isneginf(guarded).all(dim=1)
                guarded[:, eos] = torch.where(
                    dead, torch.zeros_like(guarded[:, eos]), guarded[:, eos]
                )
        if self.record_stats:
            self._record(caller, input_ids, scores, mask, checked)
        return guarded  # type: ignore[return-value]

    def _record(
        self,
        caller: Any,
        input_ids: torch.Tensor,
        scores: torch.Tensor,
        mask: torch.Tensor,
        checked: torch.Tensor,
    ) -> None:
        rows, length = int(input_ids.shape[0]), int(input_ids.shape[1])
        call = getattr(self._local, "call", None)
        if call is None or not call.continues(caller, rows, length):
            call = self._local.call = self._latest = _Call(caller, rows)
        call.next_length = length + 1
        first = scores.argmax(dim=1)
        first_blocked = mask.gather(1, first[:, None])[:, 0]
        call.records.append((length, mask.sum(dim=1), first, first_blocked, checked))

    def blocked_mask(
        self, input_ids: torch.Tensor, vocab_size: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which tokens complete a stored n-gram for each row.

        Args:
            input_ids: `(batch, seq_len)` token ids.
            vocab_size: number of candidate tokens (the scores' last dimension).
            device: where the mask goes (default: that of ``input_ids``).

        Returns:
            (bool `(batch, vocab_size)` mask of blocked tokens, bool `(batch,)` rows checked).
        """
        device = torch.device(device or input_ids.device)
        batch, length = input_ids.shape
        context = self.n - 1
        if length < context:
            nothing = torch.zeros(batch, dtype=torch.bool, device=device)
            return torch.zeros(batch, vocab_size, dtype=torch.bool, device=device), nothing
        tables = self._tables_for(device)
        if tables.words is None and not self._native:
            return self._blocked_mask_generic(input_ids, vocab_size, device)
        if tables.words is None:  # the filter did not fit on the accelerator
            tables, compute_device = self._cpu_tables(), torch.device("cpu")
        else:
            compute_device = device
        window = input_ids[:, length - context :].to(compute_device).long()
        if compute_device.type == "cuda" and self.cuda_graphs:
            key = (vocab_size, compute_device)
            cache = self._graph_cache.__dict__.setdefault("steps", {})
            graphed = cache.get(key)
            if graphed is None:
                from memfree.cuda_graphs import GraphedStep

                def step(rows: torch.Tensor, tables: _Tables = tables) -> Any:
                    return self._step(rows, tables, vocab_size, compute_device)

                graphed = cache[key] = GraphedStep(step)
            mask, active = graphed(window.contiguous())
        else:
            mask, active = self._step(window, tables, vocab_size, compute_device)
        if compute_device != device:
            mask, active = mask.to(device), active.to(device)
        return mask, active

    def _step(
        self, window: torch.Tensor, tables: _Tables, vocab_size: int, compute_device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask and the rows checked, for ``window`` (rows, n-1) int64 on ``compute_device``."""
        batch, context = window.shape
        words = tables.words
        assert words is not None
        if tables.special.numel():
            # A broadcast comparison, not torch.isin: isin switches to a sort-based path for
            # larger id sets, and on CUDA that waits for the host.
            active = ~(window[:, :, None] == tables.special).any(dim=2).any(dim=1)
        else:
            active = torch.ones(batch, dtype=torch.bool, device=compute_device)
        multiplier = _signed(HORNER_MULTIPLIER)
        state = window.new_full((batch,), _signed(self.filter.hash_seed))
        for column in range(context):
            state = state * multiplier + (window[:, column] + 1)
        if tables.prefix_words is not None and context > 0:
            prefix_found = query_bits_torch(
                tables.prefix_words, _fmix64_torch(state), self.filter.prefix_num_probes
            )
            active = active & prefix_found
        state = state * multiplier
        vocab = self._vocab(tables, vocab_size, compute_device)
        if compute_device.type == "cpu" and self.skip_rows:
            mask = self._sparse_mask(state, active, vocab, words)
        else:  # dense: no data-dependent shapes, so no host synchronisation on an accelerator
            fingerprints = _fmix64_torch(state[:, None] + (vocab[None, :] + 1))
            mask = query_bits_torch(words, fingerprints, self.filter.num_probes) & active[:, None]
        mask &= ~self._never_blocked(tables, vocab_size, compute_device)
        return mask, active

    def _sparse_mask(
        self, state: torch.Tensor, active: torch.Tensor, vocab: torch.Tensor, words: torch.Tensor
    ) -> torch.Tensor:
        """CPU path: only the active rows, and each candidate only while its probes all hit.

        Every probe of a member must be set, so dropping a candidate at its first unset probe
        gives the same answer as testing all probes; about half the candidates drop per probe.
        numpy has native uint64 logical shifts, which makes this about twice as fast as torch.
        """
        batch, vocab_size = state.shape[0], vocab.shape[0]
        mask = np.zeros((batch, vocab_size), dtype=bool)
        rows = np.flatnonzero(active.numpy())
        if rows.size:
            words_np = words.numpy().view(np.uint64)
            states = state.numpy().view(np.uint64)[rows]
            candidates = self._candidates_np(vocab_size)
            with np.errstate(over="ignore"):
                fingerprints = (states[:, None] + candidates[None, :]).reshape(-1)
            index = sparse_members_np(words_np, fmix64_np(fingerprints), self.filter.num_probes)
            rows_of, tokens = np.divmod(index, vocab_size)
            mask[rows[rows_of], tokens] = True
        return torch.from_numpy(mask)

    def _candidates_np(self, vocab_size: int) -> np.ndarray:
        """``token + 1`` for every candidate token, as uint64 (cached per vocabulary size)."""
        cached = self._candidates_cache.get(vocab_size)
        if cached is None:
            cached = self._candidates_cache[vocab_size] = np.arange(
                1, vocab_size + 1, dtype=np.uint64
            )
        return cached

    def _blocked_mask_generic(
        self, input_ids: torch.Tensor, vocab_size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Any layout (pybloomfiltermmap3 interchange files): the filter's own numpy query."""
        batch, length = input_ids.shape
        window_np = input_ids[:, length - (self.n - 1) :].cpu().numpy().astype(np.int64)
        special_np = np.asarray(self.special_token_ids, dtype=np.int64)
        clean = ~np.isin(window_np, special_np).any(axis=1)
        mask = np.zeros((batch, vocab_size), dtype=bool)
        candidates = np.arange(vocab_size, dtype=np.int64)
        for row in np.flatnonzero(clean):
            ngrams = np.concatenate(
                [np.repeat(window_np[row][None, :], vocab_size, axis=0), candidates[:, None]], 1
            )
            mask[row] = self.filter.contains(ngrams)
        mask[:, special_np[special_np < vocab_size]] = False
        return torch.from_numpy(mask).to(device), torch.from_numpy(clean).to(device)

    # -- per-device tables ------------------------------------------------------------------------

    def _cpu_tables(self) -> _Tables:
        return self._tables_for(torch.device("cpu"))

    def _tables_for(self, device: torch.device) -> _Tables:
        device = torch.device(device)
        tables = self._tables.get(device)
        if tables is not None:
            return tables
        special = torch.tensor(self.special_token_ids, dtype=torch.long)
        if not self._native:
            tables = _Tables(None, None, special)
        elif device.type == "cpu":
            tables = _Tables(
                torch.from_numpy(self.filter.words.view(np.int64)),
                _as_tensor(self.filter.prefix_words),
                special,
            )
        else:
            tables = self._tables_on_accelerator(device, special)
        self._tables[device] = tables
        return tables

    def _tables_on_accelerator(self, device: torch.device, special: torch.Tensor) -> _Tables:
        cpu = self._cpu_tables()
        try:
            assert cpu.words is not None
            words = cpu.words.to(device)
            prefix = cpu.prefix_words.to(device) if cpu.prefix_words is not None else None
            return _Tables(words, prefix, special.to(device))
        except torch.OutOfMemoryError:
            if not self._cpu_fallback_warned:
                warnings.warn(
                    f"memfree: the filter {self.filter.path} ({self.filter.size_bytes / 2**20:.0f} "
                    f"MiB) does not fit in {device} memory; the guard queries it on the CPU and "
                    "copies each step's mask to the device (slower, same tokens blocked)",
                    RuntimeWarning,
                    stacklevel=4,
                )
                self._cpu_fallback_warned = True
            return _Tables(None, None, special.to(device))

    def _vocab(self, tables: _Tables, vocab_size: int, device: torch.device) -> torch.Tensor:
        vocab = tables.vocab.get(vocab_size)
        if vocab is None:
            vocab = tables.vocab[vocab_size] = torch.arange(vocab_size, device=device)
        return vocab

    def _never_blocked(
        self, tables: _Tables, vocab_size: int, device: torch.device
    ) -> torch.Tensor:
        never = tables.never_blocked.get(vocab_size)
        if never is None:
            never = torch.zeros(vocab_size, dtype=torch.bool)
            ids = [i for i in self.special_token_ids if i < vocab_size]
            never[ids] = True
            never = tables.never_blocked[vocab_size] = never.to(device)
        return never

    def __repr__(self) -> str:
        return (
            f"MemFreeLogitsProcessor(filter={str(self.filter.path)!r}, n={self.n}, "
            f"special_token_ids={list(self.special_token_ids)}, skip_rows={self.skip_rows})"
        )


def _open_filter(ngram_filter: Any) -> NgramFilter:
    if isinstance(ngram_filter, NgramFilter):
        return ngram_filter
    if not isinstance(ngram_filter, (str, os.PathLike)):
        raise TypeError(
            "ngram_filter must be an NgramFilter or the path of a filter file, got "
            f"{type(ngram_filter).__name__}"
        )
    return NgramFilter.open(ngram_filter)


def _token_ids(name: str, value: Any) -> list[int]:
    """Token ids from None, an int, a numpy or 0-d/1-d torch integer, or an iterable of them."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    values = [value] if isinstance(value, (int, np.integer)) else value
    try:
        values = list(values)
    except TypeError:
        raise ValueError(
            f"{name} must be a token id or a list of token ids, got {value!r}"
        ) from None
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)) or item < 0:
            raise ValueError(f"{name} must hold non-negative token ids, got {item!r}")
    return [int(item) for item in values]


def _as_tensor(words: np.ndarray | None) -> torch.Tensor | None:
    return None if words is None else torch.from_numpy(words.view(np.int64))


__all__ = ["FilterError", "GuardStats", "MemFreeLogitsProcessor"]
