"""What every guard sets up and how it edits a step's scores, whatever the engine.

The transformers :class:`~memfree.MemFreeLogitsProcessor` and the engine adapters
(:mod:`memfree.integrations`) all start from a :class:`GuardSetup`: the filter, its unit, the ids
exempt from the guard, the end-of-sequence ids and the unit's :class:`~memfree.core.Masker`, with
every argument checked once, at construction. At each step they ask :func:`checked_banned_mask`
(the masker's answer, read from a filter file that was not rewritten in place meanwhile: see
:mod:`memfree.filterfile.filewatch`), then edit the scores with :func:`ban_scores` (blocked tokens at
``-inf``, end of sequence rescued) or, when a row's context is not known, :func:`fail_closed`
(nothing but end of sequence); a filter error inside a step: :mod:`memfree.engines.faults`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from memfree.core import Masker, MaskerOptions, exempt_token_ids
from memfree.core.exempt import PromptNgrams, exempt_banned_mask
from memfree.errors import EmptyFilterError, FilterMismatchError
from memfree.filterfile import open_filter
from memfree.filterfile.filewatch import FileWatch
from memfree.filterfile.protocol import NgramSet
from memfree.units import Unit, get_unit, unit_of
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.tokenizer import check_tokenizer


@dataclass(frozen=True)
class GuardSetup:
    """A guard's checked settings and its core.

    Attributes:
        filter: the filter.
        n: its n.
        unit: its unit (token or word).
        special_token_ids: the exempt ids (sorted): never banned, never part of a checked window.
        eos_token_ids: end-of-sequence ids among them (the first is the one rescued).
        masker: the unit's core.
        file_watch: the identity of the filter's mapped file, checked around every step's reads
            (None: the filter maps no file, e.g. a copy).
        canonical: the token guard also keeps the ids its text's tokenization (canonical
            decoding, :mod:`memfree.core.canonical`): its promise then holds over the text.
    """

    filter: NgramSet
    n: int
    unit: Unit
    special_token_ids: tuple[int, ...]
    eos_token_ids: tuple[int, ...]
    masker: Masker
    file_watch: FileWatch | None = None
    canonical: bool = False

    @property
    def promise(self) -> str:
        """What the guard promises, in words (for reprs and summaries)."""
        return self.unit.promise(self.canonical)

    def banned_mask(
        self,
        contexts: torch.Tensor,
        vocab_width: int,
        device: torch.device | None = None,
        prompts: Sequence[PromptNgrams | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The masker's ``banned_mask``, checked against a filter file rewritten in place (see
        :func:`checked_banned_mask`); every engine asks this, never the masker itself.
        ``prompts``: each row's prompt n-grams its output may repeat (``exempt_prompt``:
        :mod:`memfree.core.exempt`), or None.

        Raises:
            FilterChangedError: the filter file was rewritten in place; fail the step closed.
        """
        return checked_banned_mask(
            self.masker, self.file_watch, contexts, vocab_width, device, prompts
        )

    def prompt_ngrams(self, prompt: Sequence[int]) -> PromptNgrams:
        """A request's prompt n-grams for ``exempt_prompt``: its ids' windows (token unit), or
        its text's word n-grams (word unit, the text read as the guard reads it)."""
        tokenizer = getattr(self.masker, "tokenizer", None)
        return self.unit.prompt_ngrams(prompt, self.n, tokenizer, self.special_token_ids)

    @classmethod
    def create(
        cls,
        ngram_filter: NgramSet | str | os.PathLike[str],
        tokenizer: Any = None,
        *,
        unit_name: str | None = None,
        ngram_size: int | None = None,
        special_token_ids: Iterable[int] | None = None,
        eos_token_id: int | Iterable[int] | None = None,
        pad_token_id: int | None = None,
        options: MaskerOptions | None = None,
        canonical: bool | None = None,
        allow_empty: bool = False,
    ) -> GuardSetup:
        """Open and check everything a guard needs (see :class:`~memfree.MemFreeLogitsProcessor`
        for the arguments). The tokenizer (a Hugging Face one, or its
        :class:`~memfree.vocab.info.TokenizerInfo`) is read once, here: everything below takes
        its info.

        ``canonical`` (token filters): None turns canonical decoding on when there is a
        tokenizer; True asks for it (a tokenizer is then needed); False guards the ids only.
        ``allow_empty``: accept a filter that stores no n-gram (refused by default: such a guard
        changes nothing, which is almost always a build gone wrong).

        Raises:
            FilterMismatchError: tokenizer fingerprint, n or unit differs from the filter's.
            EmptyFilterError: the filter stores no n-gram and ``allow_empty`` is False.
            CanonicalUnsupportedError: canonical decoding asked for (or by default) with a
                tokenizer it is not exact for.
            ValueError: a bad argument.
        """
        if canonical is not None and not isinstance(canonical, bool):
            raise ValueError(f"canonical must be True, False or None, got {canonical!r}")
        if not isinstance(allow_empty, bool):
            raise ValueError(f"allow_empty must be True or False, got {allow_empty!r}")
        ngram_filter = open_filter(ngram_filter)
        n = ngram_filter.n
        if ngram_size is not None and ngram_size != n:
            raise FilterMismatchError(
                f"{ngram_filter.path}: holds {n}-grams, but ngram_size={ngram_size} was "
                f"asked for; rebuild it with `memfree build --n {ngram_size}` or drop ngram_size"
            )
        if len(ngram_filter) == 0 and not allow_empty:
            raise EmptyFilterError(ngram_filter.path, ngram_filter.unit, n, "pass allow_empty=True")
        special: set[int] = set()
        eos_ids: list[int] = []
        info = None if tokenizer is None else TokenizerInfo.of(tokenizer)
        if info is not None:
            check_tokenizer(ngram_filter, info)
            special.update(info.special_token_ids)
            if info.eos_token_id is not None:
                eos_ids.append(info.eos_token_id)
            if pad_token_id is None:
                pad_token_id = info.pad_token_id
        if eos_token_id is not None:
            eos_ids = token_ids("eos_token_id", eos_token_id)
        special.update(token_ids("special_token_ids", special_token_ids))
        special.update(eos_ids)
        special.update(token_ids("pad_token_id", pad_token_id))
        exempt = exempt_token_ids(ngram_filter, special)
        unit = get_unit(unit_name) if unit_name else unit_of(ngram_filter)
        eos = tuple(i for i in dict.fromkeys(eos_ids) if i in exempt)
        on = unit.text_promise(canonical, info)  # the unit decides, and refuses what it cannot
        masker = unit.masker(ngram_filter, info, exempt, options, canonical=on, end_token_ids=eos)
        watch = getattr(ngram_filter, "file_watch", None)
        return cls(ngram_filter, n, unit, exempt, eos, masker, watch, on)


