"""Quoting the prompt (``exempt_prompt``): a stored n-gram that occurs in a request's own prompt
is not banned, so a model may quote, translate or edit what the user gave it (a document, a
retrieved passage); every stored n-gram that does not occur in the prompt is banned as before.

The exemption is per row and removes bans, never adds them; it applies to what the filter
bans, never to canonical decoding's own bans (a token that would make the ids another split of
their text stays banned). Token unit: the candidate's n-gram of ids (its last n-1 ids and the
candidate) must be a window of the prompt's ids. Word unit: every stored word n-gram the
candidate creates in the text must be one of the prompt text's word n-grams. So a prompt that
holds the start of a stored passage still cannot get its continuation: the continuation's
n-grams are not in the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from memfree.core.text_promise import TextPromiseMasker, ban_readings
from memfree.core.word import WordMasker
from memfree.vocab.words import ngram_hash_rows, word_ngrams


@dataclass(frozen=True)
class PromptNgrams:
    """The n-grams of one request's prompt that its output may repeat.

    Attributes:
        next_ids: token unit: each (n-1)-id window of the prompt and the ids that follow it.
        words: word unit: the prompt text's word n-grams.
    """

    next_ids: dict[tuple[int, ...], frozenset[int]] = field(default_factory=dict)
    words: frozenset[tuple[str, ...]] = frozenset()

    @classmethod
    def of_ids(cls, prompt: Sequence[int] | np.ndarray, n: int) -> PromptNgrams:
        """A token-unit prompt's n-grams (negative ids, padding, start no window)."""
        ids = [int(i) for i in np.asarray(prompt, dtype=np.int64).tolist()]
        found: dict[tuple[int, ...], set[int]] = {}
        for end in range(n - 1, len(ids)):
            window = ids[end - n + 1 : end + 1]
            if min(window) >= 0:
                found.setdefault(tuple(window[:-1]), set()).add(window[-1])
        return cls(next_ids={prefix: frozenset(nexts) for prefix, nexts in found.items()})

    @classmethod
    def of_text(cls, text: str, n: int) -> PromptNgrams:
        """A word-unit prompt's n-grams: those of its text's normalized words."""
        return cls(words=frozenset(word_ngrams(text, n)))


def exempt_banned_mask(
    masker: object,
    contexts: torch.Tensor,
    vocab_width: int,
    device: torch.device | None,
    prompts: Sequence[PromptNgrams | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``masker.banned_mask(contexts, vocab_width, device)`` with each row's ban lifted from the
    candidates whose stored n-grams all occur in that row's prompt (``prompts[row]``; None: no
    exemption)."""
    if isinstance(masker, TextPromiseMasker):  # the filter's bans only; canonical's stay
        banned, active, noncanonical, readings = masker.parts(contexts, vocab_width, device)
        banned = _lift_ids(banned, contexts, prompts, masker.n) | noncanonical
        kept = [
            (row, token)
            for row, token, stored in readings
            if not _all_in_prompt(stored, prompts[row])
        ]
        return ban_readings(banned, kept), active
    banned, active = masker.banned_mask(contexts, vocab_width, device)  # type: ignore[attr-defined]
    if isinstance(masker, WordMasker):
        return _lift_words(masker, banned, contexts, prompts), active
    return _lift_ids(banned, contexts, prompts, masker.n), active  # type: ignore[attr-defined]


def _lift_ids(
    banned: torch.Tensor,
    contexts: torch.Tensor,
    prompts: Sequence[PromptNgrams | None],
    n: int,
) -> torch.Tensor:
    """Token unit: unban each row's candidates that follow its last n-1 ids in its prompt."""
    rows, tokens = [], []
    history = contexts.detach().cpu().numpy()
    width = banned.shape[1]
    for row, prompt in enumerate(prompts):
        if prompt is None or not prompt.next_ids:
            continue
        if history.shape[1] < n - 1:
            continue
        prefix = tuple(int(i) for i in history[row, history.shape[1] - (n - 1) :]) if n > 1 else ()
        for token in prompt.next_ids.get(prefix, ()):
            if token < width:
                rows.append(row)
                tokens.append(token)
    if rows:
        banned = banned.clone()
        banned[torch.tensor(rows), torch.tensor(tokens)] = False
    return banned


def _all_in_prompt(ngrams: list[tuple[int, ...]], prompt: PromptNgrams | None) -> bool:
    """Whether every one of ``ngrams`` is a window of the prompt's ids."""
    if prompt is None:
        return False
    return all(ngram[-1] in prompt.next_ids.get(ngram[:-1], ()) for ngram in ngrams)


def _lift_words(
    masker: WordMasker,
    banned: torch.Tensor,
    contexts: torch.Tensor,
    prompts: Sequence[PromptNgrams | None],
) -> torch.Tensor:
    """Word unit: unban each banned candidate whose stored word n-grams (created in the row's
    text) are all word n-grams of the row's prompt."""
    lifted = []
    for row, prompt in enumerate(prompts):
        if prompt is None or not prompt.words:
            continue
        for token in torch.nonzero(banned[row]).flatten().tolist():
            created = masker.created_ngrams(contexts[row], token)
            stored: list[tuple[str, ...]] = []
            if created:
                hits = masker.filter.contains(ngram_hash_rows(created))
                stored = [ngram for ngram, hit in zip(created, hits, strict=True) if hit]
            if all(ngram in prompt.words for ngram in stored):
                lifted.append((row, token))
    if lifted:
        banned = banned.clone()
        index = torch.tensor(lifted)
        banned[index[:, 0], index[:, 1]] = False
    return banned


__all__ = ["PromptNgrams", "exempt_banned_mask"]
