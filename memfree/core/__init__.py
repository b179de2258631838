"""The engine-neutral guard core: for a batch of rows, which of ``vocab_width`` candidate tokens
complete a stored n-gram (MemFree decoding, Ippolito et al. 2023, Algorithm 1).

Every engine adapter (the transformers :class:`~memfree.MemFreeLogitsProcessor`; the vLLM and
llama.cpp adapters) is a thin layer over one :class:`Masker`, which the filter's unit picks
(:func:`memfree.units.unit_of`): :class:`~memfree.core.token.TokenMasker` for token n-grams,
:class:`~memfree.core.word.WordMasker` for normalized-word n-grams. A masker:

- answers ``banned_mask(contexts, vocab_width)`` for rows of token ids (prompt and generated
  tokens; the token masker reads only the last n-1, the word masker reads the text);
- exempts special tokens: an exempt id is never banned, and a row whose last n-1 tokens hold one
  completes no n-gram (the builder cut its windows there);
- imports nothing of transformers, and keeps no state between calls that changes a mask (the
  word masker caches each row's text by its ids: the same ids give the same mask).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from memfree.filterfile.protocol import NgramSet


@dataclass(frozen=True)
class MaskerOptions:
    """How a masker computes its answer; never what it answers (every setting gives the same
    masks).

    Attributes:
        skip_rows: on CPU, skip rows whose last n-1 tokens begin no stored n-gram, read from the
            filter's prefix section (exact: such a row completes no stored n-gram). The token
            masker reads it; the word masker keeps each row's text and checks only the
            candidates that change its last words, so it has nothing to skip.
        cuda_graphs: on CUDA, capture the token step once per shape as a CUDA graph and replay
            it. The word masker computes on the CPU.
    """

    skip_rows: bool = True
    cuda_graphs: bool = True


@runtime_checkable
class Masker(Protocol):
    """The core of a guard for one filter: which candidate tokens each row may not take.

    Attributes:
        n: the filter's n.
        special_token_ids: the exempt ids (sorted): never banned, never part of a checked window.
        context_width: how many of each row's last ids the masker reads (the token masker: n-1),
            or None when it reads the whole row (the word masker reads its text). Adapters that
            keep rows of their own pass no more than this.
    """

    n: int
    special_token_ids: tuple[int, ...]
    context_width: int | None

    def banned_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Which candidates complete a stored n-gram, for each row.

        Args:
            contexts: int64 `(rows, seq_len)` token ids of each row (prompt and generated).
            vocab_width: number of candidates (the logits' width; it may exceed the tokenizer's
                vocabulary: padded embedding rows are ids that no stored n-gram holds).
            device: where the results go (default: that of ``contexts``).

        Returns:
            (bool `(rows, vocab_width)` banned candidates, bool `(rows,)` rows whose candidates
            were checked; False rows were skipped, exactly).
        """
        ...

    def describe(self) -> dict[str, Any]:
        """The masker's own settings, for the guard's ``repr``."""
        ...


def exempt_token_ids(ngram_filter: NgramSet, requested: Iterable[int]) -> tuple[int, ...]:
    """The requested special ids that may be exempt from ``ngram_filter``'s guard, sorted.

    Only ids the builder also cut at may be exempt: exempting another id would let a stored
    n-gram that holds it through. Such an id is then an ordinary token for the guard. A filter
    that records no special ids (hand-made ones) exempts every requested id.

    Args:
        ngram_filter: the filter (its ``special_token_ids``, recorded by the builder, are read).
        requested: ids the caller wants exempt (the tokenizer's special tokens, padding, ...).
    """
    special = {int(token) for token in requested}
    recorded = ngram_filter.special_token_ids
    if recorded is not None:
        special &= set(recorded)
    return tuple(sorted(special))


__all__ = ["Masker", "MaskerOptions", "exempt_token_ids"]
