"""What every guard sets up and asks at each step, whatever the engine.

The transformers :class:`~memfree.MemFreeLogitsProcessor` and the engine adapters
(:mod:`memfree.integrations`) all start from a :class:`GuardSetup`: the filter, its unit, the ids
exempt from the guard, the end-of-sequence ids and the unit's :class:`~memfree.core.Masker`, with
every argument checked once, at construction. At each step they ask :func:`checked_banned_mask`
(the masker's answer, read from a filter file that was not rewritten in place meanwhile: see
:mod:`memfree.filterfile.filewatch`), then edit the scores (:mod:`memfree.engines.scores`); a
filter error inside a step: :mod:`memfree.engines.faults`.
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
    "checked_banned_mask",
    "token_ids",
]
