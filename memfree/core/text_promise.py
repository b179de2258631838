"""The token guard with canonical decoding: the union of maskers that only remove candidates.

:class:`TextPromiseMasker` bans a candidate when the token masker does (it completes a stored
n-gram of token ids), when the canonical masker does (no text that begins with the row's text
is tokenized with the row's ids and it as a prefix), or when it leaves the row pending and the
other reading of its text holds a stored n-gram: a whitespace run followed by one whitespace
character is tokenized one way when a word follows and another when the text ends there; the
output may be cut there by a length limit, so both readings are checked. Together: an output
ended by end of sequence is its text's tokenization; one cut anywhere is, but for a pending
run, whose other reading was checked too; neither holds a stored n-gram.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from memfree.core.canonical import CanonicalMasker, Pending
from memfree.core.canonical_spm import SentencePieceMasker
from memfree.core.token import TokenMasker
from memfree.core.token_index import IndexMasker
from memfree.vocab.info import TokenizerInfo


class TextPromiseMasker:
    """The token masker and the canonical masker, as one :class:`~memfree.core.Masker`.

    Args:
        token: the token masker (the filter's n-grams over ids).
        canonical: the canonical masker (the tokenizer's own split; see
            :func:`~memfree.core.canonical.canonical_masker`).

    Attributes:
        context_width: None: the canonical masker reads each row back to its last chunks (a
            chunk can be long, so adapters keep whole rows).
        tokenizer: the tokenizer's info.
    """

    def __init__(
        self,
        token: TokenMasker | IndexMasker,
        canonical: CanonicalMasker | SentencePieceMasker,
    ) -> None:
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
        """The union of the bans; the rows checked against the filter. On the CPU the prefix
        index sets its bans in canonical decoding's mask (the step's own array), which then
        needs no union."""
        device = torch.device(device or contexts.device)
        if device.type == "cpu" and isinstance(self.token, IndexMasker):
            banned, _, pending = self.canonical.step(contexts, vocab_width, device)
            active = torch.from_numpy(self.token.banned_into(contexts, vocab_width, banned.numpy()))
            readings = self._readings(contexts, pending)
        else:
            banned, active, noncanonical, readings = self.parts(contexts, vocab_width, device)
            banned = union(noncanonical, banned)  # into the step's own copy
        return ban_readings(banned, [(row, token) for row, token, _ in readings]), active

    def parts(
        self, contexts: torch.Tensor, vocab_width: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[StoredReading]]:
        """The bans apart, for ``exempt_prompt`` to lift the filter's: the token masker's bans
        and rows checked, canonical decoding's bans, and each pending candidate whose other
        reading holds stored n-grams, with them ``(row, token, n-grams)``."""
        device = torch.device(device or contexts.device)
        banned, active = self.token.banned_mask(contexts, vocab_width, device)
        noncanonical, _, pending = self.canonical.step(contexts, vocab_width, device)
        return banned, active, noncanonical, self._readings(contexts, pending)

    def _readings(self, contexts: torch.Tensor, pending: Sequence[Pending]) -> list[StoredReading]:
        """Each pending candidate whose other reading holds stored n-grams, with them."""
        readings: list[StoredReading] = []
        if pending:
            for item, stored in zip(pending, self._stored_readings(contexts, pending), strict=True):
                if stored:
                    readings.append((item.row, item.token, stored))
        return readings

    def _stored_readings(
        self, contexts: torch.Tensor, pending: Sequence[Pending]
    ) -> list[list[tuple[int, ...]]]:
        """For each pending candidate, the stored n-grams of its other reading that hold one of
        its new tokens (windows with a special id are skipped, as the builder skips them)."""
        n, special = self.n, set(self.special_token_ids)
        history = contexts.detach().cpu().numpy()
        windows: list[tuple[int, ...]] = []
        owners: list[int] = []
        for index, item in enumerate(pending):
            base = max(0, item.at - (n - 1))  # the first id a new window can reach
            row = history[item.row, base:].tolist()
            reading = [*row[: item.at - base], *item.tokens]
            written = [*row, item.token]
            same = item.at - base  # both begin with the row up to the replaced tokens
            while same < min(len(reading), len(written)) and reading[same] == written[same]:
                same += 1
            for end in range(max(same, n - 1), len(reading)):
                window = tuple(reading[end - n + 1 : end + 1])
                if min(window) >= 0 and not special.intersection(window):
                    windows.append(window)
                    owners.append(index)
        found: list[list[tuple[int, ...]]] = [[] for _ in pending]
        if windows:
            hits = self.token.filter.contains(np.asarray(windows, dtype=np.int64))
            for index, window, hit in zip(owners, windows, hits, strict=True):
                if hit:
                    found[index].append(window)
        return found


StoredReading = tuple[int, int, list[tuple[int, ...]]]  # row, candidate, stored n-grams


def union(into: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``into |= other`` (two bool masks of one shape), returned. On the CPU through numpy: one
    thread, where torch splits a single row of a large vocabulary across its threads and, on a
    machine busy with the model, waits for them longer than the union takes."""
    if into.device.type == "cpu" and other.device.type == "cpu":
        np.logical_or(into.numpy(), other.numpy(), out=into.numpy())
        return into
    return torch.logical_or(into, other, out=into)


def ban_readings(banned: torch.Tensor, pairs: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``banned`` with each ``(row, candidate)`` of ``pairs`` banned too, in place: both callers
    hand the step's own mask (the state table's rows and the filter's bans set in them, or a
    union made for the step), so no copy of rows × vocabulary is made for a few entries."""
    if not pairs:
        return banned
    index = torch.tensor(pairs, device=banned.device)
    banned[index[:, 0], index[:, 1]] = True
    return banned


__all__ = ["StoredReading", "TextPromiseMasker", "ban_readings", "union"]
