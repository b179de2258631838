"""A canonical row's last chunks: their text and tokens read from the row's bytes, and a split
pattern's row advanced by one token without reading its text.

:class:`~memfree.core.canonical_state.RowStates` keeps, for a canonical row, its last two
pre-tokenizer chunks (the tail: what appended text may change). Under a split pattern a row one
token longer is read again from the tail and the token (the pre-tokenizer over their text, the
chunks that become fixed checked against the tokenizer, the new last chunks' state), unless the
row's own state already says where the token lands (:func:`split_moved`): its split state holds
the row shape's candidate groups (where each candidate shape's chunk starts after the row's
text, and the row's chunk boundaries then, read by the pre-tokenizer itself) and, per group,
whether the row's chunks before the candidate's are their tokens' BPE (the facts). Where the
token's group starts a chunk at the token, keeps the tail's own boundary and its fact holds, the
tail's first chunk is fixed and canonical, and the row's new last chunks are the tail's last
chunk and the token: no text is read to find them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memfree.core.canonical_split import SplitChunks


def decode_tail(data: bytes, whole: bool) -> str | None:
    """The text of a row's last tokens, or None if it is not whole UTF-8 characters (the row
    ends inside one). A window that does not reach the segment's start may begin inside a
    character: those bytes are skipped."""
    if not whole:
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
            skip += 1
        data = data[skip:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tokens_of_tail(window: list[int], token_bytes: list[bytes], length: int) -> list[int]:
    """The row's last tokens that hold exactly its last ``length`` bytes ([] if no token
    boundary falls there)."""
    total = 0
    for count, token in enumerate(reversed(window), start=1):
        total += len(token_bytes[token])
        if total >= length:
            return window[-count:] if total == length else []
    return []


def in_space_run(key: tuple[Any, ...], text: str) -> bool:
    """Whether a canonical row in state ``key`` whose last chunks are ``text`` ends in a
    whitespace run whose split waits on the next character (a candidate may enter its other
    reading)."""
    return key[0] == "space" or (key[0] == "split" and text[-1:].isspace())


def split_moved(
    split: SplitChunks,
    state: tuple[Any, ...],
    text: str,
    tokens: tuple[int, ...],
    last: tuple[int, int],
    token: int,
) -> tuple[str, tuple[int, ...], tuple[int, int]] | None:
    """The last two chunks of a canonical row after ``token`` (their text, tokens, and where
    the last starts: characters, tokens), for a row whose split state is ``state`` and whose
    last chunks are ``text`` with ``tokens``, the last starting at ``last``: the tail's last
    chunk and the token's text, where the token's group (its shape's reading after the row's
    shape, the text ending after it) starts a chunk at the token, leaves the row's chunks as
    they are and holds its fact (the chunks before the token's are their tokens' BPE: the
    tail's first chunk is then fixed and canonical). None otherwise: read the text. The caller
    checks what the groups do not say (the text stays NFC, no added token's content is
    written, no added token's content is begun)."""
    shape, _, facts, _ = state
    kind = int(split.shape_of[token])
    if kind < 0:
        return None
    groups = split.groups(shape)
    number = int(groups.of_shape[kind])
    if number < 0 or not facts[number]:
        return None
    start, bounds = groups.groups[number]
    chars, count = last
    if start != len(shape) or len(bounds) != (1 if chars else 0):
        return None
    if bounds:
        # The boundary in the shape's characters, in the text's (a run the shape cut short
        # stands for its first and last characters).
        where = bounds[0] if len(shape) == len(text) else split._shape(text, False)[1][bounds[0]]
        if where != chars:
            return None
    appended = split.bpe.texts[token] or ""
    kept = text[chars:]
    return kept + appended, (*tokens[count:], token), (len(kept), len(tokens) - count)


__all__ = ["decode_tail", "in_space_run", "split_moved", "tokens_of_tail"]
