"""The token guard with canonical decoding: the union of two maskers that only remove candidates.

:class:`TextPromiseMasker` bans a candidate when the token masker does (it completes a stored
n-gram of token ids) or the canonical masker does (the row's ids with it appended would not be
its text's tokenization). Together: the generated ids are their text's tokenization, and hold no
stored n-gram, so the text, tokenized again, holds none either. End of sequence stays allowed
by both.
"""

from __future__ import annotations

from typing import Any

import torch

from memfree.core.canonical import CanonicalMasker
from memfree.core.token import TokenMasker
from memfree.core.token_index import IndexMasker
from memfree.vocab.info import TokenizerInfo


class TextPromiseMasker:
    """The token masker and the canonical masker, as one :class:`~memfree.core.Masker`.

    Args:
        token: the token masker (the filter's n-grams over ids).
        canonical: the canonical masker (the tokenizer's own split).

    Attributes:
        context_width: None: the canonical masker reads each row back to its last chunks (a
            chunk can be long, so adapters keep whole rows).
        tokenizer: the tokenizer's info.
    """

    def __init__(self, token: TokenMasker | IndexMasker, canonical: CanonicalMasker) -> None:
        self.token = token
        self.canonical = canonical
        self.n = token.n
        self.special_token_ids = token.special_token_ids
        self.context_width: int | None = None
        self.tokenizer: TokenizerInfo = canonical.info

    def describe(self) -> dict[str, Any]:
        return {**self.token.describe(), **self.canonical.describe()}

    def holds_own_copy(self, device: torch.device) -> bool:
        return False  # the token masker may read the mapped file: keep the file watch

    def banned_mask(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The union of both maskers' bans; the rows checked against the filter."""
        device = torch.device(device or contexts.device)
        banned, active = self.token.banned_mask(contexts, vocab_width, device)
        noncanonical, _ = self.canonical.banned_mask(contexts, vocab_width, device)
        return banned | noncanonical, active


__all__ = ["TextPromiseMasker"]
