"""Scoring and extracting planted secrets: log-perplexities for exposure, greedy extraction from a
prefix (Carlini et al. 2022, k-extractability), and the Secret Sharer's shortest-path search
(Carlini et al. 2019, §8) — each with or without the MemFree guard.

Under the guard, a token that completes a stored n-gram has probability zero, so a sequence
holding a stored n-gram has infinite log-perplexity and cannot be generated or found by search.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from eval.canary_formats import CanaryFormat


def _secret_start(tokenizer: Any, text: str, prefix: str) -> int:
    """Index of the first token of ``text`` that is not wholly inside ``prefix``."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    for index, (start, end) in enumerate(encoding["offset_mapping"]):
        if end > len(prefix) or start >= len(prefix):
            return index
    return len(encoding["input_ids"])


@torch.inference_mode()
def log_perplexities(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    prefix: str = "",
    guard: Any = None,
    batch_size: int = 32,
    progress: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Log-perplexity (bits: ``-log2 Pr``) of each text, whole and of its part after ``prefix``.

    The first token has no context, so the whole-sequence score starts at the second token. With
    a guard, each position's distribution is the guarded one (blocked tokens have probability 0,
    so a text holding a stored n-gram scores ``inf``).

    Returns:
        (whole-sequence scores, secret-part scores given the prefix), float arrays `(len(texts),)`.
    """
    device = next(model.parameters()).device
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    starts = [max(_secret_start(tokenizer, text, prefix), 1) for text in texts]
    whole = np.zeros(len(texts))
    secret = np.zeros(len(texts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for begin in range(0, len(texts), batch_size):
        rows = encoded[begin : begin + batch_size]
        width = max(len(row) for row in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for index, row in enumerate(rows):  # right padding: positions stay as in training
            ids[index, : len(row)] = torch.tensor(row)
            attention[index, : len(row)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
        logits = logits[:, :-1].float()
        if guard is not None:
            logits = _guarded(guard, ids.to(device), logits)
        log_probs = torch.log_softmax(logits, dim=-1)
        targets = ids[:, 1:].to(device)
        picked = -log_probs.gather(2, targets[:, :, None])[:, :, 0] / math.log(2)
        token_bits = picked.cpu().numpy()
        for index, row in enumerate(rows):
            bits = token_bits[index, : len(row) - 1]  # bits[j] scores token j + 1
            whole[begin + index] = float(bits.sum())
            secret[begin + index] = float(bits[starts[begin + index] - 1 :].sum())
        if progress is not None:
            progress(len(rows))
    return whole, secret


def _guarded(guard: Any, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Logits with, at each position, the guard's blocked tokens at -inf."""
    masks = [
        guard.blocked_mask(ids[:, : position + 1], logits.shape[-1], logits.device)[0]
        for position in range(logits.shape[1])
    ]
    return logits.masked_fill(torch.stack(masks, dim=1), float("-inf"))


@dataclass(frozen=True)
class Extraction:
    """The outcome of one extraction attempt."""

    recovered: bool
    guess: str
    queries: int  # sequences scored (shortest path) or generate() calls (greedy)


@torch.inference_mode()
def greedy_extract(
    model: Any, tokenizer: Any, prefix: str, secret: str, guard: Any = None, slack: int = 4
) -> Extraction:
    """Greedy decoding from ``prefix``: does the continuation start with ``secret``?"""
    from memfree.generation import DecodingSettings, complete

    budget = len(tokenizer(secret, add_special_tokens=False)["input_ids"]) + slack
    [completion] = complete(
        model,
        tokenizer,
        [prefix],
        DecodingSettings(max_new_tokens=budget),
        guard,
        count_stored=False,
    )
    return Extraction(completion.text.startswith(secret), completion.text[: len(secret)], 1)


def shortest_path_extract(
    model: Any,
    tokenizer: Any,
    canary_format: CanaryFormat,
    guard: Any = None,
    max_queries: int = 100_000,
    batch_size: int = 64,
) -> Extraction:
    """Find the most likely secret of a format by best-first search (Secret Sharer §8).

    States are partial fillings of the holes, ordered by the log-perplexity of the canary text up
    to the last filled hole; popping a state scores all its children in one batch. The first
    complete filling popped is the guess. Brute force would score ``|R|`` sequences; the search
    usually needs far fewer for a memorized canary.

    Returns:
        the guess (``recovered`` is left False: compare it with the planted secret), and the
        number of sequences scored.
    """
    holes = canary_format.holes
    queries = 0
    frontier: list[tuple[float, tuple[str, ...]]] = [(0.0, ())]
    while frontier:
        _cost, partial = heapq.heappop(frontier)
        if len(partial) == len(holes):
            text = canary_format.fill(list(partial))
            return Extraction(False, text[len(canary_format.prefix) :], queries)
        children = [(*partial, choice) for choice in holes[len(partial)]]
        texts = [_partial_text(canary_format, child) for child in children]
        for begin in range(0, len(texts), batch_size):
            whole, _ = log_perplexities(
                model, tokenizer, texts[begin : begin + batch_size], guard=guard
            )
            queries += len(whole)
            for child, score in zip(children[begin : begin + batch_size], whole, strict=True):
                if math.isfinite(score):
                    heapq.heappush(frontier, (float(score), child))
        if queries >= max_queries:
            break
    return Extraction(False, "", queries)


def _partial_text(canary_format: CanaryFormat, partial: tuple[str, ...]) -> str:
    """The canary text up to and including the last filled hole."""
    holes = len(canary_format.holes)
    filler = list(partial) + ["\x00"] * (holes - len(partial))
    text = canary_format.fill(filler)
    return text[: text.index("\x00")] if "\x00" in text else text
