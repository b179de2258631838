"""A tokenizer's identity and its special ids: the fingerprint that ties a filter to the
vocabulary it was built with, and the ids no stored n-gram holds.
"""

from __future__ import annotations

import json
from typing import Any

import xxhash


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """xxh3-64 of the vocabulary (token -> id, added tokens included) and the special tokens.

    The same tokenizer loaded another way (from the GGUF file, or from a saved copy) gives the
    same fingerprint; a tokenizer that maps any token to another id does not.
    """
    vocab = tokenizer.get_vocab()
    special = sorted(
        (str(token), int(tokenizer.convert_tokens_to_ids(token)))
        for token in tokenizer.all_special_tokens
    )
    payload = json.dumps(
        {
            "vocab": sorted((str(token), int(index)) for token, index in vocab.items()),
            "special": special,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return xxhash.xxh3_64_hexdigest(payload.encode("utf-8"))


def special_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids of the special tokens (end of sequence, padding, chat markers, added special tokens).

    No stored n-gram contains one: the builder cuts token sequences at them, and the guard never
    blocks one nor checks a window that holds one. Sorted, distinct.
    """
    ids = {int(index) for index in getattr(tokenizer, "all_special_ids", []) or []}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(index) for index, token in added.items() if getattr(token, "special", False))
    return tuple(sorted(index for index in ids if index >= 0))


__all__ = ["special_token_ids", "tokenizer_fingerprint"]
