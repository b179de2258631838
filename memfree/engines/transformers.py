"""The decoding guard for transformers: a ``LogitsProcessor`` that removes every token completing a
stored n-gram (MemFree decoding, Ippolito et al. 2023, Algorithm 1), over the engine-neutral core
(:mod:`memfree.core`); it adds argument checks, the end-of-sequence rescue and statistics.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch

from memfree.core import Masker, MaskerOptions
from memfree.core.exempt import PromptNgrams
from memfree.engines.faults import StepFaults, step_masks
from memfree.engines.scores import ban_scores, ban_scores_cpu, fail_closed
from memfree.engines.setup import GuardSetup, checked_banned_mask
from memfree.engines.stats import GuardStats, StatsRecorder
from memfree.errors import FilterError
from memfree.filterfile.filewatch import FileWatch
from memfree.filterfile.protocol import NgramSet
from memfree.units import Unit

try:  # a plain base class keeps the guard importable (and testable) without transformers
    from transformers import LogitsProcessor as _Base
except ImportError:  # pragma: no cover - transformers is a hard dependency
    _Base = object  # type: ignore[assignment,misc]


class MemFreeLogitsProcessor(_Base):
    """Sets to ``-inf`` the score of every token that would complete an n-gram in the filter.

    Pass it to ``generate(logits_processor=[...])``. transformers runs it before the sampling
    warpers (temperature, top-k, top-p), so blocked tokens are removed before truncation. It works
    with greedy search, sampling, beam search, left-padded batches and ``num_return_sequences``,
    on the device of the scores. A word filter (``memfree build --unit word``) gives a guard over
    normalized words (see :mod:`memfree.core.word`): the filter's ``unit`` picks the core.

    Special tokens (end of sequence, padding, chat markers) never complete an n-gram: they are
    never blocked, and a window holding one is never checked (the builder never stores such a
    window). So end-of-sequence always stays allowed; if a row would still end with every score
    at ``-inf`` (possible only when earlier processors removed everything else), its
    end-of-sequence score is set to 0.

    Statistics (:attr:`stats`) start anew when a step's rows are not the previous step's rows one
    token longer (a new ``generate()`` call with another prompt or batch), or after
    :meth:`reset`. A call whose prompt is exactly the previous call's output looks like that
    call's next step: call :meth:`reset` between such calls, or use one guard per call (as
    transformers' stateful processors and xgrammar's ask). The masks never depend on the
    statistics. One guard may serve several threads at once: each thread records its own.

    transformers' continuous batching (``generate_batch``) passes a processor only each request's
    last token, not its history, so the guard cannot run there: it declares
    ``supports_continuous_batching = False``. Serve batches with vLLM (:mod:`memfree.integrations`).
    Assisted (speculative) generation also runs the guard inside the assistant's own
    ``generate()`` calls and on candidate tokens that are later rejected: its statistics describe
    the latest of those calls, not the output.

    A block of an index filter is verified when first read, so a damaged block can surface in the
    middle of a generation (:class:`~memfree.errors.DamagedFilterError`). The guard then closes
    only the rows whose lookup reads it: they may take only end of sequence at that step (so they
    end there), every other row is guarded as usual, and the problem (the file, its section and
    block) is logged once as an error on the ``memfree`` logger and kept in :attr:`faults`.
    ``generate()`` returns; a stored n-gram is never emitted. Without an end-of-sequence id no
    row can be closed, and the error is raised instead. A filter file rewritten in place still
    stops the generation (:meth:`__call__`).

    Args:
        ngram_filter: an :class:`~memfree.NgramFilter` (or another filter format's reader) or the
            path of a filter file.
        tokenizer: the model's tokenizer. Its fingerprint must match the filter's (a filter built
            with another vocabulary would guard nothing); its special tokens are never blocked.
            Without one, nothing is checked: pass ``special_token_ids`` and ``eos_token_id``. A
            word filter needs it (the guard reads each token's bytes).
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
        canonical: token filters: also ban every token after which the row's ids would not be
            their text's tokenization (canonical decoding, :mod:`memfree.core.canonical`), so
            that the promise holds over the text, tokenized again. Default: on when a tokenizer
            is given. False guards the ids only (the promise is then over the ids).
        exempt_prompt: a stored n-gram that occurs in a row's own prompt is not banned (the
            model may quote, translate or edit the text it was given); every other stored n-gram
            is (:mod:`memfree.core.exempt`). The prompt is each row at a generation's first step.
        allow_empty: accept a filter that stores no n-gram (by default refused: such a guard
            changes nothing, which is almost always a build gone wrong).

    Attributes:
        faults: the filter errors met inside steps, each logged once
            (:attr:`StepFaults.problems <memfree.engines.faults.StepFaults.problems>`).

    Raises:
        FilterMismatchError: tokenizer fingerprint or n differs from the filter's (or, for a word
            filter, its normalizer).
        CanonicalUnsupportedError: canonical decoding with a tokenizer it is not exact for
            (see docs/canonical.md: byte-level BPE with the split patterns it reads, or
            SentencePiece-style BPE): pass ``canonical=False``, or guard with a word filter.
        EmptyFilterError: the filter stores no n-gram (pass ``allow_empty=True`` to accept it).
        ValueError: a bad argument.

    Example:
        >>> from memfree import NgramFilter, MemFreeLogitsProcessor  # doctest: +SKIP
        >>> guard = MemFreeLogitsProcessor(NgramFilter.open("stdlib.memfree"), tokenizer=tok)
        >>> out = model.generate(**inputs, logits_processor=[guard], max_new_tokens=64)
        >>> guard.stats.interventions()
        array([3])
    """

    unit_name: ClassVar[str | None] = None  # None: the filter's unit picks the core
    # Continuous batching passes each request's last token only: a guard needs the history.
    supports_continuous_batching = False

    def __init__(
        self,
        ngram_filter: NgramSet | str | os.PathLike[str],
        tokenizer: Any = None,
        *,
        ngram_size: int | None = None,
        special_token_ids: Iterable[int] | None = None,
        eos_token_id: int | Iterable[int] | None = None,
        pad_token_id: int | None = None,
        skip_rows: bool = True,
        record_stats: bool = True,
        cuda_graphs: bool = True,
        canonical: bool | None = None,
        exempt_prompt: bool = False,
        allow_empty: bool = False,
    ) -> None:
        setup = GuardSetup.create(
            ngram_filter,
            tokenizer,
            unit_name=self.unit_name,
            ngram_size=ngram_size,
            special_token_ids=special_token_ids,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            options=MaskerOptions(skip_rows=bool(skip_rows), cuda_graphs=bool(cuda_graphs)),
            canonical=canonical,
            allow_empty=allow_empty,
        )
        self.setup = setup
        self.canonical = setup.canonical
        self.filter = setup.filter
        self.n = setup.n
        self.special_token_ids: tuple[int, ...] = setup.special_token_ids
        self.eos_token_ids: tuple[int, ...] = setup.eos_token_ids
        self.exempt_prompt = bool(exempt_prompt)
        self._prompts = threading.local()
        self.skip_rows = bool(skip_rows)
        self.record_stats = bool(record_stats)
        self.cuda_graphs = bool(cuda_graphs)
        self.unit: Unit = setup.unit
        self.masker: Masker = setup.masker
        self.file_watch: FileWatch | None = setup.file_watch
        self._recorder = StatsRecorder()
        self.faults = StepFaults(logging.getLogger("memfree"))

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with no statistics (even shallow copies)."""
        state = self.__dict__.copy()
        state["_recorder"] = StatsRecorder()
        state["_prompts"] = None  # thread-local: a copy reads its own prompts
        state["faults"] = None  # holds a lock: a copy logs its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._prompts = threading.local()
        self.faults = StepFaults(logging.getLogger("memfree"))

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the core reads token bytes from (word filters), else None."""
        info = getattr(self.masker, "tokenizer", None)
        return None if info is None else info.tokenizer

    # -- statistics -------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the calling thread's statistics; its next step starts a new record.

        Each ``generate()`` call starts new statistics by itself; call this between generations
        that run the guard directly (not from a ``LogitsProcessorList``) when one may continue
        the other.
        """
        self._recorder.reset()

    @property
    def stats(self) -> GuardStats:
        """Statistics of the calling thread's latest ``generate()`` call (copied to the host).

        A thread that has not run the guard reads the latest call started by any thread.
        """
        return self._recorder.stats()

    # -- the step -----------------------------------------------------------------------------------

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Scores with every token that completes a stored n-gram at ``-inf``.

        Args:
            input_ids: `(batch, seq_len)` token ids (prompt and generated tokens; beams flattened).
            scores: `(batch, vocab)` scores of the next token.

        Returns:
            A new `(batch, vocab)` tensor; ``scores`` is not modified.

        A row whose lookup raises another filter error (a damaged block) takes only end of
        sequence at this step, and the error is logged once (see the class's description).

        Raises:
            FilterChangedError: the filter file was rewritten in place while the guard had it
                open (see :mod:`memfree.filterfile.filewatch`). Raised, not swallowed: ``generate()`` stops
                and nothing the guard did not check is emitted. Replace filters by renaming a new
                file over the old one; a running guard then keeps the old one.
            FilterError: a row's lookup failed and the guard has no end-of-sequence id to close
                it with.
        """
        if input_ids.dim() != 2 or scores.dim() != 2 or input_ids.shape[0] != scores.shape[0]:
            raise ValueError(
                "expected input_ids (batch, seq_len) and scores (batch, vocab) with the same "
                f"batch, got {tuple(input_ids.shape)} and {tuple(scores.shape)}"
            )
        prompts = self._prompt_ngrams(input_ids) if self.exempt_prompt else None
        step = step_masks(
            self.masker, self.file_watch, input_ids, scores.shape[1], scores.device, prompts
        )
        if step.failed is not None and not self.eos_token_ids:
            raise step.errors[0]  # no end of sequence to close the rows with
        mask, checked = step.banned, step.checked
        fast = ban_scores_cpu(scores, mask, self.eos_token_ids, inplace=False)
        if fast is None:
            guarded = ban_scores(scores, mask, self.eos_token_ids, inplace=False)
            if self.record_stats:
                self._recorder.record(input_ids, scores, mask, checked)
        else:
            guarded = fast.scores
            if self.record_stats:  # the first choices and counts the fast path found on the way
                self._recorder.record(
                    input_ids, scores, mask, checked, fast.first_choice, fast.counts
                )
        if step.failed is not None:  # rows whose lookup raised a filter error: end them here
            self.faults.report(step, int(step.failed.sum()), scores.shape[0])
            guarded = fail_closed(guarded, step.failed, self.eos_token_ids)
        return guarded  # type: ignore[return-value]

    def _prompt_ngrams(self, input_ids: torch.Tensor) -> list[PromptNgrams | None]:
        """Each row's prompt n-grams: read at a generation's first step (a step whose rows do
        not extend the calling thread's previous prompts), kept for its later steps."""
        state = self._prompts
        known: torch.Tensor | None = getattr(state, "ids", None)
        if not (
            known is not None
            and known.shape[0] == input_ids.shape[0]
            and input_ids.shape[1] > known.shape[1]
            and torch.equal(input_ids[:, : known.shape[1]].to(known.device), known)
        ):
            state.ids = input_ids.detach().clone()
            special = set(self.setup.special_token_ids)  # padding, chat markers: they cut windows
            rows = [[-1 if i in special else i for i in row] for row in input_ids.cpu().tolist()]
            state.ngrams = [self.setup.prompt_ngrams(row) for row in rows]
        return list(state.ngrams)

    def blocked_mask(
        self,
        input_ids: torch.Tensor,
        vocab_size: int,
        device: torch.device | None = None,
        prompts: Sequence[PromptNgrams | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which tokens complete a stored n-gram for each row (the core's ``banned_mask``).

        Args:
            input_ids: `(batch, seq_len)` token ids.
            vocab_size: number of candidate tokens (the scores' last dimension).
            device: where the mask goes (default: that of ``input_ids``).
            prompts: each row's prompt n-grams that it may repeat (``exempt_prompt``), or None.

        Returns:
            (bool `(batch, vocab_size)` mask of blocked tokens, bool `(batch,)` rows checked).

        Raises:
            FilterChangedError: the filter file was rewritten in place (see :meth:`__call__`).
        """
        return checked_banned_mask(
            self.masker, self.file_watch, input_ids, vocab_size, device, prompts
        )

    def __repr__(self) -> str:
        word = not self.unit.reads_token_ids and type(self) is MemFreeLogitsProcessor
        name = MemFreeWordLogitsProcessor.__name__ if word else type(self).__name__
        settings = "".join(f", {key}={value!r}" for key, value in self.masker.describe().items())
        canonical = f", canonical={self.canonical}" if self.unit.reads_token_ids else ""
        return (
            f"{name}(filter={str(self.filter.path)!r}, n={self.n}, "
            f"special_token_ids={list(self.special_token_ids)}{canonical}{settings})"
        )


class MemFreeWordLogitsProcessor(MemFreeLogitsProcessor):
    """The guard over a word filter, by name: ``MemFreeLogitsProcessor(word_filter, tokenizer)``
    gives the same guard (an instance of the base class: ask ``guard.unit.name`` which unit a
    guard is over). Takes the same arguments; refuses a token filter.

    Raises:
        FilterMismatchError: the filter is not a word filter, or uses another normalizer.
        ValueError: no tokenizer.
    """

    unit_name = "word"


__all__ = ["FilterError", "GuardStats", "MemFreeLogitsProcessor", "MemFreeWordLogitsProcessor"]