def checked_banned_mask(
    masker: Masker,
    file_watch: FileWatch | None,
    contexts: torch.Tensor,
    vocab_width: int,
    device: torch.device | None = None,
    prompts: Sequence[PromptNgrams | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``masker.banned_mask(contexts, vocab_width, device)``, read from bits that were verified
    before and unchanged after (:meth:`~memfree.filterfile.filewatch.FileWatch.read`: two ``fstat`` calls).

    A masker whose steps on ``device`` read only its own copy of the bits (a filter copied to an
    accelerator at its first step there) is not checked: a change of the file cannot reach it.

    Raises:
        FilterChangedError: the filter file was rewritten in place (now or at an earlier step);
            the caller fails the step closed (end of sequence only) or stops.
    """

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        if prompts is not None and any(prompt is not None for prompt in prompts):
            return exempt_banned_mask(masker, contexts, vocab_width, device, prompts)
        return masker.banned_mask(contexts, vocab_width, device)

    if file_watch is None:
        return step()
    target = torch.device(device or contexts.device)
    holds_copy = getattr(masker, "holds_own_copy", None)
    if holds_copy is not None and holds_copy(target):
        return step()
    return file_watch.read(step)


def ban_scores(
    scores: torch.Tensor,
    banned: torch.Tensor,
    eos_token_ids: tuple[int, ...],
    *,
    inplace: bool,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``scores`` with every banned token at ``-inf``; a row left with nothing allowed (possible
    only when earlier processors removed everything else) gets its end-of-sequence score at 0.

    Args:
        scores: float `(rows, vocab_width)`.
        banned: bool `(rows, vocab_width)` on the same device.
        eos_token_ids: the rescued id is the first (none: no rescue).
        inplace: edit ``scores`` itself (engines that allow it) or return a new tensor.
        rows: bool `(rows,)`, the guarded rows (None: all); only they are rescued.
    """
    fast = ban_scores_cpu(scores, banned, eos_token_ids, inplace=inplace, rows=rows)
    if fast is not None:
        return fast.scores
    guarded = (
        scores.masked_fill_(banned, float("-inf"))
        if inplace
        else scores.masked_fill(banned, float("-inf"))
    )
    if eos_token_ids and eos_token_ids[0] < scores.shape[1]:
        eos = eos_token_ids[0]
        dead = guarded.amax(dim=1) == float("-inf")  # one reduction; NaN is not -inf
        if rows is not None:
            dead &= rows
        guarded[:, eos] = torch.where(dead, torch.zeros_like(guarded[:, eos]), guarded[:, eos])
    return guarded


@dataclass(frozen=True)
class BannedScores:
    """What :func:`ban_scores_cpu` computed: the scores, and what the statistics need."""

    scores: torch.Tensor  # the banned scores (``scores`` itself when edited in place)
    counts: torch.Tensor  # int64 (rows,) tokens banned per row
    first_choice: torch.Tensor  # int64 (rows,) each row's highest score's token before the ban


def ban_scores_cpu(
    scores: torch.Tensor,
    banned: torch.Tensor,
    eos_token_ids: tuple[int, ...],
    *,
    inplace: bool,
    rows: torch.Tensor | None = None,
) -> BannedScores | None:
    """:func:`ban_scores` in numpy, for float32/float64 scores on the CPU (None otherwise).

    The same result, without a pass over every score for each part: the banned entries are
    set in one pass over the mask (no index array: canonical decoding bans most of a row); a row is alive when its first choice (numpy's
    argmax, which torch's equals: the first of ties, NaN counted highest) is finite and not
    banned, so only the other rows are searched for a finite score. numpy runs in the calling
    thread: torch's CPU kernels wake their thread pool, which costs more than these passes right
    after a model's forward (measured: 0.85 ms a step at batch 1 in a generation, against 0.3
    ms for the same calls alone).
    """
    if not (
        scores.device.type == "cpu"
        and banned.device.type == "cpu"
        and scores.dtype in (torch.float32, torch.float64)
        and scores.dim() == 2
        and scores.is_contiguous()
        and banned.is_contiguous()
        and banned.shape == scores.shape
        and (rows is None or rows.device.type == "cpu")
    ):
        return None
    original = scores.detach().numpy()
    mask = banned.numpy()
    width = original.shape[1]
    first = original.argmax(axis=1)
    # One pass each, no index array: canonical decoding bans most of a row (half the scores).
    counts = np.count_nonzero(mask, axis=1).astype(np.int64, copy=False)
    if inplace:
        np.copyto(original, original.dtype.type(-np.inf), where=mask)
        guarded = original
    else:
        guarded = np.where(mask, original.dtype.type(-np.inf), original)
    if eos_token_ids and eos_token_ids[0] < width:
        index = np.arange(original.shape[0])
        alive = ~mask[index, first] & (original[index, first] > -np.inf)
        dead = np.zeros(original.shape[0], dtype=bool)
        suspects = np.flatnonzero(~alive)
        if suspects.size:
            dead[suspects] = guarded[suspects].max(axis=1) == -np.inf
        if rows is not None:
            dead &= rows.numpy()
        guarded[dead, eos_token_ids[0]] = 0.0
    result = scores if inplace else torch.from_numpy(guarded)
    return BannedScores(result, torch.from_numpy(counts), torch.from_numpy(first))


def fail_closed(
    scores: torch.Tensor, rows: torch.Tensor, eos_token_ids: tuple[int, ...]
) -> torch.Tensor:
    """Edits ``scores`` in place so that the given rows may take nothing but end of sequence.

    For rows whose context the guard cannot know (an engine's placeholder, an error inside a
    callback that must not raise): a token the guard did not check is never emitted.

    Args:
        scores: float `(rows, vocab_width)`.
        rows: bool `(rows,)`, the rows to close.
        eos_token_ids: their first id keeps its score (0 where it was ``-inf``); none: every
            score of the rows goes to ``-inf``.
    """
    if not bool(rows.any()):
        return scores
    eos = eos_token_ids[0] if eos_token_ids and eos_token_ids[0] < scores.shape[1] else None
    kept = scores[rows, eos] if eos is not None else None
    scores[rows] = float("-inf")
    if eos is not None and kept is not None:
        scores[rows, eos] = torch.where(torch.isneginf(kept), torch.zeros_like(kept), kept)
    return scores


def token_ids(name: str, value: Any) -> list[int]:
    """Token ids from None, an int, a numpy or 0-d/1-d torch integer, or an iterable of them.

    Raises:
        ValueError: something else, or a negative id.
    """
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


__all__ = [
    "EmptyFilterError",
    "GuardSetup",
    "ban_scores",
    "checked_banned_mask",
    "fail_closed",
    "token_ids",
]
