"""The vocabulary's texts sorted, searched by prefix: the tokens whose text starts with a text
(one range of the sorted texts, found by binary search, not a pass over the vocabulary), and,
for each sorted text, every suffix's token id (what text completes a given one into a token)."""

from __future__ import annotations

import bisect

import numpy as np


def ids_starting_with(texts: list[str], ids: np.ndarray, prefix: str, size: int) -> np.ndarray:
    """bool `(size,)`: the ids whose text starts with ``prefix``, searched in ``texts`` (sorted;
    ``ids`` beside them), not by a pass over the vocabulary."""
    found = np.zeros(size, dtype=bool)
    start = bisect.bisect_left(texts, prefix)
    end = start
    while end < len(texts) and texts[end].startswith(prefix):
        end += 1
    found[ids[start:end]] = True
    return found


def prefix_range(entries: list[tuple[str, int]], prefix: str) -> tuple[int, int]:
    """``(low, high)``: the entries (``(text, id)`` pairs, sorted) whose text starts with
    ``prefix`` are ``entries[low:high]``, found by two binary searches."""
    low = bisect.bisect_left(entries, (prefix, -1))
    bound = _past(prefix)
    high = len(entries) if bound is None else bisect.bisect_left(entries, (bound, -1), low)
    return low, high


def suffix_ids(entries: list[tuple[str, int]], ids_of: dict[str, int]) -> tuple[np.ndarray, ...]:
    """For texts sorted (``entries``), the id of each text's every suffix (-1: no token's
    text): ``ids[starts[i] + k]`` for ``entries[i][0][k:]``, ``k`` from 0 to its length."""
    lengths = np.array([len(text) + 1 for text, _ in entries], dtype=np.int64)
    starts = np.zeros(len(entries), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    get = ids_of.get
    found = [get(text[k:], -1) for text, _ in entries for k in range(len(text) + 1)]
    return starts, np.array(found, dtype=np.int32)


def _past(prefix: str) -> str | None:
    """The least text greater than every text that starts with ``prefix`` (None: none is)."""
    prefix = prefix.rstrip("\U0010ffff")  # the greatest character: what starts with it is past
    if not prefix:
        return None
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


__all__ = ["ids_starting_with", "prefix_range", "suffix_ids"]
